"""The transport vocabulary of `transfer`: one StrEnum per choice, so that YAML, JSON and CLI
flags keep their strings (`KvTransport("tcp") is KvTransport.TCP`, `str(KvTransport.TCP) ==
"tcp"`)."""

from __future__ import annotations

from enum import StrEnum


class KvTransport(StrEnum):
    """How KV blocks move between engines (`make_block_mover`'s kind, a mover's `kind`, the
    simulated engine's `kv_transport`).

    - `auto`: NIXL when it can be imported, else the TCP fallback;
    - `nixl`: NIXL (UCX), an error where it cannot be imported;
    - `tcp`: pdorch's fallback, blocks ride the ZMQ side channel;
    - `none`: no mover at all (an engine that serves no P/D); no mover has this kind.
    """

    AUTO = "auto"
    NIXL = "nixl"
    TCP = "tcp"
    NONE = "none"


class UcxTransport(StrEnum):
    """What a NIXL mover lets UCX use (`NixlSettings.transport`).

    - `auto` / `shm`: `ucx_error_handling_mode=none`, so UCX may pick shared memory on one host
      (RDMA or TCP across hosts);
    - `tcp`: UCX's default error handling and `UCX_TLS=tcp` (what a two-host TCP fabric sees).
    """

    AUTO = "auto"
    SHM = "shm"
    TCP = "tcp"
