"""The decode legs of one request flow (`flow.py`): tries until one answers.

Before the first byte a failure moves to another replica (`decode_retries`); a non-streamed
answer whose engine died after getting it (a connection failure, no HTTP answer) starts over
elsewhere as a migration (`migration_limit`, `pdorch_migrations_total`): no byte reached the
client, so the continuation is the whole request. A streamed answer is handed to `ProxyStream`
at its first byte (which migrates it later, `migration.py`); whether it may migrate is decided
here, before the first leg (`plan_migration`).

Split from `flow.py` (the request's entry, race, routing and bookkeeping) so that each module
keeps one job; the functions take the `RequestFlow` whose state they update.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from pdorch.app.edge_answer import whole_response
from pdorch.app.errors import ApiError
from pdorch.app.leg_bytes import decode_leg_bytes
from pdorch.app.leg_wait import completion_tokens, until_first_byte
from pdorch.app.legs import LegFailure, UpstreamAnswer, decode_whole, open_decode_stream
from pdorch.app.migration import StreamTrail, not_migratable, with_token_ids
from pdorch.app.openai_schema import ParsedRequest
from pdorch.app.proxy_stream import ProxyStream
from pools.fleet import FailureKind
from router.lifecycle_plan import DecodeLeg

if TYPE_CHECKING:
    from pdorch.app.flow import RequestFlow

log = logging.getLogger(__name__)

_SERVING = ("decode", "colocated")  # the pools a stream can continue in (migration.py)


def plan_migration(flow: RequestFlow, parsed: ParsedRequest, decode: str) -> dict[str, Any]:
    """The decode legs' base body: with `return_token_ids` when the stream may migrate.

    Only while a migration is possible: with no other routable replica to serve it (a fleet
    of one decode replica) the stream keeps no trail and asks for no token ids, so the
    relay passes the engine's chunks on as they are (the trail cost ~2.9 µs per event,
    proxy.md). A replica that joins later does not make such a stream migratable."""
    if not parsed.stream or flow.c.settings.migration_limit == 0:
        flow.not_migratable = "migration_limit=0" if parsed.stream else None
        return parsed.body
    flow.not_migratable = not_migratable(parsed)
    if flow.not_migratable is not None:
        return parsed.body
    if not _other_server(flow, decode):
        flow.not_migratable = "no other replica could continue it when it started"
        return parsed.body
    flow.trail = StreamTrail(keep_ids=parsed.body.get("return_token_ids") is True)
    return with_token_ids(parsed.body)


async def decode_until_answer(
    flow: RequestFlow, leg: DecodeLeg, parsed: ParsedRequest, kv_params: bytes | None
) -> Response:
    """Decode legs until one answers (the module docstring); 502 when every try failed."""
    c = flow.c
    lifecycle = c.lifecycle
    request_id = flow.request_id
    tried = retries = migrations = 0
    last = "no decode replica"
    base = plan_migration(flow, parsed, leg.replica)
    next_leg: DecodeLeg | None = leg
    tried_replicas: set[str] = set()
    while True:
        if next_leg is None:
            if retries >= c.settings.decode_retries:
                break
            retries += 1
            retry = lifecycle.retry_decode(request_id, c.now())
            if retry is None:
                break
            c.metrics.decode_retries.inc()
            next_leg = retry
        leg, next_leg = next_leg, None
        flow.show(leg)
        tried += 1
        decode = leg.replica
        replica = c.replica(decode)
        if replica is None:
            last = f"{decode}: removed from the fleet"
            lifecycle.decode_failed(request_id, c.now(), reached=False)
            continue
        sent = kv_params if leg.with_kv else None
        body = decode_leg_bytes(parsed, base, sent)
        url = replica.url + flow.path
        tried_replicas.add(decode)
        if parsed.stream:
            budget = retries < c.settings.decode_retries
        else:
            budget = migrations < c.settings.migration_limit
        can_move = partial(_can_move, flow, budget, replica.pool, frozenset(tried_replicas))
        try:
            if parsed.stream:
                deadline = c.settings.first_byte_deadline_s()
                stream = await until_first_byte(
                    c,
                    request_id,
                    decode,
                    open_decode_stream(c.legs, url, body, flow.headers, c.stream_timeout),
                    deadline,
                    can_move,
                )
            else:
                content, ctype = await until_first_byte(
                    c,
                    request_id,
                    decode,
                    decode_whole(c.legs, url, body, flow.headers),
                    None,
                    can_move,
                )
        except UpstreamAnswer as answer:
            return Response(
                answer.content,
                status_code=answer.status,
                media_type=answer.content_type,
                headers=flow.route_headers(),
            )
        except LegFailure as failure:
            last = f"{decode}: {failure.detail}"
            flow.faults.failed(decode, failure.kind, failure.detail)
            log.info("request %s: decode on %s failed: %s", request_id, decode, last)
            mid_answer = not parsed.stream and failure.reached and failure.status == 0
            if mid_answer and migrations < c.settings.migration_limit:
                migrations += 1
                reason = "stall" if failure.kind is FailureKind.TIMEOUT else "connection"
                c.metrics.migrations.labels(reason).inc()
                next_leg = lifecycle.migrate(request_id, c.now(), 0)
                if next_leg is None:
                    c.metrics.migrations_refused.labels("no_replica").inc()
                    break
                continue
            if mid_answer:
                c.metrics.migrations_refused.labels("limit").inc()
                break
            # `reached`: the engine may have claimed the blocks, the next one prefills
            lifecycle.decode_failed(request_id, c.now(), reached=failure.reached)
            continue
        c.report_success(decode)
        flow.faults.served(decode)
        # the decode engine answered: the KV is pulled, the prefill replica is free
        if flow.prefill_replica is not None and flow.prefill_replica != decode:
            flow.untrack(flow.prefill_replica)
        first_byte = time.monotonic() - flow.started
        c.metrics.decode_first_byte(flow.endpoint, first_byte)
        if parsed.stream:
            prefilled = c.replica(leg.prefilled_by) if leg.prefilled_by != decode else replica
            if prefilled is not None:
                c.metrics.first_token(prefilled.pool, prefilled.replica_id, first_byte)
            return ProxyStream(flow, stream, decode, replica.pool)
        output = completion_tokens(content)
        if output is not None:
            c.metrics.completed(flow.route_kind, output)
        return whole_response(content, ctype, flow.route_raw_headers())
    raise ApiError(
        502, f"Every decode attempt failed ({tried}); last: {last}", code="decode_failed"
    )


def _other_server(flow: RequestFlow, decode: str) -> bool:
    """Some routable decode or colocated replica other than `decode` exists."""
    fleet = flow.c.fleet
    return any(r.replica_id != decode for pool in _SERVING for r in fleet.routable(pool))


def _can_move(flow: RequestFlow, budget: bool, pool: str, tried: frozenset[str]) -> bool:
    """Another try is allowed and another replica is routable: only then is a leg waiting
    on a slow or ejected replica given up (`leg_wait.until_first_byte`)."""
    return budget and any(r.replica_id not in tried for r in flow.c.fleet.routable(pool))
