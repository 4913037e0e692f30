"""`Profile`: one routing decision as a pipeline of parts (filters → weighted scorers → picker).

    pick(request, replicas, now):
        candidates = replicas, narrowed by each filter in turn (rejections kept, with why)
        no candidate left → chosen None ("no healthy replica" when the health filter emptied it)
        total(r)   = Σ_i sign_i · w_i · s_i(r)     (see `router.plugins.base.Scored`)
        chosen     = picker(candidates, totals and every scorer's numbers)

It keeps the interface every caller of a routing policy uses (`PdRouter`, the coordinator,
the fleet simulator): `pick` (pure: no part changes state in it), `score`, `route` (= `pick`
+ `on_request_routed`), `on_request_routed` and `on_replica_removed` (passed on to every part),
and `name`. Profiles are built from YAML specs by `router.plugins.spec.build_profile`.

When the candidates are `ReplicaColumns` and every part supports columns (`supports_columns`,
`router/plugins/base.py`), `pick` runs the same pipeline on the arrays: the same decision
(chosen, scores, rejections, reason), with the details built only when read. Any other case,
and columns of at most `SCALAR_ROWS` candidates (where numpy's per-call cost is more than the
loop), runs on the snapshots (built from the columns on first access).

`choose` (issue 15, proxy-8; the proxy's and the simulator's admissions) is the replica `pick`
would choose and nothing else, for the hot path that reads only that:

    > SCALAR_ROWS candidates, or a picker other than `max_score`  -> pick(...).chosen
    filters as in `pick` (rejections and notes dropped); none left   -> None
    one survivor                                                 -> that survivor
    else  total(r) as in `_score` (the same float operations), chosen = `best` over it

It builds no terms, `Scored`, `Pick`, reason or `PolicyDecision`, and with one survivor it
runs no scorer (`max_score` takes a lone candidate whatever its total; scorers are pure, so
not calling them changes nothing). The one difference: a NaN total on a lone candidate, where
`pick` raises (`best` finds no tie at the top) and `choose` returns the candidate.
`tests/router/test_profile_choose.py` compares it with `pick` on random states, ties included.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from router.latency_predictor import LatencyFitParams
from router.plugins.base import Filter, Picker, Scored, Scorer
from router.plugins.pickers.max_score import MaxScorePicker, best
from router.replica_columns import SCALAR_ROWS, FloatArray, ReplicaColumns
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest

Terms = dict[str, dict[str, float]]


class Profile:
    """A named pipeline of filters, weighted scorers and one picker."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter[Any]],
        scorers: Sequence[tuple[Scorer[Any], float]],
        picker: Picker[Any],
        rng: random.Random | None = None,
    ) -> None:
        if not scorers:
            raise ValueError(f"profile {name!r} has no scorer")
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.rng = rng if rng is not None else random.Random(0)
        self.higher_is_better = self.scorers[0][0].higher_is_better
        picker.check([s.name for s, _ in self.scorers])
        # built once: `on_request_routed` walks every part on each routed request
        self._all_parts: tuple[Filter[Any] | Scorer[Any] | Picker[Any], ...] = (
            *self.filters,
            *(s for s, _ in self.scorers),
            self.picker,
        )
        self._columnar = all(part.supports_columns() for part in self._all_parts)
        # `choose`'s lean path is `max_score`'s rule (exactly that class: a subclass may differ)
        self._max_score = picker if type(picker) is MaxScorePicker else None

    @property
    def needs_prompt_text(self) -> bool:
        """Whether any part reads the prompt text (`text_prefix`)."""
        return any(p.needs_prompt_text for p in self._parts())

    @property
    def latency_fit(self) -> LatencyFitParams | None:
        """The first part's latency-fit parameters (`Part.latency_fit`), None if no part
        reads a learnt fit."""
        for part in self._all_parts:
            fit = part.latency_fit()
            if fit is not None:
                return fit
        return None

    @property
    def columnar(self) -> bool:
        """Whether `pick` runs on `ReplicaColumns` without building snapshots."""
        return self._columnar

    @property
    def weights(self) -> dict[str, float]:
        """Scorer name → weight."""
        return {s.name: w for s, w in self.scorers}

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        """Filter, score and pick (see module docstring); changes no state."""
        # at most SCALAR_ROWS candidates the snapshots are cheaper than the arrays (a pick on
        # one replica: 22 -> 13 µs with the build; proxy.md, proxy-cpu-4), and the same decision
        if self._columnar and isinstance(replicas, ReplicaColumns) and len(replicas) > SCALAR_ROWS:
            decision = self._pick_columns(request, replicas, now)
            if decision is not None:
                return decision
        candidates = list(replicas)
        rejected: dict[str, str] = {}
        notes: list[str] = []
        for f in self.filters:
            result = f.filter(request, candidates, now)
            rejected.update(result.rejected)
            candidates = result.kept
            if result.note:
                notes.append(result.note)
            if not candidates:
                reason = (
                    "no healthy replica" if f.name == "health" else f"no candidate left by {f.name}"
                )
                return PolicyDecision(self.name, None, reason, rejected=rejected)
        scored = self._score(request, candidates, now)
        pick = self.picker.pick(request, candidates, scored, self.rng, now)
        details = scored.terms
        for rid, extra in pick.terms.items():
            details[rid].update(extra)
        row = details[pick.chosen]
        chosen = pick.chosen
        head = pick.reason
        # Built only when read (`PolicyDecision.reason`: /admin/explain, reports): on the
        # simulator's and the proxy's hot path nobody reads it (issues 11 and 15).
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            why=lambda: self._reason(head if isinstance(head, str) else head(), row, notes),
            scores=pick.scores,
            higher_is_better=pick.higher_is_better,
            terms=details,
            rejected=rejected,
        )

    def choose(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> str | None:
        """`pick(...).chosen` without the decision around it (module docstring); no state."""
        if len(replicas) > SCALAR_ROWS or self._max_score is None:
            return self.pick(request, replicas, now).chosen
        candidates = replicas
        for f in self.filters:
            candidates = f.filter(request, candidates, now).kept
            if not candidates:
                return None
        if len(candidates) == 1:
            return candidates[0].replica_id
        ids = [r.replica_id for r in candidates]
        total: dict[str, float] | None = None
        for scorer, weight in self.scorers:
            scores = scorer.score(request, candidates, now).scores
            w = weight if scorer.higher_is_better == self.higher_is_better else -weight
            total = _accumulate(total, ids, w, scores)
        assert total is not None  # a profile has at least one scorer
        return best(candidates, total, self.higher_is_better, self._max_score.params.tie_break)

    def _pick_columns(
        self, request: RoutingRequest, columns: ReplicaColumns, now: float
    ) -> PolicyDecision | None:
        """`pick` on the arrays (module docstring); None: the picker needs the snapshots."""
        kept = np.ones(len(columns), dtype=np.bool_)
        rejected: dict[str, str] = {}
        notes: list[str] = []
        for f in self.filters:
            result = f.filter_columns(request, columns, kept, now)
            rejected.update(result.rejected)
            kept = result.kept
            if result.note:
                notes.append(result.note)
            if not kept.any():
                reason = (
                    "no healthy replica" if f.name == "health" else f"no candidate left by {f.name}"
                )
                return PolicyDecision(self.name, None, reason, rejected=rejected)
        rows = np.flatnonzero(kept)
        ids = columns.ids if len(rows) == len(columns) else [columns.ids[i] for i in rows.tolist()]
        total: FloatArray | None = None
        outputs = []
        for scorer, weight in self.scorers:
            out = scorer.score_columns(request, columns, rows, now)
            outputs.append((scorer.name, out))
            w = weight if scorer.higher_is_better == self.higher_is_better else -weight
            # the same float operations as `_score`: copy for a leading weight 1, else 0.0 + ...
            if total is None and w == 1.0:
                total = out.values
            else:
                total = (np.zeros(len(ids)) if total is None else total) + w * out.values
        assert total is not None  # a profile has at least one scorer
        pick = self.picker.pick_columns(
            request, columns, rows, ids, total, self.higher_is_better, now
        )
        if pick is None:
            return None
        pick_terms = pick.terms

        def details() -> Terms:
            terms: Terms = {}
            for name, out in outputs:
                _merge_terms(
                    terms, ids, name, dict(zip(ids, out.values.tolist(), strict=True)), out.terms()
                )
            for rid, extra in pick_terms.items():
                terms[rid].update(extra)
            return terms

        chosen = pick.chosen
        head = pick.reason
        decision = PolicyDecision(
            policy=self.name,
            chosen=chosen,
            why="",
            scores=pick.scores,
            higher_is_better=pick.higher_is_better,
            terms=details,
            rejected=rejected,
        )
        decision.why = lambda: self._reason(
            head if isinstance(head, str) else head(), decision.details[chosen], notes
        )
        return decision

    def _score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> Scored:
        # On every decision (benchmarks/router_bench.py): the scorers' own dicts are reused
        # rather than copied, and a leading weight-1 scorer's scores are the total as they are
        # (0.0 + 1.0 * s == s exactly, so single-scorer profiles rank by the formula itself).
        ids = [r.replica_id for r in candidates]
        total: dict[str, float] | None = None
        terms: dict[str, dict[str, float]] = {}
        by_scorer: dict[str, dict[str, float]] = {}
        directions: dict[str, bool] = {}
        for scorer, weight in self.scorers:
            out = scorer.score(request, candidates, now)
            scores = out.scores
            name = scorer.name
            by_scorer[name] = scores
            directions[name] = scorer.higher_is_better
            w = weight if scorer.higher_is_better == self.higher_is_better else -weight
            total = _accumulate(total, ids, w, scores)
            _merge_terms(terms, ids, name, scores, out.terms)
        assert total is not None  # a profile has at least one scorer
        return Scored(total, self.higher_is_better, by_scorer, directions, terms)

    def _reason(self, head: str, row: dict[str, float], notes: list[str]) -> str:
        parts = [head]
        if len(self.scorers) > 1:
            parts.append(
                "= " + " + ".join(f"{w:g}*{row[s.name]:.3g} {s.name}" for s, w in self.scorers)
            )
        described = [d for s, _ in self.scorers if (d := s.describe(row))]
        if described:
            parts.append("(" + "; ".join(described) + ")")
        reason = " ".join(parts)
        return "; ".join([*notes, reason]) if notes else reason

    def score(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> dict[str, float]:
        """Every competing candidate's score as `pick` reports it (no side effects)."""
        return self.pick(request, replicas, now).scores

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        """Tell every part that `request` went to `replica_id` (stateful parts learn here)."""
        for part in self._all_parts:
            part.on_request_routed(request, replica_id, now)

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        """Tell every part to forget `replica_id`."""
        for part in self._parts():
            part.on_replica_removed(replica_id, now)

    def route(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        """`pick`, then `on_request_routed` for the chosen replica."""
        decision = self.pick(request, replicas, now)
        if decision.chosen is not None:
            self.on_request_routed(request, decision.chosen, now)
        return decision

    def _parts(self) -> list[Filter[Any] | Scorer[Any] | Picker[Any]]:
        return [*self.filters, *(s for s, _ in self.scorers), self.picker]


def _accumulate(
    total: dict[str, float] | None, ids: Sequence[str], w: float, scores: Mapping[str, float]
) -> dict[str, float]:
    """`total + w * scores`, the one float order `pick` and `choose` share (so they agree to
    the bit): a leading weight-1 scorer's scores are copied as they are (0.0 + 1.0 * s == s),
    any other starts from 0.0."""
    if total is None and w == 1.0:
        return dict(scores)
    if total is None:
        total = dict.fromkeys(ids, 0.0)
    for rid in ids:
        total[rid] += w * scores[rid]
    return total


def _merge_terms(
    terms: Terms, ids: Sequence[str], name: str, scores: dict[str, float], extra: Terms
) -> None:
    """Add one scorer's terms (its own rows are reused) and its raw score under its name."""
    for rid in ids:
        row = terms.get(rid)
        more = extra.get(rid)
        if row is None:
            row = terms[rid] = more if more is not None else {}
        elif more:
            row.update(more)
        row[name] = scores[rid]
