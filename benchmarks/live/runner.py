"""Drive a workload against an OpenAI endpoint in real time.

Scheduling (the contract in `benchmarks/workloads/API.md`):
- open-loop sessions start turn 0 at `start_s` seconds after the run starts (already divided by
  `rate_scale` by the loader);
- closed-loop sessions (`start_s is None`) start in list order whenever fewer than the cap are
  active; the cap is `concurrency` if given, else `Workload.concurrency`, else unbounded;
- `concurrency`, when given, also caps open-loop sessions: an arrival waits for a free slot
  (like `--max-concurrency` in vLLM's benchmark);
- turn k > 0 is sent `think_time_s` after turn k-1 completes; a session stops at its first
  failed turn (later turns would resend the same, growing context);
- with `carry_context`, the prompt is the rendered context (`text.py`), not the text the server
  generated, so every run sends identical prompts.

Termination is guaranteed: no request starts after `duration_s` or after `max_requests` have
been started; at `duration_s` the requests still in flight are cancelled (counted as
`cancelled`, not as errors); every request has `request_timeout_s`. Without `duration_s` the
run ends when the workload (or `max_requests`) is done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from benchmarks.live.client import RequestResult, stream_request
from benchmarks.workloads.model import SessionSpec, Workload
from benchmarks.workloads.text import chat_messages, completion_prompt, completion_token_ids
from pools.http_client import client_limits, http_client

__all__ = ["LiveConfig", "LiveRun", "run_workload"]

Api = Literal["chat", "completions"]


@dataclass(slots=True)
class LiveConfig:
    """How to drive the endpoint (see the module docstring for the semantics)."""

    base_url: str
    model: str
    api: Api = "chat"
    concurrency: int | None = None
    duration_s: float | None = None
    max_requests: int | None = None
    request_timeout_s: float = 600.0
    ignore_eos: bool = True
    """Send vLLM's `ignore_eos` so each request generates exactly `output_tokens`."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: bool = False
    """Completions only: send each prompt as token ids (`text.completion_token_ids`, exactly the
    workload's prompt tokens) instead of rendered text."""


@dataclass(slots=True)
class LiveRun:
    """Everything measured: one result per started request, and the wall time of the run."""

    results: list[RequestResult]
    wall_s: float
    planned_requests: int


def endpoint_url(base_url: str, api: Api) -> str:
    """`{base}/v1/chat/completions` or `{base}/v1/completions` (base may end in `/v1`)."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/chat/completions" if api == "chat" else f"{base}/completions"


def build_payload(cfg: LiveConfig, session: SessionSpec, turn: int) -> dict[str, Any]:
    """The JSON body of one streaming request."""
    spec = session.turns[turn]
    body: dict[str, Any] = {
        "model": cfg.model,
        "max_tokens": spec.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.api == "chat":
        body["messages"] = chat_messages(session, turn)
    elif cfg.prompt_token_ids:
        body["prompt"] = completion_token_ids(session, turn)
    else:
        body["prompt"] = completion_prompt(session, turn)
    body.update(cfg.extra_body)
    return body


class _Budget:
    """Counts started requests; closes the door at `max_requests` or the deadline."""

    def __init__(self, max_requests: int | None, deadline: float | None) -> None:
        self.max_requests = max_requests
        self.deadline = deadline
        self.started = 0
        self.closed = asyncio.Event()

    def take(self) -> bool:
        if self.closed.is_set():
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            self.closed.set()
            return False
        if self.max_requests is not None and self.started >= self.max_requests:
            self.closed.set()
            return False
        self.started += 1
        if self.max_requests is not None and self.started >= self.max_requests:
            self.closed.set()
        return True

    async def wait_or_closed(self, delay: float) -> bool:
        """Sleep `delay` seconds; True if the door closed meanwhile."""
        if delay <= 0:
            return self.closed.is_set()
        try:
            await asyncio.wait_for(self.closed.wait(), timeout=delay)
        except TimeoutError:
            return False
        return True


async def run_workload(
    workload: Workload,
    cfg: LiveConfig,
    *,
    on_result: Callable[[RequestResult], None] | None = None,
    client: httpx.AsyncClient | None = None,
) -> LiveRun:
    """Run `workload` against `cfg.base_url` and return every request's measurements."""
    url = endpoint_url(cfg.base_url, cfg.api)
    results: list[RequestResult] = []
    tasks: set[asyncio.Task[None]] = set()
    cap = cfg.concurrency if cfg.concurrency is not None else workload.concurrency
    slots = asyncio.Semaphore(cap) if cap is not None else None
    open_capped = cfg.concurrency is not None
    own_client = client is None
    http = client or http_client(
        trust_env=False,  # never route load through an environment proxy
        timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0),
        limits=client_limits(max_connections=None, max_keepalive_connections=64),
    )
    # The clock starts after the client exists: building it (TLS context) takes a while.
    origin = time.perf_counter()
    deadline = origin + cfg.duration_s if cfg.duration_s is not None else None
    budget = _Budget(cfg.max_requests, deadline)

    async def run_session(session: SessionSpec, slot_held: bool) -> None:
        try:
            for k, turn in enumerate(session.turns):
                if k > 0 and await budget.wait_or_closed(turn.think_time_s):
                    return
                if not budget.take():
                    return
                result = RequestResult(session.session_id, k, session.group, 0.0)
                result.expected_output_tokens = turn.output_tokens
                result.expected_prompt_tokens = session.prompt_tokens(k)
                results.append(result)
                try:
                    await stream_request(
                        http,
                        url,
                        build_payload(cfg, session, k),
                        result,
                        clock_origin=origin,
                        timeout_s=cfg.request_timeout_s,
                    )
                finally:
                    if on_result is not None:
                        on_result(result)
                if result.error is not None:
                    return
        finally:
            if slot_held and slots is not None:
                slots.release()

    async def acquire_slot() -> bool:
        """Wait for a session slot; False (holding nothing) if the run closes first."""
        assert slots is not None
        acquire = asyncio.ensure_future(slots.acquire())
        closed = asyncio.ensure_future(budget.closed.wait())
        try:
            await asyncio.wait({acquire, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if acquire.done() and not acquire.cancelled():
            if budget.closed.is_set():
                slots.release()
                return False
            return True
        acquire.cancel()
        return False

    async def start_when_slot(session: SessionSpec) -> None:
        if await acquire_slot():
            await run_session(session, True)

    def spawn(coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        tasks.add(task)

    async def feed_open(sessions: list[SessionSpec]) -> None:
        for s in sessions:
            assert s.start_s is not None
            delay = origin + s.start_s - time.perf_counter()
            if await budget.wait_or_closed(delay):
                return
            spawn(start_when_slot(s) if open_capped and slots else run_session(s, False))

    async def feed_closed(sessions: list[SessionSpec]) -> None:
        for s in sessions:
            if slots is not None:
                if not await acquire_slot():
                    return
            elif budget.closed.is_set():
                return
            spawn(run_session(s, slots is not None))

    open_sessions = sorted(
        (s for s in workload.sessions if s.start_s is not None),
        key=lambda s: s.start_s or 0.0,
    )
    closed_sessions = [s for s in workload.sessions if s.start_s is None]

    async def run_all() -> None:
        await asyncio.gather(feed_open(open_sessions), feed_closed(closed_sessions))
        while tasks:
            pending = [t for t in tasks if not t.done()]
            if not pending:
                break
            await asyncio.gather(*pending)

    try:
        if deadline is None:
            await run_all()
        else:
            main = asyncio.create_task(run_all())
            try:
                await asyncio.wait_for(asyncio.shield(main), timeout=deadline - origin)
            except TimeoutError:
                budget.closed.set()
                main.cancel()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(main, *tasks, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if own_client:
            await http.aclose()
    wall = time.perf_counter() - origin
    planned = workload.num_requests
    if cfg.max_requests is not None:
        planned = min(planned, cfg.max_requests)
    return LiveRun(results=results, wall_s=wall, planned_requests=planned)
