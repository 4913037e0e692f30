"""Launching fleets: the demo file's simulated engines start, serve P/D and publish KV events;
leaving the context (normally, on error, on cancellation) leaves no process, port or socket."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
import zmq.asyncio

from pdorch.config.fleet import FleetConfig, load_fleet_config, parse_fleet_config
from pools.http_client import http_client
from pools.launch import RunningFleet, launch_fleet, plan_fleet
from pools.launch_engines import FleetLaunchError
from pools.replica import ReplicaEndpoint
from tests.waiting import async_wait_until
from transfer.params import KvTransferParams

DEMO = Path(__file__).parents[2] / "deploy" / "examples" / "fleet-sim.yaml"
PD_PARAMS = KvTransferParams(do_remote_decode=True, do_remote_prefill=False)


def port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped; launch_fleet waits on its children
    return True


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def sim_fleet(in_process: bool, prefill: int = 1, decode: int = 1, **extra: Any) -> FleetConfig:
    spec = {"kind": "sim", "time_scale": 0.01, "kv_transport": "tcp", "in_process": in_process}
    spec.update(extra)
    return parse_fleet_config(
        {
            "served_model_name": "tiny",
            "pools": {
                "prefill": {"launch": [{**spec, "count": prefill}]},
                "decode": {"launch": [{**spec, "count": decode}]},
            },
        }
    )


async def test_demo_fleet_starts_serves_pd_and_stops_clean() -> None:
    config = load_fleet_config(DEMO).with_sim_time_scale(0.01)
    async with launch_fleet(config) as running:
        ids = [(e.replica_id, e.pool) for e in running.endpoints]
        assert ids == [
            ("prefill-0", "prefill"),
            ("prefill-1", "prefill"),
            ("decode-0", "decode"),
            ("decode-1", "decode"),
        ]
        assert len({e.url for e in running.endpoints}) == 4
        assert all(e.model == "llama-3.1-8b" and e.block_size == 16 for e in running.endpoints)
        assert all(e.num_gpu_blocks for e in running.endpoints)
        assert len(running.describe()) == 4
        prefill, decode = running.by_pool("prefill")[0], running.by_pool("decode")[1]
        assert prefill.kv_events_endpoint is not None and prefill.kv_events_topic == "prefill-0"

        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(prefill.kv_events_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, prefill.kv_events_topic.encode())
        try:
            async with http_client(timeout=30.0) as client:
                for endpoint in running.endpoints:
                    assert (await client.get(f"{endpoint.url}/health")).status_code == 200
                before = await metric(
                    client,
                    decode.url,
                    'vllm:prompt_tokens_by_source_total{engine="0",'
                    'model_name="llama-3.1-8b",source="external_kv_transfer"}',
                )
                prompt = f"{uuid.uuid4().hex} " + "the quick brown fox " * 100
                body = {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 1}

                async def prefilled() -> KvTransferParams:
                    # the SUB socket joins asynchronously: prefill until an event is seen
                    r = await client.post(
                        f"{prefill.url}/v1/completions",
                        json={**body, "kv_transfer_params": PD_PARAMS.wire()},
                    )
                    assert r.status_code == 200, r.text
                    return KvTransferParams.parse(r.json()["kv_transfer_params"])

                params = await prefilled()
                frames = await asyncio.wait_for(sub.recv_multipart(), 5.0)
                assert frames[0] == b"prefill-0" and len(frames) == 3
                r = await client.post(
                    f"{decode.url}/v1/completions",
                    json={**body, "max_tokens": 4, "kv_transfer_params": params.wire()},
                )
                assert r.status_code == 200, r.text
                after = await metric(
                    client,
                    decode.url,
                    'vllm:prompt_tokens_by_source_total{engine="0",'
                    'model_name="llama-3.1-8b",source="external_kv_transfer"}',
                )
                assert after > before  # decode pulled the KV from prefill over the side channel
        finally:
            sub.close(linger=0)
            ctx.term()
        urls = [e.url for e in running.endpoints]
        ipc_dir = running.ipc_dir
    assert not any(port_open(u) for u in urls)
    assert not ipc_dir.exists()


async def test_subprocess_sims_leave_no_process_or_port_behind() -> None:
    async with launch_fleet(sim_fleet(in_process=False)) as running:
        pids = running.pids()
        assert len(pids) == 2 and all(alive(p) for p in pids)
        urls = [e.url for e in running.endpoints]
        async with http_client() as client:
            for url in urls:
                assert (await client.get(f"{url}/health")).status_code == 200
        assert all(e.num_gpu_blocks for e in running.endpoints)
    assert not any(alive(p) for p in pids)
    assert not any(port_open(u) for u in urls)


async def test_cancellation_stops_everything() -> None:
    """Ctrl-C under asyncio.run cancels the main task; the fleet must still be stopped."""
    entered: asyncio.Future[RunningFleet] = asyncio.get_running_loop().create_future()

    # one engine of each kind: a process and an in-process server
    config = sim_fleet(in_process=False, prefill=1, decode=1)
    config.pools.decode.launch[0] = config.pools.decode.launch[0].model_copy(
        update={"in_process": True}
    )

    async def serve_config() -> None:
        async with launch_fleet(config) as running:
            entered.set_result(running)
            await asyncio.Event().wait()

    task = asyncio.ensure_future(serve_config())
    running = await asyncio.wait_for(asyncio.shield(entered), 120.0)
    pids, urls = running.pids(), [e.url for e in running.endpoints]
    assert len(pids) == 1 and len(urls) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any(alive(p) for p in pids)
    assert not any(port_open(u) for u in urls)


async def test_a_failing_engine_fails_the_launch_and_stops_the_rest(tmp_path: Path) -> None:
    missing = tmp_path / f"no-tokenizer-{uuid.uuid4().hex}"
    config = sim_fleet(in_process=True)
    config.pools.prefill.launch[0] = config.pools.prefill.launch[0].model_copy(
        update={"in_process": False, "tokenizer": str(missing)}
    )
    with pytest.raises(FleetLaunchError) as info:
        async with launch_fleet(config, log_dir=tmp_path / "logs"):
            pytest.fail("the fleet must not come up")
    message = str(info.value)
    assert "prefill-0" in message and "OSError" in message  # the engine's log tail

    def leftover() -> bool:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if str(missing).encode() in (entry / "cmdline").read_bytes():
                        return True
                except OSError:
                    continue
        return False

    async def none_left() -> bool:
        return not leftover()

    await async_wait_until(none_left, timeout=5.0, message="engine process gone")


@pytest.mark.unit
def test_vllm_engines_get_cores_round_robin_and_ipc_events(tmp_path: Path) -> None:
    config = parse_fleet_config(
        {
            "served_model_name": "tiny",
            "block_size": 32,
            "pools": {
                "prefill": {"launch": [{"kind": "vllm", "model": "/m", "count": 2}]},
                "decode": {
                    "endpoints": [{"url": "http://10.0.0.1:8000", "id": "edge"}],
                    "launch": [
                        {"kind": "vllm", "model": "/m", "count": 2},
                        {"kind": "vllm", "model": "/m", "cpu_cores": "0-1", "kv_events": False},
                    ],
                },
            },
        }
    )
    plan, ids = plan_fleet(config, tmp_path / "ipc", tmp_path / "logs")
    assert ids == ["prefill-0", "prefill-1", "edge", "decode-1", "decode-2", "decode-3"]
    cores = sorted(os.sched_getaffinity(0))
    engines: list[Any] = [p for p in plan if not isinstance(p, ReplicaEndpoint)]
    assigned = [e.cpu_cores for e in engines]
    assert assigned[:4] == [str(cores[i % len(cores)]) for i in range(4)]
    assert assigned[4] is None  # the spec pins its cores itself
    assert engines[0].events_endpoint == f"ipc://{tmp_path}/ipc/prefill-0.ev"
    assert engines[4].events_endpoint is None
