"""One streaming OpenAI request, timed: TTFT, inter-token latencies, output tokens, errors.

Timing rules (the same as vLLM's `benchmark_serving` and guidellm):
- TTFT = first SSE chunk that carries generated text - request start.
- ITL = gaps between successive text-carrying chunks (a chunk holding several tokens counts
  as one gap, so ITL is per chunk; TPOT below is per token).
- TPOT = (end - first token) / (output tokens - 1), output tokens from the final
  `usage.completion_tokens` (`stream_options.include_usage`), else the chunk count.
- A stream that ends without `data: [DONE]`, a non-200 status, an `error` object in the
  stream, or a transport error is an error (with its message), never a silent success.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

__all__ = ["RequestResult", "stream_request"]

_decode = msgspec.json.Decoder().decode


@dataclass(slots=True)
class RequestResult:
    """What one request measured (times in seconds, relative to the run start)."""

    session_id: str
    turn: int
    group: str | None
    start_s: float
    end_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    expected_output_tokens: int = 0
    expected_prompt_tokens: int = 0
    """Planned prompt length (workload tokens); compare with the server's `prompt_tokens`."""
    error: str | None = None
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.end_s - self.start_s - self.ttft_s) / (self.output_tokens - 1)


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    result: RequestResult,
    *,
    clock_origin: float,
    timeout_s: float,
) -> RequestResult:
    """POST `payload` with `stream: true` to `url`, filling `result` as chunks arrive."""
    chunks = 0
    last_token_at: float | None = None
    done = False
    t_start = time.perf_counter()
    result.start_s = t_start - clock_origin
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=payload) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    result.error = f"HTTP {response.status_code}: {_error_message(body)}"
                    return result
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = _decode(data)
                    if not isinstance(chunk, dict):
                        continue
                    if "error" in chunk:
                        result.error = f"stream error: {_error_message(chunk)}"
                        return result
                    now = time.perf_counter()
                    if _chunk_text(chunk):
                        chunks += 1
                        if last_token_at is None:
                            result.ttft_s = now - t_start
                        else:
                            result.itl_s.append(now - last_token_at)
                        last_token_at = now
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        if isinstance(usage.get("completion_tokens"), int):
                            result.output_tokens = usage["completion_tokens"]
                        if isinstance(usage.get("prompt_tokens"), int):
                            result.prompt_tokens = usage["prompt_tokens"]
        if not done:
            result.error = "stream ended without [DONE] (truncated)"
        elif result.output_tokens == 0:
            result.output_tokens = chunks
    except asyncio.CancelledError:
        result.cancelled = True
        raise
    except TimeoutError:
        result.error = f"timed out after {timeout_s:g}s"
    except (httpx.HTTPError, msgspec.DecodeError, OSError) as err:
        result.error = f"{type(err).__name__}: {err}"
    except Exception as err:  # a load generator records a bad response; it never dies of one
        result.error = f"unexpected {type(err).__name__}: {err}"
    finally:
        result.end_s = time.perf_counter() - clock_origin
    return result


def _chunk_text(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for c in choices:
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
            return True
        if c.get("text"):
            return True
    return False


def _error_message(body: str | dict[str, Any]) -> str:
    obj: Any = body
    if isinstance(body, str):
        try:
            obj = _decode(body)
        except msgspec.DecodeError:
            return body[:300]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
        return str(err)[:300]
    return str(obj)[:300]
