"""Tokenization the way the engine sees it, so the router's block keys match the engine's blocks.

The precise KV index holds keys computed from the token ids engines *cached*; if the router
tokenizes a prompt differently (another tokenizer, a missing BOS, a different chat rendering)
every key differs from the first block on, and routing silently degrades to load-only (the
:mod:`router.hash_match_monitor` reports that). Three modes (``TokenizationConfig.mode``):

* ``hf`` (default) -- the model's own tokenizer and chat template from its directory
  (transformers ``AutoTokenizer``). Chat: ``apply_chat_template(messages, tokenize=False,
  add_generation_prompt=True, **chat_template_kwargs)`` then ``encode(text,
  add_special_tokens=False)`` -- vLLM's rendering (its chat ``add_special_tokens`` defaults to
  False: the template brings BOS). Message content given as a list of parts is joined by
  ``"\\n"`` over its text parts, as vLLM does for string-content templates. Completions:
  ``encode(prompt, add_special_tokens=True)`` -- BOS (and EOS if the tokenizer config says so)
  exactly as the tokenizer adds them, vLLM's default for ``/v1/completions``. Exact for text
  models; use ``engine`` for templates that take structured content or tools the router does
  not pass.
* ``engine`` -- the engine's own ``POST /tokenize`` (vLLM: ``{"model", "prompt"}`` or
  ``{"model", "messages", "add_generation_prompt": true}`` -> ``{"tokens": [...]}``) over async
  httpx; always what the engine does, at one HTTP round trip per *new* prompt. Results are kept
  in an LRU of ``cache_size`` entries (default 4096) keyed by the blake2b-128 digest of the
  request body.
* ``chars`` -- no tokenizer: the text (chat: ``role + "\\n" + content + "\\n"`` per message)
  is cut into chunks of ``chars_per_token`` characters (default 4, roughly English BPE) and
  each chunk becomes the pseudo token ``xxh3_64(chunk) & 0x7fffffff``. Equal text prefixes give
  equal keys, so it serves :class:`router.approx_index.ApproxKvIndex` (routing history), and
  ``len(tokens)`` approximates the prompt length; its keys never match engine events.

Public API (stable): :class:`TokenizationConfig`, :class:`TokenizerMode`,
:class:`PromptTokenizer` (protocol: ``encode_chat``, ``encode_completion``, ``aclose``),
:class:`HfPromptTokenizer`, :class:`EnginePromptTokenizer`, :class:`CharsPromptTokenizer`,
:func:`make_tokenizer`, :class:`TokenizationError`.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator
from xxhash import xxh3_64_intdigest

Message = Mapping[str, Any]


class TokenizationError(RuntimeError):
    """The prompt could not be tokenized (template error, engine error, bad reply)."""


class TokenizerMode(StrEnum):
    HF = "hf"
    ENGINE = "engine"
    CHARS = "chars"


class TokenizationConfig(BaseModel):
    """How the router turns a request into token ids (see module doc for each mode)."""

    model_config = ConfigDict(extra="forbid")

    mode: TokenizerMode = Field(default=TokenizerMode.HF, description="hf | engine | chars")
    model_dir: Path | None = Field(
        default=None, description="hf: the model directory (tokenizer files)"
    )
    engine_url: str | None = Field(
        default=None, description="engine: base URL, e.g. http://host:8000"
    )
    model: str | None = Field(
        default=None, description="engine: the served model name sent to /tokenize"
    )
    cache_size: int = Field(default=4096, ge=0, description="engine: LRU entries (0 disables)")
    timeout_s: float = Field(default=10.0, gt=0, description="engine: HTTP timeout per call")
    chars_per_token: int = Field(default=4, ge=1, description="chars: characters per pseudo token")

    @model_validator(mode="after")
    def _check_mode(self) -> TokenizationConfig:
        if self.mode is TokenizerMode.HF and self.model_dir is None:
            raise ValueError("model_dir: required when mode is 'hf'")
        if self.mode is TokenizerMode.ENGINE and self.engine_url is None:
            raise ValueError("engine_url: required when mode is 'engine'")
        return self


class PromptTokenizer(Protocol):
    mode: TokenizerMode

    async def encode_chat(
        self, messages: Sequence[Message], *, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]: ...

    async def encode_completion(self, prompt: str) -> list[int]: ...

    async def aclose(self) -> None: ...


def _content_text(content: Any) -> Any:
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and part.get("type", "text") == "text"
        )
    return content


class HfPromptTokenizer:
    """The model's own tokenizer + chat template (transformers), rendered as vLLM renders."""

    mode = TokenizerMode.HF

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> HfPromptTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def encode_chat_sync(
        self, messages: Sequence[Message], *, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        conversation = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=True,
                **dict(chat_template_kwargs or {}),
            )
        except Exception as exc:
            raise TokenizationError(f"chat template failed: {exc}") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_completion_sync(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    async def encode_chat(
        self, messages: Sequence[Message], *, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        # Fast (Rust) tokenizers take ~1 ms for thousands of tokens: inline beats a thread hop.
        return self.encode_chat_sync(messages, chat_template_kwargs=chat_template_kwargs)

    async def encode_completion(self, prompt: str) -> list[int]:
        return self.encode_completion_sync(prompt)

    async def aclose(self) -> None:
        return None


class EnginePromptTokenizer:
    """The engine's ``POST /tokenize``, LRU-cached by request digest."""

    mode = TokenizerMode.ENGINE

    def __init__(
        self,
        engine_url: str,
        model: str | None = None,
        *,
        cache_size: int = 4096,
        timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.model = model
        self.cache_size = cache_size
        self.hits = 0
        self.misses = 0
        # expire pooled connections before the engine's 5 s keep-alive close (a request on a
        # connection the server is just closing fails with ReadError; pools/http_client.py)
        self._client = (
            client
            if client is not None
            else httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(keepalive_expiry=4.0))
        )
        self._own_client = client is None
        self._cache: OrderedDict[bytes, list[int]] = OrderedDict()

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        if self.model is not None:
            body["model"] = self.model
        digest = hashlib.blake2b(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), digest_size=16
        ).digest()
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
            self.hits += 1
            return list(cached)
        self.misses += 1
        try:
            resp = await self._client.post(f"{self.engine_url}/tokenize", json=body)
        except httpx.HTTPError as exc:
            raise TokenizationError(f"/tokenize at {self.engine_url} failed: {exc}") from exc
        if resp.status_code != 200:
            raise TokenizationError(
                f"/tokenize at {self.engine_url} answered {resp.status_code}: {resp.text[:200]}"
            )
        tokens = resp.json().get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise TokenizationError(f"/tokenize at {self.engine_url}: no token list in reply")
        if self.cache_size > 0:
            self._cache[digest] = tokens
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return list(tokens)

    async def encode_chat(
        self, messages: Sequence[Message], *, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        body: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": True,
        }
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        return await self._tokenize(body)

    async def encode_completion(self, prompt: str) -> list[int]:
        return await self._tokenize({"prompt": prompt})

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


class CharsPromptTokenizer:
    """Character-chunk pseudo tokens (see module doc): for the approximate index only."""

    mode = TokenizerMode.CHARS

    def __init__(self, chars_per_token: int = 4) -> None:
        if chars_per_token < 1:
            raise ValueError("chars_per_token must be >= 1")
        self.chars_per_token = chars_per_token

    def encode_text(self, text: str) -> list[int]:
        """Token i = xxh3_64 of the UTF-8 bytes of characters [i*k, (i+1)*k), masked to 31 bits.

        ASCII text (one byte per character) is encoded once and sliced as bytes: the same
        chunks, without a str slice and an encode per token (proxy-9)."""
        k = self.chars_per_token
        if text.isascii():
            data = text.encode("ascii")
            return [xxh3_64_intdigest(data[i : i + k]) & 0x7FFFFFFF for i in range(0, len(data), k)]
        return [
            xxh3_64_intdigest(text[i : i + k].encode("utf-8")) & 0x7FFFFFFF
            for i in range(0, len(text), k)
        ]

    async def encode_chat(
        self, messages: Sequence[Message], *, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        text = "".join(
            f"{m.get('role', '')}\n{_content_text(m.get('content')) or ''}\n" for m in messages
        )
        return self.encode_text(text)

    async def encode_completion(self, prompt: str) -> list[int]:
        return self.encode_text(prompt)

    async def aclose(self) -> None:
        return None


def make_tokenizer(
    config: TokenizationConfig, *, client: httpx.AsyncClient | None = None
) -> PromptTokenizer:
    """Build the tokenizer ``config`` names (``hf`` loads the tokenizer files now)."""
    if config.mode is TokenizerMode.HF:
        assert config.model_dir is not None
        return HfPromptTokenizer.from_dir(config.model_dir)
    if config.mode is TokenizerMode.ENGINE:
        assert config.engine_url is not None
        return EnginePromptTokenizer(
            config.engine_url,
            config.model,
            cache_size=config.cache_size,
            timeout_s=config.timeout_s,
            client=client,
        )
    return CharsPromptTokenizer(config.chars_per_token)
