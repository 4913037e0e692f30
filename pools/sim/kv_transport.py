"""The sim server's KV bytes: block memory, the block mover, holds and pulls (P/D I/O).

The core keeps the books (`pools/sim/kv_connector.py`: which blocks are held, which loads are
pending); this module moves the bytes with the same block movers real engines use (`transfer`):

- prefill side: a finished `do_remote_decode` request returns `kv_transfer_params`; its blocks'
  content (see `kv_store`) is written and `hold`-ed on the mover for `kv_lease_s`; the mover's
  release (decode side notified, or lease expired) reaches the engine through `on_release`.
- decode side: each `RemoteLoad` is pulled with `pull(peer, remote_ids, local_ids, rid,
  deadline)` within `kv_load_timeout_s`; every received block is verified against the content
  its token prefix implies; the result (False on a failure, timeout or dead peer) goes to
  `on_done`, which the engine turns into `finish_remote_load`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from pools.roles import EngineRole
from pools.sim.kv_store import SimKvStore, content_keys
from pools.sim.metrics import EngineMetrics
from pools.sim.outputs import RemoteLoad, RequestOutput
from pools.sim.settings import SimEngineSettings

log = logging.getLogger(__name__)

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


class SimKvTransport:
    """Block memory + mover of one simulated engine (none with `--kv-transport none`)."""

    def __init__(
        self,
        settings: SimEngineSettings,
        engine_id: str,
        num_blocks: int,
        metrics: EngineMetrics,
    ) -> None:
        self.settings = settings
        self.engine_id = engine_id
        self.num_blocks = num_blocks
        self.metrics = metrics
        self._mover: Any = None
        self._kv: SimKvStore | None = None
        self._pull_tasks: set[asyncio.Task[None]] = set()
        self.address: dict[str, Any] | None = None

    @property
    def store(self) -> SimKvStore | None:
        """The engine's KV block memory (None before `start` or without a transport)."""
        return self._kv

    @property
    def port(self) -> int | None:
        return int(self._mover.address.port) if self._mover is not None else None

    async def start(self, on_release: Callable[[str, str], None]) -> None:
        """Start the mover; `on_release(request_id, reason)` runs on this event loop."""
        from transfer import KvBlockPool, make_block_mover

        s = self.settings
        pool = KvBlockPool(self.num_blocks, s.kv_block_bytes, touch=False)
        if s.role is not EngineRole.PREFILL:
            touch_decode_pages(pool.blocks_array())
        self._kv = SimKvStore(pool.blocks_array(), s.block_size)
        loop = asyncio.get_running_loop()

        def released(rel: Any) -> None:
            loop.call_soon_threadsafe(on_release, rel.request_id, rel.reason)

        self._mover = make_block_mover(
            pool,
            kind=s.kv_transport,
            engine_id=self.engine_id,
            host=s.kv_host,
            port=s.kv_port,
            on_release=released,
        )
        await self._mover.start()
        self.address = {
            "engine_id": self.engine_id,
            "host": s.kv_host,
            "port": int(self._mover.address.port),
            "kind": self._mover.kind,
        }

    async def cancel_pulls(self) -> None:
        for task in list(self._pull_tasks):
            task.cancel()
        for task in list(self._pull_tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        await self.cancel_pulls()
        if self._mover is not None:
            await self._mover.close()
            self._mover = None

    # -- prefill side ---------------------------------------------------------------------
    def hold(self, out: RequestOutput, prompt_token_ids: list[int]) -> None:
        """Write a finished prefill leg's blocks and lend them to the decode side."""
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

    # -- decode side ----------------------------------------------------------------------
    def start_pull(self, load: RemoteLoad, on_done: Callable[[str, bool], None]) -> None:
        """Pull `load` in a task; `on_done(request_id, ok)` when it ends (not when cancelled)."""
        task = asyncio.get_running_loop().create_task(self._pull(load, on_done))
        self._pull_tasks.add(task)
        task.add_done_callback(self._pull_tasks.discard)

    async def _pull(self, load: RemoteLoad, on_done: Callable[[str, bool], None]) -> None:
        ok = False
        try:
            ok = await self._pull_blocks(load)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("KV pull for %s failed: %r", load.request_id, exc)
            self.metrics.nixl_num_failed_transfers += 1
        on_done(load.request_id, ok)

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
