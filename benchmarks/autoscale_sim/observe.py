"""The `Observation` a planner reads, built from the dynamic fleet simulator at a control tick.

Window: everything since the previous call of the same `ObservationBuilder` (the planner's
last tick, `planner.interval_s` earlier; the first call's window starts at 0):

- arrivals: requests that arrived in the window (`arrival_rps` = count / window, mean ISL =
  prompt tokens, mean OSL = the request's `max_tokens`, which a trace replay knows);
- `prefix_hit_rate`: Σ cached prompt tokens / Σ prompt tokens over the requests whose
  first token came in the window (the hit is known once its prefill ran);
- `ttft`: p50/p90/p99/mean over the requests whose first token came in the window;
- `itl`: the same over the requests that *finished* in the window, each request's ITL being
  its mean inter-token gap `(last - first token) / (outputs - 1)` (single-token outputs
  excluded), i.e. the per-request mean ITL the SLO is stated in;
- `slo_attainment`: the share of requests finished in the window with TTFT and ITL both
  within the policy's targets;
- per *ready* replica (`ReplicaSignals`), at `now`, from its engine core and the router's
  `TokenLoad`: running and waiting sequences, queued prefill tokens (the uncached prompt
  tokens admitted and not yet prefilled), KV usage and capacity (tokens), decode KV tokens
  (the KV blocks of its decode sequences x block size), mean engine step time over the
  window (steps that started in it; `None` when none did);
- `prefill_leg`: p50/p90/p99/mean of `prefill_end - arrival` over the disaggregated requests
  whose prefill leg ended in the window (queue wait + prefill steps, as a coordinator times its
  prefill leg), and `prefill_leg_uncached_tokens` their mean uncached prompt tokens (prompt -
  the prefill replica's cache hits);
- `pools`: ready / pending / draining per pool (`DynamicFleetSimulator.status`: a replica
  being moved is pending in its new pool and counts nowhere else).

Percentiles: linear interpolation between order statistics (numpy's default).
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from benchmarks.fleet_sim.membership import READY, DynamicFleetSimulator
from benchmarks.fleet_sim.simulator import RequestRecord


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) of ascending values, linear interpolation."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values: Sequence[float]) -> LatencySummary:
    if not values:
        return LatencySummary()
    v = sorted(values)
    return LatencySummary(
        count=len(v),
        p50_s=percentile(v, 50),
        p90_s=percentile(v, 90),
        p99_s=percentile(v, 99),
        mean_s=sum(v) / len(v),
    )


def ttft_s(rec: RequestRecord) -> float | None:
    return None if rec.first_token is None else rec.first_token - rec.arrival


def mean_itl_s(rec: RequestRecord) -> float | None:
    """Mean inter-token gap of a finished request; None for fewer than two outputs."""
    if rec.first_token is None or rec.last_token is None or rec.num_output < 2:
        return None
    return (rec.last_token - rec.first_token) / (rec.num_output - 1)


def within(rec: RequestRecord, ttft_target_s: float, itl_target_s: float) -> tuple[bool, bool]:
    """(TTFT within target, mean ITL within target) of a finished request."""
    t = ttft_s(rec)
    i = mean_itl_s(rec)
    return (t is not None and t <= ttft_target_s, i is None or i <= itl_target_s)


class ObservationBuilder:
    """Cursors over the simulator's arrival, first-token and finish lists (module docstring)."""

    def __init__(self, sim: DynamicFleetSimulator, ttft_target_s: float, itl_target_s: float):
        self.sim = sim
        self.ttft_target_s = ttft_target_s
        self.itl_target_s = itl_target_s
        self.last_now = 0.0
        self._arr = 0
        self._first = 0
        self._fin = 0
        self._leg = 0
        self._steps: dict[str, tuple[float, float]] = {}

    def observe(self, now: float) -> Observation:
        sim = self.sim
        window = max(now - self.last_now, 1e-9)
        self.last_now = now
        arrived = sim.all_records[self._arr :]
        self._arr = len(sim.all_records)
        firsts = sim.first_token_records[self._first :]
        self._first = len(sim.first_token_records)
        finished = sim.finished_records[self._fin :]
        self._fin = len(sim.finished_records)

        n = len(arrived)
        isl = sum(r.prompt_tokens for r in arrived) / n if n else 0.0
        osl = sum(r.output_tokens for r in arrived) / n if n else 0.0
        prompt = sum(r.prompt_tokens for r in firsts)
        hit = sum(r.hit_tokens for r in firsts) / prompt if prompt else 0.0
        ttfts = [t for r in firsts if (t := ttft_s(r)) is not None]
        itls = [i for r in finished if (i := mean_itl_s(r)) is not None]
        legs = sim.prefill_leg_records[self._leg :]
        self._leg = len(sim.prefill_leg_records)
        leg_s = [r.prefill_end - r.arrival for r in legs if r.prefill_end is not None]
        leg_uncached = (
            sum(max(0, r.prompt_tokens - r.hit_tokens) for r in legs) / len(legs) if legs else 0.0
        )
        attained = None
        if finished:
            ok = 0
            for r in finished:
                a, b = within(r, self.ttft_target_s, self.itl_target_s)
                ok += a and b
            attained = ok / len(finished)
        pools = {}
        for pool in Pool:
            ready, pending, draining = sim.status(pool.value)
            pools[pool] = PoolStatus(ready, pending, draining)
        return Observation(
            now=now,
            window_s=window,
            pools=pools,
            num_requests=n,
            arrival_rps=n / window,
            mean_isl_tokens=isl,
            mean_osl_tokens=osl,
            prefix_hit_rate=min(1.0, hit),
            ttft=summarize(ttfts),
            itl=summarize(itls),
            slo_attainment=attained,
            replicas=self.replica_signals(now),
            prefill_leg=summarize(leg_s),
            prefill_leg_uncached_tokens=leg_uncached,
        )

    def replica_signals(self, now: float) -> tuple[ReplicaSignals, ...]:
        sim = self.sim
        bs = sim.config.block_size
        out = []
        for m in sim.members.values():
            if m.state != READY:
                continue
            rep = sim.by_id[m.replica_id]
            st = rep.core.stats()
            used = rep.blocks_capacity - st.num_free_blocks
            load = sim.load.load(rep.id, now)
            busy, steps = sim.step_time.get(rep.id, (0.0, 0))
            busy0, steps0 = self._steps.get(rep.id, (0.0, 0))
            self._steps[rep.id] = (busy, steps)
            mean_step = (busy - busy0) / (steps - steps0) if steps > steps0 else None
            out.append(
                ReplicaSignals(
                    replica_id=rep.id,
                    pool=Pool(m.pool),
                    num_running=st.num_running,
                    num_waiting=st.num_waiting,
                    queued_prefill_tokens=load.prefill_tokens_queued,
                    kv_usage=used / rep.blocks_capacity,
                    kv_capacity_tokens=rep.blocks_capacity * bs,
                    decode_kv_tokens=load.decode_blocks * bs if m.pool == "decode" else 0,
                    mean_step_s=mean_step,
                )
            )
        return tuple(out)
