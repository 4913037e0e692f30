"""The predictive floor's order on a ramp: replica `k` is ordered once the need ahead passes
`k - ε`, not `k` (planner option `ramp_epsilon` ε, in replicas; 0: off, the default).

Formula: for the floor for the load `startup_s` ahead, while the rate it is sized for is above
the level (the floor expects growth: a sustained trend, or `cold_start_growth` > 1),
`need' = need + ε` and the count is `ceil(need')`; the floor for the load now and a flat or
falling projection are unchanged (so the way down after a peak reads the plain need).

Why: a floor count is `ceil(need)`, so on a ramp the tick a replica is ordered turns on the
need's second decimal. On the 600 s diurnal day with the burst policy
(`benchmarks/results/autoscale-round12-fit/README.md`, section 1) decode's floor need at 150 s
was 2.00 with the prefill-leg fit and 2.01 with the TTFT fit (a 0.5 % difference through the
corrections): the TTFT run ordered its third decode replica at 150 s, the leg run at 160 s (need
1.88 at 155 s), which served 10 s into the peak and cost minute 4 (88.44 % within both against
97.76 %) and 1.55 points of the day. A need that reaches `k - ε` on a rising ramp reaches `k` a
tick or two later anyway; the replica costs those ticks, and a cold start ordered a tick late
costs a whole tick of the peak. ε is an absolute share of one replica, not a fraction of the
need, because the edge is the integer the ceiling rounds to. Source: pdorch's own measurement
(Round 13, `benchmarks/results/autoscale-round13-prefill/`); the default stays 0 unless it wins
on every workload measured there. It won on the short workloads paired with the prefill-leg
fit, but the pair flapped prefill on the whole Azure hour (11 direction changes, 3 in the
worst 10 minutes, at 1.03x the GPU-hours: `benchmarks/results/autoscale-round13-whole/`), so
both stay off.
"""

from __future__ import annotations

from autoscale.planner_terms import Term
from autoscale.sizing import replicas_for


def ramp_term(term: Term, rate_ahead: float, level_rate: float, epsilon: float) -> Term:
    """`term` (a floor for the load ahead, `inputs["need"]` its fractional need) with its need
    raised by `epsilon` when the rate it is sized for is above the level (module docstring);
    `term` itself otherwise (epsilon 0, or no growth expected)."""
    if epsilon <= 0 or rate_ahead <= level_rate:
        return term
    need = float(term.inputs["need"])
    inputs = {**term.inputs, "need": need + epsilon, "need_before_ramp_epsilon": need}
    return Term(replicas_for(need + epsilon), term.reason, inputs)
