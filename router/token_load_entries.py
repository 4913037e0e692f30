"""`TokenLoad`'s records (router/token_load.py): one (request, replica) entry, the per-replica
totals, a replica's last scraped metrics, and `TokenLoadDelta`, an entry as coordinators share
it. Split from token_load.py (issue 15 code health), which keeps the lifecycle and the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

Key = tuple[str, str]  # (request_id, replica_id)


class TokenLoadDelta(BaseModel):
    """One entry's absolute state, as shared between coordinator replicas.

    `origin` names the coordinator that owns the request; `version` is that coordinator's
    monotonic change counter. `removed` marks a finished/aborted entry (a tombstone).
    """

    model_config = ConfigDict(frozen=True)

    origin: str
    version: int = Field(ge=0)
    request_id: str
    replica_id: str
    removed: bool = False
    reserved: bool = False  # decode blocks promised to a leg the engine has not seen yet
    prefill_tokens: int = Field(default=0, ge=0)
    decode_blocks: int = Field(default=0, ge=0)
    updated_at: float = 0.0
    # The remaining-decode signal (`ReplicaLoad.decoding`); absent from older peers' records.
    prompt_tokens: int = Field(default=0, ge=0)
    generated: int = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)


@dataclass(slots=True)
class Entry:
    prompt_tokens: int
    block_size: int
    prefill_tokens: int
    decodes: bool
    generated: int
    decode_blocks: int
    updated_at: float
    origin: str
    version: int
    reserved: bool = False
    max_tokens: int | None = None  # the request's output bound (None: not given)

    def delta(self, request_id: str, replica_id: str) -> TokenLoadDelta:
        """The entry's absolute state as a peer record (`TokenLoad.export_deltas`)."""
        return TokenLoadDelta(
            origin=self.origin,
            version=self.version,
            request_id=request_id,
            replica_id=replica_id,
            reserved=self.reserved,
            prefill_tokens=self.prefill_tokens,
            decode_blocks=self.decode_blocks,
            updated_at=self.updated_at,
            prompt_tokens=self.prompt_tokens,
            generated=self.generated,
            max_tokens=self.max_tokens,
        )

    @classmethod
    def of_delta(cls, delta: TokenLoadDelta, now: float) -> Entry:
        """A peer's entry from its record (`TokenLoad.apply_delta`)."""
        return cls(
            prompt_tokens=delta.prompt_tokens,
            block_size=0,
            prefill_tokens=delta.prefill_tokens,
            decodes=True,
            generated=delta.generated,
            decode_blocks=delta.decode_blocks,
            updated_at=max(delta.updated_at, now),
            origin=delta.origin,
            version=delta.version,
            reserved=delta.reserved,
            max_tokens=delta.max_tokens,
        )


@dataclass(slots=True)
class Totals:
    prefill_tokens: int = 0
    decode_blocks: int = 0
    reserved_blocks: int = 0  # the part of decode_blocks held by no engine yet
    requests: int = 0
    last_change: float = float("-inf")


@dataclass(slots=True)
class EngineMetrics:
    num_running: int
    num_waiting: int
    kv_usage: float
    kv_capacity_blocks: int
    sampled_at: float


def blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) if block_size > 0 else 0
