"""vLLM's `kv_transfer_params`, typed: the one schema of the P/D params in pdorch.

vLLM's NixlConnector (0.32, `nixl/pull_scheduler.py` `request_finished`) answers a prefill leg
with a dict like `{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids":
[[...]], "remote_engine_id": ..., "remote_request_id": ..., "remote_host": ..., "remote_port":
..., "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": ...,
"remote_blocks_expiry_time": ..., "transfer_mode": "pull"}`, and its scheduler adds
`remote_prefill_cached_tokens`. `remote_block_ids` is one list per KV-cache group in current
vLLM, a flat list in older ones. pdorch's simulated engines speak the same dict; `remote_port`
is the owner's side-channel port (a ZMQ ROUTER).

Every producer and consumer in pdorch (coordinator legs, simulated engines, fleet simulator)
holds a `KvTransferParams`; the dict exists only on the wire (`wire()`, `parse()`).
Wire fidelity, so that a decode engine gets what the prefill engine sent:
- keys pdorch does not know (newer vLLM adds some every release) are kept (`extra="allow"`) and
  sent back unchanged;
- `wire()` emits exactly the keys that were given (parsed or passed to the constructor), never
  a default: vLLM reads e.g. `params.get("dcp_size", 1)`, and an emitted `null` would not
  fall back to its default;
- instances are frozen, so a retry can send the same params again without a defensive copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


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
    ) -> KvTransferParams:
        """What a prefill engine returns so that a decode engine can pull `block_ids`.

        `extra`: further fields (typed ones such as `remote_num_tokens`, or unknown keys)."""
        return KvTransferParams(
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_engine_id=self.engine_id,
            remote_host=self.host,
            remote_port=self.port,
            remote_block_ids=[list(block_ids)],
            remote_request_id=request_id,
            tp_size=1,
            **extra,
        )


class KvTransferParams(BaseModel):
    """vLLM's `kv_transfer_params` (request and response side); unknown keys are kept.

    Fields (vLLM's names; all optional on the wire):
    - `do_remote_decode`: on a prefill leg, keep the prompt's blocks for a remote decode;
    - `do_remote_prefill`: on a decode leg, pull the prompt's KV from `remote_*`;
    - `remote_engine_id`, `remote_host`, `remote_port`: the owner's engine id and side channel;
    - `remote_block_ids`: the owner's block ids, one list per KV-cache group (or one flat list);
    - `remote_request_id`: the owner's id of the request (its lease key);
    - `tp_size`, `dcp_size`, `pp_size`: the owner's tensor / decode-context / pipeline parallel
      sizes (vLLM's defaults 1);
    - `remote_num_tokens`: tokens whose KV the owner holds; `remote_prefill_cached_tokens`:
      of the prompt, how many the prefill found cached; `remote_blocks_expiry_time`: when the
      owner's lease ends (None: not reported); `transfer_mode`: `"pull"` (decode reads) or
      `"push"`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_block_ids: list[list[int]] | list[int] | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_request_id: str | None = None
    tp_size: int = 1
    dcp_size: int = 1
    pp_size: int = 1
    remote_num_tokens: int | None = None
    remote_prefill_cached_tokens: int | None = None
    remote_blocks_expiry_time: float | None = None
    transfer_mode: str | None = None

    @classmethod
    def prefill_request(cls) -> KvTransferParams:
        """What a prefill leg carries: keep the blocks for a remote decode.

        The `remote_*` keys are sent as explicit nulls, as vLLM's own P/D proxy does."""
        return cls(
            do_remote_decode=True,
            do_remote_prefill=False,
            remote_engine_id=None,
            remote_block_ids=None,
            remote_host=None,
            remote_port=None,
        )

    @classmethod
    def parse(cls, raw: object) -> KvTransferParams:
        """Parse wire JSON (a dict); ValueError naming the bad field or the wrong type."""
        if not isinstance(raw, dict):
            raise ValueError(f"kv_transfer_params must be an object, got {raw!r}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"kv_transfer_params: {exc}") from None

    def wire(self) -> dict[str, Any]:
        """The JSON object to send: exactly the keys given, unknown ones included (a new dict,
        nested values copied)."""
        return self.model_dump(exclude_unset=True)

    def replace(self, **changes: Any) -> KvTransferParams:
        """A copy with `changes` set (and so sent by `wire()`)."""
        return self.model_copy(update=changes)

    @property
    def unknown(self) -> dict[str, Any]:
        """The keys pdorch does not know, as received."""
        return dict(self.__pydantic_extra__ or {})

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

    def first_group(self) -> list[int]:
        """The block ids of the first KV-cache group (a flat list is one group); [] if none.

        For engines with one KV-cache group (pdorch's simulated engines)."""
        ids = self.remote_block_ids
        if not ids:
            return []
        first = ids[0]
        if isinstance(first, list):
            return list(first)
        return [i for i in ids if isinstance(i, int)]

    def block_ids(self) -> list[int]:
        """The remote block ids as one flat list; ValueError if absent or not one group."""
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
        return self.first_group()
