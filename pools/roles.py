"""The engine role vocabulary: one StrEnum, so that fleet YAML, JSON and CLI flags keep their
strings (`EngineRole("both") is EngineRole.BOTH`, `str(EngineRole.BOTH) == "both"`)."""

from __future__ import annotations

from enum import StrEnum


class EngineRole(StrEnum):
    """What a pool uses an engine for (vLLM engines and simulated ones alike).

    Every engine is NixlConnector `kv_both` (or its simulated equal), so any engine can still
    serve a prefill leg, a decode leg or a colocated request: the role names the engine's pool
    and its logs, and lets a simulated engine skip work its pool never asks for (a `prefill`
    engine does not pre-fault decode-side KV pages).

    - `prefill`: the prefill pool's engines; `decode`: the decode pool's;
    - `both`: an engine of the colocated pool, or one started on its own.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"
