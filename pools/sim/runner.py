"""The real-time runner: drives the pure engine core from asyncio and feeds the HTTP streams.

One `SimEngine` per simulated engine; many can share one process and one event loop.

Clock. The core runs on *simulated* seconds: `sim_now = (monotonic() - t0) / time_scale`.
The loop is

1. `t = core.next_step_time(sim_now)`; nothing to do → sleep until woken (a new request, a
   finished KV pull); `t` in the future (a lease expiry) → sleep until then or until woken;
2. `result = core.step(sim_now)`; publish the step's KV events (one ZMQ batch);
3. sleep `result.duration_s * time_scale` real seconds (the GPU is busy), never blocking the loop;
4. deliver the step's outputs to their request streams, observe TTFT/ITL/e2e (simulated
   seconds, at the step's simulated end), start the KV pulls the step asked for.

Host lag. Sleeps end on an absolute timeline (`t0 + end * time_scale`), and when the loop
wakes late (a busy host, hundreds of engines on one loop) while the engine was busy, the next
step starts at the previous step's end (`busy_until`) as the GPU would have, absorbing up to
`MAX_CATCH_UP_REAL_S` of lag instead of adding it to every step. Latency metrics use the
simulated timeline; clients see the real delivery times.

P/D (vLLM NixlConnector protocol; the core keeps the books, this runner moves the bytes):
- prefill side: a finished `do_remote_decode` request returns `kv_transfer_params`; the runner
  writes the blocks' content (see `kv_store`) and `hold`s them on the block mover for
  `kv_lease_s`; the mover's release (decode side notified, or lease expired) → `release_held`.
- decode side: each `RemoteLoad` is pulled with `pull(peer, remote_ids, local_ids, rid, deadline)`
  within `kv_load_timeout_s`; every received block is verified against the content its token
  prefix implies; a failure, timeout or dead peer → `finish_remote_load(ok=False)`, which ends
  the request with `"error"` (HTTP 500) under the default `fail` policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pools.roles import EngineRole
from pools.sim.kv_store import SimKvStore, content_keys
from pools.sim.metrics import EngineMetrics
from pools.sim.settings import SimEngineSettings
from pools.sim.tokenization import SimTokenizer, load_tokenizer
from transfer.transports import KvTransport

if TYPE_CHECKING:
    from pools.sim.engine_core import EngineCore, RemoteLoad, RequestOutput, StepResult
    from pools.sim.kv_publisher import ZmqKvEventPublisher
    from transfer.params import KvTransferParams

log = logging.getLogger(__name__)

KV_LOAD_ERROR = "KV transfer failed for request {rid}: {why}"
MAX_CATCH_UP_REAL_S = 0.05


KV_TOUCH_MAX_BYTES = 256 * 1024 * 1024


def touch_decode_pages(blocks: npt.NDArray[np.uint8], max_bytes: int = KV_TOUCH_MAX_BYTES) -> int:
    """Write the first `max_bytes` of a KV pool once (its leading blocks); returns the bytes.

    Only engines that pull KV (role decode, or both: kv_both serves decode legs) call it: the
    first NIXL READ into never-touched pages was measured 10x slower. A prefill-only engine
    writes its blocks itself before lending them, so it skips this. The cap bounds memory: the
    pool is sized like the GPU's (`tiny` on H100: ~9 GiB of 4 KiB blocks; 8B on H200: ~220
    MiB) and large in-process fleets hold many. The leading blocks are the ones handed out
    first (the free queue starts in block-id order), so a capped pool is fast where it is used
    first; the rest is faulted in on first use, as before.
    """
    flat = blocks.reshape(-1)
    n = min(int(flat.nbytes), max_bytes)
    flat[:n].fill(0)
    return n


class EngineUnavailable(RuntimeError):
    """The engine is stopped or its loop crashed: no request can be served."""


@dataclass(slots=True)
class StreamDelta:
    """What one step produced for one request, as the HTTP layer consumes it."""

    token_ids: list[int]
    finish_reason: str | None
    error: str | None = None


class RequestStream:
    """The async iterator of one request's deltas; `final` is the core's last output."""

    __slots__ = ("_engine", "_event", "_items", "done", "final", "request_id")

    def __init__(self, engine: SimEngine, request_id: str) -> None:
        self._engine = engine
        self.request_id = request_id
        self._items: deque[StreamDelta] = deque()
        self._event = asyncio.Event()
        self.final: RequestOutput | None = None
        self.done = False

    def push(self, item: StreamDelta) -> None:
        self._items.append(item)
        self._event.set()

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamDelta]:
        while True:
            while self._items:
                item = self._items.popleft()
                yield item
                if item.finish_reason is not None or item.error is not None:
                    return
            self._event.clear()
            await self._event.wait()

    def close(self) -> None:
        """Abort the request if it is still running (client gone); idempotent."""
        if not self.done:
            self._engine.abort(self.request_id)

    def cancel(self) -> None:
        """The client went away while someone iterates: abort the request (its blocks are
        freed) and end the iteration with finish reason `"abort"`; a finished request is
        left as it is."""
        if not self.done:
            self._engine.abort(self.request_id)
            self.push(StreamDelta([], "abort"))


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
        self._t0 = time.monotonic()
        self._scale = settings.time_scale
        self._requests: dict[str, _Tracking] = {}
        self._client_aborts = 0  # not in request_success_total, as in vLLM (refresh_gauges)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._pull_tasks: set[asyncio.Task[None]] = set()
        self._publisher: ZmqKvEventPublisher | None = None
        self._mover: Any = None
        self._kv: SimKvStore | None = None
        self.kv_address: dict[str, Any] | None = None

    # -- clock -------------------------------------------------------------------------
    def sim_now(self) -> float:
        return (time.monotonic() - self._t0) / self._scale

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        from pools.sim.config import EngineConfig
        from pools.sim.engine_core import EngineCore

        s = self.settings
        kv_port = s.kv_port
        if s.kv_transport is not KvTransport.NONE:
            await self._start_mover()
            assert self._mover is not None
            kv_port = int(self._mover.address.port)
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
            engine_id=self.engine_id,
            kv_host=s.kv_host,
            kv_port=kv_port,
            # the core's clock is simulated seconds; the lease is specified in real seconds
            kv_lease_duration_s=s.kv_lease_s / self._scale,
            kv_load_failure_policy=s.kv_load_failure_policy,
        )
        self.core = EngineCore(config, self.timing)
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

    async def _start_mover(self) -> None:
        from transfer import KvBlockPool, make_block_mover

        s = self.settings
        pool = KvBlockPool(self.num_blocks, s.kv_block_bytes, touch=False)
        if s.role is not EngineRole.PREFILL:
            touch_decode_pages(pool.blocks_array())
        self._kv = SimKvStore(pool.blocks_array(), s.block_size)
        loop = asyncio.get_running_loop()

        def on_release(released: Any) -> None:
            loop.call_soon_threadsafe(self._on_release, released.request_id, released.reason)

        self._mover = make_block_mover(
            pool,
            kind=s.kv_transport,
            engine_id=self.engine_id,
            host=s.kv_host,
            port=s.kv_port,
            on_release=on_release,
        )
        await self._mover.start()
        self.kv_address = {
            "engine_id": self.engine_id,
            "host": s.kv_host,
            "port": int(self._mover.address.port),
            "kind": self._mover.kind,
        }

    async def stop(self) -> None:
        self.healthy = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self._pull_tasks):
            task.cancel()
        for task in list(self._pull_tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_all("engine stopped")
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None
        if self._mover is not None:
            await self._mover.close()
            self._mover = None

    # -- requests -----------------------------------------------------------------------
    def submit(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        seed: int | None = None,
        kv_transfer_params: KvTransferParams | None = None,
    ) -> RequestStream:
        """Queue a request; raises ValueError (message names the field) if the core refuses."""
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
        core = self.core
        assert core is not None
        wake = self._wake
        scale = self._scale
        # how far (simulated seconds) a late wake-up may be absorbed: see "Host lag" above
        max_catch_up = MAX_CATCH_UP_REAL_S / scale
        busy = False
        while True:
            now = self.sim_now()
            t = core.next_step_time(now)
            if t is None:
                busy = False
                wake.clear()
                await wake.wait()
                continue
            if t > now:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), (t - now) * scale)
                continue
            if busy and 0.0 <= now - core.busy_until <= max_catch_up:
                now = core.busy_until  # back to back, as the GPU would have run it
            result = core.step(now)
            busy = result.duration_s > 0
            if self._publisher is not None:
                events = core.drain_events()
                if events:
                    self._publisher.publish(events)
            # sleep to the step's end on the absolute timeline, so sleep overshoot and
            # loop lag do not add up step after step
            delay = self._t0 + result.end * scale - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
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
                    self._hold_for_decode(out, tracking.prompt_token_ids)
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
            self._start_pull(load)

    # -- P/D ------------------------------------------------------------------------------
    def _hold_for_decode(self, out: RequestOutput, prompt_token_ids: list[int]) -> None:
        params = out.kv_transfer_params
        block_ids = params.first_group() if params is not None else []
        if self._mover is None or self._kv is None or not block_ids:
            return
        rid = (params.remote_request_id if params is not None else None) or out.request_id
        try:
            keys = content_keys(prompt_token_ids, self.settings.block_size, len(block_ids))
            self._kv.write(block_ids, keys)
            self._mover.hold(rid, block_ids, self.settings.kv_lease_s)
        except Exception:  # a refused hold must not take the engine loop down
            log.exception("hold failed for %s", rid)

    def _on_release(self, request_id: str, reason: str) -> None:
        if self.core is None:
            return
        if reason == "expired":
            self.metrics.nixl_num_kv_expired_reqs += 1
        self.core.release_held(request_id, self.sim_now())
        self._wake.set()

    def _start_pull(self, load: RemoteLoad) -> None:
        task = asyncio.get_running_loop().create_task(self._pull(load))
        self._pull_tasks.add(task)
        task.add_done_callback(self._pull_tasks.discard)

    async def _pull(self, load: RemoteLoad) -> None:
        ok = False
        try:
            ok = await self._pull_blocks(load)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("KV pull for %s failed: %r", load.request_id, exc)
            self.metrics.nixl_num_failed_transfers += 1
        if self.core is not None:
            self.core.finish_remote_load(load.request_id, ok, self.sim_now())
            self._wake.set()

    async def _pull_blocks(self, load: RemoteLoad) -> bool:
        from transfer import PeerAddress

        if not load.remote_block_ids:
            return True
        if self._mover is None or self._kv is None:
            raise RuntimeError("this engine has no KV transport (--kv-transport none)")
        peer = PeerAddress(
            engine_id=str(load.remote_engine_id),
            host=str(load.remote_host),
            port=int(load.remote_port or 0),
        )
        deadline = time.monotonic() + self.settings.kv_load_timeout_s
        result = await self._mover.pull(
            peer,
            list(load.remote_block_ids),
            list(load.local_block_ids),
            str(load.remote_request_id or load.request_id),
            deadline,
        )
        self.metrics.nixl_xfer_time.observe(result.seconds)
        self.metrics.nixl_bytes_transferred.observe(result.nbytes)
        end = load.first_block + len(load.local_block_ids)
        keys = content_keys(load.prompt_token_ids, self.settings.block_size, end)
        wanted = keys[load.first_block : end]
        bad = self._kv.verify(list(load.local_block_ids), wanted)
        if bad:
            self.metrics.kv_block_verify_failures += len(bad)
            log.warning("KV pull for %s: %d blocks failed verification", load.request_id, len(bad))
            return False
        return True

    # -- metrics ---------------------------------------------------------------------------
    def refresh_gauges(self) -> None:
        """Copy the core's counters and gauges into the exposition (called on scrape)."""
        if self.core is None:
            return
        st = self.core.stats()
        m = self.metrics
        m.num_requests_running = st.num_running
        m.num_requests_waiting = st.num_waiting
        m.kv_cache_usage_perc = st.kv_cache_usage
        m.prefix_cache_queries = st.prefix_cache_queries
        m.prefix_cache_hits = st.prefix_cache_hits
        m.external_prefix_cache_queries = st.external_prefix_cache_queries
        m.external_prefix_cache_hits = st.external_prefix_cache_hits
        m.num_preemptions = st.num_preemptions
        m.prompt_tokens = st.prompt_tokens
        m.generation_tokens = st.generation_tokens
        for key, value in st.prompt_tokens_by_source.items():
            m.prompt_tokens_by_source[key] = value
        for key, value in st.request_success.items():
            m.request_success[key] = value
        # vLLM 0.32 counts a request in request_success_total only when the engine core
        # reports its finish; a frontend abort (client gone) drops the request's output state
        # first (OutputProcessor.abort_requests), so `finished_reason="abort"` never counts it.
        m.request_success["abort"] = max(0, m.request_success["abort"] - self._client_aborts)

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
        }
