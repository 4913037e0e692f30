"""`SyncSettings`: the fleet file's optional `sync:` section (several coordinators, one fleet)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _zmq_endpoint(value: str) -> str:
    if "://" not in value:
        raise ValueError(f"{value!r} is not a ZMQ endpoint (e.g. tcp://host:port)")
    return value


ZmqEndpoint = Annotated[str, AfterValidator(_zmq_endpoint)]


class SyncSettings(BaseModel):
    """How this coordinator shares token-load deltas with the other coordinators of the fleet.

    ```yaml
    sync:
      bind: tcp://10.0.0.2:7300          # this coordinator's PUB (port 0 or *: any free port)
      peers: [tcp://10.0.0.2:7300, tcp://10.0.0.3:7300]   # every coordinator; own one skipped
      flush_interval_s: 0.02
    ```

    One file can serve every coordinator: list all of them in `peers` and give each process its
    own `bind` (e.g. `pdorch serve --sync-bind ...`); the endpoint equal to `bind` is skipped and
    a message carrying this coordinator's own origin is ignored.
    """

    model_config = ConfigDict(extra="forbid")

    bind: ZmqEndpoint = Field(
        default="tcp://127.0.0.1:0",
        min_length=1,
        description="ZMQ endpoint this coordinator's PUB socket binds (port 0 or '*': a free "
        "port, see PeerSync.endpoint).",
    )
    peers: list[ZmqEndpoint] = Field(
        default_factory=list,
        description="PUB endpoints of the other coordinators (ZMQ connect; reconnects itself).",
    )
    origin: str | None = Field(
        default=None,
        min_length=1,
        description="This coordinator's id in shared records; default: TokenLoad.origin. Must "
        "differ between coordinators (and should differ across restarts).",
    )
    flush_interval_s: float = Field(
        default=0.02, gt=0, le=10, description="Local deltas are sent at least this often."
    )
    min_flush_gap_s: float = Field(
        default=0.002,
        ge=0,
        le=1,
        description="A lifecycle change (flush_soon) sends at once unless the last send is "
        "younger than this: coalesces bursts into one message.",
    )
    heartbeat_interval_s: float = Field(
        default=0.5, gt=0, description="An empty message is sent when nothing was sent this long."
    )
    snapshot_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="Full state of this coordinator's live entries is re-sent this often (repairs "
        "lost messages and late joiners; also sent when a peer subscribes).",
    )
    peer_timeout_s: float = Field(
        default=3.0,
        gt=0,
        description="A peer silent this long is gone: its entries leave this coordinator's load.",
    )

    @model_validator(mode="after")
    def _check_times(self) -> SyncSettings:
        if self.peer_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "peer_timeout_s: must be longer than heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or live peers expire"
            )
        return self
