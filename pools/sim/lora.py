"""LoRA adapters a simulated engine has "loaded" (`--lora-modules name[=path]`, as vLLM's flag).

The simulator has no weights: an adapter is a name, a path and vLLM's integer id (1, 2, ... in
the order given, as vLLM numbers `--lora-modules`). What an adapter changes on the wire is what
the router must see: the request's block hashes are salted by `("lora", name, path)` as vLLM
hashes them (`pools/sim/hashing.py`), `BlockStored` carries `lora_name`/`lora_id`, and
`/v1/models` lists the adapter with `parent` = the base model and `root` = its path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One loaded adapter: `name` is what clients send as `model`."""

    name: str
    path: str
    lora_id: int


def parse_lora_modules(items: Iterable[str]) -> dict[str, LoraAdapter]:
    """`name` or `name=path` per item (path defaults to the name); ValueError names a bad item."""
    adapters: dict[str, LoraAdapter] = {}
    for item in items:
        name, _, path = item.partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"lora_modules: {item!r} has no adapter name (want name or name=path)")
        if name in adapters:
            raise ValueError(f"lora_modules: adapter {name!r} is listed twice")
        adapters[name] = LoraAdapter(name, path.strip() or name, len(adapters) + 1)
    return adapters
