"""The P/D request flow of one client request (the contract: docs/RUNTIME-FACTS.md, "Protocol").

```
admit (429) → read body (413) → validate (400/404) → tokenize → block keys
→ PdRouter: decode pick, P/D decision, prefill pick (503 when nobody can serve)
→ [disaggregated] prefill leg: max_tokens=1, stream false, do_remote_decode   (X-Request-Id)
      failure (connection, timeout > prefill_timeout_s, 5xx, no params)
      → report_failure, decode prefills locally (the decode leg carries no kv_transfer_params)
→ decode leg with the prefill's kv_transfer_params, same X-Request-Id; wait for its first byte
      failure before the first byte → report_failure, another decode replica (decode_retries);
      the retry reuses kv_transfer_params only when the failed engine never got the request;
      a hung engine is a failure too: a stream with no first byte within first_byte_timeout_s
      (default 2 x stall_timeout_s; only while another decode replica could take it), or any
      leg whose replica the health checker ejects while it waits (`leg_wait.until_first_byte`)
→ stream the decode engine's events (`proxy_stream.py`); a failure after the first byte (dead,
  ended early, or no byte for `stall_timeout_s`) continues the request on another decode replica
  from prompt + the tokens streamed (`migration.py`, up to `migration_limit` times), else ends the
  stream with an OpenAI error event and `data: [DONE]`; a non-streamed answer whose engine died
  mid-answer, or turned unhealthy under it (hung), starts over on another replica
  (`migration_limit` too)
```

The decode legs (tries, retries, a whole answer's migration) are `decode_attempts.py`'s.
A batch of prompts runs one such flow per prompt (`fanout.py`), merged into one answer.

Everything up to the decode leg's first byte runs in one task raced against the client's
disconnect and the whole-request deadline (`request_timeout_s`, 504): a client that leaves
cancels the legs (the upstream connections are closed, the engines abort the requests) and releases
the token load. After the first byte, `ProxyStream` does the same on disconnect.

Routing and token load are `RequestLifecycle`'s (`router/lifecycle.py`, the object the fleet
simulator drives too): this module only sends the legs it plans and tells it what happened:
`admit` → plan; the prefill leg's outcome → `prefill_done(ok)` → the decode leg (with the
prefill's KV params, or the fallback that prefills locally); a decode failure before the first
byte → `decode_failed(reached)` then `retry_decode`; a failure after it → `migrate`; streamed
tokens → `tokens` (one per SSE
`data:` event, vLLM sends one per step, cumulative; the first byte is the first such event);
`finished` at the last byte, `aborted` on any failure or disconnect (always exactly once).

Response headers: `x-request-id` (both legs' id), `x-pdorch-prefill` (the replica that
prefilled: the prefill replica, or the decode replica when it prefilled locally),
`x-pdorch-decode`, `x-pdorch-route` (`pd`, `local`, `colocated`, `fallback`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

import msgspec
from starlette.responses import Response, StreamingResponse

from pdorch.app.admission import PRIORITY_HEADER, parse_priority
from pdorch.app.deadlines import Cut
from pdorch.app.decode_attempts import decode_until_answer
from pdorch.app.edge_request import ClientRequest
from pdorch.app.errors import ApiError
from pdorch.app.fanout import fan_out
from pdorch.app.faults import RequestFaults
from pdorch.app.leg_wait import (
    ClientGone,
    read_body,
)
from pdorch.app.legs import (
    LegFailure,
    prefill_leg,
)
from pdorch.app.migration import StreamTrail
from pdorch.app.openai_schema import ParsedRequest, RequestKind, parse_request
from pdorch.app.proxy_stream import ProxyStream
from pdorch.app.state import Coordinator
from pools.fleet import FailureKind
from pools.pd_protocol import REQUEST_ID_HEADER, prefill_leg_body
from router.lifecycle_plan import DecodeLeg
from router.pd_router import NoReplicaError
from router.replica_state import RoutingRequest
from router.vocabulary import RouteKind

# the body reader and ClientGone stay importable from here (api.py, admin*.py, passthrough.py)
__all__ = ["ClientGone", "RequestFlow", "read_body"]

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
PATHS: dict[RequestKind, str] = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
ENDPOINTS: dict[RequestKind, str] = {"completion": "completions", "chat": "chat"}
SESSION_HEADER = "x-session-id"
_PRIORITY = PRIORITY_HEADER.encode("latin-1")
_SESSION = SESSION_HEADER.encode("latin-1")


def _routing_headers(raw: list[tuple[bytes, bytes]]) -> tuple[int, str | None]:
    """(priority, session id) from the request's raw ASGI headers, in one pass: the first of
    each, as starlette's `Headers.get` gives it, without its per-lookup scan and decode of
    every header (three lookups per request, proxy-9)."""
    priority: str | None = None
    session: str | None = None
    for name, value in raw:
        if name == _PRIORITY:
            if priority is None:
                priority = value.decode("latin-1")
        elif name == _SESSION and session is None:
            session = value.decode("latin-1")
    return parse_priority(priority), session


class RequestFlow:
    """One client request through the coordinator (see the module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        kind: RequestKind,
        request: ClientRequest,
        request_id: str | None = None,
    ) -> None:
        self.c = coordinator
        self.kind = kind
        self.http = request
        self.started = time.monotonic()
        self.request_id = request_id or coordinator.new_request_id()
        self.counted = True  # counted in the request metrics (a batch's per-prompt flows: no)
        self.headers = {REQUEST_ID_HEADER: self.request_id, "content-type": "application/json"}
        self.path = PATHS[kind]
        self.endpoint = ENDPOINTS[kind]
        self.parsed: ParsedRequest | None = None
        self.decode_replica: str | None = None
        self.prefill_replica: str | None = None
        self.route_kind = RouteKind.LOCAL
        self._closed = False
        self._tracked: set[str] = set()  # replicas this request uses (pools/drain.py)
        self.cut_reason: str | None = None  # set when a drain ends this request early
        self.stream: ProxyStream | None = None
        self._work: asyncio.Task[Any] | None = None  # the task running the legs (`cut`)
        self._cut_cancel = False  # `cut` cancelled `_work`
        self._admitted = False
        self._admitted_to_lifecycle = False
        self.faults = RequestFaults(coordinator.report_failure)  # whose fault a 5xx is
        self.priority, self.session = _routing_headers(request.headers)
        # migration (migration.py): a streamed request that may move gets a trail of what the
        # client got; `not_migratable` says why another does not; `carried` output tokens are
        # in the current replica's prompt already
        self.trail: StreamTrail | None = None
        self.not_migratable: str | None = None
        self.carried = 0

    # ---- entry -------------------------------------------------------------------------------

    async def run(self) -> Response:
        """Serve the request; never raises (errors become OpenAI-shaped answers)."""
        status = 500
        streaming = False
        try:
            await self.c.admit(self.priority)
            self._admitted = True
            raw = await self.http.body(self.c.limits.max_body_bytes)
            self.parsed = parse_request(raw, self.kind, self.c.served_model, self.c.adapter_names())
            # a batch of prompts: one flow each, one merged answer (fanout.py)
            work = self._legs() if self.parsed.batch is None else fan_out(self)
            response = await self._race(work)
            status = response.status_code
            streaming = isinstance(response, StreamingResponse)  # it finishes the request
            return response
        except ApiError as err:
            status = err.status
            if status == 413:
                self.c.metrics.rejected("body_size")
            return err.response({"x-request-id": self.request_id})
        except ClientGone:
            status = 499
            self.c.metrics.disconnects.inc()
            return Response(status_code=499)
        except Exception as exc:  # a bug must still answer JSON, not a bare 500 page
            log.exception("request %s failed", self.request_id)
            failed = ApiError(502, f"pdorch could not serve the request: {exc!r}")
            status = failed.status
            return failed.response({"x-request-id": self.request_id})
        finally:
            if not streaming:
                self._finish(ok=200 <= status < 300, status=status)

    async def _race(self, work: Awaitable[Response]) -> Response:
        """Run `work` until done, the client leaves (ClientGone) or the deadline (504).

        `work` runs in this task (one task per request less than running it beside the
        watcher: the hot path): the client's disconnect (`disconnect.py`: told by the edge, no
        task of its own there) cancels this task, the deadline is a `Cut` (`deadlines.py`: an
        `asyncio.timeout` on a timer shared by every request); either way `work` is cancelled
        and unwound before we answer.
        """
        task = asyncio.current_task()
        assert task is not None
        left = False
        self._work = task

        def client_left() -> None:
            nonlocal left
            left = True
            task.cancel()  # lands in `work`: this task is suspended inside it

        watch = self.http.watch_disconnect(client_left)
        deadline = Cut(self.c.deadlines.queue(self.c.settings.request_timeout_s))
        try:
            async with deadline:
                return await work
        except asyncio.CancelledError:
            ours = int(left) + int(self._cut_cancel)  # the watcher's and `cut`'s cancels
            pending = task.cancelling()
            for _ in range(ours):
                pending = task.uncancel()
            if ours and pending == 0:  # our cancels alone, not an outer one
                if left:
                    raise ClientGone() from None
                raise ApiError(
                    503, f"Request ended early: {self.cut_reason}.", code="replica_drained"
                ) from None
            raise
        except TimeoutError:
            if not deadline.expired():
                raise
            raise ApiError(
                504,
                f"No answer within request_timeout_s={self.c.settings.request_timeout_s:g} s.",
                code="timeout",
            ) from None
        finally:
            self._work = None
            watch.stop()

    # ---- the legs ----------------------------------------------------------------------------

    async def _legs(self) -> Response:
        c = self.c
        parsed = self.parsed
        assert parsed is not None
        tokens = await c.tokens.tokens(parsed)
        now = c.now()
        lora, eligible = c.adapter_scope(parsed.body["model"])  # only its replicas, salted keys
        if tokens:
            keys: list[int] = c.index.keys_for(tokens, lora_name=lora)
            prompt_tokens = len(tokens)
        else:
            keys = []
            prompt_tokens = max(1, len(parsed.prompt_text) // 4)
        request = RoutingRequest(
            self.request_id,
            prompt_tokens,
            c.block_size,
            keys,
            self.session,
            parsed.prompt_text,
            parsed.max_tokens,
            eligible,
        )
        lifecycle = c.lifecycle
        try:
            plan = await c.bind(request, self.priority)
        except NoReplicaError as err:
            raise ApiError(
                503, f"No healthy replica can serve the request: {err}", code="no_replica"
            ) from None
        self._admitted_to_lifecycle = True
        leg = plan.decode
        self.show(leg)
        kv_params: bytes | None = None  # the prefill's checked kv_transfer_params, as JSON
        if plan.prefill is not None:
            prefill = plan.prefill.replica
            self.track(prefill)
            c.expect_blocks(prefill, keys, now)
            c.expect_blocks(leg.replica, keys, now)
            kv_params = await self._prefill(prefill, parsed)
            if kv_params is not None:
                c.report_success(prefill)
            else:  # nothing to pull from it: the decode side prefills
                self.untrack(prefill)
            confirmed = lifecycle.prefill_done(self.request_id, c.now(), ok=kv_params is not None)
            assert confirmed is not None  # a PD plan's request is in flight until we end it
            leg = confirmed
            self.show(leg)
        else:
            c.expect_blocks(leg.replica, keys, now)
        c.metrics.routed(self.route_kind, prompt_tokens)
        c.recent_routes.add(
            c.clock(),
            self.request_id,
            self.route_kind,
            self.prefill_replica,
            leg.replica,
            prompt_tokens,
        )
        c.token_load_changed()
        return await decode_until_answer(self, leg, parsed, kv_params)

    def show(self, leg: DecodeLeg) -> None:
        """The response headers follow the leg being sent."""
        if self.decode_replica is not None and self.decode_replica != leg.replica:
            self.untrack(self.decode_replica)
        self.decode_replica = leg.replica
        self.prefill_replica = leg.prefilled_by
        self.route_kind = leg.kind
        self.track(leg.replica)

    # ---- drain bookkeeping (pools/drain.py) --------------------------------------------------

    def track(self, replica_id: str) -> None:
        if replica_id not in self._tracked:
            self._tracked.add(replica_id)
            self.c.requests.begin(replica_id, self.request_id, self.cut)

    def untrack(self, replica_id: str) -> None:
        if replica_id in self._tracked:
            self._tracked.discard(replica_id)
            self.c.requests.end(replica_id, self.request_id)

    def cut(self, reason: str) -> None:
        """A drain ran out of time. A stream ends with an OpenAI error event; a non-streamed
        request still waiting on its legs is cancelled and answered 503 `replica_drained`
        with the reason (`_race`), not left to a dropped connection when the engine stops.
        A streamed request not yet streaming ends when the draining engine stops: retried on
        another replica, or answered with an error."""
        if self.cut_reason is not None:
            return
        self.cut_reason = reason
        if self.stream is not None:
            self.stream.cut()
        elif self._work is not None and self.parsed is not None and not self.parsed.stream:
            self._cut_cancel = True
            self._work.cancel()

    async def _prefill(self, replica_id: str, parsed: ParsedRequest) -> bytes | None:
        """The prefill leg; None (after reporting) when the decode side must prefill."""
        c = self.c
        replica = c.replica(replica_id)
        if replica is None:
            return None
        body = _encode(prefill_leg_body(parsed.body))
        try:
            async with Cut(c.deadlines.queue(c.settings.prefill_timeout_s)):
                return await prefill_leg(c.legs, replica.url + self.path, body, self.headers)
        except TimeoutError:
            failure = LegFailure(
                FailureKind.TIMEOUT,
                f"no prefill answer within prefill_timeout_s={c.settings.prefill_timeout_s:g}",
            )
        except LegFailure as exc:
            failure = exc
        c.metrics.prefill_failures.labels(failure.label).inc()
        self.faults.failed(replica_id, failure.kind, failure.detail)
        log.info(
            "request %s: prefill on %s failed (%s); decode prefills locally",
            self.request_id,
            replica_id,
            failure.detail,
        )
        return None

    # ---- bookkeeping -------------------------------------------------------------------------

    def route_headers(self) -> dict[str, str]:
        return {
            "x-request-id": self.request_id,
            "x-pdorch-prefill": self.prefill_replica or self.decode_replica or "",
            "x-pdorch-decode": self.decode_replica or "",
            "x-pdorch-route": self.route_kind,
        }

    def route_raw_headers(self) -> list[tuple[bytes, bytes]]:
        """`route_headers` as the raw pairs a response sends (`edge_answer.whole_response`)."""
        decode = self.decode_replica or ""
        return [
            (b"x-request-id", self.request_id.encode("latin-1")),
            (b"x-pdorch-prefill", (self.prefill_replica or decode).encode("latin-1")),
            (b"x-pdorch-decode", decode.encode("latin-1")),
            (b"x-pdorch-route", self.route_kind.encode("latin-1")),
        ]

    def _finish(self, ok: bool, status: int) -> None:
        """Release the request (exactly once): token load, admission slot, metrics."""
        if self._closed:
            return
        self._closed = True
        for replica_id in list(self._tracked):
            self.untrack(replica_id)
        if self._admitted_to_lifecycle:
            now = self.c.now()
            if ok:
                self.c.lifecycle.finished(self.request_id, now)
            else:
                self.c.lifecycle.aborted(self.request_id, now)
            self.c.token_load_changed()
        if self._admitted:
            self.c.release()
        if not self.counted:
            return
        self.c.metrics.answered(self.endpoint, status, time.monotonic() - self.started)
