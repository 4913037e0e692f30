"""Issue 16 item 2 under faults: a decode engine process killed mid-stream under a streamed batch
(the prompt on it migrates, the merged stream goes on unbroken) and under `n > 1` (not
migratable: the stream ends with an error event naming `n`, then `[DONE]`). Real engine
processes (simulated engines), the real coordinator, real signals; the `openai` SDK reads the
streams."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import openai

from tests.coordinator.decode_processes import decode_process_fleet, engine_pid
from tests.coordinator.helpers import MODEL, long_prompt


async def _stream(client: openai.AsyncOpenAI, kill: Any | None, **body: Any) -> dict[str, Any]:
    """Stream a completion; after 6 chunks call `kill(decode header)`; texts, usage, errors."""
    texts: dict[int, str] = {}
    usage = None
    raw = await client.completions.with_raw_response.create(model=MODEL, stream=True, **body)
    decode = raw.headers["x-pdorch-decode"]
    chunks = 0
    async for chunk in raw.parse():
        chunks += 1
        if chunks == 6 and kill is not None:
            kill(decode)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = chunk.usage or usage
    return {"texts": texts, "usage": usage}


async def test_streamed_batch_survives_a_decode_engine_killed_mid_stream() -> None:
    async with decode_process_fleet() as (pd, http):
        client = openai.AsyncOpenAI(base_url=f"{pd.url}/v1", api_key="none", max_retries=0)
        body = {
            "prompt": [long_prompt(), long_prompt()],
            "max_tokens": 200,
            "temperature": 0.0,
            "stream_options": {"include_usage": True},
        }
        reference = await _stream(client, None, **body)
        assert set(reference["texts"]) == {0, 1}

        def kill(decode: str) -> None:
            os.kill(engine_pid(pd, decode.split(",")[0]), signal.SIGKILL)

        got = await _stream(client, kill, **body)
        assert got["texts"] == reference["texts"]
        assert got["usage"] is not None and reference["usage"] is not None
        assert got["usage"].completion_tokens == reference["usage"].completion_tokens == 400
        assert got["usage"].prompt_tokens == reference["usage"].prompt_tokens
        metrics = (await http.get("/metrics")).text
        moved = re.findall(
            r'^pdorch_migrations_total\{reason="(?:connection|eof)"\} (\S+)$', metrics, re.M
        )
        assert sum(float(v) for v in moved) >= 1, moved  # the killed engine's prompt moved


async def test_n_choices_stream_ends_with_an_error_naming_n_when_its_engine_dies() -> None:
    async with decode_process_fleet() as (pd, _http):
        client = openai.AsyncOpenAI(base_url=f"{pd.url}/v1", api_key="none", max_retries=0)

        def kill(decode: str) -> None:
            os.kill(engine_pid(pd, decode), signal.SIGKILL)

        try:
            await _stream(client, kill, prompt=long_prompt(), max_tokens=300, n=2, seed=3)
        except openai.APIError as err:  # the SDK raises the stream's error event
            assert "cannot be continued elsewhere (n)" in err.message, err.message
        else:
            raise AssertionError("the stream ended without the error event")
