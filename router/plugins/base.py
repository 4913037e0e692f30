"""The three kinds of routing parts and what flows between them.

A routing decision is a pipeline, as llm-d's scheduler reads (`router/plugins/profile.py`):

    candidates ──filters──▶ survivors ──weighted scorers──▶ Scored ──picker──▶ Pick

- A `Filter` drops candidates that must not get the request (unhealthy, no KV headroom) and
  says why for each (`rejected`).
- A `Scorer` maps every survivor to one number, in its own direction (`higher_is_better`),
  plus named terms for the explain API. It never knows its weight: weights live in the profile.
- A `Picker` chooses from the scored survivors (argmax with a stable tie-break, a softmax
  draw, or a rule over several scorers such as `cache_aware`'s balance thresholds).

Every part is pure with respect to the fleet and takes `now`; a part with state (round-robin's
rotation, `cache_aware`'s text tree, a sampling picker's pending draw) changes it only in
`on_request_routed` / `on_replica_removed`, so a pick can be explained or repeated without
changing the next one. Each part has a pydantic `params_model` (`extra="forbid"`) whose
defaults are documented in the part's module docstring.

**Columns** (issue 15: decisions over 256-1,024 replicas). A part may also work on
`ReplicaColumns` (`router/replica_columns.py`): `supports_columns()` says it can (default
False), and `filter_columns` / `score_columns` / `pick_columns` then give exactly what
`filter` / `score` / `pick` give on the same candidates as snapshots. `Profile.pick` takes that
path only when every part of the profile supports it; otherwise the snapshots are built and
the parts run as above. `rows` are the positions (in `candidates`) of the survivors.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from router.latency_predictor import LatencyFitParams
from router.replica_columns import BoolArray, FloatArray, IntArray, ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest


class NoParams(BaseModel):
    """Params model of parts without parameters (unknown keys are still errors)."""

    model_config = ConfigDict(extra="forbid")


P = TypeVar("P", bound=BaseModel)


class Part(ABC, Generic[P]):
    """What filters, scorers and pickers share: a registry name, params, lifecycle hooks."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    params_model: ClassVar[type[BaseModel]] = NoParams
    # True for parts that read `RoutingRequest.prompt_text` (callers build it only then).
    needs_prompt_text: ClassVar[bool] = False

    def __init__(self, params: P) -> None:
        self.params = params

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        """Learn that `request` was sent to `replica_id` (stateless parts ignore it)."""
        return None

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        """Forget `replica_id` (stateless parts ignore it)."""
        return None

    def supports_columns(self) -> bool:
        """Whether this part (with its params) has a `*_columns` method (module docstring)."""
        return False

    def latency_fit(self) -> LatencyFitParams | None:
        """The latency fit this part reads from the snapshots (`ReplicaSnapshot.latency`),
        or None: the lifecycle keeps per-replica fits only when some part asks for them."""
        return None


@dataclass(slots=True)
class FilterResult:
    """Survivors in the order given, why each other candidate was dropped, and a note for the
    decision's reason when the filter relaxed itself (e.g. nobody had KV headroom)."""

    kept: list[ReplicaSnapshot]
    rejected: dict[str, str] = field(default_factory=dict)
    note: str | None = None


@dataclass(slots=True)
class ColumnFilterResult:
    """`FilterResult` over columns: `kept[i]` for candidate `i` (already-dropped ones stay
    False), the rejections of this filter, and its note."""

    kept: BoolArray
    rejected: dict[str, str] = field(default_factory=dict)
    note: str | None = None


class Filter(Part[P]):
    """Drops candidates (see module docstring)."""

    kind = "filter"

    @abstractmethod
    def filter(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> FilterResult:
        """Split `candidates` into survivors and rejections."""

    def filter_columns(
        self, request: RoutingRequest, candidates: ReplicaColumns, kept: BoolArray, now: float
    ) -> ColumnFilterResult:
        """`filter` over the candidates still `kept` (only when `supports_columns()`)."""
        raise NotImplementedError(f"filter {self.name!r} has no column path")


@dataclass(slots=True)
class ColumnScores:
    """`ScorerOutput` over columns: one score per survivor row, and a function building the
    terms (`{replica_id: {term: value}}`, as `ScorerOutput.terms`) when explain reads them."""

    values: FloatArray
    terms: Callable[[], dict[str, dict[str, float]]]


@dataclass(slots=True)
class ScorerOutput:
    """One scorer's number per candidate and, optionally, the terms behind each number."""

    scores: dict[str, float]
    terms: dict[str, dict[str, float]] = field(default_factory=dict)


class Scorer(Part[P]):
    """Scores candidates (see module docstring)."""

    kind = "scorer"
    higher_is_better: ClassVar[bool] = True

    @abstractmethod
    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        """One number per candidate (every candidate gets one)."""

    def score_columns(
        self, request: RoutingRequest, candidates: ReplicaColumns, rows: IntArray, now: float
    ) -> ColumnScores:
        """`score` over the survivor `rows` (only when `supports_columns()`)."""
        raise NotImplementedError(f"scorer {self.name!r} has no column path")

    def describe(self, terms: dict[str, float]) -> str:
        """A short account of the chosen replica's terms for the decision's reason ("")."""
        return ""


@dataclass(slots=True)
class Scored:
    """What a picker sees: the weighted total and every scorer's own numbers.

    `total[r] = Σ_i sign_i · w_i · s_i(r)` over the profile's scorers in order, where
    `sign_i` is +1 when scorer `i` reads in the profile's direction (`higher_is_better`, the
    first scorer's) and -1 when it reads the other way. `by_scorer[name][r]` is `s_i(r)`;
    `terms[r]` merges every scorer's raw score (under its name) and its extra terms.
    """

    total: dict[str, float]
    higher_is_better: bool
    by_scorer: dict[str, dict[str, float]]
    scorer_higher_is_better: dict[str, bool]
    terms: dict[str, dict[str, float]]


@dataclass(slots=True)
class Pick:
    """A picker's answer: the choice, why, the scores to report and how to read them.

    `reason` may be a function that builds the text: the profile calls it only when the
    decision's reason is read (`PolicyDecision.reason`), so pickers pass lambdas."""

    chosen: str
    reason: str | Callable[[], str]
    scores: dict[str, float]
    higher_is_better: bool
    terms: dict[str, dict[str, float]] = field(default_factory=dict)  # e.g. probabilities


class Picker(Part[P]):
    """Chooses one candidate (see module docstring)."""

    kind = "picker"
    # Scorers the picker reads by name; the profile checks they are present at build time.
    required_scorers: ClassVar[tuple[str, ...]] = ()

    def check(self, scorer_names: Sequence[str]) -> None:
        """Raise `ValueError` if the profile lacks a scorer this picker needs."""
        missing = [n for n in self.required_scorers if n not in scorer_names]
        if missing:
            raise ValueError(f"picker {self.name!r} needs scorer(s) {missing}")

    @abstractmethod
    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaSnapshot],
        scored: Scored,
        rng: random.Random,
        now: float,
    ) -> Pick:
        """Choose among `candidates` (never empty)."""

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
        """`pick` over the survivor `rows` (ids `ids`, weighted totals `total`), or None when
        these inputs need the snapshot path (only called when `supports_columns()`). Only
        pickers that read no single scorer's numbers and draw nothing from the rng have it."""
        raise NotImplementedError(f"picker {self.name!r} has no column path")
