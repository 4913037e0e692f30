"""`softmax`: sample a candidate with probabilities from the normalised totals (Dynamo's
worker selector), or pick the best at temperature 0.

    temperature = 0:  as `max_score` (with its `tie_break`)
    temperature > 0:  c(r) = total(r), negated when higher is better (so lower c is better)
                      p(r) ∝ exp(-(c(r) - min c) / ((max c - min c) · temperature))
                      uniform when all c are equal; one draw u ∈ [0, 1) per routed request;
                      candidates in replica-id order, the first with cumulative p ≥ u wins

The draw comes from `random.Random(seed)` when `seed` is set, else from the profile's seeded
generator, so a seed reproduces the sequence. The draw is taken on the first pick after a
routed request and kept until the next `on_request_routed`: a pick that is only explained (or
not used) does not move the sequence, and repeating it gives the same answer.

Parameters (defaults, Dynamo's): `temperature` 0.0, `seed` (None), `tie_break` ([]).

Example::

    picker: {name: softmax, params: {temperature: 0.5, seed: 7}}
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from pydantic import Field

from router.plugins.base import Pick, Picker, Scored
from router.plugins.pickers.max_score import MaxScoreParams, best
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class SoftmaxParams(MaxScoreParams):
    """Parameters of the `softmax` picker."""

    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = None


def softmax_probabilities(costs: Mapping[str, float], temperature: float) -> dict[str, float]:
    """Normalised softmax over negated costs (lower cost, higher probability)."""
    lo, hi = min(costs.values()), max(costs.values())
    if hi == lo:
        return dict.fromkeys(costs, 1.0 / len(costs))
    scale = 1.0 / ((hi - lo) * temperature)
    weights = {rid: math.exp(-(c - lo) * scale) for rid, c in costs.items()}
    total = sum(weights.values())
    return {rid: w / total for rid, w in weights.items()}


@register
class SoftmaxPicker(Picker[SoftmaxParams]):
    """Temperature-scaled sampling over the totals; state: the pending draw."""

    name = "softmax"
    params_model = SoftmaxParams

    def __init__(self, params: SoftmaxParams) -> None:
        super().__init__(params)
        self._rng = random.Random(params.seed) if params.seed is not None else None
        self._draw: float | None = None

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaSnapshot],
        scored: Scored,
        rng: random.Random,
        now: float,
    ) -> Pick:
        params = self.params
        total, higher = scored.total, scored.higher_is_better
        if params.temperature == 0.0:
            chosen = best(candidates, total, higher, params.tie_break)
            word = "max" if higher else "min"
            value = total[chosen]
            return Pick(chosen, lambda: f"{word} score {value:.4g}", total, higher)
        ids = sorted(r.replica_id for r in candidates)
        costs = {rid: -total[rid] if higher else total[rid] for rid in ids}
        probs = softmax_probabilities(costs, params.temperature)
        if self._draw is None:
            self._draw = (self._rng or rng).random()
        sample = self._draw
        cumulative = 0.0
        chosen = ids[-1]
        for rid, p in probs.items():
            cumulative += p
            if sample <= cumulative:
                chosen = rid
                break
        value, p_chosen, temperature = total[chosen], probs[chosen], params.temperature
        return Pick(
            chosen,
            lambda: (
                f"softmax sample {sample:.3f} (T={temperature:g}): score "
                f"{value:.4g}, p={p_chosen:.3f}"
            ),
            total,
            higher,
            terms={rid: {"probability": p} for rid, p in probs.items()},
        )

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        self._draw = None
