"""Microbenchmark: one request's routing lifecycle on the proxy bench's fleet (1P + 1D).

`admit` → `prefill_done(ok)` → `tokens` → `finished` on a `RequestLifecycle` built as the
coordinator builds it for `benchmarks/proxy/processes.py: write_pdorch_fleet` (every request
disaggregated, the default `token_load` / `token_load_decode` profiles), min over repeats of
the µs per request; `--profile` prints cProfile's top functions by own time after it:

    python -m benchmarks.proxy.lifecycle_micro [REQUESTS] [--profile]

It times the routing part of the proxy's CPU per request without HTTP (proxy.md, proxy-cpu-4).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from pdorch.config.fleet import FleetConfig
from router.approx_index import ApproxKvIndex
from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.pd_router import PdRouter
from router.replica_state import ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName

_FLEET = {
    "served_model_name": "m",
    "block_size": 16,
    "pools": {
        "prefill": {"endpoints": [{"id": "prefill-0", "url": "http://127.0.0.1:1"}]},
        "decode": {"endpoints": [{"id": "decode-0", "url": "http://127.0.0.1:2"}]},
    },
    "pd": {"enabled": True, "min_uncached_tokens": 0},
    "tokenizer": {"mode": "chars"},
}


class LifecycleMicro:
    """The lifecycle of the bench's fleet and one request's events on it."""

    def __init__(self) -> None:
        config = FleetConfig.model_validate(_FLEET)
        index = KvIndex("m", 16)
        self.lifecycle = RequestLifecycle(
            PdRouter(config.router_policy_config()),
            TokenLoad(origin="micro"),
            index,
            ApproxKvIndex(),
        )
        self.lifecycle.add_replica("prefill-0", PoolName.PREFILL, ReplicaStatic())
        self.lifecycle.add_replica("decode-0", PoolName.DECODE, ReplicaStatic())
        self.keys = index.keys_for(list(range(40)))

    def one(self, i: int) -> None:
        rid = f"r{i}"
        now = float(i)
        lc = self.lifecycle
        lc.admit(RoutingRequest(rid, 40, 16, self.keys, None, "hello world", 4, None), now)
        lc.prefill_done(rid, now, ok=True)
        lc.tokens(rid, now, 4)
        lc.finished(rid, now)

    def us_per_request(self, requests: int, repeats: int = 5) -> float:
        for i in range(min(requests, 2000)):  # warm-up
            self.one(i)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(requests):
                self.one(i)
            best = min(best, (time.perf_counter() - start) / requests * 1e6)
        return best


def main(argv: list[str]) -> None:
    requests = int(next((a for a in argv if a.isdigit()), "10000"))
    micro = LifecycleMicro()
    best = micro.us_per_request(requests)
    print(
        f"admit + prefill_done + tokens + finished: {best:.1f} µs/request (min of 5 x {requests})"
    )
    if "--profile" in argv:
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(requests):
            micro.one(i)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main(sys.argv[1:])
