"""The real-time runner: drives the pure engine core from asyncio and feeds the HTTP streams.

One `SimEngine` per simulated engine; many can share one process and one event loop.

Clock. The core runs on *simulated* seconds: `sim_now = (monotonic() - t0) / time_scale`.
The loop is the one engine driver cycle (`pools/sim/driver.py`) on that clock:

1. `adv = driver.tick(sim_now, on_outputs)`: the step that ended is completed (its KV events
   are published as one ZMQ batch and its outputs delivered to their request streams, as vLLM
   publishes a step's events with its outputs), then the next step starts if one is due;
2. a step started: sleep `duration_s * time_scale` real seconds (the GPU is busy; new requests
   wait for the next step, as in vLLM's busy loop), never blocking the event loop;
   a timer (a lease expiry): sleep until then or until woken; idle: sleep until woken (a new
   request, a finished KV pull, a released hold).

Outputs are observed at the step's simulated end (TTFT/ITL/e2e on the simulated timeline, free
of this host's scheduling noise); clients see the real delivery times.

Host lag. Sleeps end on an absolute timeline (`t0 + end * time_scale`), and when the loop
wakes late (a busy host, hundreds of engines on one loop) while the engine was busy, the next
step starts at the previous step's end (`busy_until`) as the GPU would have, absorbing up to
`MAX_CATCH_UP_REAL_S` of lag instead of adding it to every step.

P/D: the core keeps the books (`kv_connector.py`); `kv_transport.py` moves the bytes (holds
for the decode side, pulls from the prefill side). A failed, timed-out or unverifiable pull
→ `finish_remote_load(ok=False)`, which ends the request with `"error"` (HTTP 500) under the
default `fail` policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pools.sim.kv_store import SimKvStore
from pools.sim.kv_transport import KV_TOUCH_MAX_BYTES, SimKvTransport, touch_decode_pages
from pools.sim.lora import LoraAdapter, parse_lora_modules
from pools.sim.metrics import EngineMetrics
from pools.sim.settings import SimEngineSettings
from pools.sim.streams import EngineUnavailable, RequestStream, StreamDelta
from pools.sim.tokenization import SimTokenizer, load_tokenizer
from pools.sim.words import WORDS_TOKENIZER
from transfer.transports import KvTransport

if TYPE_CHECKING:
    from pools.sim.driver import EngineDriver
    from pools.sim.engine_core import EngineCore, StepResult
    from pools.sim.kv_events import KVCacheEvent
    from pools.sim.kv_publisher import ZmqKvEventPublisher
    from transfer.params import KvTransferParams

__all__ = [
    "KV_TOUCH_MAX_BYTES",
    "EngineUnavailable",
    "RequestStream",
    "SimEngine",
    "StreamDelta",
    "touch_decode_pages",
]

log = logging.getLogger(__name__)

KV_LOAD_ERROR = "KV transfer failed for request {rid}: {why}"
MAX_CATCH_UP_REAL_S = 0.05


@dataclass(slots=True)
class _Tracking:
    stream: RequestStream
    arrival: float
    prompt_token_ids: list[int]
    first_token_at: float | None = None
    last_token_at: float | None = None


class SimEngine:
    """One simulated engine: core + clock + KV memory/mover + events + metrics."""

    def __init__(self, settings: SimEngineSettings) -> None:
        from pools.sim.profiles import get_gpu, get_model
        from pools.sim.timing import TimingModel

        self.settings = settings
        self.tokenizer: SimTokenizer = load_tokenizer(settings.tokenizer)
        name = settings.served_model_name or settings.model_profile
        self.served_model_names: list[str] = [name]
        self.model_root = settings.tokenizer or settings.model_profile
        self.loras: dict[str, LoraAdapter] = parse_lora_modules(settings.lora_modules)
        self.max_model_len = settings.max_model_len
        self.engine_id = settings.engine_id or str(uuid.uuid4())
        self.metrics = EngineMetrics(name)
        self.timing = TimingModel(
            get_model(settings.model_profile),
            get_gpu(settings.gpu),
            tp=settings.tp,
            kv_memory_gb=settings.kv_memory_gb,
            max_num_batched_tokens=settings.max_num_batched_tokens,
        )
        self.num_blocks = settings.num_blocks or self.timing.num_gpu_blocks(settings.block_size)
        self.healthy = False
        self.core: EngineCore | None = None
        self.driver: EngineDriver | None = None
        self._t0 = time.monotonic()
        self._scale = settings.time_scale
        self._requests: dict[str, _Tracking] = {}
        self._client_aborts = 0  # not in request_success_total, as in vLLM (render_metrics)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._publisher: ZmqKvEventPublisher | None = None
        # without a transport (`--kv-transport none`) it has no mover: holds are skipped and
        # pulls of remote blocks fail
        self._transport = SimKvTransport(settings, self.engine_id, self.num_blocks, self.metrics)

    @property
    def kv_address(self) -> dict[str, Any] | None:
        return self._transport.address

    @property
    def kv_store(self) -> SimKvStore | None:
        """This engine's KV block memory (None without a KV transport)."""
        return self._transport.store

    # -- clock -------------------------------------------------------------------------
    def sim_now(self) -> float:
        return (time.monotonic() - self._t0) / self._scale

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        from pools.sim.config import EngineConfig
        from pools.sim.driver import EngineDriver
        from pools.sim.engine_core import EngineCore

        s = self.settings
        kv_port = s.kv_port
        if s.kv_transport is not KvTransport.NONE:
            await self._transport.start(self._on_release)
            kv_port = self._transport.port or kv_port
        config = EngineConfig(
            block_size=s.block_size,
            num_gpu_blocks=self.num_blocks,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
            max_model_len=s.max_model_len,
            enable_prefix_caching=s.enable_prefix_caching,
            enable_kv_cache_events=s.kv_events_endpoint is not None,
            vocab_size=self.tokenizer.vocab_size,
            eos_token_id=self.tokenizer.eos_token_id,
            text="words" if self.tokenizer.name == WORDS_TOKENIZER else "hash",
            engine_id=self.engine_id,
            kv_host=s.kv_host,
            kv_port=kv_port,
            # the core's clock is simulated seconds; the lease is specified in real seconds
            kv_lease_duration_s=s.kv_lease_s / self._scale,
            kv_load_failure_policy=s.kv_load_failure_policy,
        )
        self.core = EngineCore(config, self.timing)
        self.driver = EngineDriver(self.core)
        if s.kv_events_endpoint is not None:
            from pools.sim.kv_publisher import ZmqKvEventPublisher

            self._publisher = ZmqKvEventPublisher(
                s.kv_events_endpoint,
                s.kv_events_replay_endpoint,
                topic=s.kv_events_topic,
                buffer_steps=s.kv_events_buffer_steps,
            )
            self._publisher.start()
        self._t0 = time.monotonic()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._loop_task.add_done_callback(self._on_loop_exit)
        self.healthy = True

    def _on_loop_exit(self, task: asyncio.Task[None]) -> None:
        """A crashed engine loop must not leave clients hanging: fail every open request and
        report unhealthy (`/health` 503), as a dead vLLM engine core would."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("simulated engine loop crashed", exc_info=task.exception())
        self.healthy = False
        self._fail_all("engine loop crashed")

    def _fail_all(self, why: str) -> None:
        for tracking in self._requests.values():
            tracking.stream.done = True
            tracking.stream.push(StreamDelta([], None, why))
        self._requests.clear()

    async def stop(self) -> None:
        self.healthy = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        await self._transport.cancel_pulls()
        self._fail_all("engine stopped")
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None
        await self._transport.close()

    # -- requests -----------------------------------------------------------------------
    def submit(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        seed: int | None = None,
        kv_transfer_params: KvTransferParams | None = None,
        lora: LoraAdapter | None = None,
    ) -> RequestStream:
        """Queue a request (with `lora`: run with that adapter, its blocks salted by it);
        raises ValueError (message names the field) if the core refuses."""
        from pools.sim.request import SimRequest

        if self.core is None or not self.healthy:
            raise EngineUnavailable("the engine is not running")
        if request_id in self._requests:
            request_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        now = self.sim_now()
        self.core.add_request(
            SimRequest(
                request_id=request_id,
                prompt_token_ids=prompt_token_ids,
                max_tokens=max_tokens,
                seed=seed,
                kv_transfer_params=kv_transfer_params,
                lora_name=lora.name if lora is not None else None,
                lora_id=lora.lora_id if lora is not None else None,
                lora_path=lora.path if lora is not None else None,
            ),
            now,
        )
        stream = RequestStream(self, request_id)
        self._requests[request_id] = _Tracking(stream, now, prompt_token_ids)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        tracking = self._requests.pop(request_id, None)
        if tracking is None or self.core is None:
            return
        tracking.stream.done = True
        if self.core.abort_request(request_id, self.sim_now()) is not None:
            self._client_aborts += 1
        self._wake.set()

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (vLLM semantics: refused while blocks are in use)."""
        if self.core is None:
            return False
        ok = self.core.reset_prefix_cache()
        self._wake.set()
        return ok

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        driver = self.driver
        assert driver is not None
        wake = self._wake
        scale = self._scale
        # how far (simulated seconds) a late wake-up may be absorbed: see "Host lag" above
        max_catch_up = MAX_CATCH_UP_REAL_S / scale
        while True:
            now = self.sim_now()
            flight = driver.in_flight
            busy = flight is not None and flight.duration_s > 0
            if busy and flight is not None and 0.0 <= now - flight.end <= max_catch_up:
                now = flight.end  # back to back, as the GPU would have run it
            adv = driver.tick(now, self._on_outputs)
            if adv.wake is None:
                wake.clear()
                await wake.wait()
            elif adv.step is not None:
                # sleep to the step's end on the absolute timeline, so sleep overshoot and
                # loop lag do not add up step after step
                delay = self._t0 + adv.wake * scale - time.monotonic()
                await asyncio.sleep(delay if delay > 0 else 0)
            else:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), (adv.wake - now) * scale)

    def _on_outputs(self, result: StepResult, events: list[KVCacheEvent]) -> None:
        if self._publisher is not None and events:
            self._publisher.publish(events)
        self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        # latency metrics on the simulated timeline: what the simulated GPU produced, free of
        # this host's scheduling noise (the client still sees real delivery times)
        now = result.end
        m = self.metrics
        for out in result.outputs:
            tracking = self._requests.get(out.request_id)
            if tracking is None:
                continue
            n_new = len(out.new_token_ids)
            if n_new:
                if tracking.first_token_at is None:
                    tracking.first_token_at = now
                    m.time_to_first_token.observe(now - tracking.arrival)
                elif tracking.last_token_at is not None:
                    m.inter_token_latency.observe((now - tracking.last_token_at) / n_new)
                tracking.last_token_at = now
            if out.finished:
                del self._requests[out.request_id]
                tracking.stream.done = True
                tracking.stream.final = out
                m.e2e_request_latency.observe(now - tracking.arrival)
                m.request_prompt_tokens.observe(out.num_prompt_tokens)
                m.request_generation_tokens.observe(out.num_output_tokens)
                if out.kv_transfer_params is not None:
                    self._transport.hold(out, tracking.prompt_token_ids)
                if out.finish_reason == "error":
                    why = getattr(out, "error", None) or "the KV blocks could not be loaded"
                    tracking.stream.push(
                        StreamDelta(
                            out.new_token_ids,
                            None,
                            KV_LOAD_ERROR.format(rid=out.request_id, why=why),
                        )
                    )
                    continue
            tracking.stream.push(
                StreamDelta(out.new_token_ids, out.finish_reason if out.finished else None)
            )
        for load in result.new_remote_loads:
            self._transport.start_pull(load, self._on_pull_done)

    # -- P/D callbacks ------------------------------------------------------------------
    def _on_release(self, request_id: str, reason: str) -> None:
        if self.core is None:
            return
        if reason == "expired":
            self.metrics.nixl_num_kv_expired_reqs += 1
        self.core.release_held(request_id, self.sim_now())
        self._wake.set()

    def _on_pull_done(self, request_id: str, ok: bool) -> None:
        if self.core is not None:
            self.core.finish_remote_load(request_id, ok, self.sim_now())
            self._wake.set()

    # -- metrics ---------------------------------------------------------------------------
    def render_metrics(self) -> str:
        """`/metrics`: the core's counters and gauges (one snapshot) + frontend histograms."""
        stats = self.core.stats() if self.core is not None else None
        return self.metrics.render(stats, client_aborts=self._client_aborts)

    def info(self) -> dict[str, Any]:
        """What a pool needs to know about this engine (served at `/sim/info`)."""
        s = self.settings
        return {
            "role": s.role,
            "engine_id": self.engine_id,
            "model_profile": s.model_profile,
            "gpu": s.gpu,
            "tp": s.tp,
            "time_scale": s.time_scale,
            "block_size": s.block_size,
            "num_gpu_blocks": self.num_blocks,
            "max_model_len": s.max_model_len,
            "served_model_name": self.served_model_names[0],
            "kv_events_endpoint": s.kv_events_endpoint,
            "kv_events_replay_endpoint": s.kv_events_replay_endpoint,
            "kv_transfer": self.kv_address,
            # prefill-side KV leases not yet pulled or expired (a drain waits for 0)
            "num_held_requests": len(self.core.scheduler.connector.leases)
            if self.core is not None
            else 0,
            # blocks in the prefix cache now: what a KV index fed by this engine's events
            # should hold for it (benchmarks/chaos compares the coordinator's index with it)
            "cached_blocks": len(
                self.core.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
            )
            if self.core is not None
            else 0,
        }
