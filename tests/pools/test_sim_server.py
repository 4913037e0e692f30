"""The simulated engine server in-process: P/D failure paths, leases, aborts, the CLI, many
engines in one process. (Behaviour shared with vLLM is in tests/conformance/.)"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from pools.http_client import http_client
from pools.roles import EngineRole
from pools.sim.engine_core import EngineCore
from pools.sim.runner import KV_TOUCH_MAX_BYTES, touch_decode_pages
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings
from tests.waiting import async_wait_until, wait_until
from transfer.params import KvTransferParams

PREFILL_PARAMS = KvTransferParams(do_remote_decode=True, do_remote_prefill=False)


def settings(**overrides: Any) -> SimEngineSettings:
    base: dict[str, Any] = {
        "port": 0,
        "time_scale": 0.01,
        "block_size": 32,
        "num_blocks": 128,
        "max_model_len": 2048,
        "served_model_name": "tiny",
        "kv_transport": "tcp",
    }
    base.update(overrides)
    return SimEngineSettings(**base)


Pd = tuple[SimServer, SimServer, httpx.AsyncClient]


def core_of(server: SimServer) -> EngineCore:
    assert server.engine.core is not None, "the engine is not started"
    return server.engine.core


def url_of(server: SimServer) -> str:
    assert server.url is not None, "the server is not started"
    return server.url


@pytest.fixture
async def pd() -> AsyncIterator[Pd]:
    prefill, decode = (
        SimServer(settings(role=EngineRole.PREFILL)),
        SimServer(settings(role=EngineRole.DECODE)),
    )
    await prefill.start()
    await decode.start()
    try:
        async with http_client(timeout=30.0) as client:
            yield prefill, decode, client
    finally:
        await decode.stop()
        await prefill.stop()


def prompt() -> str:
    return f"{uuid.uuid4().hex} " + "the quick brown fox jumps over the lazy dog " * 20


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def prefill_leg(
    client: httpx.AsyncClient, url: str, text: str
) -> tuple[dict[str, Any], KvTransferParams]:
    body = {"model": "tiny", "prompt": text, "max_tokens": 1}
    leg = {**body, "kv_transfer_params": PREFILL_PARAMS.wire()}
    r = await client.post(f"{url}/v1/completions", json=leg)
    assert r.status_code == 200, r.text
    return body, KvTransferParams.parse(r.json()["kv_transfer_params"])


async def test_disaggregated_equals_colocated_and_frees_prefill_blocks(pd: Pd) -> None:
    prefill, decode, client = pd
    text = prompt()
    body, params = await prefill_leg(client, url_of(prefill), text)
    assert core_of(prefill).stats().num_held_blocks == len(params.block_ids())
    r = await client.post(
        f"{decode.url}/v1/completions",
        json={**body, "max_tokens": 10, "kv_transfer_params": params.wire()},
    )
    assert r.status_code == 200, r.text
    colocated = await client.post(
        f"{prefill.url}/v1/completions", json={**body, "max_tokens": 10, "kv_transfer_params": None}
    )
    assert r.json()["choices"][0]["text"] == colocated.json()["choices"][0]["text"]

    async def freed() -> bool:
        return core_of(prefill).stats().num_held_blocks == 0

    await async_wait_until(freed, 10.0, message="prefill blocks released after the pull")
    ext = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external'
    assert await metric(client, url_of(decode), ext) >= r.json()["usage"]["prompt_tokens"] - 32


async def test_corrupted_block_fails_verification_with_500(pd: Pd) -> None:
    prefill, decode, client = pd
    body, params = await prefill_leg(client, url_of(prefill), prompt())
    # damage one held block's bytes on the owner: the decode side must notice
    store = prefill.engine.kv_store
    assert store is not None
    store.blocks[params.block_ids()[1], :8] ^= 0xFF
    r = await client.post(
        f"{decode.url}/v1/completions", json={**body, "kv_transfer_params": params.wire()}
    )
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "InternalServerError"
    assert await metric(client, url_of(decode), "pdorch_sim:kv_block_verify_failures_total") == 1
    assert (await client.get(f"{decode.url}/health")).status_code == 200


async def test_dead_prefill_side_gives_500_and_decode_stays_healthy(pd: Pd) -> None:
    prefill, decode, client = pd
    body, params = await prefill_leg(client, url_of(prefill), prompt())
    await prefill.stop()
    r = await client.post(
        f"{decode.url}/v1/completions", json={**body, "kv_transfer_params": params.wire()}
    )
    assert r.status_code == 500
    assert r.json()["error"]["code"] == 500
    assert await metric(client, url_of(decode), "vllm:nixl_num_failed_transfers_total") == 1
    assert (await client.get(f"{decode.url}/health")).status_code == 200
    ok = await client.post(f"{decode.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


async def test_unpulled_blocks_are_freed_when_the_lease_expires() -> None:
    prefill = SimServer(settings(kv_lease_s=0.3))
    await prefill.start()
    try:
        async with http_client(timeout=30.0) as client:
            _, params = await prefill_leg(client, url_of(prefill), prompt())
            assert core_of(prefill).stats().num_held_blocks == len(params.block_ids())

            async def freed() -> bool:
                return core_of(prefill).stats().num_held_blocks == 0

            await async_wait_until(freed, 10.0, message="lease expiry to free the blocks")
            usage = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"}'
            assert await metric(client, url_of(prefill), usage) == 0.0
    finally:
        await prefill.stop()


async def test_client_disconnect_aborts_the_request() -> None:
    server = SimServer(settings(kv_transport="none", time_scale=1.0, gpu="cpu"))
    await server.start()
    try:
        async with http_client(timeout=30.0) as client:
            body = {"prompt": "hello", "max_tokens": 1000, "stream": True, "ignore_eos": True}
            async with client.stream("POST", f"{server.url}/v1/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    break  # first chunk, then hang up

            async def idle() -> bool:
                return core_of(server).stats().num_running == 0

            await async_wait_until(idle, 10.0, message="the aborted request to leave the engine")
            # as vLLM 0.32: a client-side abort is not counted in request_success_total
            abort = 'vllm:request_success_total{engine="0",finished_reason="abort"'
            assert await metric(client, url_of(server), abort) == 0
    finally:
        await server.stop()


async def test_client_disconnect_aborts_a_non_streamed_request() -> None:
    """vLLM aborts a non-streamed request when its client hangs up (`with_cancellation`):
    the request leaves the engine and frees its blocks instead of generating to the end."""
    server = SimServer(settings(kv_transport="none", time_scale=1.0, gpu="cpu"))
    url = await server.start()
    core = server.engine.core
    assert core is not None
    running = 'vllm:num_requests_running{engine="0",model_name="tiny"}'
    usage = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"}'
    abort = 'vllm:request_success_total{engine="0",finished_reason="abort"'
    try:
        async with http_client(timeout=30.0) as client:
            body = b'{"prompt": "hello", "max_tokens": 2000, "ignore_eos": true}'
            port = httpx.URL(url).port
            assert port is not None
            # a raw connection, so that "the client hangs up" is exactly a closed socket
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()

            async def started() -> bool:
                return await metric(client, url, running) == 1

            await async_wait_until(started, 10.0, message="the request to run")
            writer.close()  # the client hangs up before the answer
            await writer.wait_closed()

            async def aborted() -> bool:
                return await metric(client, url, running) == 0

            await async_wait_until(aborted, 10.0, message="num_requests_running back to 0")
            assert await metric(client, url, usage) == 0.0  # its blocks are free
            finished = core.stats().request_success
            assert finished.get("abort") == 1 and finished.get("length", 0) == 0
            assert not core.has_unfinished()
            assert await metric(client, url, abort) == 0  # as vLLM: client aborts not counted
    finally:
        await server.stop()


async def test_many_engines_share_one_process() -> None:
    servers = [SimServer(settings(kv_transport="none", num_blocks=64)) for _ in range(12)]
    try:
        urls = await asyncio.gather(*(s.start() for s in servers))
        async with http_client(timeout=30.0) as client:
            rs = await asyncio.gather(
                *(
                    client.post(f"{u}/v1/completions", json={"prompt": "hi", "max_tokens": 3})
                    for u in urls
                )
            )
        assert [r.status_code for r in rs] == [200] * len(servers)
        assert len({r.json()["choices"][0]["text"] for r in rs}) == 1  # same prompt, same text
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


def test_cli_prints_one_ready_line_and_stops_on_sigint() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pdorch.cli import main; main()",
            "engine",
            "sim",
            "--port",
            "0",
            "--kv-transport",
            "none",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("ready http://127.0.0.1:") and line.endswith("\n")
        url = line.split()[1]
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 10.0, message="health")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert proc.stdout.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_reset_prefix_cache_publishes_all_blocks_cleared_at_next_step(tmp_path: Any) -> None:
    import msgspec
    import zmq
    import zmq.asyncio

    endpoint = f"ipc://{tmp_path}/ev"
    server = SimServer(settings(kv_transport="none", kv_events_endpoint=endpoint))
    await server.start()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        async with http_client(timeout=30.0) as client:
            seen: list[str] = []

            async def got(kind: str) -> bool:
                await client.post(
                    f"{server.url}/v1/completions", json={"prompt": prompt(), "max_tokens": 1}
                )
                while await sub.poll(10):
                    _, _, payload = await sub.recv_multipart()
                    seen.extend(e["type"] for e in msgspec.msgpack.decode(payload)[1])
                return kind in seen

            await async_wait_until(lambda: got("BlockStored"), 10.0, message="BlockStored")
            assert (await client.post(f"{server.url}/reset_prefix_cache")).status_code == 200
            await async_wait_until(
                lambda: got("AllBlocksCleared"), 10.0, message="AllBlocksCleared"
            )
    finally:
        sub.close(0)
        ctx.term()
        await server.stop()


def start_sim_process(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from pdorch.cli import main; main()", "engine", "sim", "--port",
         "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def test_hung_prefill_side_gives_500_within_the_load_timeout() -> None:
    """A SIGSTOPped prefill engine (a real process) neither answers nor disconnects: the decode
    leg must still end, with 500, after `kv_load_timeout_s`."""
    proc = start_sim_process("--kv-transport", "tcp", "--block-size", "32", "--time-scale", "0.01")
    decode = SimServer(settings(kv_load_timeout_s=1.0))
    try:
        assert proc.stdout is not None
        prefill_url = (await asyncio.to_thread(proc.stdout.readline)).decode().split()[1]
        await decode.start()
        async with http_client(timeout=30.0) as client:
            body, params = await prefill_leg(client, prefill_url, prompt())
            proc.send_signal(signal.SIGSTOP)
            started = asyncio.get_running_loop().time()
            r = await client.post(
                f"{decode.url}/v1/completions", json={**body, "kv_transfer_params": params.wire()}
            )
            waited = asyncio.get_running_loop().time() - started
            assert r.status_code == 500, r.text
            assert 0.9 <= waited < 10.0
            assert (await client.get(f"{decode.url}/health")).status_code == 200
    finally:
        await decode.stop()
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


async def test_decode_side_kv_pages_are_touched_at_start() -> None:
    """The pool KV is READ into (decode/both) is written once at start, so the first transfer
    does not page-fault; a prefill-only engine leaves its pages untouched (memory)."""
    pool_bytes = 16384 * 4096  # 64 MiB of KV memory
    warm = SimServer(settings(num_blocks=64))  # imports and first-use allocations first
    await warm.start()
    await warm.stop()
    grown: dict[str, int] = {}
    for role in ("prefill", "decode"):
        server = SimServer(settings(role=role, num_blocks=16384, kv_block_bytes=4096))
        before = _rss_bytes()
        await server.start()
        try:
            grown[role] = _rss_bytes() - before
        finally:
            await server.stop()
    assert grown["decode"] >= pool_bytes * 0.9, grown
    assert grown["prefill"] < pool_bytes * 0.5, grown


@pytest.mark.unit
def test_touching_is_capped_to_the_leading_blocks() -> None:
    """Pools are sized like the GPU's (GiBs for small models): only the leading blocks, the
    ones handed out first, are touched."""
    assert KV_TOUCH_MAX_BYTES == 256 * 1024 * 1024
    blocks = np.empty((1024, 64 * 1024), dtype=np.uint8)  # 64 MiB, untouched
    before = _rss_bytes()
    assert touch_decode_pages(blocks, max_bytes=16 * 1024 * 1024) == 16 * 1024 * 1024
    grown = _rss_bytes() - before
    assert 15 * 1024 * 1024 <= grown < 32 * 1024 * 1024, grown
    assert not blocks[:256].any()  # the first 256 blocks (16 MiB) are written


async def test_return_token_ids_as_vllm_sends_them_and_a_continuation_goes_on_alike() -> None:
    server = SimServer(settings(kv_transport="none"))
    await server.start()
    try:
        async with http_client(base_url=url_of(server), timeout=30.0) as client:
            base = {"prompt": "hello there", "max_tokens": 8, "return_token_ids": True}
            whole = (await client.post("/v1/completions", json=base)).json()["choices"][0]
            prompt, out = whole["prompt_token_ids"], whole["token_ids"]
            assert len(out) == 8 and prompt
            stream = await client.post("/v1/completions", json={**base, "stream": True})
            chunks = [
                json.loads(line[len("data: ") :])
                for line in stream.text.split("\n\n")
                if line.startswith("data: {")
            ]
            assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
            assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
            assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == out
            # prompt + the first 3 outputs as a prompt: the same next 5 tokens
            more = {**base, "prompt": prompt + out[:3], "max_tokens": 5}
            cont = (await client.post("/v1/completions", json=more)).json()["choices"][0]
            assert cont["token_ids"] == out[3:]
            chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            chat_ids = {**chat, "max_tokens": 2, "return_token_ids": True}
            answer = await client.post("/v1/chat/completions", json=chat_ids)
            opening = answer.text.split("\n\n")[0]
            assert json.loads(opening[len("data: ") :])["prompt_token_ids"]
            no_ids = {**base, "stream": True, "return_token_ids": False}
            plain = (await client.post("/v1/completions", json=no_ids)).text
            assert "token_ids" not in plain  # bytes unchanged without the flag
    finally:
        await server.stop()
