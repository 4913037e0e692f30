"""A multi-tenant radix tree over raw text: which replica has seen which prompt prefixes.

The approximate tree behind the `cache_aware` policy (SGLang / vllm-router design): the router
never asks engines what they cache; it remembers the text it sent to each replica ("tenant").
Text, not tokens, so no tokenizer is needed on the routing path.

- Each node holds an edge label and, per tenant, the time that tenant last used the node. A
  tenant that inserted a string is on every node of its path.
- `match(text)` returns, per tenant, how many leading characters of `text` it has seen (a
  partially matched edge counts its matching characters).
- `size(tenant)` is the number of characters attributed to the tenant (its share of the tree).
- `evict_tenant_by_size(max_chars, ...)` removes a tenant's least recently used leaves until
  the tenant holds at most `max_chars` characters; nodes left without tenants are deleted.

All methods take `now` where time matters; nothing reads a clock.
"""

from __future__ import annotations

import heapq


class _Node:
    __slots__ = ("children", "edge", "parent", "tenants")

    def __init__(self, edge: str, parent: _Node | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.tenants: dict[str, float] = {}


def _common_prefix_len(a: str, b: str) -> int:
    # Slice comparisons run in C: the common case (whole edge matches) costs one comparison,
    # a mismatch is found by bisection instead of a per-character Python loop.
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class TextPrefixTree:
    """Radix tree of text prefixes shared by several tenants (replicas)."""

    def __init__(self) -> None:
        self._root = _Node("", None)
        self._sizes: dict[str, int] = {}

    def size(self, tenant: str) -> int:
        """Characters attributed to `tenant` (0 if unknown)."""
        return self._sizes.get(tenant, 0)

    def tenants(self) -> list[str]:
        """Tenants with at least one node."""
        return sorted(self._sizes)

    def insert(self, text: str, tenant: str, now: float) -> None:
        """Record that `text` was sent to `tenant` at `now`."""
        node = self._root
        node.tenants[tenant] = now
        self._sizes.setdefault(tenant, 0)
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node)
                leaf.tenants[tenant] = now
                node.children[text[i]] = leaf
                self._sizes[tenant] += len(text) - i
                return
            k = _common_prefix_len(child.edge, text[i : i + len(child.edge)])
            if k < len(child.edge):
                mid = _Node(child.edge[:k], node)
                mid.tenants = dict(child.tenants)
                node.children[text[i]] = mid
                child.edge = child.edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            if tenant not in child.tenants:
                self._sizes[tenant] += len(child.edge)
            child.tenants[tenant] = now
            node = child
            i += k

    def match(self, text: str) -> dict[str, int]:
        """Per tenant, the number of leading characters of `text` it has seen."""
        matched: dict[str, int] = {}
        node = self._root
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            k = _common_prefix_len(child.edge, text[i : i + len(child.edge)])
            i += k
            for tenant in child.tenants:
                matched[tenant] = i
            if k < len(child.edge):
                break
            node = child
        return matched

    def remove_tenant(self, tenant: str) -> None:
        """Forget `tenant` everywhere (its replica went away)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            node.tenants.pop(tenant, None)
            stack.extend(node.children.values())
            self._prune(node)
        self._sizes.pop(tenant, None)

    def evict_tenant_by_size(self, max_chars: int) -> int:
        """Trim every tenant over `max_chars` by its LRU leaves; returns characters removed."""
        removed = 0
        for tenant, size in list(self._sizes.items()):
            if size > max_chars:
                removed += self._evict_tenant(tenant, max_chars)
        return removed

    def _evict_tenant(self, tenant: str, max_chars: int) -> int:
        heap: list[tuple[float, int, _Node]] = []
        serial = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self._root and self._is_leaf_for(node, tenant):
                heap.append((node.tenants[tenant], serial, node))
                serial += 1
        heapq.heapify(heap)
        removed = 0
        while heap and self._sizes.get(tenant, 0) > max_chars:
            _, _, node = heapq.heappop(heap)
            del node.tenants[tenant]
            self._sizes[tenant] -= len(node.edge)
            removed += len(node.edge)
            parent = node.parent
            self._prune(node)
            if (
                parent is not None
                and parent is not self._root
                and self._is_leaf_for(parent, tenant)
            ):
                heapq.heappush(heap, (parent.tenants[tenant], serial, parent))
                serial += 1
        return removed

    @staticmethod
    def _is_leaf_for(node: _Node, tenant: str) -> bool:
        if tenant not in node.tenants:
            return False
        return all(tenant not in child.tenants for child in node.children.values())

    def _prune(self, node: _Node) -> None:
        while node.parent is not None and not node.tenants and not node.children:
            parent = node.parent
            if parent.children.get(node.edge[0]) is node:
                del parent.children[node.edge[0]]
            node = parent
