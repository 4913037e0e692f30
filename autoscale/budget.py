"""Splitting a GPU budget between the pools by marginal SLO gain.

A request meets its SLO only if both its prefill and its decode do, and a pool given `n` of
the `w` replicas it wants serves about `min(1, n/w)` of its demand within target. So the
attainment of an allocation is estimated as

    A(n_p, n_d) = Π_pool min(1, n_pool / w_pool)

Starting from each pool's minimum, the budget is handed out one replica at a time to the pool
whose next replica raises `A` the most per GPU (`ΔA / gpus_per_replica`); ties go to the pool
further from its want (smaller `n/w`), then to decode (its replicas hold in-flight sequences).
This equalises `n/w` across pools with equal GPU sizes and favours the cheaper pool when a
replica of one costs more GPUs. Pools never go below their minimum, even when the minimums
alone exceed the budget (the budget is then reported as unmet).

**Keeping the last split** (`keep`, `margin`; the planner's `budget_margin`, default 0.2).
While the budget binds, each pool's want moves with its own noise (a breach here, a fit there),
and the split that maximises `A` moves one replica from pool to pool with it: on the whole
Mooncake trace at the 16-GPU budget, prefill and decode traded a replica 4-5 times within
10 minutes, each trade a drain on one side and a 120 s cold start on the other. So a split
kept from the last binding tick stands while it is still a valid allocation (within the
budget, at or above each minimum, at or below each want) and the fresh split would raise the
estimate by at most `margin`: `A(fresh) - A(keep) <= margin`. The planner passes no `keep`
when its `budget_margin` is 0 (a fresh split every tick, the behaviour before).

**The load now first** (`now`; the planner's `budget_now_first`, default false). A pool's want
can hold headroom for load that has not arrived: the floor for the load `startup_s` ahead,
which `cold_start_growth` sizes for `g x` the level (decode 2.5 with the burst model). `A`
counts that headroom as demand served, so when the budget binds a pool that asks for growth
takes replicas from one that is short now. With `now` (each pool's need for the load now:
its floor for the level and its reactive term, at most its want) the split is done in two
tiers: the marginal-gain split of the budget over the `now` needs first, then, from that
allocation, over the whole wants with what is left. Formula: `fresh = M(want | M(now | min))`,
`M(w | a)` the marginal split from allocation `a` towards `w`. A kept split must then also
serve the `now` needs as well as the fresh one within `margin`. Why: on the Mooncake x2
prefix (Round 13, `benchmarks/results/autoscale-round13-decode/`) the burst model with decode
growth 2.5 asked for 9-14 decode replicas (the floor ahead; its reactive term read 1-3) while
prefill, short now, wanted 9-11: the single-tier split gave 8 + 8 all run and TTFT fell to
85.9 %.
"""

from __future__ import annotations

from autoscale.signals import Pool

_TIE_ORDER = {Pool.DECODE: 0, Pool.PREFILL: 1}


def _served(n: int, want: int) -> float:
    return 1.0 if want <= 0 else min(1.0, n / want)


def attainment_estimate(alloc: dict[Pool, int], want: dict[Pool, int]) -> float:
    out = 1.0
    for pool, w in want.items():
        out *= _served(alloc.get(pool, 0), w)
    return out


def split_budget(
    want: dict[Pool, int],
    minimum: dict[Pool, int],
    gpus_per_replica: dict[Pool, int],
    budget: int,
    keep: dict[Pool, int] | None = None,
    margin: float = 0.0,
    now: dict[Pool, int] | None = None,
) -> dict[Pool, int]:
    """Replicas per pool within `budget` GPUs (module docstring); `want` if it fits; `keep`
    (the last binding split) while it is valid and the fresh split gains at most `margin`;
    `now` (each pool's need for the load now) is served first when given."""
    if sum(want[p] * gpus_per_replica[p] for p in want) <= budget:
        return dict(want)
    if now is None:
        fresh = _marginal_split(want, minimum, gpus_per_replica, budget)
    else:
        # the `now` needs, each within [min, want], first; then the rest towards the wants
        first = {p: min(max(now.get(p, 0), minimum[p]), want[p]) for p in want}
        start = _marginal_split(first, minimum, gpus_per_replica, budget)
        fresh = _marginal_split(want, start, gpus_per_replica, budget)
    if keep is None or set(keep) != set(want):
        return fresh
    valid = sum(keep[p] * gpus_per_replica[p] for p in keep) <= budget and all(
        minimum[p] <= keep[p] <= want[p] for p in want
    )
    gains = [attainment_estimate(fresh, want) - attainment_estimate(keep, want)]
    if now is not None:
        gains.append(attainment_estimate(fresh, now) - attainment_estimate(keep, now))
    if valid and max(gains) <= margin:
        return dict(keep)
    return fresh


def _marginal_split(
    want: dict[Pool, int],
    start: dict[Pool, int],
    gpus_per_replica: dict[Pool, int],
    budget: int,
) -> dict[Pool, int]:
    """`M(want | start)`: from `start`, each next replica to the pool of the largest gain."""
    alloc = {p: start[p] for p in want}
    used = sum(alloc[p] * gpus_per_replica[p] for p in alloc)
    while True:
        best: tuple[float, float, int, Pool] | None = None
        for p in want:
            if alloc[p] >= want[p] or used + gpus_per_replica[p] > budget:
                continue
            trial = dict(alloc)
            trial[p] += 1
            gain = attainment_estimate(trial, want) - attainment_estimate(alloc, want)
            key = (gain / gpus_per_replica[p], -_served(alloc[p], want[p]), -_TIE_ORDER[p], p)
            if best is None or key[:3] > best[:3]:
                best = key
        if best is None:
            return alloc
        alloc[best[3]] += 1
        used += gpus_per_replica[best[3]]
