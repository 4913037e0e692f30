"""`RequestLifecycle`: one request's routing and token-load accounting, for every caller.

The coordinator (`pdorch/app/flow.py`, real HTTP legs) and the fleet simulator
(`benchmarks/fleet_sim/`, virtual time) both drive this one object; neither touches
`PdRouter` or `TokenLoad` for a request itself. It owns the KV index lookups (the precise
`KvIndex`, plus an approximate index for replicas that publish no KV events), the pools'
members and their static facts (health, profiled throughput: given to it as data), the
snapshots, `PdRouter` and `TokenLoad`. It takes the request's events, each with `now`, and
answers with typed leg plans (`router/lifecycle_plan.py`). No I/O, no clock.

Events and what they do (R = the request, p = prefill replica, d = decode replica):

    admit(R)                   route; PD: p gets its uncached tokens (prefill-only entry),
                               d gets its decode reservation (below); LOCAL/COLOCATED: d gets
                               its own uncached tokens. → RequestPlan
    prefill_done(R, ok)        p's entry ends. ok → the decode leg with the prefill's KV params;
                               failed → d's reservation becomes d's own uncached tokens
                               (route FALLBACK). → DecodeLeg
    kv_landed(R)               the transfer into d finished: no load change (see below)
    tokens(R, generated_total) cumulative output tokens on d: its prompt is computed, its
                               decode blocks are ceil((prompt + generated) / block_size)
    decode_failed(R, reached)  d's entry ends; `reached` (the engine may have claimed the
                               prefill's blocks) drops the KV params → the next decode prefills
                               locally (a PD route becomes FALLBACK)
    retry_decode(R)            another serving replica (decode pool, else colocated), the tried
                               ones excluded → DecodeLeg or None
    migrate(R, generated)      d failed after `generated` output tokens reached the client: d's
                               entry ends; the request goes on as prompt + those tokens on
                               another serving replica (as retry_decode picks), which prefills
                               it itself (its own uncached tokens: the longer prompt less the
                               original prompt's overlap) → DecodeLeg or None
    finished(R) / aborted(R)   every entry of R ends

**Decode-side accounting of a disaggregated request** (the reason, from vLLM v1): the decode
engine only sees the request when the decode leg arrives, after the prefill leg returned. Its
scheduler then asks the connector how many prompt tokens are remote
(`NixlConnector.get_num_new_matched_tokens`: all but what it caches, asynchronously), allocates
KV blocks for the *whole* prompt at once and parks the request in `WAITING_FOR_REMOTE_KVS`
while NIXL pulls; when the pull lands (`_update_waiting_for_remote_kv`) it sets
`num_computed_tokens` to the prompt length, minus one when that is all of it, so it computes
the last prompt token only and starts decoding. So the decode replica's cost is KV memory and
decode work (`decode_blocks`), never prefill compute (`prefill_tokens`). We count it as
`decode_blocks = ceil(prompt / block_size)`, `prefill_tokens = 0`, **from admission**: before the
prefill returns the engine holds nothing, but the router has committed the request to it and
the blocks arrive one prefill time later, which is short against the decode that follows;
leaving them out would let every request that arrives during one prefill see the same decode
loads and pile onto one replica. KV landing changes nothing (the blocks were counted already),
so the coordinator, which never sees the transfer, and the simulator, which does, agree.

What changed against the two copies this replaces:
- coordinator (`flow.py` before): decode admitted with 0 uncached tokens and no blocks until
  the prefill leg returned; now its blocks count from admission. Token events reach `TokenLoad`
  only when the block count changes (the same state, fewer deltas to peers); the first byte is
  a `tokens` event with the events it carries (was `on_prefill_done`, one block less when the
  prompt fills its last block). Snapshots now carry `cached_blocks` (the simulator's did).
- simulator (`simulator.py` before): decode admitted with `prompt - overlap * block_size`
  *prefill* tokens until the KV transfer landed; now the blocks above, no prefill tokens.
  Inputs moved for every decode policy that reads `prefill_tokens_queued` or
  `decode_blocks` (`token_load_decode`, `dynamo`) on P/D fleets.

The reservation is `TokenLoad.on_reserved` until the decode leg is sent (`on_leg_sent`, at
`prefill_done`): no engine holds those blocks yet, so a `/metrics` scrape must not bound them
(the KV-usage bound applies to the blocks the engine holds only; router/token_load.py).

**Learnt latency fits** (router/latency_predictor.py): when a policy of the router reads one
(`PdRouter.latency_fit`, the `latency_predictor` scorer), the lifecycle feeds a
`LatencyPredictor` from these same events: admission records the model's prefill estimate on
the replica that prefills; the prefill's end (`prefill_done` ok, or the first token of a local
prefill) is a prefill observation; the first token on the decode replica starts a decode
observation that `finished` ends (`generated_total`, else the last token count seen). Failed,
retried, migrated and aborted requests are not observed. Each new estimate becomes the
replica's `ReplicaStatic.latency` (merged into the caller's statics), so the snapshots carry it.

Membership, statics and the index lookups live in `router/lifecycle_pools.py` (members in
natural order: `p2` before `p10`); the latency fits' bookkeeping in `router/lifecycle_fit.py`;
a request's state and the event recorder in `router/lifecycle_live.py`. Optional `recorder`: a
list that receives one `LifecycleEvent` per event, with its inputs and the token load after it
(the agreement test replays it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence

from router.latency_predictor import LatencyPredictor
from router.lifecycle_fit import LatencyFits
from router.lifecycle_live import EventRecorder, LiveRequest, blocks
from router.lifecycle_load import admit_local, reserve_decode
from router.lifecycle_plan import (
    DecodeLeg,
    EventKind,
    KvLookup,
    LifecycleEvent,
    PrefillLeg,
    RequestPlan,
    RoutedRequest,
)
from router.lifecycle_pools import DEFAULT_STATIC, ApproximateIndex, PreciseIndex, ReplicaPools
from router.pd_router import PdRouter
from router.replica_columns import SCALAR_ROWS
from router.replica_state import ReplicaSnapshot, ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName, RouteKind

__all__ = ["ApproximateIndex", "PreciseIndex", "RequestLifecycle"]


class RequestLifecycle:
    """Routing + token load through every request's events (see the module docstring)."""

    def __init__(
        self,
        router: PdRouter,
        token_load: TokenLoad,
        index: PreciseIndex,
        approx: ApproximateIndex | None = None,
        *,
        recorder: list[LifecycleEvent] | None = None,
        scalar_rows: int = SCALAR_ROWS,
    ) -> None:
        """`scalar_rows`: `ReplicaPools`'s bound for plain snapshots (default unchanged)."""
        self.router = router
        self.token_load = token_load
        self.index = index
        self.approx = approx
        self.pools = ReplicaPools(index, approx, scalar_rows)
        self._events = None if recorder is None else EventRecorder(recorder, self.pools, token_load)
        self._live: dict[str, LiveRequest] = {}
        fit = router.latency_fit()
        self.predictor: LatencyPredictor | None = LatencyPredictor(fit) if fit else None
        self.fits = (
            None if self.predictor is None else LatencyFits(self.predictor, self.pools, token_load)
        )

    @property
    def recorder(self) -> list[LifecycleEvent] | None:
        """The list every event is appended to (None: not recorded); settable at any time."""
        return None if self._events is None else self._events.events

    @recorder.setter
    def recorder(self, events: list[LifecycleEvent] | None) -> None:
        self._events = (
            None if events is None else EventRecorder(events, self.pools, self.token_load)
        )

    # ---- fleet membership (data the caller hands in: router/lifecycle_pools.py) --------------

    def add_replica(
        self,
        replica_id: str,
        pool: PoolName,
        static: ReplicaStatic = DEFAULT_STATIC,
        *,
        approximate: bool = False,
    ) -> None:
        """A replica joins `pool`; `approximate`: it publishes no KV events, so its overlap
        comes from what we routed to it (the approximate index)."""
        self.pools.add(replica_id, pool, self._with_fit(replica_id, static), approximate)

    def set_static(self, replica_id: str, static: ReplicaStatic) -> None:
        """New health/throughput facts for a member (ignored for unknown replicas)."""
        self.pools.set_static(replica_id, self._with_fit(replica_id, static))

    def _with_fit(self, replica_id: str, static: ReplicaStatic) -> ReplicaStatic:
        return static if self.fits is None else self.fits.with_fit(replica_id, static)

    def _fit_changed(self, replica_id: str | None) -> None:
        if self.fits is not None:
            self.fits.changed(replica_id)

    def remove_replica(self, replica_id: str, now: float) -> None:
        """The replica left: forget it, its token load and the policies' state about it. (The
        caller that feeds the indexes drops its index entries.)"""
        self.pools.remove(replica_id)
        self.token_load.remove_replica(replica_id, now)
        if self.predictor is not None:
            self.predictor.remove_replica(replica_id)
        router = self.router
        for policy in (router.prefill_policy, router.decode_policy, router.colocated_policy):
            policy.on_replica_removed(replica_id, now)

    def members(self, pool: PoolName) -> list[str]:
        return list(self.pools.members(pool))

    def is_approximate(self, replica_id: str) -> bool:
        return self.pools.is_approximate(replica_id)

    # ---- reading -----------------------------------------------------------------------------

    def lookup(self, keys: Sequence[int], now: float) -> KvLookup:
        """The indexes' answer for `keys` (`ReplicaPools.lookup`)."""
        return self.pools.lookup(keys, now)

    def snapshots(
        self,
        pool: PoolName,
        lookup: KvLookup,
        now: float,
        exclude: Iterable[str] = (),
        eligible: frozenset[str] | None = None,
    ) -> Sequence[ReplicaSnapshot]:
        """Candidates of `pool`, excluded ones and (when `eligible` is given) the ones not in
        it marked unhealthy (`RoutingRequest.eligible`: a LoRA request's replicas)."""
        if eligible is not None:
            exclude = [*exclude, *(r for r in self.pools.members(pool) if r not in eligible)]
        return self.pools.snapshots(pool, lookup, self.token_load, now, exclude)

    def route(
        self,
        request: RoutingRequest,
        now: float,
        *,
        lookup: KvLookup | None = None,
        commit: bool = True,
        only: Collection[str] | None = None,
        decisions: bool = True,
    ) -> RoutedRequest:
        """Run `PdRouter` over the current snapshots; `NoReplicaError` when nobody can serve.
        `commit=False` (explain) leaves the policies and the token load unchanged. `only`: the
        prefill and colocated replicas allowed to prefill it (late binding's choice; the
        others are candidates marked unhealthy). `decisions=False`: the choices only
        (`PdRouter.route`; `admit` reads nothing else)."""
        if lookup is None:
            lookup = self.lookup(request.block_keys, now)
        eligible = request.eligible  # a LoRA request's replicas (multi-model)
        prefill = self.snapshots(
            PoolName.PREFILL, lookup, now, self._others(PoolName.PREFILL, only), eligible
        )
        decode = self.snapshots(PoolName.DECODE, lookup, now, eligible=eligible)
        colocated = self.snapshots(
            PoolName.COLOCATED, lookup, now, self._others(PoolName.COLOCATED, only), eligible
        )
        route = self.router.route(
            request, prefill, decode, now, colocated=colocated, commit=commit, decisions=decisions
        )
        return RoutedRequest(request, route, lookup, prefill, decode, colocated)

    def in_flight(self, request_id: str) -> bool:
        return request_id in self._live

    def prefilling_on(self, request_id: str) -> str | None:
        """The replica computing the request's prompt right now: its PD prefill replica while
        the prefill leg runs, its decode replica while a local prefill has produced no token;
        None otherwise (late binding's in-flight prefixes, router/binding_queue.py)."""
        live = self._live.get(request_id)
        if live is None:
            return None
        if live.prefilling:
            return live.prefill
        if not live.with_kv and live.generated < 0:
            return live.decode
        return None

    # ---- events ------------------------------------------------------------------------------

    def admit(
        self,
        request: RoutingRequest,
        now: float,
        *,
        lookup: KvLookup | None = None,
        only: Collection[str] | None = None,
    ) -> RequestPlan:
        """Route `request` and count it in (module docstring); raises `NoReplicaError`.
        `only`: as in `route` (late binding)."""
        routed = self.route(request, now, lookup=lookup, only=only, decisions=False)
        route = routed.route
        lookup = routed.lookup
        rid = request.request_id
        d = route.decode_replica
        tl = self.token_load
        prefill: PrefillLeg | None = None
        if self.fits is not None:
            prefiller = route.prefill_replica if route.kind is RouteKind.PD else d
            if prefiller is not None:
                self.fits.predict_prefill(request, lookup, prefiller, now)
        if route.kind is RouteKind.PD and route.prefill_replica is not None:
            p = route.prefill_replica
            uncached = request.uncached_tokens(lookup.overlap.get(p, 0))
            tl.on_admitted(
                rid,
                p,
                now,
                prompt_tokens=request.prompt_tokens,
                uncached_tokens=uncached,
                block_size=request.block_size,
                decodes=False,
            )
            reserve_decode(self.token_load, request, d, now)
            self._record_routed(p, request, now)
            prefill = PrefillLeg(p, uncached)
            live = LiveRequest(request, lookup, RouteKind.PD, PoolName.DECODE, p, d, True, True)
            leg = DecodeLeg(d, True, 0, RouteKind.PD, p)
        else:
            serving = PoolName.COLOCATED if route.kind is RouteKind.COLOCATED else PoolName.DECODE
            uncached = admit_local(self.token_load, request, lookup, d, now)
            live = LiveRequest(request, lookup, route.kind, serving, None, d, False)
            leg = DecodeLeg(d, False, uncached, route.kind, d)
        self._record_routed(d, request, now)
        live.tried.append(d)
        self._live[rid] = live
        plan = RequestPlan(rid, live.kind, prefill, leg)
        if self._events is not None:
            self._events.record(
                EventKind.ADMITTED, rid, now, request=request, lookup=lookup, plan=plan
            )
        return plan

    def prefill_done(self, request_id: str, now: float, *, ok: bool) -> DecodeLeg | None:
        """The prefill leg returned (`ok`: with KV params) or failed; the decode leg to send
        (None for an unknown or non-PD request)."""
        live = self._live.get(request_id)
        if live is None or live.prefill is None or not live.prefilling:
            return None
        tl = self.token_load
        p = live.prefill
        live.prefilling = False
        if self.predictor is not None:
            if ok:
                self._fit_changed(self.predictor.prefill_done(request_id, now))
            else:
                self.predictor.forget(request_id)
        if ok:
            tl.on_prefill_done(request_id, p, now)
            tl.on_leg_sent(request_id, live.decode, now)  # the decode engine allocates them now
            leg = DecodeLeg(live.decode, True, 0, RouteKind.PD, p)
        else:
            tl.on_aborted(request_id, now, p)
            live.with_kv = False
            live.kind = RouteKind.FALLBACK
            tl.on_aborted(request_id, now, live.decode)
            uncached = admit_local(self.token_load, live.request, live.lookup, live.decode, now)
            leg = DecodeLeg(live.decode, False, uncached, RouteKind.FALLBACK, live.decode)
        if self._events is not None:
            self._events.record(EventKind.PREFILL_DONE, request_id, now, ok=ok, leg=leg)
        return leg

    def kv_landed(self, request_id: str, now: float) -> None:
        """The prefill's KV is in the decode replica: nothing to count (it was, from
        admission); recorded so a trace shows it."""
        if self._events is not None and request_id in self._live:
            self._events.record(EventKind.KV_LANDED, request_id, now)

    def tokens(self, request_id: str, now: float, generated_total: int) -> None:
        """`generated_total` output tokens exist on the decode replica (cumulative)."""
        live = self._live.get(request_id)
        if live is None:
            return
        prev = live.generated
        total = max(prev, generated_total)
        if prev >= 0:
            bs = live.request.block_size
            prompt = live.request.prompt_tokens
            if blocks(prompt + total, bs) == blocks(prompt + prev, bs):
                live.generated = total
                return  # same blocks: the token load would not change
        live.generated = total
        if prev < 0 and self.fits is not None:
            self.fits.first_token(request_id, live.request, live.decode, live.with_kv, now)
        self.token_load.on_tokens(request_id, live.decode, now, total)
        if self._events is not None:
            self._events.record(EventKind.TOKENS, request_id, now, generated=total)

    def decode_failed(self, request_id: str, now: float, *, reached: bool) -> None:
        """The decode leg on the current replica failed before its first byte; `reached`:
        the engine got the request and may have claimed the prefill's blocks."""
        live = self._live.get(request_id)
        if live is None:
            return
        self.token_load.on_aborted(request_id, now, live.decode)
        live.generated = -1
        if self.predictor is not None:
            self.predictor.forget(request_id)
        if reached and live.with_kv:
            live.with_kv = False
            if live.kind is RouteKind.PD:
                live.kind = RouteKind.FALLBACK
        if self._events is not None:
            self._events.record(EventKind.DECODE_FAILED, request_id, now, reached=reached)

    def retry_decode(self, request_id: str, now: float) -> DecodeLeg | None:
        """Another replica to serve the request after the tried ones failed (the serving
        pool, then the colocated pool), admitted like the first; None when none is left."""
        live = self._live.get(request_id)
        if live is None:
            return None
        request = live.request
        chosen = self._pick_other(live, now)
        leg: DecodeLeg | None = None
        if chosen is not None:
            self.token_load.on_aborted(request_id, now, live.decode)
            live.decode = chosen
            live.tried.append(chosen)
            live.generated = -1
            if live.with_kv:
                reserve_decode(self.token_load, request, chosen, now)
                if not live.prefilling:  # the prefill is done: this leg is sent at once
                    self.token_load.on_leg_sent(request_id, chosen, now)
                by = live.prefill if live.kind is RouteKind.PD and live.prefill else chosen
                leg = DecodeLeg(chosen, True, 0, live.kind, by)
            else:
                uncached = admit_local(self.token_load, request, live.lookup, chosen, now)
                leg = DecodeLeg(chosen, False, uncached, live.kind, chosen)
        if self._events is not None:
            self._events.record(
                EventKind.DECODE_RETRIED, request_id, now, lookup=live.lookup, leg=leg
            )
        return leg

    def migrate(self, request_id: str, now: float, generated: int) -> DecodeLeg | None:
        """The decode replica failed after `generated` output tokens reached the client: end
        its entry (once: a later `aborted`/`finished` finds it gone) and continue on another
        serving replica (the tried ones excluded, as `retry_decode`) from prompt + those
        tokens, prefilled there (`with_kv` False: the prefill's KV described the prompt
        only). The request's prompt is the longer one from now on, its `max_tokens` less by
        `generated`, and its token events count the continuation's outputs only. None when no
        replica is left (nothing is held then)."""
        live = self._live.get(request_id)
        if live is None:
            return None
        self.token_load.on_aborted(request_id, now, live.decode)
        if self.predictor is not None:
            self.predictor.forget(request_id)
        old = live.request
        live.request = dataclasses.replace(
            old,
            prompt_tokens=old.prompt_tokens + max(0, generated),
            max_tokens=None if old.max_tokens is None else max(1, old.max_tokens - generated),
        )
        live.generated = -1
        live.with_kv = False
        live.prefilling = False
        chosen = self._pick_other(live, now)
        leg: DecodeLeg | None = None
        if chosen is not None:
            live.decode = chosen
            live.tried.append(chosen)
            uncached = admit_local(self.token_load, live.request, live.lookup, chosen, now)
            leg = DecodeLeg(chosen, False, uncached, live.kind, chosen)
        if self._events is not None:
            self._events.record(
                EventKind.MIGRATED,
                request_id,
                now,
                lookup=live.lookup,
                generated=generated,
                leg=leg,
            )
        return leg

    def finished(self, request_id: str, now: float, generated_total: int | None = None) -> None:
        """The request completed: every entry it has ends. `generated_total`: its output
        tokens (else the last count `tokens` saw), for the decode latency fit."""
        live = self._live.pop(request_id, None)
        if self.predictor is not None and live is not None:
            generated = live.generated if generated_total is None else generated_total
            self._fit_changed(self.predictor.finished(request_id, now, generated))
        self.token_load.on_finished(request_id, now)
        if self._events is not None:
            self._events.record(EventKind.FINISHED, request_id, now)

    def aborted(self, request_id: str, now: float) -> None:
        """The request failed or its client left: every entry it has ends."""
        self._live.pop(request_id, None)
        if self.predictor is not None:
            self.predictor.forget(request_id)
        self.token_load.on_aborted(request_id, now)
        if self._events is not None:
            self._events.record(EventKind.ABORTED, request_id, now)

    # ---- internals ---------------------------------------------------------------------------

    def _others(self, pool: PoolName, only: Collection[str] | None) -> Collection[str]:
        if only is None:
            return ()
        return [rid for rid in self.pools.members(pool) if rid not in only]

    def _pick_other(self, live: LiveRequest, now: float) -> str | None:
        """A serving replica not tried yet: the serving pool's policy, then colocated."""
        router = self.router
        if live.serving is PoolName.COLOCATED:
            pool, policy = PoolName.COLOCATED, router.colocated_policy
        else:
            pool, policy = PoolName.DECODE, router.decode_policy
        only = live.request.eligible
        snaps = self.snapshots(pool, live.lookup, now, exclude=live.tried, eligible=only)
        chosen = policy.choose(live.request, snaps, now)
        if chosen is None and pool is PoolName.DECODE and self.pools.members(PoolName.COLOCATED):
            snaps = self.snapshots(
                PoolName.COLOCATED, live.lookup, now, exclude=live.tried, eligible=only
            )
            chosen = router.colocated_policy.choose(live.request, snaps, now)
        return chosen

    def _record_routed(self, replica: str, request: RoutingRequest, now: float) -> None:
        self.pools.record_routed(replica, request.block_keys, now)
