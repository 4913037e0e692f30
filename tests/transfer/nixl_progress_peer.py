"""A NIXL agent built the way vLLM's NixlConnector builds it, after pdorch's vLLM plugin ran.

`python -m tests.transfer.nixl_progress_peer owner NBYTES`: registers NBYTES of DRAM filled
with a pattern, prints one JSON line (agent metadata, address, whether the plugin replaced the
bindings' agent class), then only idles until stdin closes: any progress the agent makes is its
progress thread's, as in an idle vLLM engine.

`python -m tests.transfer.nixl_progress_peer pull`: reads the owner's JSON line on stdin,
READs sizes of it over NIXL (each with a deadline), checks the bytes and prints
`{"ms": [...]}`.

The agent config is vLLM 0.32's for UCX (`nixl/base_worker.py`: `num_threads=4`, progress
thread on, the `nixl_agent_config` default).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from transfer import nixl_progress
from transfer.nixl_mover import import_nixl_api

PATTERN = 0x5A
READ_DEADLINE_S = 30.0


def _agent(name: str) -> Any:
    nixl_progress.register()
    api = import_nixl_api()
    return api.nixl_agent(name, api.nixl_agent_config(num_threads=4))


def _patched() -> bool:
    bindings = sys.modules[import_nixl_api().__name__.rsplit(".", 1)[0] + "._bindings"]
    return getattr(bindings.nixlAgent, "_pdorch_pthr_delay_us", None) is not None


def owner(nbytes: int) -> None:
    agent = _agent("owner")
    buffer = np.full(nbytes, PATTERN, dtype=np.uint8)
    agent.register_memory([(buffer.ctypes.data, nbytes, 0, "")], "DRAM")
    hello = {
        "metadata": agent.get_agent_metadata().hex(),
        "address": buffer.ctypes.data,
        "nbytes": nbytes,
        "patched": _patched(),
    }
    print(json.dumps(hello), flush=True)
    sys.stdin.read()  # idle until the test closes stdin


def pull() -> None:
    hello = json.loads(sys.stdin.readline())
    nbytes = int(hello["nbytes"])
    agent = _agent("puller")
    target = np.zeros(nbytes, dtype=np.uint8)
    agent.register_memory([(target.ctypes.data, nbytes, 0, "")], "DRAM")
    remote = agent.add_remote_agent(bytes.fromhex(hello["metadata"]))
    times: list[float] = []
    for size in (4096, nbytes // 16, nbytes):
        local = agent.get_xfer_descs([(target.ctypes.data, size, 0)], "DRAM")
        far = agent.get_xfer_descs([(int(hello["address"]), size, 0)], "DRAM")
        began = time.monotonic()
        handle = agent.initialize_xfer("READ", local, far, remote, b"pulled")
        state = agent.transfer(handle)
        while state not in ("DONE", "ERR") and time.monotonic() - began < READ_DEADLINE_S:
            state = agent.check_xfer_state(handle)  # vLLM checks once per engine step
        times.append((time.monotonic() - began) * 1000)
        agent.release_xfer_handle(handle)
        if state != "DONE":
            raise SystemExit(f"READ of {size} bytes: {state} after {times[-1]:.0f} ms")
        if not bool((target[:size] == PATTERN).all()):
            raise SystemExit(f"READ of {size} bytes: wrong bytes")
    print(json.dumps({"ms": times, "patched": _patched()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "owner":
        owner(int(sys.argv[2]))
    else:
        pull()
