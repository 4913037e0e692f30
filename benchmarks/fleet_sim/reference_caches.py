"""Two reference caches every request is scored against, beside what the fleet's engines hit.

- oracle: one infinite cache over the same block ids, filled in routing order; its hit is the
  most prefix reuse any routing could get (`RequestRecord.oracle_hit_tokens`).
- pooled LRU: one LRU cache as big as the prefilling pools' KV together (the fleet's KV as if
  it were one replica); `RequestRecord.lru_hit_tokens`.

Hits are counted in whole blocks over the prompt, at most `(prompt_tokens - 1) // block_size`
blocks (the last prompt token is always computed, as the engine's own lookup). Accounting only:
nothing here feeds back into routing or the engines.
"""

from __future__ import annotations

from collections import OrderedDict


class ReferenceCaches:
    """The oracle and pooled-LRU reference caches (module docstring)."""

    def __init__(self, block_size: int, lru_capacity_blocks: int) -> None:
        self.block_size = block_size
        self.oracle: set[int] = set()
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.lru_capacity = lru_capacity_blocks

    def observe(
        self, prompt_keys: list[int], all_ids: list[int], prompt_tokens: int
    ) -> tuple[int, int]:
        """Score one routed request, then cache every block of its sequence (prompt + output);
        returns `(oracle_hit_tokens, lru_hit_tokens)`."""
        bs = self.block_size
        max_hit = (prompt_tokens - 1) // bs
        oracle = self.oracle
        hit = 0
        while hit < max_hit and prompt_keys[hit] in oracle:
            hit += 1
        oracle_hit_tokens = hit * bs
        oracle.update(all_ids)
        lru = self.lru
        hit = 0
        while hit < max_hit and prompt_keys[hit] in lru:
            hit += 1
        lru_hit_tokens = hit * bs
        for key in all_ids:
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > self.lru_capacity:
            lru.popitem(last=False)
        return oracle_hit_tokens, lru_hit_tokens
