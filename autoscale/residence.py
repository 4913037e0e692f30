"""The decode floor's load over a sequence's residence (pdorch's planner, step 1; Round 7).

A decode replica holds a sequence from its first token to its last, `R = T_own + OSL·ITL`
seconds in the floor's own model (`planner_terms.decode_floor_need`). So the sequences, and
the KV, a decode pool holds at `t` are the arrivals of `[t - R, t]` (Little's law): a 5 s
window's arrivals are a sample of that load, not the load. On the Mooncake trace (heavy-tailed
prompts: mean 13.5k tokens, p99 95k; ~30 requests per 5 s window) one window's decode need
swung 2-9 replicas around a mean of 4.5, and the floor's 180 s hold kept the swings' maximum
(7-8 decode replicas where the oracle runs 4), taking GPUs of the shared budget from prefill.

Formula: the decode floor for the load now is `ceil(mean(need_k))` over the ticks `k` of the
last `R` seconds (`R` read at this tick; the tick itself always counts; `R` shorter than a
tick: the tick alone, as before), `need_k` the fractional need of tick `k`'s level. A floor
for the load `startup_s` ahead scales that mean by the projected rate over the level's
(`need` is linear in the rate before rounding). Parameters: none (`R` is the model's own
residence). Planner option `decode_residence_mean` (default off: Round 7 measured it with
`decode_correction_on_target` on Mooncake and the diurnal day, where it lost attainment).
"""

from __future__ import annotations

from collections import deque


class ResidenceMean:
    """Mean of the decode need over the last residence time (module docstring)."""

    def __init__(self) -> None:
        self._hist: deque[tuple[float, float]] = deque()

    def add(self, now: float, need: float, residence_s: float) -> float:
        """Record this tick's fractional need; the mean over the ticks of the last
        `residence_s` (this one included)."""
        self._hist.append((now, need))
        while len(self._hist) > 1 and now - self._hist[0][0] >= residence_s:
            self._hist.popleft()
        return sum(n for _, n in self._hist) / len(self._hist)
