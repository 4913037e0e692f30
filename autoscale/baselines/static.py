"""`static-peak` and `static-mean`: fixed replica counts for the whole run.

Formula: counts given as options (`prefill=`, `decode=`), else computed from the whole trace
with the perf model (`autoscale.sizing.size_window`, no headroom): the trace (`requests=` as
`(arrival_s, isl, osl, hit)` tuples, or `windows=` as `LoadWindow`s) is cut into
`window_s` (60 s) windows; `static-peak` takes each pool's largest per-window count (what an
operator provisions for the busiest minute), `static-mean` the count for the time-averaged load.
Both are clamped to the policy's [min, max]; the GPU budget is not applied (a static fleet is
what it is). Source: the conventional baselines of the autoscaling literature (DistServe,
llm-d's "8 static replicas").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from autoscale.baselines.common import POOLS, clamp
from autoscale.decision import ScaleDecision
from autoscale.load_window import LoadWindow, TraceRequest, mean_window, split_windows
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool
from autoscale.sizing import size_window


class StaticPlanner(Planner):
    name = "static"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        mode: Literal["peak", "mean"] = "peak",
        prefill: int | None = None,
        decode: int | None = None,
        requests: Sequence[TraceRequest] | None = None,
        windows: Sequence[LoadWindow] | None = None,
        window_s: float = 60.0,
    ) -> None:
        self.label = f"static-{mode}"
        self.interval_s = 3600.0
        given = {Pool.PREFILL: prefill, Pool.DECODE: decode}
        computed: dict[Pool, int] = {}
        if prefill is None or decode is None:
            if windows is None:
                if requests is None:
                    raise ValueError(f"static-{mode} needs prefill= and decode=, or the trace")
                windows = split_windows(requests, window_s)
            if not windows:
                raise ValueError(f"static-{mode}: the trace is empty")
            if mode == "peak":
                sized = [size_window(perf_model, policy, w) for w in windows]
                computed = {p: max(s[p] for s in sized) for p in POOLS}
            else:
                computed = size_window(perf_model, policy, mean_window(windows))
        self.counts: dict[Pool, int] = {}
        self.reasons: dict[Pool, str] = {}
        for p in POOLS:
            n = given[p]
            n = computed[p] if n is None else n
            self.counts[p], self.reasons[p] = clamp(policy, p, n, self.label)

    def plan(self, observation: Observation) -> ScaleDecision:
        return ScaleDecision(
            observation.now, dict(self.counts), dict(self.reasons), (), {"static": self.label}
        )


register_planner(
    "static-peak",
    lambda policy, perf_model, **o: StaticPlanner(policy, perf_model, mode="peak", **o),
)
register_planner(
    "static-mean",
    lambda policy, perf_model, **o: StaticPlanner(policy, perf_model, mode="mean", **o),
)
