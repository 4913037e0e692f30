"""Token-load sharing between coordinator replicas (ZMQ pub/sub, msgspec); see `pdorch/SYNC.md`."""

from pdorch.sync.peer_sync import PeerSync, PeerSyncStats
from pdorch.sync.settings import SyncSettings

__all__ = ["PeerSync", "PeerSyncStats", "SyncSettings"]
