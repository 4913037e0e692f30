"""What a caller hands the engine core, and the states a request goes through (vLLM's names)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from transfer.params import KvTransferParams


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
