"""vLLM general plugin: an idle NIXL agent's progress thread sleeps instead of spinning.

Why: NIXL's Python API (`nixl_cu12/_api.py`, NIXL 1.5.1) builds every agent with
`pthrDelay = 0`, and vLLM's NixlConnector keeps the progress thread on. In NIXL's UCX backend
(`src/plugins/ucx/ucx_backend.cpp`, `nixlUcxSharedThread`) `pthrDelay` is the timeout of the
thread's `poll()` on its workers' event fds, in µs rounded up to whole ms; it also sets how
often the thread progresses every worker unconditionally (NIXL's workaround for a UCX event fd
that does not wake `poll()`). With 0 the poll returns at once and the thread progresses all
workers in a loop: ~0.9 core per idle engine (docs/RUNTIME-FACTS.md). With a delay the thread
sleeps until a worker's fd fires or the delay passes, so a transfer still completes; at worst
its completion is seen up to one delay later.

How: vLLM calls `register()` in every process it starts (entry point group
`vllm.general_plugins` in pyproject.toml). It does nothing unless the engine's environment sets
`PDORCH_NIXL_PROGRESS_DELAY_US` (pdorch's launcher does, `pools/vllm_spec.py`); then every NIXL
agent the process builds gets that `pthrDelay`. NIXL's Python API offers no parameter for it,
so the bindings' `nixlAgent` class is replaced by a subclass that sets the delay on the config
before the C++ agent is built (the API looks the class up on the bindings module at each agent
creation, so the order of imports does not matter).

Imports nothing of pdorch, and NIXL only when the variable is set.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

ENV = "PDORCH_NIXL_PROGRESS_DELAY_US"
# The wheels NIXL's `nixl` meta package chooses between (`nixl/__init__.py`); each has its own
# bindings module. Only installed ones are patched.
BINDINGS = ("nixl_cu13._bindings", "nixl_cu12._bindings", "nixl_rocm._bindings")
_MARK = "_pdorch_pthr_delay_us"

# A child of vLLM's logger, so the line lands in the engine's log with vLLM's format.
logger = logging.getLogger("vllm.pdorch.nixl_progress")


def parse_delay_us(raw: str) -> int:
    """The delay in µs from the variable's text; ValueError unless a positive integer."""
    try:
        delay = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a positive integer (µs), got {raw!r}") from None
    if delay <= 0:
        raise ValueError(f"{ENV} must be a positive integer (µs), got {raw!r}")
    return delay


def register() -> None:
    """vLLM's plugin hook: install the delay when `PDORCH_NIXL_PROGRESS_DELAY_US` is set.

    Safe to call more than once (vLLM may): a patched bindings module is left as it is.
    A bad value is logged and ignored rather than raised: a plugin that raises only makes
    vLLM log a traceback, and the engine would start spinning either way.
    """
    raw = os.environ.get(ENV)
    if not raw:
        return
    try:
        delay = parse_delay_us(raw)
    except ValueError as error:
        logger.warning("%s; NIXL progress threads keep spinning", error)
        return
    patched = [name for name in BINDINGS if _patch(name, delay)]
    if patched:
        logger.info("NIXL progress thread delay %d us (%s)", delay, ", ".join(patched))
    else:
        logger.warning("%s set but no NIXL bindings found (%s)", ENV, ", ".join(BINDINGS))


def _patch(module_name: str, delay_us: int) -> bool:
    """Replace `module_name.nixlAgent` by a subclass setting `pthrDelay`; False if absent."""
    try:
        bindings: Any = importlib.import_module(module_name)
    except ImportError:
        return False
    agent_class: Any = bindings.nixlAgent
    if getattr(agent_class, _MARK, None) is not None:
        return True

    class DelayedProgressAgent(agent_class):  # type: ignore[misc]
        """`nixlAgent` whose progress thread waits `delay_us` between unconditional rounds."""

        def __init__(self, name: str, config: Any, *args: Any, **kwargs: Any) -> None:
            # 0 is what NIXL's Python API always passes; anything else was chosen by someone.
            if config.pthrDelay == 0:
                config.pthrDelay = delay_us
            super().__init__(name, config, *args, **kwargs)

    DelayedProgressAgent.__name__ = DelayedProgressAgent.__qualname__ = "nixlAgent"
    setattr(DelayedProgressAgent, _MARK, delay_us)
    bindings.nixlAgent = DelayedProgressAgent
    return True
