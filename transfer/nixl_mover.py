"""The NIXL block mover: one NIXL agent per mover, one registration of the whole pool.

Choices, and why (measured on this kind of machine, see docs/RUNTIME-FACTS.md):

* **No NIXL progress thread** (`enable_prog_thread=False`): it spins ~0.8 core per agent even
  when idle, which two engines on two cores cannot afford. Instead the mover's asyncio tick calls
  `get_new_notifs()` (which progresses UCX) — hot (`poll_interval_s`) while a pull is in flight
  here or announced by a puller (BeginPull), slow (`idle_poll_interval_s`) otherwise. An owner
  must keep progressing during a pull: over UCX/TCP the READ is served by the owner's worker,
  and without polling it stalls.
* **One agent thread.** Every NIXL call runs on a single-worker executor: the agent is created
  without locking (`NIXL_THREAD_SYNC_NONE`), the shared-memory copy happens *inside*
  `transfer()` (with the GIL released, so the event loop keeps running), and FIFO order makes
  teardown safe (handles are released before the descriptor lists and remote agent they use).
* **`ucx_error_handling_mode="none"` for transport auto/shm**: with UCX's default ("peer") mode
  UCX only picks transports that can detect a dead peer, which excludes the shared-memory ones,
  and a one-host READ goes over TCP loopback (~10x slower). Dead peers are detected by the side
  channel instead (socket monitor), and every pull has its own deadline.
* **Deadlines are ours**: NIXL has none per transfer. A pull that is not DONE by its deadline is
  released (`release_xfer_handle`, which cancels it) and reported as `TransferTimeout`; a handle
  NIXL refuses to release yet is retried on every tick and counted in `xfer_handles_live`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from transfer.contract import Released
from transfer.errors import BackendUnavailable, PeerGone, TransferFailed, TransferTimeout
from transfer.mover import MoverBase
from transfer.pool import KvBlockPool
from transfer.puller import Pull
from transfer.side_channel import HelloReply, PeerLink
from transfer.transports import KvTransport, UcxTransport

log = logging.getLogger(__name__)

T = TypeVar("T")


_BACKEND_PACKAGES = ("nixl_cu13", "nixl_cu12", "nixl_rocm")


def import_nixl_api() -> Any:
    """NIXL's `_api` module, without importing torch when that can be avoided.

    The `nixl` meta package picks its backend wheel (`nixl_cu12`, ...) from the CUDA version,
    and with a CPU-only torch installed it finds none and imports torch to ask (1.5-6 s here,
    per process). When exactly one backend wheel is installed there is nothing to choose, so
    its `_api` is imported directly; otherwise the meta package decides.
    """
    if "nixl._api" in sys.modules:
        return sys.modules["nixl._api"]
    installed = [name for name in _BACKEND_PACKAGES if importlib.util.find_spec(name)]
    if len(installed) == 1:
        return importlib.import_module(f"{installed[0]}._api")
    return importlib.import_module("nixl._api")


def nixl_available() -> bool:
    """True when NIXL's Python API can be imported here."""
    try:
        import_nixl_api()
    except Exception:
        return False
    return True


def _nixl_logs_to_stderr() -> None:
    """NIXL's Python logger writes INFO lines to stdout; move them to stderr, where logs belong
    (stdout carries JSON for `pdorch bench transfer --json` and `python -m transfer.peer`)."""
    for handler in logging.getLogger("nixl").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _scoped_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` only while the UCX backend is created. UCX reads its configuration (UCX_TLS,
    ...) when a context is created, so one mover's transport settings do not leak into other
    movers of the same process (checked: a UCX_TLS=tcp agent and a default one side by side)."""
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@dataclass(frozen=True)
class NixlSettings:
    """How the NIXL agent talks to peers.

    * `transport="auto"` (default) / `"shm"`: UCX backend with `ucx_error_handling_mode=none`,
      so UCX can use shared memory on one host (and still RDMA/TCP across hosts).
    * `transport="tcp"`: UCX's default error handling and `UCX_TLS=tcp` (a fabric check that
      matches a two-host TCP deployment). The environment is set only while this mover's UCX
      context is created, so movers with different settings can share a process.
    * `backend_params` / `ucx_env` override or add UCX backend parameters / environment.
    * `poll_interval_s` (default 0.5 ms): tick while pulls are active; `idle_poll_interval_s`
      (default 50 ms) otherwise (notifications for explicit `notify` still arrive).
    """

    transport: UcxTransport = UcxTransport.AUTO
    backend_params: Mapping[str, str] = field(default_factory=dict)
    ucx_env: Mapping[str, str] = field(default_factory=dict)
    poll_interval_s: float = 0.0005
    idle_poll_interval_s: float = 0.05

    def __post_init__(self) -> None:
        # a plain string from a caller or a CLI flag becomes the member (ValueError if unknown)
        object.__setattr__(self, "transport", UcxTransport(self.transport))

    def resolved_backend_params(self) -> dict[str, str]:
        tcp = self.transport is UcxTransport.TCP
        params = {} if tcp else {"ucx_error_handling_mode": "none"}
        params.update(self.backend_params)
        return params

    def resolved_env(self) -> dict[str, str]:
        env = {"UCX_TLS": "tcp"} if self.transport is UcxTransport.TCP else {}
        env.update(self.ucx_env)
        return env


@dataclass
class _RemoteAgent:
    """Per-peer NIXL state, owned by the agent thread (`released` is only set there)."""

    name: str
    dlist: Any
    released: bool = False


@dataclass
class _Inflight:
    future: asyncio.Future[str]
    link: PeerLink


class NixlBlockMover(MoverBase):
    """`BlockMover` over NIXL (UCX). See the module docstring for the design."""

    kind = KvTransport.NIXL

    def __init__(
        self,
        pool: KvBlockPool,
        *,
        engine_id: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_release: Callable[[Released], None] | None = None,
        settings: NixlSettings | None = None,
        default_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(
            pool,
            engine_id=engine_id,
            host=host,
            port=port,
            on_release=on_release,
            default_timeout_s=default_timeout_s,
        )
        self.settings = settings or NixlSettings()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._agent: Any = None
        self._registration: Any = None
        self._local_dlist: Any = None
        self._metadata = b""
        self._live_handles: set[Any] = set()
        self._zombies: set[Any] = set()
        self._inflight: dict[Any, _Inflight] = {}
        self._n = {"dlists_live": 0, "remote_agents_live": 0, "registrations_live": 0}

    # --- agent thread -----------------------------------------------------------------------
    async def _call(self, fn: Callable[[], T]) -> T:
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _release_handle_sync(self, handle: Any) -> None:
        try:
            self._agent.release_xfer_handle(handle)
        except Exception as exc:  # still active and not cancellable yet: retry each tick
            log.debug("xfer handle release deferred: %s", exc)
            self._zombies.add(handle)
            return
        self._zombies.discard(handle)
        self._live_handles.discard(handle)

    # --- lifecycle --------------------------------------------------------------------------
    async def _start_backend(self) -> None:
        try:
            api = import_nixl_api()
        except Exception as exc:
            raise BackendUnavailable(f"nixl is not importable: {exc}") from exc
        nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config
        _nixl_logs_to_stderr()
        env = self.settings.resolved_env()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nixl-agent")
        pool = self.pool
        params = self.settings.resolved_backend_params()

        def init() -> None:
            with _scoped_env(env):
                agent = nixl_agent(
                    self.engine_id, nixl_agent_config(backends=[], enable_prog_thread=False)
                )
                agent.create_backend("UCX", params)
            self._agent = agent
            self._registration = agent.register_memory(
                [(pool.base_address, pool.nbytes, pool.device_id, "")], pool.mem_type
            )
            self._n["registrations_live"] += 1
            self._local_dlist = agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", pool.descriptors(), pool.mem_type
            )
            self._n["dlists_live"] += 1
            self._metadata = agent.get_agent_metadata()

        try:
            await self._call(init)
        except Exception as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise BackendUnavailable(f"NIXL agent could not start: {exc}") from exc

    async def _close_backend(self) -> None:
        if self._executor is None:
            return

        def teardown() -> None:
            for handle in list(self._live_handles):
                self._release_handle_sync(handle)
            if self._local_dlist is not None:
                self._agent.release_dlist_handle(self._local_dlist)
                self._local_dlist = None
                self._n["dlists_live"] -= 1
            if self._registration is not None:
                self._agent.deregister_memory(self._registration)
                self._registration = None
                self._n["registrations_live"] -= 1
            self._agent = None

        try:
            await self._call(teardown)
        finally:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _agent_metadata(self) -> bytes:
        return self._metadata

    async def _connect_backend(self, link: PeerLink, hello: HelloReply) -> None:
        if hello.mem_type != "DRAM" and self.pool.mem_type != hello.mem_type:
            log.info("pulling %s blocks into %s", hello.mem_type, self.pool.mem_type)
        rows = np.empty((hello.num_blocks, 3), dtype=np.uint64)
        rows[:, 0] = np.uint64(hello.base_address) + np.arange(
            hello.num_blocks, dtype=np.uint64
        ) * np.uint64(hello.block_bytes)
        rows[:, 1] = hello.block_bytes
        rows[:, 2] = hello.device_id

        def connect() -> _RemoteAgent:
            raw = self._agent.add_remote_agent(hello.agent_metadata)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            self._n["remote_agents_live"] += 1
            try:
                dlist = self._agent.prep_xfer_dlist(name, rows, hello.mem_type)
            except Exception:
                self._agent.remove_remote_agent(name)
                self._n["remote_agents_live"] -= 1
                raise
            self._n["dlists_live"] += 1
            return _RemoteAgent(name, dlist)

        try:
            link.backend_state = await self._call(connect)
        except Exception as exc:
            raise TransferFailed(f"cannot load NIXL agent of {link.peer}: {exc}") from exc

    def _disconnect_backend(self, link: PeerLink) -> None:
        state = link.backend_state
        doomed = [h for h, inflight in self._inflight.items() if inflight.link is link]
        for handle in doomed:
            inflight = self._inflight.pop(handle)
            if not inflight.future.done():
                inflight.future.set_exception(
                    PeerGone(link.gone or "peer dropped", peer=str(link.peer))
                )
        if self._executor is None:
            return

        def disconnect() -> None:
            for handle in doomed:
                self._release_handle_sync(handle)
            if isinstance(state, _RemoteAgent) and not state.released:
                state.released = True
                with contextlib.suppress(Exception):
                    self._agent.release_dlist_handle(state.dlist)
                self._n["dlists_live"] -= 1
                with contextlib.suppress(Exception):
                    self._agent.remove_remote_agent(state.name)
                self._n["remote_agents_live"] -= 1

        self._executor.submit(disconnect)

    # --- the tick: notifications, transfer states, deferred releases ------------------------
    def _tick_interval(self) -> float:
        if self._inflight or self._active_pulls or self._zombies:
            return self.settings.poll_interval_s
        return self.settings.idle_poll_interval_s

    async def _backend_tick(self) -> None:
        if self._executor is None or self._agent is None:
            return
        handles = list(self._inflight)

        def pump() -> tuple[dict[str, list[bytes]], dict[Any, str]]:
            notifs: dict[str, list[bytes]] = self._agent.get_new_notifs()
            states: dict[Any, str] = {}
            for handle in handles:
                try:
                    states[handle] = self._agent.check_xfer_state(handle)
                except Exception as exc:
                    states[handle] = f"ERR {exc}"
                if states[handle] != "PROC":
                    self._release_handle_sync(handle)
            for handle in list(self._zombies):
                self._release_handle_sync(handle)
            return notifs, states

        notifs, states = await self._call(pump)
        for messages in notifs.values():
            for message in messages:
                self._end_lease(message.decode(errors="replace"), "notified")
        for handle, state in states.items():
            if state == "PROC":
                continue
            inflight = self._inflight.pop(handle, None)
            if inflight is not None and not inflight.future.done():
                inflight.future.set_result(state)

    def _backend_counters(self) -> dict[str, int]:
        return {"xfer_handles_live": len(self._live_handles), **self._n}

    # --- the data path ----------------------------------------------------------------------
    async def _transfer(self, pull: Pull) -> None:
        link, remote, local = pull.link, pull.remote, pull.local
        request_id, deadline = pull.request_id, pull.deadline
        await self._begin_pull(link, remote, request_id, deadline)
        state = link.backend_state
        assert isinstance(state, _RemoteAgent)
        notif = request_id.encode() if pull.notify else b""
        local_idx = np.asarray(local, dtype=np.int32)
        remote_idx = np.asarray(remote, dtype=np.int32)

        def post() -> tuple[Any, str]:
            if state.released:
                raise PeerGone(link.gone or "peer dropped", peer=str(link.peer))
            handle = self._agent.make_prepped_xfer(
                "READ", self._local_dlist, local_idx, state.dlist, remote_idx, notif
            )
            self._live_handles.add(handle)
            try:
                status = self._agent.transfer(handle)
            except Exception as exc:
                status = f"ERR {exc}"
            if status != "PROC":
                self._release_handle_sync(handle)
            return handle, status

        try:
            handle, status = await self._call(post)
        except PeerGone:
            raise
        except Exception as exc:
            raise TransferFailed(
                f"NIXL refused the READ from {link.peer}: {exc}",
                peer=str(link.peer),
                request_id=request_id,
            ) from exc
        if status == "PROC":
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._inflight[handle] = _Inflight(future, link)
            self._poke()
            try:
                status = await asyncio.wait_for(
                    asyncio.shield(future), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                self._inflight.pop(handle, None)
                await self._call(lambda: self._release_handle_sync(handle))
                raise TransferTimeout(
                    f"READ of {len(local)} blocks from {link.peer} not done by the deadline; "
                    "transfer released",
                    peer=str(link.peer),
                    request_id=request_id,
                ) from None
            except PeerGone as exc:
                exc.request_id = request_id
                raise
        if status != "DONE":
            if "REMOTE_DISCONNECT" in status:
                # UCX saw the owner die (often before the side channel's socket monitor does):
                # same error as every other dead-peer path, and the peer's state is dropped.
                link.mark_gone(f"{link.peer} disconnected during the READ ({status})")
            if link.gone is not None:
                raise PeerGone(link.gone, peer=str(link.peer), request_id=request_id)
            raise TransferFailed(
                f"READ from {link.peer} failed: {status}",
                peer=str(link.peer),
                request_id=request_id,
            )
