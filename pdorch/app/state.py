"""`Coordinator`: the router state of one coordinator process, wired to the fleet.

It owns, per process:
- the fleet view (`pools.fleet.Fleet`), its health checker and metrics scraper;
- the routing state: one `RequestLifecycle` (`router/lifecycle.py`, the object the fleet
  simulator drives too) over `PdRouter`, `TokenLoad`, the precise `KvIndex` fed by a
  `KvEventSubscriber`, and an `ApproxKvIndex` for replicas that publish no KV events (recorded
  when we route there); the coordinator hands it pool membership and health as fleet events
  arrive;
- one `aiohttp.ClientSession` for the request legs (`upstream.py`: the hot path) and the
  health probes, and one shared `httpx.AsyncClient` for scrapes, `/tokenize` and admin (and
  the probes too when the caller passes its own `client`);
- the prompt tokenizer and the coordinator's Prometheus metrics.

Fleet events drive the router state (`fleet_follow.py`: KV-event following, lifecycle
membership and health, token-load reconciliation).

Several coordinators (issue 6 item 6) plug in through `export_token_load_deltas()` and
`apply_token_load_deltas()`: a transport (e.g. ZMQ pub/sub) drains the first periodically and
feeds the second with what the peers sent; `TokenLoad` makes the exchange idempotent. Each
coordinator started on the same fleet file follows every engine's KV events itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import aiohttp
import httpx

from pdorch.app.adapters import AdapterLearningSink, AdapterPoller, ReplicaAdapters
from pdorch.app.admission import Admission, AdmissionQueue, CoordinatorLimits, Shed
from pdorch.app.binding import Binder
from pdorch.app.deadlines import Deadlines
from pdorch.app.errors import ApiError
from pdorch.app.fleet_follow import follow_fleet_event
from pdorch.app.leg_client import NativeLegClient
from pdorch.app.metrics import CoordinatorMetrics
from pdorch.app.pools_view import pools_view
from pdorch.app.prompt_tokens import PromptTokens
from pdorch.app.recent_routes import RecentRoutes
from pdorch.app.upstream import leg_timeout, new_upstream_session
from pdorch.config.fleet import FleetConfig
from pdorch.sync import PeerSync
from pools.drain import RequestTracker
from pools.fleet import (
    FailureKind,
    Fleet,
    ReplicaAdded,
)
from pools.health import HealthChecker
from pools.http_client import client_limits, http_client
from pools.metrics_scrape import MetricsScraper
from pools.replica import Replica
from router.approx_index import ApproxKvIndex
from router.hash_match_monitor import HashMatchMonitor
from router.kv_event_subscriber import KvEventSubscriber
from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import LifecycleEvent, RequestPlan
from router.pd_router import PdRouter
from router.replica_state import RoutingRequest
from router.token_load import TokenLoad, TokenLoadDelta
from router.tokenization import TokenizerMode
from router.vocabulary import PoolName

log = logging.getLogger(__name__)

POOLS = tuple(PoolName)


class Coordinator:
    """Router state + fleet wiring of one coordinator (see the module docstring)."""

    def __init__(
        self,
        config: FleetConfig,
        fleet: Fleet,
        *,
        client: httpx.AsyncClient | None = None,
        origin: str | None = None,
        limits: CoordinatorLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        run_health_checks: bool = True,
        scrape_metrics: bool = True,
        recorder: list[LifecycleEvent] | None = None,
    ) -> None:
        self.config = config
        self.settings = config.coordinator
        self.fleet = fleet
        self.clock = clock
        self.origin = origin or f"coordinator-{uuid.uuid4().hex[:8]}"
        # request ids (`new_request_id`): 64 random bits per coordinator + a counter, unique
        # across coordinators, workers and restarts as a uuid4 per request was, without its
        # getrandom() syscall and UUID object per request (proxy.md, proxy-lean-5)
        self._request_id_prefix = f"pdorch-{uuid.uuid4().hex[:16]}"
        self._request_ids = itertools.count()
        self.served_model = config.served_model_name
        self.block_size = config.block_size
        self.limits = limits or CoordinatorLimits.from_settings(config.coordinator)
        self.admission = Admission(
            AdmissionQueue(self.limits.max_concurrent_requests, self.limits.max_queue),
            self.limits.max_wait_s,
        )
        self.api_keys = tuple(self.settings.api_keys)
        self.admin_token = self.settings.admin_token
        self.router = PdRouter(config.router_policy_config(), seed=seed)
        self.token_load = TokenLoad(origin=self.origin)
        self.index = KvIndex(self.served_model, self.block_size)
        self.approx = ApproxKvIndex()
        # LoRA adapters per replica (adapters.py): from KV events' lora_name and /v1/models
        self.adapters = ReplicaAdapters()
        self.subscriber = KvEventSubscriber(AdapterLearningSink(self.index, self.adapters))
        # `recorder`: every request event with its inputs (the lifecycle agreement test)
        self.lifecycle = RequestLifecycle(
            self.router, self.token_load, self.index, self.approx, recorder=recorder
        )
        # late binding (binding.py): off by default, then `bind` is `lifecycle.admit`
        self.binder = Binder(
            self.lifecycle, self.router.config.late_binding, clock, self.limits.max_wait_s
        )
        # checks that our block keys match what engines report storing (tokenizer drift)
        self.hash_monitor = HashMatchMonitor()
        self.hash_checked_at = float("-inf")
        self._own_client = client is None
        self.client = client or http_client(
            limits=client_limits(max_connections=None, max_keepalive_connections=1024),
            timeout=httpx.Timeout(
                self.settings.request_timeout_s, connect=self.settings.connect_timeout_s
            ),
        )
        self._upstream: aiohttp.ClientSession | None = None
        self._probes: aiohttp.ClientSession | None = None  # probes and scrapes: no cap
        self._native: NativeLegClient | None = None  # the legs' client when leg_client: native
        # no read timer on streamed legs: after the first byte the relay's stall watchdog
        # (`stall_timeout_s`, proxy_stream.py) ends a silent stream; aiohttp would re-arm a
        # timer per packet (upstream.py)
        self.stream_timeout = leg_timeout(self.settings.connect_timeout_s)
        # the hot path's deadlines: one loop timer per duration (deadlines.py, proxy-7)
        self.deadlines = Deadlines()
        tokenizer = config.tokenizer
        fixed = None
        if tokenizer.mode is not TokenizerMode.ENGINE or tokenizer.engine_url is not None:
            fixed = config.tokenization_config(None)
        self.tokens = PromptTokens(
            fixed,
            self.client,
            self._tokenize_urls,
            engine_cache_size=tokenizer.cache_size,
            engine_timeout_s=tokenizer.timeout_s,
            model=tokenizer.model,
        )
        self.adapter_poller = AdapterPoller(
            self.adapters,
            lambda: [(r.replica_id, r.url) for r in self.fleet.replicas()],
            self.client,
            clock=clock,
        )
        self.adapter_polls: set[asyncio.Task[bool]] = set()
        self.health = (
            HealthChecker.from_config(fleet, self.client, config.health)
            if run_health_checks
            else None
        )
        self.scraper = (
            MetricsScraper.from_config(fleet, self.client, config.metrics)
            if scrape_metrics
            else None
        )
        # client requests per replica, for drains (pools/drain.py); the flow keeps it
        self.requests = RequestTracker()
        # non-streamed decode legs waiting on each replica: one found unhealthy hangs them up,
        # so they start over elsewhere (`leg_wait.until_first_byte`), not wait on a hung engine
        self.waiting_legs = RequestTracker()
        # the scaling control (pdorch/app/scaling.py) when the fleet can be scaled
        self.scaling: Any = None
        # pools.kubernetes.discovery.KubernetesDiscovery when the fleet file has `discovery:`
        self.discovery: Any = None
        # why run-time fleet changes (scale, add/remove, drain) are refused: set on each worker
        # of `pdorch serve --workers N`, where a change on one worker would miss the others
        self.fixed_fleet: str | None = None
        self.metrics = CoordinatorMetrics(self)
        self.recent_routes = RecentRoutes()  # the status page's last decisions (dashboard.py)
        self._unsubscribe: Callable[[], None] | None = None
        self._started = False
        self.delta_listeners: list[Callable[[list[TokenLoadDelta]], None]] = []
        # several coordinators: token-load deltas over ZMQ pub/sub (pdorch/SYNC.md)
        self.sync: PeerSync | None = None
        if config.sync is not None:
            self.sync = PeerSync.for_token_load(
                self.token_load,
                config.sync,
                source=self.export_token_load_deltas,
                clock=self.clock,
            )

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Follow the fleet (every replica already in it, then its changes) and start loops."""
        if self._started:
            return
        self._started = True
        self._unsubscribe = self.fleet.subscribe(partial(follow_fleet_event, self))
        now = self.clock()
        for replica in self.fleet.replicas():
            follow_fleet_event(self, ReplicaAdded(replica, now))
        await self.subscriber.start()
        await self.adapter_poller.start()
        if self.sync is not None:
            await self.sync.start()
        if self.health is not None:
            if self._own_client:  # probes on aiohttp (upstream.py): far less CPU per probe
                self.health.client = self.probe_session
            await self.health.start()
        if self.scraper is not None:
            if self._own_client:  # scrapes on aiohttp too (pools/metrics_scrape.py)
                self.scraper.client = self.probe_session
            await self.scraper.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.sync is not None:  # first: peers get our last deltas and our `bye`
            with contextlib.suppress(Exception):
                await self.sync.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in list(self.adapter_polls):
            task.cancel()
        for loop in (self.scraper, self.health, self.adapter_poller):
            if loop is not None:
                with contextlib.suppress(Exception):
                    await loop.stop()
        with contextlib.suppress(Exception):
            await self.subscriber.stop()
        await self.tokens.aclose()
        for session in (self._upstream, self._probes, self._native):
            if session is not None:
                with contextlib.suppress(Exception):
                    await session.close()
        self._upstream = self._probes = self._native = None
        if self._own_client:
            await self.client.aclose()

    async def __aenter__(self) -> Coordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        """Between `start()` and `stop()`."""
        return self._started

    def now(self) -> float:
        return self.clock()

    def new_request_id(self) -> str:
        """A fresh request id, `pdorch-` + 32 hex digits (both legs' `X-Request-Id`)."""
        return f"{self._request_id_prefix}{next(self._request_ids):016x}"

    @property
    def upstream(self) -> aiohttp.ClientSession:
        """The legs' session (`upstream.py`), made on first use on the running loop."""
        session = self._upstream
        if session is None or session.closed:
            session = self._upstream = new_upstream_session(
                self.settings.connect_timeout_s, self.settings.upstream_connections_per_replica
            )
        return session

    @property
    def legs(self) -> aiohttp.ClientSession | NativeLegClient:
        """The prefill and decode legs' client (`coordinator.leg_client`, `legs.py`): the
        aiohttp session (`upstream`) or the native one, made on first use on the running loop."""
        if self.settings.leg_client == "aiohttp":
            return self.upstream
        native = self._native
        if native is None or native.closed:
            native = self._native = NativeLegClient(
                self.settings.connect_timeout_s, self.settings.upstream_connections_per_replica
            )
        return native

    @property
    def probe_session(self) -> aiohttp.ClientSession:
        """Health probes' and scrapes' session: no connection cap, so a probe never waits
        behind the legs of a busy engine (`upstream.py`)."""
        session = self._probes
        if session is None or session.closed:
            session = self._probes = new_upstream_session(self.settings.connect_timeout_s, 0)
        return session

    def _tokenize_urls(self) -> list[str]:
        return [r.url for pool in ("decode", "colocated", "prefill") for r in self.routable(pool)]

    # ---- reading -----------------------------------------------------------------------------

    def replica(self, replica_id: str) -> Replica | None:
        return self.fleet.get(replica_id)

    def kv_events_live(self, replica_id: str) -> bool:
        """True when the replica publishes no KV events or we follow them (a new replica
        joins routing only then, so no stored block goes unseen)."""
        replica = self.fleet.get(replica_id)
        if replica is None:
            return False
        if replica.endpoint.kv_events_endpoint is None:
            return True
        followed = {s.replica_id for s in self.subscriber.engines()}
        return self._started and replica_id in followed

    def routable(self, pool: str) -> list[Replica]:
        return self.fleet.routable(pool)

    def adapter_scope(self, model: str) -> tuple[str | None, frozenset[str] | None]:
        """(LoRA name, eligible replicas) of a request for `model`: (None, None) for the base
        model (any replica); for an adapter, its name and the replicas that have it loaded."""
        if model == self.served_model:
            return None, None
        return model, self.adapters.holders(model)

    def adapter_names(self) -> list[str]:
        """The LoRA adapters clients may send as `model` (some replica has each loaded)."""
        return [a.name for a in self.adapters.known(self.served_model)]

    def can_serve(self) -> bool:
        """True when some replica can serve a whole request (a decode or colocated one)."""
        return bool(self.fleet.routable("decode") or self.fleet.routable("colocated"))

    def expect_blocks(self, replica_id: str, keys: Sequence[int], now: float) -> None:
        """`replica_id` will hold `keys`: expect its KV events to say so (the hash-match
        monitor warns when they do not). The lifecycle records routes to replicas without KV
        events in the approximate index itself."""
        if (
            keys
            and not self.lifecycle.is_approximate(replica_id)
            and self.tokens.mode != TokenizerMode.CHARS.value
        ):
            self.hash_monitor.on_routed(replica_id, keys, now)

    # ---- request-path health feedback --------------------------------------------------------

    def report_failure(self, replica_id: str, kind: FailureKind, detail: str = "") -> None:
        if self.fleet.report_failure(replica_id, self.clock(), kind, detail):
            log.warning("replica %s ejected after a %s failure: %s", replica_id, kind, detail)

    def report_success(self, replica_id: str) -> None:
        self.fleet.report_success(replica_id, self.clock())

    # ---- admission ---------------------------------------------------------------------------

    async def admit(self, priority: int = 0) -> None:
        """Wait for a slot (admission.py); 429 when shed."""
        try:
            await self.admission.acquire(priority, self.clock())
        except Shed as shed:
            raise self._shed_error(shed) from None

    async def bind(self, request: RoutingRequest, priority: int = 0) -> RequestPlan:
        """Admit the request to the lifecycle, at once or by late binding (binding.py);
        `NoReplicaError`, or 429 when held past `admission.max_wait_s`."""
        try:
            return await self.binder.bind(request, priority)
        except Shed as shed:
            raise self._shed_error(shed) from None

    def _shed_error(self, shed: Shed) -> ApiError:
        self.metrics.rejected(shed.reason)
        limits = self.limits
        return ApiError(
            429,
            f"Too many concurrent requests (limit {limits.max_concurrent_requests}, "
            f"queue {limits.max_queue}, wait {limits.max_wait_s:g} s): {shed.reason}; "
            "retry later.",
            code="concurrency_limit",
            headers={"Retry-After": str(limits.retry_after_s)},
        )

    def release(self) -> None:
        self.admission.release()

    @property
    def in_flight(self) -> int:
        """Client requests admitted and not finished."""
        return self.admission.in_flight

    # ---- several coordinators (issue 6 item 6 plugs in here) ---------------------------------

    def export_token_load_deltas(self) -> list[TokenLoadDelta]:
        """Drain this coordinator's token-load changes (absolute state per entry) and hand
        them to every `delta_listeners` callback; returns them too."""
        deltas = self.token_load.export_deltas()
        if deltas:
            for listener in list(self.delta_listeners):
                try:
                    listener(deltas)
                except Exception:
                    log.exception("token-load delta listener failed")
        return deltas

    def token_load_changed(self) -> None:
        """A request's load changed: let the peers know soon (coalesced by `PeerSync`)."""
        if self.sync is not None:
            self.sync.flush_soon()
        self.binder.dispatch()  # late binding: a freed replica may take a held request

    def apply_token_load_deltas(self, deltas: Iterable[TokenLoadDelta]) -> int:
        """Apply deltas a peer coordinator published; returns how many changed our view."""
        now = self.clock()
        return sum(1 for d in deltas if self.token_load.apply_delta(d, now))

    # ---- views -------------------------------------------------------------------------------

    def pools_view(self) -> dict[str, Any]:
        """`GET /admin/pools`: every pool's replicas with health, load, KV usage and hit rate
        (`pools_view.py`)."""
        return pools_view(self)


async def wait_routable(coordinator: Coordinator, timeout_s: float) -> bool:
    """Poll until some replica can serve (used by `pdorch serve` after start-up)."""
    deadline = coordinator.clock() + timeout_s
    while not coordinator.can_serve():
        if coordinator.clock() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True
