"""The discrete-event fleet simulator over virtual time (no sleeps, no threads).

One `EngineCore` (`pools/sim`) per replica with a `TimingModel(model, gpu, tp)`; the real
router: `KvIndex` fed by every core's KV events (drained after each step) and the coordinator's
own `RequestLifecycle` (`router/lifecycle.py`: lookups, snapshots, `PdRouter`, `TokenLoad`),
told what happens through `lifecycle_adapter.SimLifecycle`; KV transfers timed by the link
model; arrivals from a `Workload`.

This module is the event loop and the request flow through the cores (legs, outputs,
transfers, ticks). Its parts: `records.py` (`SimConfig`, `RequestRecord`, `SimResult`),
`sessions.py` (turn arrivals, open and closed loop), `replica.py` (a replica's core and its P/D
plumbing), `fast_forward.py` (decode fast-forward: a replica's horizon, applying its steps),
`collect.py` (the run's `SimResult`), `kv_event_bridge.py` (core KV events -> the index),
`reference_caches.py` (the oracle and pooled-LRU hit accounting); `membership.py` adds
replicas that come and go.

Events (heaps ordered by `(time, sequence number)`, so runs are deterministic; the arrivals
have their own, `sessions.SessionArrivals`, the metrics tick its own clock):

- arrival of a session's turn (open loop at `start_s`; closed loop when a concurrency slot
  frees; later turns `think_time_s` after the previous turn finished): the request is hashed
  into block ids, matched in the index, routed, and added to the chosen core(s);
- a replica's step boundary: the outputs of its previous step are applied (tokens, first
  token, finish, prefill-leg completion -> decode leg submitted to its decode replica, KV
  events -> index), then its next step starts;
- a KV transfer done: the decode core's `finish_remote_load`, the prefill core's
  `release_held`; transfers into one decode replica are serialized on its link;
- a metrics tick every `tick_s` (0.5 s): each replica's `/metrics` view (`observe_metrics`:
  running, waiting, KV usage) and the decode-KV balance sample.

Disaggregated request (vLLM NixlConnector flow): prefill leg on `p` (`max_tokens=1`,
`do_remote_decode`), then decode leg on `d` with the returned `kv_transfer_params`; `d` loads
the blocks it does not hold (`kv_transfer_time(tokens)` on the link), recomputes the last prompt
token and streams every output token, so TTFT is measured at `d`'s first token.

Stepping: each replica's core is driven by the one engine driver loop (`pools/sim/driver.py`,
the same the sim server and the fidelity replay use); a step event is one `EngineDriver.tick`.

Decode fast-forward (`EngineCore.fast_forward_decode`): a pure-decode replica advances many
steps in one call up to its horizon; the rule and why results equal stepping one by one are in
`fast_forward.py`.

Late binding (`SimConfig`'s router `late_binding.enabled`, policy suffix `+late`): arrivals are
held in a `BindingQueue` (router/binding_queue.py) and admitted by its `dispatch` after each
step boundary and tick (the token load's queued prefill drops when a prefill ends, the signal
the coordinator has); the horizon then also stops at every other replica's next step.

Token-free: requests carry block ids (`block_ids.py`), not token ids; the cores' prefix caches
and the `KvIndex` (`engine_hash_keys=True`) work on those ids.
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Callable
from typing import Any

from benchmarks.fleet_sim.collect import collect_result
from benchmarks.fleet_sim.fast_forward import apply_fast_forward, decode_horizon
from benchmarks.fleet_sim.kv_event_bridge import to_router_events
from benchmarks.fleet_sim.lifecycle_adapter import SimLifecycle, build_sim_lifecycle
from benchmarks.fleet_sim.policies import router_config_for
from benchmarks.fleet_sim.records import RequestRecord, SimConfig, SimResult
from benchmarks.fleet_sim.reference_caches import ReferenceCaches
from benchmarks.fleet_sim.replica import SimReplica, make_engine_core, max_model_len_for
from benchmarks.fleet_sim.sessions import SessionArrivals
from benchmarks.workloads.model import Workload
from pools.sim.engine_core import StepResult
from pools.sim.kv_events import KVCacheEvent
from pools.sim.outputs import DecodeFastForward
from pools.sim.request import SimRequest
from pools.sim.timing import TimingModel, make_timing
from router.binding_queue import BindingQueue
from router.kv_index import KvIndex
from router.lifecycle_plan import RequestPlan
from router.replica_state import ReplicaStatic, RoutingRequest
from transfer.params import KvTransferParams

# The run's data (records.py) is imported from here by the CLI, autoscale_sim and tests.
__all__ = [
    "FleetSimulator",
    "RequestRecord",
    "SimConfig",
    "SimReplica",
    "SimResult",
    "run_simulation",
]

_STEP, _TRANSFER = 1, 2  # kinds of the event heap (arrivals and ticks have their own clocks)
_INF = float("inf")
_PREFILL_LEG_PARAMS = KvTransferParams.prefill_request()  # what the coordinator's prefill leg sends
_TEXT_BASE = 0x4E00  # CJK block: one printable char per block id for text-based policies


class FleetSimulator:
    """One run of one policy over one workload (see the module docstring)."""

    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.workload = workload
        self.config = config
        self.progress = progress
        kw: dict[str, Any] = {
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_num_seqs": config.max_num_seqs,
        }
        if config.link is not None:
            from pools.sim.profiles import get_link

            kw["link"] = get_link(config.link)
        self.timing: TimingModel = make_timing(
            config.model, config.gpu, tp=config.tp, kv_memory_gb=config.kv_memory_gb, **kw
        )
        bs = config.block_size
        self.max_model_len = max_model_len_for(workload, self.timing, bs)
        self.replicas: list[SimReplica] = []
        for i, (rid, role) in enumerate(config.fleet.replica_ids()):
            self.replicas.append(self._make_replica(rid, role, i))
        self.by_id = {r.id: r for r in self.replicas}
        self.prefill_ids = [r.id for r in self.replicas if r.role == "prefill"]
        self.decode_ids = [r.id for r in self.replicas if r.role == "decode"]
        self.colocated_ids = [r.id for r in self.replicas if r.role == "colocated"]
        router_cfg = (
            config.router if config.router is not None else router_config_for(config.policy)
        )
        self.index = KvIndex(config.model, bs, engine_hash_keys=True)
        self.tps = 8192 / self.timing.prefill_time(8192)
        self.static = {r.id: self.replica_static() for r in self.replicas}
        self.routing = SimLifecycle(
            build_sim_lifecycle(
                router_cfg,
                config.fleet.replica_ids(),
                self.static,
                self.index,
                seed=config.seed,
            )
        )
        self.load = self.routing.token_load  # the metrics ticks reconcile it
        # Late binding (router/late_binding.py): arrivals wait here while every prefilling
        # replica is busy; a prefill's end (the token load drops) dispatches them.
        late = router_cfg.late_binding
        self.binding: BindingQueue | None = (
            BindingQueue(self.routing.lifecycle, late) if late.enabled else None
        )
        self._held_hashes: dict[str, list[bytes]] = {}
        router = self.routing.lifecycle.router
        self.needs_text = any(
            p.needs_prompt_text for p in (router.prefill_policy, router.decode_policy)
        )
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.next_tick = 0.0
        self.next_arrival = _INF
        self.arrivals = SessionArrivals(workload, bs)
        self.records: dict[str, RequestRecord] = {}
        self.all_records: list[RequestRecord] = []
        self.itl = array("d")
        # the pooled-LRU reference is as big as the prefilling pools' KV together
        pools = [r for r in self.replicas if r.role != "decode"] or self.replicas
        self.references = ReferenceCaches(bs, sum(r.blocks_capacity for r in pools))
        self.tick_times: list[float] = []
        self.decode_kv: list[list[int]] = []
        self.decode_capable = [r for r in self.replicas if r.role != "prefill"]
        self.ff_steps = 0
        self.outstanding = 0
        self._pending_decode: dict[str, list[bytes]] = {}
        self.all_transfers: list[float] = []  # heap of every pending transfer-done time

    def replica_static(self, healthy: bool = True) -> ReplicaStatic:
        """A replica's statics from its timing profile: profiled prefill tokens/s (full chunks)
        and the seconds to read one KV token in a decode step (what `token_load`'s
        `per_replica_decode_cost` and `latency_predictor` read)."""
        return ReplicaStatic(
            healthy=healthy,
            prefill_tokens_per_s=self.tps,
            decode_s_per_kv_token=self.timing.decode_s_per_kv_token,
        )

    def _make_replica(self, rid: str, role: str, index: int) -> SimReplica:
        """One replica with its own engine core (every replica is configured alike)."""
        core = make_engine_core(self.config, self.timing, self.max_model_len, rid)
        return SimReplica(rid, role, index, core)

    # ------------------------------------------------------------------ event plumbing
    def _push(self, t: float, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def _wake(self, rep: SimReplica, now: float) -> None:
        """Make sure the replica has a step event if it has work."""
        t = rep.driver.wake_time(now)
        if t is not None and (rep.next_event is None or t < rep.next_event):
            # an earlier wake-up (e.g. new work while idling until a lease expiry) supersedes
            # the scheduled one, which becomes stale and is skipped
            rep.next_event = t
            self._push(t, _STEP, rep.index)

    # ------------------------------------------------------------------ the run
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        arrivals = self.arrivals
        arrivals.start()
        self.outstanding = self.workload.num_requests
        last_progress = 0.0
        while True:
            t_arr = arrivals.next_time()
            t_heap = self.heap[0][0] if self.heap else _INF
            if self.outstanding <= 0 and t_heap == _INF and t_arr == _INF:
                break
            t_tick = self.next_tick if self.outstanding > 0 else _INF
            t = min(t_arr, t_heap, t_tick)
            if t == _INF:
                break
            if t_tick <= t_arr and t_tick <= t_heap:
                self._tick(t_tick)
                self.next_tick = t_tick + self.config.tick_s
                if self.progress is not None and t_tick - last_progress >= 5.0:
                    last_progress = t_tick
                    self.progress(t_tick)
            elif t_arr <= t_heap:
                session, turn = arrivals.pop()
                self._arrive(t_arr, session, turn)
            else:
                _, _, kind, data = heapq.heappop(self.heap)
                if kind == _STEP:
                    rep = self.replicas[data]
                    if rep.next_event == t_heap:
                        self._on_step(rep, t_heap)
                elif kind == _TRANSFER:
                    self._on_transfer(data, t_heap)
        result = self._result(time.perf_counter() - wall0)
        result.cpu_s = time.process_time() - cpu0
        if self.binding is not None:  # how much late binding held (results.json)
            result.meta["late_binding_delayed"] = self.binding.delayed
            result.meta["late_binding_max_held"] = self.binding.max_held
        return result

    # ------------------------------------------------------------------ arrivals + routing
    def _arrive(self, now: float, si: int, turn: int) -> None:
        s = self.workload.sessions[si]
        spec = s.turns[turn]
        bs = self.config.block_size
        blocks = self.arrivals.turn_blocks(si, turn, now)
        prompt_tokens = blocks.prompt_tokens
        keys = blocks.prompt_keys
        seq_hashes = blocks.seq_hashes
        rid = f"{s.session_id}#{turn}"
        rec = RequestRecord(rid, si, turn, now, prompt_tokens, spec.output_tokens)
        self.records[rid] = rec
        self.all_records.append(rec)
        rec.oracle_hit_tokens, rec.lru_hit_tokens = self.references.observe(
            keys, blocks.all_ids, prompt_tokens
        )

        text = None
        if self.needs_text:
            text = "".join(chr(_TEXT_BASE + (k % 20000)) for k in keys) or "\x00"
        req = RoutingRequest(
            request_id=rid,
            prompt_tokens=prompt_tokens,
            block_size=bs,
            block_keys=keys,
            session_key=s.session_id,
            prompt_text=text,
            max_tokens=spec.output_tokens,
        )
        if self.binding is not None:
            self.binding.hold(req, now)
            self._held_hashes[rid] = seq_hashes
            self._dispatch(now)
            return
        self._start(rec, self.routing.arrive(req, now), seq_hashes, now)

    def _dispatch(self, now: float) -> None:
        """Late binding: admit the held requests that may go now, and start their legs."""
        binding = self.binding
        assert binding is not None
        for rid, plan in binding.dispatch(now):
            if plan is None:
                raise RuntimeError(f"request {rid}: no replica can serve it")
            self._start(self.records[rid], plan, self._held_hashes.pop(rid), now)

    def _start(
        self, rec: RequestRecord, plan: RequestPlan, seq_hashes: list[bytes], now: float
    ) -> None:
        """The request is admitted: send its leg(s) to the planned core(s)."""
        rid = rec.request_id
        prompt_tokens = rec.prompt_tokens
        d = self.by_id[plan.decode.replica]
        rec.decode_replica = d.id
        if plan.prefill is not None:
            p = self.by_id[plan.prefill.replica]
            rec.prefill_replica = p.id
            rec.disaggregated = True
            d.inbound[p.index] = d.inbound.get(p.index, 0) + 1
            p.core.add_request(
                SimRequest(
                    rid,
                    [],
                    max_tokens=1,
                    num_prompt_tokens=prompt_tokens,
                    block_hashes=seq_hashes,
                    kv_transfer_params=_PREFILL_LEG_PARAMS,
                ),
                now,
            )
            self._pending_decode[rid] = seq_hashes
            self._wake(p, now)
        else:
            d.core.add_request(
                SimRequest(
                    rid,
                    [],
                    max_tokens=rec.output_tokens,
                    num_prompt_tokens=prompt_tokens,
                    block_hashes=seq_hashes,
                ),
                now,
            )
            self._wake(d, now)

    # ------------------------------------------------------------------ replica steps
    def _horizon(self, rep: SimReplica) -> float:
        held = self.binding is not None and bool(self.binding.held)
        return decode_horizon(
            rep,
            self.replicas,
            self.next_tick,
            self.arrivals.next_time(),
            held,
            self.all_transfers,
        )

    def _on_step(self, rep: SimReplica, now: float) -> None:
        rep.next_event = None

        def on_outputs(res: StepResult, events: list[KVCacheEvent]) -> None:
            self._drain(rep, events)  # the step's KV events reach the index with its outputs
            self._apply_outputs(rep, res, now)
            if self.binding is not None and self.binding.held:
                # a prefill that ended in this step frees its replica; admitted before this
                # replica's next step (or fast-forward) is planned, as in step-by-step mode
                self._dispatch(now)

        horizon = None
        if self.config.fast_forward and rep.role != "prefill":

            def horizon() -> float:
                return self._horizon(rep)

        adv = rep.driver.tick(now, on_outputs, horizon)
        ff = adv.fast_forward
        if ff is not None:
            self.ff_steps += ff.num_steps
            self._apply_fast_forward(rep, ff)
            self._drain(rep, adv.events)
        if adv.wake is not None:
            rep.next_event = adv.wake
            self._push(adv.wake, _STEP, rep.index)

    def _drain(self, rep: SimReplica, events: list[KVCacheEvent]) -> None:
        if events:
            self.index.apply(rep.id, to_router_events(events))

    def _apply_outputs(self, rep: SimReplica, res: StepResult, now: float) -> None:
        bs = self.config.block_size
        routing = self.routing
        for out in res.outputs:
            rid = out.request_id
            rec = self.records[rid]
            if rep.role == "prefill":
                # the prefill leg finished: its KV goes to the decode replica
                rec.hit_tokens, rec.prefill_end = out.num_local_cached_tokens, now
                d = self.by_id[routing.prefill_leg_done(rid, now).replica]
                d.inbound[rep.index] -= 1
                if out.finish_reason not in ("stop", "length") or out.kv_transfer_params is None:
                    raise RuntimeError(f"prefill leg {rid} ended with {out.finish_reason}")
                d.core.add_request(
                    SimRequest(
                        rid,
                        [],
                        max_tokens=rec.output_tokens,
                        num_prompt_tokens=rec.prompt_tokens,
                        block_hashes=self._pending_decode.pop(rid),
                        kv_transfer_params=out.kv_transfer_params,
                    ),
                    now,
                )
                self._wake(d, now)
                continue
            n = out.num_output_tokens
            if out.is_first_token:
                rec.first_token = now
                if not rec.disaggregated:
                    rec.hit_tokens = out.num_local_cached_tokens
                else:
                    rec.transfer_tokens = out.num_external_tokens
                    if rec.prefill_replica is not None:
                        self.by_id[rec.prefill_replica].core.release_held(rid, now)
                routing.token_output(rid, now, n)
            else:
                if rec.last_token is not None:
                    gap = now - rec.last_token
                    self.itl.append(gap)
                    if gap > rec.max_itl:
                        rec.max_itl = gap
                if (rec.prompt_tokens + n) % bs == 1:  # a new block (the lifecycle's own test)
                    routing.token_output(rid, now, n)
            rec.last_token = now
            rec.num_output = n
            if out.finished:
                self._finish(rec, rep, now)
        for ld in res.new_remote_loads:
            rec = self.records[ld.request_id]
            start = max(now, rep.link_free)
            done = start + self.timing.kv_transfer_time(ld.num_tokens)
            rep.link_free = done
            heapq.heappush(rep.transfers, done)
            heapq.heappush(self.all_transfers, done)
            self._push(done, _TRANSFER, (rep.index, ld.request_id))

    def _apply_fast_forward(self, rep: SimReplica, ff: DecodeFastForward) -> None:
        apply_fast_forward(ff, self.records, self.routing, self.itl, self.config.block_size)

    def _finish(self, rec: RequestRecord, rep: SimReplica, now: float) -> None:
        rec.finish = now
        rec.finish_count += 1
        self.routing.finished(rec.request_id, now, rec.num_output)
        self._end_turn(rec, now)

    def _end_turn(self, rec: RequestRecord, now: float) -> None:
        """The request is over (finished, or aborted by scaling): its session goes on."""
        self.records.pop(rec.request_id, None)
        self.outstanding -= 1
        self.arrivals.turn_ended(rec.session, rec.turn, now)

    def _on_transfer(self, data: tuple[int, str], now: float) -> None:
        di, rid = data
        d = self.replicas[di]
        heapq.heappop(d.transfers)
        heapq.heappop(self.all_transfers)
        d.core.finish_remote_load(rid, True, now)
        rec = self.records.get(rid)
        if rec is not None and rec.prefill_replica is not None:
            self.by_id[rec.prefill_replica].core.release_held(rid, now)
            self._wake(self.by_id[rec.prefill_replica], now)
        self.routing.transfer_landed(rid, now)
        self._wake(d, now)

    def _tick(self, now: float) -> None:
        load = self.load
        used: dict[str, int] = {}
        for r in self.replicas:
            st = r.core.stats()  # the engine's one set of counters and gauges (pools/sim/stats.py)
            used[r.id] = r.blocks_capacity - st.num_free_blocks
            load.observe_metrics(
                r.id,
                now,
                num_running=st.num_running,
                num_waiting=st.num_waiting,
                kv_usage=used[r.id] / r.blocks_capacity,
                kv_capacity_blocks=r.blocks_capacity,
            )
        self.tick_times.append(now)
        self.decode_kv.append([used[r.id] for r in self.decode_capable])
        if self.binding is not None and self.binding.held:
            self._dispatch(now)  # the scrape may have dropped stale load

    # ------------------------------------------------------------------ result
    def _result(self, wall: float) -> SimResult:
        return collect_result(
            self.config,
            self.workload,
            self.replicas,
            self.arrivals,
            self.all_records,
            self.itl,
            self.tick_times,
            self.decode_kv,
            self.decode_capable,
            self.ff_steps,
            wall,
        )


def run_simulation(
    workload: Workload,
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Simulate `workload` on `config.fleet` with `config.policy`; deterministic per seed."""
    return FleetSimulator(workload, config, progress).run()
