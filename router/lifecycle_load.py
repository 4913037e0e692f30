"""The token-load side of routing a request onto a replica in `RequestLifecycle`
(router/lifecycle.py): a PD route's decode reservation, and a replica prefilling locally.

Split from `router/lifecycle.py` (proxy-8, code health: below ~500 lines); unchanged.
"""

from __future__ import annotations

from router.lifecycle_plan import KvLookup
from router.replica_state import RoutingRequest
from router.token_load import TokenLoad


def reserve_decode(
    token_load: TokenLoad, request: RoutingRequest, replica: str, now: float
) -> None:
    """The decode side of a PD route: the whole prompt's KV blocks, no prefill tokens
    (lifecycle module docstring: vLLM allocates them at once and computes only the last
    token)."""
    token_load.on_reserved(
        request.request_id,
        replica,
        now,
        prompt_tokens=request.prompt_tokens,
        block_size=request.block_size,
        max_tokens=request.max_tokens,
    )


def admit_local(
    token_load: TokenLoad, request: RoutingRequest, lookup: KvLookup, replica: str, now: float
) -> int:
    """`replica` prefills the prompt itself: counts its own uncached tokens, returns them."""
    uncached = request.uncached_tokens(lookup.overlap.get(replica, 0))
    token_load.on_admitted(
        request.request_id,
        replica,
        now,
        prompt_tokens=request.prompt_tokens,
        uncached_tokens=uncached,
        block_size=request.block_size,
        max_tokens=request.max_tokens,
    )
    return uncached
