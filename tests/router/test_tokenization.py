"""Tokenization modes: the model's own tokenizer (tiny model), an HTTP /tokenize, characters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from xxhash import xxh3_64_intdigest

from pools.http_client import http_client
from router.tokenization import (
    CharsPromptTokenizer,
    EnginePromptTokenizer,
    HfPromptTokenizer,
    TokenizationConfig,
    TokenizationError,
    TokenizerMode,
    make_tokenizer,
)
from tests.ports import free_port
from tests.threaded_server import ThreadedHttpServer

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HfPromptTokenizer:
    tok = make_tokenizer(TokenizationConfig(mode=TokenizerMode.HF, model_dir=tiny_model_dir))
    assert isinstance(tok, HfPromptTokenizer)
    return tok


async def test_hf_chat_renders_the_template_with_a_generation_prompt(hf: HfPromptTokenizer) -> None:
    ids = await hf.encode_chat(MESSAGES)
    t = hf.tokenizer
    text = t.decode(ids)
    assert text.startswith(t.bos_token)
    assert text.count(t.bos_token) == 1  # the template brings BOS; no second one
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "Name three colours." in text
    expected = t.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ids == t.encode(expected, add_special_tokens=False)


async def test_hf_chat_joins_text_parts_like_vllm(hf: HfPromptTokenizer) -> None:
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    plain = [{"role": "user", "content": "a\nb"}]
    assert await hf.encode_chat(parts) == await hf.encode_chat(plain)


async def test_hf_completion_adds_bos_per_tokenizer_config(hf: HfPromptTokenizer) -> None:
    ids = await hf.encode_completion("hello world")
    t = hf.tokenizer
    assert ids[0] == t.bos_token_id
    assert ids[1:] == t.encode("hello world", add_special_tokens=False)


async def test_hf_template_errors_are_typed(hf: HfPromptTokenizer) -> None:
    with pytest.raises(TokenizationError):
        await hf.encode_chat(
            [{"role": "user"}], chat_template_kwargs={"chat_template": "{{ x.y.z }}"}
        )


class FakeTokenizeEngine:
    """An HTTP server answering vLLM's ``POST /tokenize`` with the tiny model's tokenizer
    (stands in for an engine in this unit test; the e2e test uses a real vLLM)."""

    def __init__(self, tokenizer: HfPromptTokenizer) -> None:
        app = FastAPI()
        self.calls: list[dict[str, Any]] = []

        @app.post("/tokenize")
        async def tokenize(request: Request) -> JSONResponse:
            body = await request.json()
            self.calls.append(body)
            if body.get("prompt") == "explode":
                return JSONResponse({"error": "boom"}, status_code=500)
            if "messages" in body:
                tokens = tokenizer.encode_chat_sync(body["messages"])
            else:
                tokens = tokenizer.encode_completion_sync(body["prompt"])
            return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": 1024})

        self.server = ThreadedHttpServer(app)

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> FakeTokenizeEngine:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def fake_engine(hf: HfPromptTokenizer) -> Iterator[FakeTokenizeEngine]:
    with FakeTokenizeEngine(hf) as server:
        yield server


@pytest.mark.integration
async def test_engine_mode_asks_tokenize_and_caches(
    hf: HfPromptTokenizer, fake_engine: FakeTokenizeEngine
) -> None:
    tok = make_tokenizer(
        TokenizationConfig(
            mode=TokenizerMode.ENGINE, engine_url=fake_engine.url, model="tiny", cache_size=2
        )
    )
    assert isinstance(tok, EnginePromptTokenizer)
    try:
        before = len(fake_engine.calls)
        assert await tok.encode_chat(MESSAGES) == await hf.encode_chat(MESSAGES)
        assert await tok.encode_completion("hi there") == await hf.encode_completion("hi there")
        assert await tok.encode_chat(MESSAGES) == await hf.encode_chat(MESSAGES)  # cached
        assert len(fake_engine.calls) - before == 2
        assert tok.hits == 1 and tok.misses == 2
        chat_call = fake_engine.calls[before]
        assert chat_call["model"] == "tiny" and chat_call["add_generation_prompt"] is True
        await tok.encode_completion("x")
        await tok.encode_completion("y")  # LRU of 2: the chat entry is gone
        await tok.encode_chat(MESSAGES)
        assert tok.misses == 5
        with pytest.raises(TokenizationError):
            await tok.encode_completion("explode")
    finally:
        await tok.aclose()


@pytest.mark.integration
async def test_engine_mode_unreachable_is_a_typed_error() -> None:
    async with http_client(timeout=2.0) as client:
        tok = EnginePromptTokenizer(f"http://127.0.0.1:{free_port()}", client=client)
        with pytest.raises(TokenizationError):
            await tok.encode_completion("x")


async def test_chars_mode_makes_prefix_stable_pseudo_tokens() -> None:
    tok = make_tokenizer(TokenizationConfig(mode=TokenizerMode.CHARS, chars_per_token=4))
    assert isinstance(tok, CharsPromptTokenizer) and tok.mode is TokenizerMode.CHARS
    a = await tok.encode_completion("abcdefghij")
    b = await tok.encode_completion("abcdefgh-different")
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert all(0 <= t < 2**31 for t in a)
    chat = await tok.encode_chat(MESSAGES)
    assert chat == tok.encode_text("system\nYou are terse.\nuser\nName three colours.\n")


@pytest.mark.parametrize("k", [1, 3, 4])
def test_chars_tokens_are_the_hashes_of_character_chunks_ascii_or_not(k: int) -> None:
    """The ASCII fast path (bytes sliced once) and the general one give the documented
    tokens: xxh3_64 of each k-character chunk's UTF-8 bytes, masked to 31 bits."""
    tok = CharsPromptTokenizer(chars_per_token=k)
    for text in ("", "a", "plain ascii prompt, 0123456789 ~", "héllo wörld ✓ 漢字 ", "é" * 7):
        expected = [
            xxh3_64_intdigest(text[i : i + k].encode("utf-8")) & 0x7FFFFFFF
            for i in range(0, len(text), k)
        ]
        assert tok.encode_text(text) == expected  # non-ASCII: byte slices would differ


def test_config_names_the_missing_field() -> None:
    with pytest.raises(ValidationError, match="model_dir"):
        TokenizationConfig(mode=TokenizerMode.HF)
    with pytest.raises(ValidationError, match="engine_url"):
        TokenizationConfig(mode=TokenizerMode.ENGINE)
    with pytest.raises(ValidationError):
        TokenizationConfig(mode=TokenizerMode.CHARS, chars_per_token=0)
