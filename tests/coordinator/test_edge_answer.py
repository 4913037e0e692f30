"""`WholeAnswer` (`pdorch/app/edge_answer.py`): a whole answer written by the edge is the
same bytes, and leaves uvicorn's cycle in the same state, as the ASGI `send()` path through
`HeadCork`; what it cannot write the same way it leaves to that path, writing nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from starlette.responses import Response
from uvicorn._types import HTTPScope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from pdorch.app.edge import HeadCork
from pdorch.app.edge_answer import WholeAnswer, whole_response
from tests.coordinator.test_head_cork import RecordingTransport

pytestmark = pytest.mark.unit

DEFAULT_HEADERS = [(b"date", b"Thu, 03 Dec 2026 08:00:00 GMT"), (b"server", b"uvicorn")]


class _Done:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _cycle(keep_alive: bool = True) -> tuple[RecordingTransport, Any, HeadCork, _Done]:
    transport = RecordingTransport()
    done = _Done()
    cycle: Any = RequestResponseCycle(
        scope=cast(HTTPScope, {"type": "http", "method": "POST", "path": "/v1/completions"}),
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=DEFAULT_HEADERS,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=done,
    )
    cork = HeadCork(transport, cycle, asyncio.get_running_loop())
    cycle.transport = cork  # as the edge sets it
    return transport, cycle, cork, done


def _answer(headers: dict[str, str] | None = None) -> Response:
    return Response(
        b'{"id":"cmpl-1"}',
        status_code=200,
        media_type="application/json",
        headers={"x-request-id": "r-1", "x-pdorch-route": "pd", **(headers or {})},
    )


async def _asgi(response: Response, cycle: Any) -> None:
    async def receive() -> Any:
        raise AssertionError("not read")

    await response(cycle.scope, receive, cycle.send)


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("extra", [{}, {"connection": "close"}])
async def test_the_same_bytes_and_state_as_the_asgi_path(
    keep_alive: bool, extra: dict[str, str]
) -> None:
    asgi_transport, asgi_cycle, _, asgi_done = _cycle(keep_alive)
    await _asgi(_answer(extra), asgi_cycle)
    transport, cycle, cork, done = _cycle(keep_alive)
    response = _answer(extra)
    assert WholeAnswer(cycle, cork).send_whole(
        response.status_code, response.raw_headers, response.body
    )
    assert transport.writes == [b"".join(asgi_transport.writes)]
    assert len(transport.writes) == 1  # head and body: one write
    for name in ("response_started", "response_complete", "keep_alive"):
        assert getattr(cycle, name) == getattr(asgi_cycle, name), name
    assert cycle.message_event.is_set() and asgi_cycle.message_event.is_set()
    assert transport.closed == asgi_transport.closed == (not keep_alive or bool(extra))
    assert done.calls == asgi_done.calls == 1
    assert cycle.transport is transport  # the cork is gone
    await asyncio.sleep(0)  # one loop turn: the cork's flush was a `call_soon`, it would run now
    assert len(transport.writes) == 1  # no flush of the cork later


async def test_a_held_head_goes_out_first_in_the_same_write() -> None:
    transport, cycle, cork, _ = _cycle()
    cork.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # receive() writes it through the cork
    response = _answer()
    assert WholeAnswer(cycle, cork).send_whole(200, response.raw_headers, response.body)
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")


async def test_what_it_cannot_write_alike_is_left_to_the_asgi_path() -> None:
    transport, cycle, cork, done = _cycle()
    bad = [(b"x-bad", b"a\x01b"), (b"content-length", b"2")]
    assert not WholeAnswer(cycle, cork).send_whole(200, bad, b"{}")  # uvicorn raises on it
    cycle.flow.write_paused = True
    assert not WholeAnswer(cycle, cork).send_whole(200, [], b"")  # send() waits for the drain
    cycle.flow.write_paused = False
    cycle.access_log = True
    assert not WholeAnswer(cycle, cork).send_whole(200, [], b"")  # uvicorn logs each answer
    assert transport.writes == [] and not cycle.response_started and done.calls == 0
    assert cycle.transport is cork


async def test_an_answer_for_a_client_gone_is_dropped() -> None:
    transport, cycle, cork, done = _cycle()
    cycle.disconnected = True
    assert WholeAnswer(cycle, cork).send_whole(499, [(b"content-length", b"0")], b"")
    assert transport.writes == [] and done.calls == 0


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "text/plain"]
)
def test_whole_response_is_the_response_starlette_builds(content_type: str) -> None:
    """`whole_response` (the decode leg's 200 answer) has the status, body and raw headers,
    in order, that `Response(content, headers=dict, media_type=...)` gives."""
    content = b'{"id":"cmpl-1","choices":[{"text":"hi"}]}'
    named = {
        "x-request-id": "pdorch-00ff",
        "x-pdorch-prefill": "p0",
        "x-pdorch-decode": "d1",
        "x-pdorch-route": "pd",
    }
    raw = [(k.encode(), v.encode()) for k, v in named.items()]
    lean = whole_response(content, content_type, raw)
    built = Response(content, status_code=200, headers=named, media_type=content_type)
    assert (lean.status_code, lean.body, lean.background) == (200, content, None)
    assert lean.raw_headers == built.raw_headers
    assert lean.headers["content-length"] == str(len(content))
