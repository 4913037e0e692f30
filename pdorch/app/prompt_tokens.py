"""The prompt's token ids for routing, in the fleet's tokenizer mode, never failing a request.

Modes (`tokenizer:` in the fleet file, `router/tokenization.py`): `hf` (the model's tokenizer
and chat template, in process), `engine` (an engine's `POST /tokenize`, LRU-cached), `chars`
(pseudo tokens for the approximate index). In `engine` mode without an `engine_url`, the
coordinator asks a *routable* replica (decode, then colocated, then prefill), so a dead engine
does not take tokenization down with it.

Tokens only steer routing; the engines tokenize for themselves. So when tokenization fails
the request is still served: routing then sees an estimated length (`len(text) // 4`) and no
block keys (load-only routing), and the failure is counted (`failures`).

A hung engine (SIGSTOP: no reset, no FIN) would hold every request tokenizing on it for the
whole HTTP timeout (`timeout_s`, 10 s) before its first byte, though the health checker ejects
it within a second (issue 14: the 10-13 s waits of the SIGSTOP chaos scenario). So the
coordinator calls `hang_up(url)` when an engine turns unhealthy: its waiting calls end at once
as failed tokenizations (the requests go on, routed by load).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from pdorch.app.openai_schema import ParsedRequest
from router.tokenization import (
    EnginePromptTokenizer,
    PromptTokenizer,
    TokenizationConfig,
    TokenizerMode,
    make_tokenizer,
)

log = logging.getLogger(__name__)


class PromptTokens:
    """Tokenizes prompts for routing; `engine_urls()` lists routable engine URLs."""

    def __init__(
        self,
        config: TokenizationConfig | None,
        client: httpx.AsyncClient,
        engine_urls: Callable[[], list[str]],
        *,
        engine_cache_size: int = 4096,
        engine_timeout_s: float = 10.0,
        model: str | None = None,
    ) -> None:
        self._client = client
        self._engine_urls = engine_urls
        self._cache_size = engine_cache_size
        self._timeout_s = engine_timeout_s
        self._model = model
        self._fixed: PromptTokenizer | None = None
        self._by_url: dict[str, EnginePromptTokenizer] = {}
        self.failures = 0
        self._waiting: dict[str, set[asyncio.Timeout]] = {}  # engine url → calls waiting on it
        if config is not None:
            self._cache_size = config.cache_size
            self._timeout_s = config.timeout_s
            self._model = config.model or model
            if config.mode is not TokenizerMode.ENGINE or config.engine_url is not None:
                self._fixed = make_tokenizer(config, client=client)

    @property
    def mode(self) -> str:
        return self._fixed.mode.value if self._fixed is not None else TokenizerMode.ENGINE.value

    def _tokenizer(self) -> PromptTokenizer | None:
        if self._fixed is not None:
            return self._fixed
        urls = self._engine_urls()
        if not urls:
            return None
        url = urls[0]
        tokenizer = self._by_url.get(url)
        if tokenizer is None:
            tokenizer = EnginePromptTokenizer(
                url,
                self._model,
                cache_size=self._cache_size,
                timeout_s=self._timeout_s,
                client=self._client,
            )
            self._by_url[url] = tokenizer
        return tokenizer

    def hang_up(self, url: str) -> int:
        """End the calls waiting on the engine at `url` (it turned unhealthy: module doc);
        they fail as tokenizations do. Returns how many."""
        waiting = self._waiting.pop(url.rstrip("/"), set())
        for hung in waiting:
            hung.reschedule(0)  # in the past: the call is cancelled at once
        return len(waiting)

    def forget(self, url: str) -> None:
        """Drop the cached tokenizer of an engine that left the fleet."""
        self._by_url.pop(url, None)

    async def tokens(self, request: ParsedRequest) -> list[int] | None:
        """The prompt's token ids, or None when they cannot be had (see the module doc)."""
        if request.kind == "completion" and isinstance(request.prompt, list):
            return request.prompt
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return None
        url = tokenizer.engine_url if isinstance(tokenizer, EnginePromptTokenizer) else ""
        try:
            async with asyncio.timeout(None) as hung:
                waiting = self._waiting.setdefault(url, set())
                waiting.add(hung)
                try:
                    if request.kind == "chat":
                        assert request.messages is not None
                        return await tokenizer.encode_chat(
                            request.messages, chat_template_kwargs=request.chat_template_kwargs
                        )
                    assert isinstance(request.prompt, str)
                    return await tokenizer.encode_completion(request.prompt)
                finally:
                    waiting.discard(hung)
                    if not waiting:
                        self._waiting.pop(url, None)
        except Exception as exc:  # routing degrades to load-only; the request goes on
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.warning("tokenization failed (%d so far): %r", self.failures, exc)
            return None

    async def aclose(self) -> None:
        if self._fixed is not None:
            await self._fixed.aclose()
        for tokenizer in self._by_url.values():
            await tokenizer.aclose()
        self._by_url.clear()
