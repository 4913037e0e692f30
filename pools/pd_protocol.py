"""The two-leg prefill/decode protocol of vLLM's NixlConnector, as request bodies and one helper.

A disaggregated request is two ordinary OpenAI requests with the same `X-Request-Id`:

1. prefill leg, to the prefill engine: the client's body forced to a single, non-streamed
   output token (`max_tokens: 1`, and `max_completion_tokens: 1` if the client used it;
   `stream_options` and `min_tokens` removed since they contradict one token; `n: 1`, as the
   prompt's KV is the same for every choice and the decode engine samples the `n`), plus
   `kv_transfer_params = {do_remote_decode: true, ...}` so the engine keeps the prompt's KV
   blocks for a decode engine to pull instead of freeing them;
2. decode leg, to the decode engine: the client's body unchanged plus the
   `kv_transfer_params` the prefill response returned, parsed into `transfer.KvTransferParams`
   and sent back key for key (keys pdorch does not know are kept: vLLM adds keys between
   releases).

The body rewriting is pure and reused by the coordinator; `run_pd_request` is the minimal
non-streaming driver that tests and tools use to exercise a real engine pair.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from transfer.params import KvTransferParams

REQUEST_ID_HEADER = "X-Request-Id"
PREFILL_KV_TRANSFER_PARAMS = KvTransferParams.prefill_request()
# Its wire form, dumped once: every value is a scalar, so a shallow copy per leg is a fresh,
# equal dict without a pydantic `model_dump` per request.
_PREFILL_WIRE: dict[str, Any] = PREFILL_KV_TRANSFER_PARAMS.wire()
# Fields that make no sense for a one-token, non-streamed prefill answer.
_DROPPED_FOR_PREFILL = ("stream_options", "min_tokens")


class PdProtocolError(RuntimeError):
    """A leg failed: the message names the leg, the engine URL, the status and the body."""

    def __init__(self, leg: str, url: str, status: int | None, detail: str) -> None:
        super().__init__(f"{leg} leg to {url} failed (status {status}): {detail}")
        self.leg = leg
        self.url = url
        self.status = status


def new_request_id() -> str:
    """A request id shared by both legs (vLLM's connector matches the legs by it)."""
    return f"pdorch-{uuid.uuid4().hex}"


def prefill_leg_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill engine's body: one non-streamed token, KV kept for a remote decode.

    A shallow copy: only top-level keys are set or dropped, nested values (messages, ...) are
    shared with `body` and never mutated, and the coordinator serializes the leg at once. A deep
    copy of every request body was 2-3% of the proxy's CPU (`benchmarks/results/proxy.md`).
    """
    leg = dict(body)
    leg["stream"] = False
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    if "n" in leg:
        leg["n"] = 1  # one prefill; the decode leg samples the n choices
    for key in _DROPPED_FOR_PREFILL:
        leg.pop(key, None)
    leg["kv_transfer_params"] = dict(_PREFILL_WIRE)
    return leg


def decode_leg_body(
    body: Mapping[str, Any], kv_transfer_params: KvTransferParams
) -> dict[str, Any]:
    """The decode engine's body: the client's request plus the prefill's transfer params."""
    leg = dict(body)  # shallow, as in `prefill_leg_body`
    leg["kv_transfer_params"] = kv_transfer_params.wire()  # a fresh dict per leg
    return leg


def kv_transfer_params_of(response_json: Mapping[str, Any]) -> KvTransferParams:
    """The top-level `kv_transfer_params` of a prefill response; ValueError if absent or bad.

    Absent params mean the engine has no KV connector (or refused the remote decode): the
    decode leg would then silently recompute the prompt, which P/D must not hide.
    """
    raw = response_json.get("kv_transfer_params")
    params = KvTransferParams.parse(raw) if isinstance(raw, dict) else None
    if params is None or not params.do_remote_prefill:
        raise ValueError(
            "prefill response carries no usable kv_transfer_params "
            f"(got {raw!r}); is the engine started with a KV connector?"
        )
    return params


async def run_pd_request(
    client: httpx.AsyncClient,
    *,
    prefill_url: str,
    decode_url: str,
    path: str,
    body: Mapping[str, Any],
    request_id: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Run one non-streaming request disaggregated; return the decode engine's JSON.

    `path` is the OpenAI route (`/v1/completions` or `/v1/chat/completions`). Raises
    `PdProtocolError` when a leg answers non-200 or the prefill returns no transfer params.
    """
    if body.get("stream"):
        raise ValueError("run_pd_request drives non-streaming requests only")
    rid = request_id or new_request_id()
    headers = {REQUEST_ID_HEADER: rid}

    prefill_target = prefill_url.rstrip("/") + path
    response = await client.post(
        prefill_target, json=prefill_leg_body(body), headers=headers, timeout=timeout_s
    )
    if response.status_code != 200:
        raise PdProtocolError("prefill", prefill_target, response.status_code, response.text)
    try:
        params = kv_transfer_params_of(response.json())
    except ValueError as exc:
        raise PdProtocolError("prefill", prefill_target, response.status_code, str(exc)) from exc

    decode_target = decode_url.rstrip("/") + path
    response = await client.post(
        decode_target, json=decode_leg_body(body, params), headers=headers, timeout=timeout_s
    )
    if response.status_code != 200:
        raise PdProtocolError("decode", decode_target, response.status_code, response.text)
    result: dict[str, Any] = response.json()
    return result
