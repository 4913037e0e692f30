"""What a caller hands the engine core (`SimRequest`), the engine's own request state
(`Request`) and the states a request goes through (vLLM's names)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pools.sim.block_pool import KVCacheBlock
from pools.sim.hashing import BlockHasher
from transfer.params import KvTransferParams

if TYPE_CHECKING:
    from pools.sim.token_gen import SequenceHash


class RequestStatus(enum.IntEnum):
    """vLLM v1's request states (only those the simulated engine uses)."""

    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 10
    FINISHED_LENGTH_CAPPED = 11
    FINISHED_ABORTED = 12
    FINISHED_ERROR = 13

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """The string vLLM reports (`finish_reason` in the API, `request_success` label)."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)
class SimRequest:
    """One request as the engine core sees it (already tokenized).

    - `max_tokens`: output cap (>= 1); `min_tokens`: no stop before this many; `ignore_eos`.
    - `stop_token_ids`: generating one of them ends the request with `"stop"` (its id becomes
      `stop_reason`), as vLLM's `SamplingParams.stop_token_ids`.
    - `seed`: with the prompt, determines the generated tokens (None = 0).
    - `cache_salt`, `lora_name`/`lora_id`/`lora_path`: enter the block hashes as in vLLM.
    - `kv_transfer_params`: vLLM's NixlConnector params: `do_remote_decode` on the prefill
      leg, the prefill response's params (`do_remote_prefill`) on the decode leg.
    - Token-free mode (the fleet simulator's fast path, additive): `prompt_token_ids=[]`,
      `num_prompt_tokens=N` and `block_hashes` = the hashes of the sequence's full blocks
      (prompt, and optionally the expected output so decoded blocks are cached too). The core
      then never sees token ids: the prefix cache works on the given block identities,
      `BlockStored.token_ids` is empty, output tokens are not appended to the sequence.
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    lora_path: str | None = None
    kv_transfer_params: KvTransferParams | None = None
    num_prompt_tokens: int | None = None
    block_hashes: list[bytes] | None = None

    def validate(self, max_model_len: int) -> None:
        """Raise ValueError naming the bad field (the engine's admission checks)."""
        n = len(self.prompt_token_ids)
        if n == 0 and self.num_prompt_tokens is not None:
            n = self.num_prompt_tokens  # token-free mode
        if n == 0:
            raise ValueError("prompt_token_ids: the prompt is empty")
        if n >= max_model_len:
            raise ValueError(
                f"prompt_token_ids: prompt length {n} must be < max_model_len {max_model_len}"
            )
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens: must be >= 0, got {self.min_tokens}")


class Request:
    """Engine-internal request state (vLLM's `Request`, trimmed); owned by the `Scheduler`.

    Attributes are public because the scheduler, the KV-cache manager and the connector state
    all read them (as vLLM's do); only the `Scheduler` changes them.
    """

    __slots__ = (
        "all_token_ids",
        "block_hashes",
        "blocks",
        "do_remote_decode",
        "do_remote_prefill",
        "first_token_done",
        "gen_state",
        "hasher",
        "ignore_eos",
        "kv_params",
        "load_result",
        "max_tokens",
        "min_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_external_tokens",
        "num_local_cached_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_tokens",
        "request_id",
        "sim",
        "skip_stats",
        "sources_set",
        "status",
        "stop_ids",
        "stop_reason",
        "token_free",
    )

    def __init__(self, sim: SimRequest, block_size: int, gen_state: SequenceHash) -> None:
        self.sim = sim
        self.request_id = sim.request_id
        self.all_token_ids: list[int] = list(sim.prompt_token_ids)
        # Token-free mode (SimRequest docstring): identities come as block hashes.
        self.token_free = not sim.prompt_token_ids and sim.num_prompt_tokens is not None
        self.num_prompt_tokens = (
            sim.num_prompt_tokens
            if self.token_free and sim.num_prompt_tokens is not None
            else len(sim.prompt_token_ids)
        )
        self.num_tokens = self.num_prompt_tokens  # len(all_token_ids), kept in step
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.blocks: list[KVCacheBlock] = []
        self.num_cached_blocks = 0
        self.block_hashes: list[bytes] = (
            list(sim.block_hashes) if self.token_free and sim.block_hashes else []
        )
        self.hasher = BlockHasher(
            block_size,
            lora_name=sim.lora_name,
            lora_path=sim.lora_path,
            cache_salt=sim.cache_salt,
        )
        self.gen_state = gen_state  # the running hash `TokenGenerator.next` samples from
        self.max_tokens = sim.max_tokens
        self.min_tokens = sim.min_tokens
        self.ignore_eos = sim.ignore_eos
        self.stop_ids = frozenset(sim.stop_token_ids)
        self.stop_reason: int | None = None
        self.num_preemptions = 0
        self.first_token_done = False
        self.sources_set = False
        self.num_local_cached_tokens = 0
        self.num_external_tokens = 0
        params = sim.kv_transfer_params
        self.kv_params: KvTransferParams | None = params
        self.do_remote_decode = params is not None and params.do_remote_decode
        self.do_remote_prefill = params is not None and params.do_remote_prefill
        self.load_result: bool | None = None
        self.skip_stats = False


def check_stop(
    r: Request, tok: int, max_model_len: int, eos_token_id: int | None
) -> RequestStatus | None:
    """The finished status after `r` sampled `tok` (None: it goes on); sets `stop_reason` for
    a stop token (vLLM's `check_stop`: length first, then `min_tokens`, eos, stop ids)."""
    if r.num_output_tokens >= r.max_tokens or r.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    if r.num_output_tokens < r.min_tokens:
        return None
    if eos_token_id is not None and not r.ignore_eos and tok == eos_token_id:
        return RequestStatus.FINISHED_STOPPED
    if tok in r.stop_ids:
        r.stop_reason = tok
        return RequestStatus.FINISHED_STOPPED
    return None
