"""`LatencyFits`: how `RequestLifecycle` (router/lifecycle.py) feeds its `LatencyPredictor`.

Split from `router/lifecycle.py` (proxy-7, code health: one module per job, below ~500 lines);
the behaviour is the lifecycle's as before (its module docstring, "Learnt latency fits"):
admission records the model's prefill estimate on the replica that prefills; the first token
on the decode replica ends a local prefill's observation and starts the decode one; each new
estimate becomes the replica's `ReplicaStatic.latency` in the pools' statics.
"""

from __future__ import annotations

import dataclasses

from router.latency_predictor import LatencyPredictor, prior_prefill_s
from router.lifecycle_plan import KvLookup
from router.lifecycle_pools import ReplicaPools
from router.replica_state import ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad


class LatencyFits:
    """The predictor's inputs from the lifecycle's events (module docstring)."""

    __slots__ = ("pools", "predictor", "token_load")

    def __init__(self, predictor: LatencyPredictor, pools: ReplicaPools, token_load: TokenLoad):
        self.predictor = predictor
        self.pools = pools
        self.token_load = token_load

    def with_fit(self, replica_id: str, static: ReplicaStatic) -> ReplicaStatic:
        """The caller's statics with the replica's learnt fit."""
        fit = self.predictor.estimate(replica_id)
        return static if fit is static.latency else dataclasses.replace(static, latency=fit)

    def changed(self, replica_id: str | None) -> None:
        """A new estimate for `replica_id` (None: none): into the pools' statics."""
        if replica_id is not None:
            self.pools.set_static(
                replica_id, self.with_fit(replica_id, self.pools.static(replica_id))
            )

    def constants(self, replica_id: str) -> tuple[float, float]:
        """(prefill tokens/s, s per KV token) of a replica: its statics, else the fit's
        defaults (the `latency_predictor` scorer reads them the same way)."""
        p = self.predictor.params
        static = self.pools.static(replica_id)
        return (
            static.prefill_tokens_per_s or p.default_prefill_tokens_per_s,
            static.decode_s_per_kv_token or p.decode_s_per_kv_token,
        )

    def predict_prefill(
        self, request: RoutingRequest, lookup: KvLookup, replica: str, now: float
    ) -> None:
        """Record the model's prefill seconds on `replica` before the request counts there."""
        load = self.token_load.load(replica, now)
        tps, c = self.constants(replica)
        kv = load.decode_blocks * request.block_size
        work = load.prefill_tokens_queued + request.uncached_tokens(lookup.overlap.get(replica, 0))
        seqs = load.requests_in_flight if kv > 0 else 0
        budget = self.predictor.params.max_num_batched_tokens
        prior = prior_prefill_s(work, seqs, kv, tps, c, budget)
        self.predictor.admitted(request.request_id, replica, now, prior)

    def first_token(
        self, request_id: str, request: RoutingRequest, decode: str, with_kv: bool, now: float
    ) -> None:
        """The first output token on the decode replica: a local prefill ended here (an
        observation), and the decode observation starts."""
        if not with_kv:
            self.changed(self.predictor.prefill_done(request_id, now))
        load = self.token_load.load(decode, now)
        tps, c = self.constants(decode)
        kv = load.decode_blocks * request.block_size
        seqs = load.requests_in_flight if kv > 0 else 0
        self.predictor.decode_started(request_id, decode, now, seqs / tps + c * kv)
