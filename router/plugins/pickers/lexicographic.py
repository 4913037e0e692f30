"""`lexicographic`: the first scorer decides; the `fallback` scorer breaks its ties.

    chosen = best by (s_first(r), s_fallback(r), replica id), each scorer read in its own
             direction; weights are ignored

For session affinity: `session_hash` scores 1 for the session's ring owner, so a keyed request
goes there; without a key every candidate ties on it and the fallback (`least_request`:
fewest in flight; `round_robin`: the rotation's turn) places the request. Reported scores are
1 for the chosen candidate and 0 for the others (a lexicographic order has no single number).

Parameters (defaults): `fallback` (None: the profile's second scorer, if any).

Example::

    scorers: [{name: session_hash}, {name: least_request}]
    picker: {name: lexicographic, params: {fallback: least_request}}
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from router.plugins.base import Pick, Picker, Scored
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class LexicographicParams(BaseModel):
    """Parameters of the `lexicographic` picker."""

    model_config = ConfigDict(extra="forbid")
    fallback: str | None = None


@register
class LexicographicPicker(Picker[LexicographicParams]):
    """First scorer, then the fallback scorer, then replica id."""

    name = "lexicographic"
    params_model = LexicographicParams

    def check(self, scorer_names: Sequence[str]) -> None:
        fallback = self.params.fallback
        if fallback is not None and fallback not in scorer_names:
            raise ValueError(
                f"fallback: no scorer {fallback!r} in the profile; it has {list(scorer_names)}"
            )
        if not scorer_names:
            raise ValueError("picker 'lexicographic' needs at least one scorer")

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaSnapshot],
        scored: Scored,
        rng: random.Random,
        now: float,
    ) -> Pick:
        names = list(scored.by_scorer)
        order = [names[0]]
        fallback = self.params.fallback or (names[1] if len(names) > 1 else None)
        if fallback is not None and fallback != names[0]:
            order.append(fallback)
        signs = [-1.0 if scored.scorer_higher_is_better[n] else 1.0 for n in order]
        columns = [scored.by_scorer[n] for n in order]

        def key(r: ReplicaSnapshot) -> tuple[object, ...]:
            rid = r.replica_id
            return (*(s * col[rid] for s, col in zip(signs, columns, strict=True)), rid)

        chosen = min(candidates, key=key).replica_id
        first = scored.by_scorer[order[0]]
        best_value = first[chosen]

        def reason() -> str:
            if sum(v == best_value for v in first.values()) == 1:
                return f"{order[0]} decides"
            return f"{order[0]} ties: {' then '.join(order[1:]) or 'replica id'}"

        return Pick(
            chosen,
            reason,
            {r.replica_id: float(r.replica_id == chosen) for r in candidates},
            True,
        )
