"""Where an owner's blocks can be pulled from, in vLLM's `kv_transfer_params` vocabulary.

vLLM's NixlConnector answers a prefill request with a dict like
`{"do_remote_prefill": true, "remote_engine_id": ..., "remote_host": ..., "remote_port": ...,
"remote_block_ids": [[...]], "remote_request_id": ..., "tp_size": 1}` (`remote_block_ids` is one
list per KV-cache group in current vLLM, a flat list in older ones). pdorch's simulated engines
speak the same dict; `remote_port` is the owner's side-channel port (a ZMQ ROUTER).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PeerAddress(BaseModel):
    """An owner's identity and side channel: `tcp://host:port`, engine `engine_id`."""

    model_config = ConfigDict(frozen=True)

    engine_id: str = Field(min_length=1)
    host: str = Field(min_length=1)
    port: int = Field(gt=0, lt=65536)

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.engine_id}@{self.host}:{self.port}"

    def kv_transfer_params(
        self, block_ids: Sequence[int], request_id: str, **extra: Any
    ) -> dict[str, Any]:
        """The dict a prefill engine returns so that a decode engine can pull `block_ids`."""
        params: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": [list(block_ids)],
            "remote_request_id": request_id,
            "tp_size": 1,
        }
        params.update(extra)
        return params

    @classmethod
    def from_kv_transfer_params(cls, params: Mapping[str, Any]) -> PeerAddress:
        """Raises pydantic.ValidationError naming the missing/bad field."""
        return KvTransferParams.model_validate(dict(params)).peer()


class KvTransferParams(BaseModel):
    """vLLM's `kv_transfer_params` dict (request and response side); unknown keys are kept."""

    model_config = ConfigDict(extra="allow")

    do_remote_prefill: bool = False
    do_remote_decode: bool = False
    remote_engine_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_block_ids: list[list[int]] | list[int] | None = None
    remote_request_id: str | None = None
    tp_size: int = 1

    def peer(self) -> PeerAddress:
        """The owner's address; raises ValueError naming the first missing field."""
        for name in ("remote_engine_id", "remote_host", "remote_port"):
            if getattr(self, name) is None:
                raise ValueError(f"kv_transfer_params.{name} is missing")
        return PeerAddress(
            engine_id=str(self.remote_engine_id),
            host=str(self.remote_host),
            port=int(self.remote_port or 0),
        )

    def block_ids(self) -> list[int]:
        """The remote block ids as one flat list (one KV-cache group expected)."""
        ids = self.remote_block_ids
        if ids is None:
            raise ValueError("kv_transfer_params.remote_block_ids is missing")
        if ids and isinstance(ids[0], list):
            groups = [g for g in ids if isinstance(g, list)]
            if len(groups) != 1:
                raise ValueError(
                    f"kv_transfer_params.remote_block_ids has {len(groups)} KV-cache groups, "
                    "the mover handles one"
                )
            return [int(i) for i in groups[0]]
        return [int(i) for i in ids if not isinstance(i, list)]
