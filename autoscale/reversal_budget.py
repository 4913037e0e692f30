"""A pool's reversal budget: at most `count` direction changes in any `window_s` (planner option
`reversal_budget`, per pool; off by default, Round 16).

Issue 11's flap goal is at most 2 direction changes per pool in any 10 minutes (the measure:
`benchmarks/autoscale_sim/flaps.py`, a change of the pool's provisioned count of the opposite
sign to the change before it, counted in every window `[s, s + W)`). Hysteresis and
persistence (`autoscale.stabilization`) make a reversal rarer; this rule bounds them. Ups are
never refused (attainment first), so the budget is kept by the one move it may hold: a **down
that would be a reversal** (the pool's last change was an up).

**Rule.** Let `R(t)` be the pool's reversals before `t` at times `u > t - W` (inside the
last `W`). A down at tick `t` whose pool last went up is refused (the pool keeps
its count, reason `reversal-budget`) while

    |R(t)| > count - 2

i.e. it goes only when `|R(t)| + 1 (this down) + 1 (an up at once after it) <= count`. Downs
that continue a down, and every up, are never touched.

**Why this condition, and that it suffices** (every window of length W holds at most `count`
reversals, whatever the ups do). The direction changes alternate in kind: an up-to-down one
(a *down-reversal*), then a down-to-up one (an *up-reversal*), and so on, since each ends the
run of moves the one before began. Take any window `[s, s + W)` and its reversals
`u_1 < ... < u_m`. If none is a down-reversal, alternation leaves `m <= 1`. Else let `u_j` be
the last down-reversal in it: after it the window holds at most one up-reversal (a second one
needs a down-reversal between them), so `m <= j + 1`. `u_j` went through the rule, and
`u_1..u_{j-1}` lie in `[s, u_j) ⊂ (u_j - W, u_j)` (as `u_j < s + W`), so
`j - 1 <= |R(u_j)| <= count - 2`, hence `m <= j + 1 <= count`. Tightness: a weaker test
(`|R(t)| <= count - 1`) lets an up at the next tick make `count + 1`, and the rule cannot
refuse that up. Hence `count >= 2`: with 1 every down after an up would wait for ever.

**What it reads.** The reversals are those of the provisioned count (ready + pending) the
planner observes each tick, `observe(now, provisioned)`: what the measure counts (scales,
budget cuts and role moves alike). A move the actuator applied at tick `t` is seen at the next
tick and recorded then: late, which keeps it in `R` longer, never shorter, so the proof holds
on the recorded times. Scope: the rule holds the pool's own way down (planner step 5); a cut
by the GPU budget (step 6) or a role move out of the pool (step 7) is forced by the other
pool's need and is counted, not refused.

**Cost.** With `count` 2 a pool goes down after an up-reversal only once `W` has passed since
its last reversal: it keeps a burst's replicas up to `W` after the burst when the next burst
comes within `W` (the Azure hour's bursts recur every 5-15 minutes: replayed on its W 90
run, +0.83 prefill GPU-h, an estimate; `benchmarks/results/autoscale-round16-flap/`).

Parameters (`ReversalBudgetOptions`, the policy's `planner.reversal_budget: {POOL: {...}}`):
- `count` (default 2, integer >= 2): direction changes allowed in any `window_s`: the goal's 2.
- `window_s` W (default 600): the goal's 10 minutes.

Source: pdorch's own (issue 11's flap goal; Round 15's whole Azure hour with
`prefill_scale_down_s` 90: 3 prefill direction changes in its worst 10 minutes, 1500-2100 s;
the up at 1870 s met a real burst, the downs at 1500 and 2000 s are what a rule can hold).
Pure: `now` comes with each observation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoscale.signals import Pool

REASON = "reversal-budget"


class ReversalBudgetOptions(BaseModel):
    """One pool's `planner.reversal_budget` entry (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(default=2, ge=2, strict=True)
    window_s: float = Field(default=600.0, gt=0)


@dataclass
class ReversalBudget:
    """One pool's reversals of the last `window_s` and the rule on its downs (module
    docstring). `observe` once per tick, before `refuses`."""

    count: int = 2
    window_s: float = 600.0
    _last: int | None = None  # the provisioned count the last tick saw
    _sign: int = 0  # the sign of its last change (0: none yet)
    _reversals: deque[float] = field(default_factory=deque)

    def observe(self, now: float, provisioned: int) -> None:
        """This tick's provisioned count; a change against the last one's sign is a reversal."""
        if self._last is not None and provisioned != self._last:
            sign = 1 if provisioned > self._last else -1
            if self._sign and sign != self._sign:
                self._reversals.append(now)
            self._sign = sign
        self._last = provisioned
        while self._reversals and now - self._reversals[0] >= self.window_s:
            self._reversals.popleft()

    def recent(self, now: float) -> int:
        """`|R(now)|`: the reversals recorded within the last `window_s` (all before this
        tick's decision: the one seen now was ordered at an earlier tick)."""
        return sum(1 for u in self._reversals if u > now - self.window_s)

    def refuses(self, now: float) -> bool:
        """Is a down now refused (it would be a reversal and the budget has no room for it and
        an up at once after it)?"""
        return self._sign > 0 and self.recent(now) > self.count - 2


def budgets_of(
    options: Mapping[Pool, ReversalBudgetOptions | Mapping[str, Any]] | None,
) -> dict[Pool, ReversalBudget]:
    """Each named pool's `ReversalBudget` from the policy's (or a keyword's) options."""
    out: dict[Pool, ReversalBudget] = {}
    for pool, opt in (options or {}).items():
        o = opt if isinstance(opt, ReversalBudgetOptions) else ReversalBudgetOptions(**opt)
        out[Pool(pool)] = ReversalBudget(o.count, o.window_s)
    return out
