"""`max_score`: the best weighted total wins, ties broken by a stable, documented order.

    chosen = best of total(r) in the profile's direction (max when higher is better, else
             min); among equal totals, by each `tie_break` entry in turn, then the lowest
             replica id (llm-d breaks ties at random; pdorch must replay exactly)

A `tie_break` entry names a `ReplicaSnapshot` field: `cached_blocks` prefers the smaller
value, `-overlap_blocks` the larger.

Parameters (defaults): `tie_break` ([]).

Example::

    picker: {name: max_score, params: {tie_break: [-overlap_blocks]}}
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import fields

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from router.plugins.base import Pick, Picker, Scored
from router.plugins.registry import register
from router.replica_columns import FloatArray, IntArray, ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest

_NUMERIC_FIELDS = {
    f.name
    for f in fields(ReplicaSnapshot)
    if f.name not in ("replica_id", "prefill_tokens_per_s", "role")
}


class MaxScoreParams(BaseModel):
    """Parameters of the `max_score` picker (the `softmax` picker shares `tie_break`)."""

    model_config = ConfigDict(extra="forbid")
    tie_break: list[str] = Field(default_factory=list)

    @field_validator("tie_break")
    @classmethod
    def _known_fields(cls, value: list[str]) -> list[str]:
        for item in value:
            if item.removeprefix("-") not in _NUMERIC_FIELDS:
                raise ValueError(
                    f"{item!r} is not a replica snapshot field; known: {sorted(_NUMERIC_FIELDS)}"
                )
        return value


def best(
    candidates: Sequence[ReplicaSnapshot],
    total: Mapping[str, float],
    higher_is_better: bool,
    tie_break: Sequence[str],
) -> str:
    """The best candidate's id (see module docstring)."""
    # The best value first, then the tie-break among the few that reach it: the same order
    # as sorting by (total, *tie_break, id), without a key tuple per candidate.
    values = total.values()
    top = max(values) if higher_is_better else min(values)
    tied = [r for r in candidates if total[r.replica_id] == top]
    if len(tied) == 1:
        return tied[0].replica_id
    getters = [
        (item.removeprefix("-"), -1.0 if item.startswith("-") else 1.0) for item in tie_break
    ]

    def key(r: ReplicaSnapshot) -> tuple[object, ...]:
        return (*(s * float(getattr(r, name)) for name, s in getters), r.replica_id)

    return min(tied, key=key).replica_id


def best_row(
    candidates: ReplicaColumns,
    rows: IntArray,
    ids: Sequence[str],
    total: FloatArray,
    higher_is_better: bool,
    tie_break: Sequence[str],
) -> str | None:
    """`best` over columns: the same choice, or None when a tie needs a field that is not a
    column (or a total is NaN, where `max`/`min` over a list and over an array differ)."""
    top = total.max() if higher_is_better else total.min()
    if np.isnan(top):
        return None
    tied: list[int] = np.flatnonzero(total == top).tolist()
    if len(tied) == 1:
        return ids[tied[0]]
    getters = []
    for item in tie_break:
        column = candidates.column(item.removeprefix("-"))
        if column is None:
            return None
        getters.append((column[rows].tolist(), -1.0 if item.startswith("-") else 1.0))

    def key(t: int) -> tuple[object, ...]:
        return (*(s * float(values[t]) for values, s in getters), ids[t])

    return ids[min(tied, key=key)]


@register
class MaxScorePicker(Picker[MaxScoreParams]):
    """Argmax (or argmin) of the weighted total with a stable tie-break."""

    name = "max_score"
    params_model = MaxScoreParams

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaSnapshot],
        scored: Scored,
        rng: random.Random,
        now: float,
    ) -> Pick:
        chosen = best(candidates, scored.total, scored.higher_is_better, self.params.tie_break)
        return _pick(chosen, scored.total, scored.higher_is_better)

    def supports_columns(self) -> bool:
        return True

    def pick_columns(
        self,
        request: RoutingRequest,
        candidates: ReplicaColumns,
        rows: IntArray,
        ids: Sequence[str],
        total: FloatArray,
        higher_is_better: bool,
        now: float,
    ) -> Pick | None:
        chosen = best_row(candidates, rows, ids, total, higher_is_better, self.params.tie_break)
        if chosen is None:
            return None
        return _pick(chosen, dict(zip(ids, total.tolist(), strict=True)), higher_is_better)


def _pick(chosen: str, total: dict[str, float], higher_is_better: bool) -> Pick:
    word = "max" if higher_is_better else "min"
    value = total[chosen]
    return Pick(chosen, lambda: f"{word} score {value:.4g}", total, higher_is_better)
