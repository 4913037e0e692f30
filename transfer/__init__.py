"""pdorch transfer: move KV blocks between engines (NIXL, with a TCP fallback).

Imports nothing else of pdorch. NIXL itself is imported only when a NIXL mover starts, so this
package imports on machines without it. See transfer/README.md for the API and design.
"""

from transfer.contract import BlockMover, MoverStats, PullResult, Released
from transfer.errors import (
    BackendUnavailable,
    BadBlockIds,
    LayoutMismatch,
    LeaseNotFound,
    PeerGone,
    TransferError,
    TransferFailed,
    TransferTimeout,
)
from transfer.factory import make_block_mover
from transfer.lease import Lease, LeaseTable
from transfer.nixl_mover import NixlBlockMover, NixlSettings, nixl_available
from transfer.params import KvTransferParams, PeerAddress
from transfer.pool import KvBlockPool
from transfer.tcp_mover import TcpBlockMover
from transfer.transports import KvTransport, UcxTransport

__all__ = [
    "BackendUnavailable",
    "BadBlockIds",
    "BlockMover",
    "KvBlockPool",
    "KvTransferParams",
    "KvTransport",
    "LayoutMismatch",
    "Lease",
    "LeaseNotFound",
    "LeaseTable",
    "MoverStats",
    "NixlBlockMover",
    "NixlSettings",
    "PeerAddress",
    "PeerGone",
    "PullResult",
    "Released",
    "TcpBlockMover",
    "TransferError",
    "TransferFailed",
    "TransferTimeout",
    "UcxTransport",
    "make_block_mover",
    "nixl_available",
]
