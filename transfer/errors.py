"""Typed errors of the block mover.

Every failure a caller can act on has its own class, so the P/D code can decide without parsing
messages: `PeerGone` means "this prefill engine is dead, recompute or pick another",
`TransferTimeout` means "it may come back, but not in time", `BadBlockIds`/`LayoutMismatch`
are programming or configuration errors that must never be retried.
"""

from __future__ import annotations


class TransferError(RuntimeError):
    """Base class: a pull, notification or lease operation did not happen."""

    def __init__(
        self, message: str, *, peer: str | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.peer = peer
        self.request_id = request_id


class TransferTimeout(TransferError):
    """The caller's deadline passed (handshake, lease check or data); nothing is left posted."""


class PeerGone(TransferError):
    """The owner's side channel disconnected or refused the connection (e.g. killed)."""


class BadBlockIds(TransferError, ValueError):
    """Block ids out of range, duplicated, of different lengths, or not held for the request.

    Raised before anything is posted to the fabric.
    """


class LayoutMismatch(TransferError):
    """The two pools disagree on block size or memory kind: no block can be copied as is."""


class LeaseNotFound(TransferError):
    """The owner holds no lease for this request id (expired, already freed, never held)."""


class TransferFailed(TransferError):
    """The backend reported an error for a posted transfer (e.g. NIXL_ERR_REMOTE_DISCONNECT)."""


class BackendUnavailable(TransferError):
    """The requested backend (NIXL) cannot be imported or initialised here."""
