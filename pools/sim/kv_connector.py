"""P/D connector state, scheduler side (vLLM's `NixlConnectorScheduler` role, read not copied).

Two halves, one per leg of a disaggregated request:

- decode side (`do_remote_prefill`): at admission the blocks the local prefix cache does not
  hold are to be loaded (`get_num_new_matched_tokens`); the request waits
  (`WAITING_FOR_REMOTE_KVS`) while the caller moves the KV (`RemoteLoad`, `start_load`); the
  caller's `finish_load` makes the result visible to the next step (`take_finished_loads`).
- prefill side (`do_remote_decode`): a finished request's blocks are *held* under a lease
  (`hold`) until the puller is done (`release`) or the lease runs out (`expire`); the puller's
  heartbeat extends it (`extend`). The leases live in `transfer.lease.LeaseTable`, the table the
  real block movers use, so expiry (lazy-deletion heap, never-shortening extension) is one rule;
  it keeps block ids, which this module maps back to the pool's blocks.

Pure: times are the caller's `now`.
"""

from __future__ import annotations

from pools.sim.config import EngineConfig
from pools.sim.kv_cache_manager import KVCacheManager
from pools.sim.outputs import RemoteLoad
from pools.sim.request import Request
from transfer.lease import LeaseTable
from transfer.params import KvTransferParams


class ConnectorState:
    """Loads in flight (decode side) and held blocks (prefill side) of one engine."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.leases = LeaseTable()
        self.loads: dict[str, RemoteLoad] = {}  # admitted, transfer not finished
        self.num_loading = 0  # requests in WAITING_FOR_REMOTE_KVS with no result yet
        self.finished_loads: list[Request] = []  # results for the next step

    # ------------------------------------------------------------------ decode side
    def get_num_new_matched_tokens(self, r: Request, num_local: int) -> int:
        """Tokens to load from the prefill engine for a decode-leg request (0: nothing to load,
        the request then runs as a local one)."""
        if not r.do_remote_prefill:
            return 0
        num_ext = r.num_prompt_tokens - num_local
        if num_ext <= 0:
            r.do_remote_prefill = False
            return 0
        return num_ext

    def start_load(self, r: Request, first_block: int, num_ext: int) -> RemoteLoad:
        """Record the load of `r`'s blocks from `first_block` on (`num_ext` tokens)."""
        r.do_remote_prefill = False
        r.load_result = None
        self.num_loading += 1
        params = r.kv_params or KvTransferParams()
        remote_ids = params.first_group()
        local_ids = [b.block_id for b in r.blocks[first_block:]]
        load = RemoteLoad(
            request_id=r.request_id,
            kv_transfer_params=params,
            remote_engine_id=params.remote_engine_id,
            remote_host=params.remote_host,
            remote_port=params.remote_port,
            remote_request_id=params.remote_request_id,
            remote_block_ids=remote_ids[first_block : first_block + len(local_ids)],
            local_block_ids=local_ids,
            num_tokens=num_ext,
            prompt_token_ids=r.all_token_ids[: r.num_prompt_tokens],
            first_block=first_block,
        )
        self.loads[r.request_id] = load
        return load

    def finish_load(self, r: Request, ok: bool) -> bool:
        """The transfer for `r` ended; False if its result is already known."""
        if r.load_result is not None:
            return False
        self.loads.pop(r.request_id, None)
        r.load_result = ok
        self.num_loading -= 1
        self.finished_loads.append(r)
        return True

    def take_finished_loads(self) -> list[Request]:
        loads = self.finished_loads
        self.finished_loads = []
        return loads

    def forget(self, r: Request) -> None:
        """`r` was aborted: drop its load, whatever state it is in."""
        if r.load_result is None and r.request_id in self.loads:
            self.num_loading -= 1
        elif r in self.finished_loads:
            self.finished_loads.remove(r)
        self.loads.pop(r.request_id, None)

    @property
    def num_waiting_for_remote_kvs(self) -> int:
        return self.num_loading + len(self.finished_loads)

    # ------------------------------------------------------------------ prefill side
    def hold(self, r: Request, now: float) -> KvTransferParams:
        """Hold finished `r`'s blocks for the decode leg until `now + kv_lease_duration_s`;
        returns the `kv_transfer_params` for the decode leg (vLLM 0.32 NixlConnector keys)."""
        cfg = self.config
        rid = r.request_id
        if rid in self.leases:  # the id came back while its old blocks were still held
            self.release(rid)
        self.leases.hold(rid, [b.block_id for b in r.blocks], now + cfg.kv_lease_duration_s)
        return KvTransferParams(  # every key vLLM 0.32's NixlConnector returns
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_block_ids=[[b.block_id for b in r.blocks]],
            remote_engine_id=cfg.engine_id,
            remote_request_id=rid,
            remote_host=cfg.kv_host,
            remote_port=cfg.kv_port,
            tp_size=1,
            dcp_size=1,
            pp_size=1,
            remote_num_tokens=r.num_computed_tokens,
            remote_blocks_expiry_time=None,
            transfer_mode="pull",
            remote_prefill_cached_tokens=r.num_local_cached_tokens + r.num_external_tokens,
        )

    def release(self, request_id: str) -> bool:
        """Free the blocks held for `request_id` (its KV was pulled); False if none."""
        lease = self.leases.release(request_id)
        if lease is None:
            return False
        self.kv.free_blocks(self.kv.blocks_by_id(lease.block_ids))
        return True

    def extend(self, request_id: str, now: float) -> bool:
        """Push the lease to `now + kv_lease_duration_s` (never earlier); False if none."""
        return self.leases.extend(request_id, now + self.config.kv_lease_duration_s) is not None

    def expire(self, now: float) -> bool:
        """Free the blocks of every lease ended by `now`, earliest first; True if any."""
        expired = self.leases.pop_expired(now)
        for lease in expired:
            self.kv.free_blocks(self.kv.blocks_by_id(lease.block_ids))
        return bool(expired)

    def next_expiry(self) -> float | None:
        return self.leases.next_expiry()
