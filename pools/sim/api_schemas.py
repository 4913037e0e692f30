"""Request schemas of the simulated engine's OpenAI server (the subset of vLLM's it honours).

Field names, defaults and bounds follow vLLM 0.32's `CompletionRequest`, `ChatCompletionRequest`
and `TokenizeRequest`; unknown fields are accepted and ignored, as vLLM does. Validation errors
become vLLM's 400 `{"error": {"message", "type": "Bad Request", "param", "code": 400}}`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pools.sim.api_logprobs import MAX_LOGPROBS
from transfer.params import KvTransferParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _SamplingFields(BaseModel):
    """Sampling parameters shared by completions and chat (simulated: only `seed` matters)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, description="Choices (vLLM's parallel sampling: a request each).")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    kv_transfer_params: KvTransferParams | None = None
    request_id: str | None = None
    # vLLM's: the prompt's ids (first chunk / the answer) and each choice's output ids
    return_token_ids: bool | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TokenizeRequest(BaseModel):
    """vLLM's `/tokenize`: either `prompt` (completion form) or `messages` (chat form)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeRequest(BaseModel):
    """vLLM's `/detokenize`: token ids back to text."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[int]
