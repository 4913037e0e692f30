"""Admin endpoints (admin token required when configured, see `auth.py`).

- `GET /admin/pools`: every pool's replicas: state, failures, token load, KV usage, prefix
  hit rate, indexed blocks (`Coordinator.pools_view`); `sync` (several coordinators, else
  null): this coordinator's sync endpoint, `peers` (origin → entries held) and the
  `PeerSyncStats` counters (deltas sent/received/applied, snapshots, gaps, expiries).
- `POST /admin/explain`: a `/v1/completions` or `/v1/chat/completions` body (chat when it has
  `messages`) in, the routing decision out (`router/explain.py`: prefill pick, P/D decision,
  decode pick, every replica's score and terms) plus the route; nothing is sent to an engine
  and no policy state changes (`commit=False`).
- `POST /admin/pools/{pool}/replicas`: add an endpoint at run time; body
  `{"url": ..., "id"?, "kv_events_endpoint"?, "kv_events_replay_endpoint"?, "kv_events_topic"?,
  "metrics_url"?}` (`pools.launch_spec.StaticEndpointSpec`). It is probed once first: a replica
  that does not answer `/health` joins UNHEALTHY and the health checker brings it in. 201 with
  the replica; 409 if the id is taken; 404 for an unknown pool; 403
  (`replica_address_refused`, naming the field and address) when a host of the body is
  outside `coordinator.replica_allow` (SSRF guard, `replica_guard.py`: link-local and
  metadata addresses refused by default).
- `DELETE /admin/pools/{pool}/replicas/{replica_id}`: stop routing to it (an engine pdorch
  launched keeps running until pdorch stops). 200; 404 if unknown.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from pdorch.app.errors import ApiError
from pdorch.app.flow import read_body
from pdorch.app.models import ModelDispatch
from pdorch.app.openai_schema import RequestKind, parse_request
from pdorch.app.replica_guard import check_spec
from pdorch.app.state import POOLS, Coordinator
from pools.launch_spec import StaticEndpointSpec
from router.pd_router import NoReplicaError
from router.replica_state import RoutingRequest
from router.vocabulary import RouteKind

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _json(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


def admin_router(models: ModelDispatch) -> APIRouter:
    router = APIRouter(prefix="/admin")

    def guard(request: Request) -> Coordinator:
        """Admin auth, then the `?model=` coordinator (`models.py`: default the first)."""
        return models.admin_target(request)

    @router.get("/pools")
    async def pools(request: Request) -> Response:
        c = guard(request)
        return _json(c.pools_view())

    @router.post("/explain")
    async def explain(request: Request) -> Response:
        c = guard(request)
        raw = await read_body(request, c.limits.max_body_bytes)
        try:
            peek = _decode(raw)
        except msgspec.DecodeError:
            peek = None
        kind: RequestKind = (
            "chat" if isinstance(peek, dict) and "messages" in peek else "completion"
        )
        parsed = parse_request(raw, kind, c.served_model, c.adapter_names())
        tokens = await c.tokens.tokens(parsed)
        now = c.now()
        lora, eligible = c.adapter_scope(parsed.body["model"])  # as the request path routes
        keys = c.index.keys_for(tokens, lora_name=lora) if tokens else []
        prompt_tokens = len(tokens) if tokens else max(1, len(parsed.prompt_text) // 4)
        routing = RoutingRequest(
            "explain",
            prompt_tokens,
            c.block_size,
            keys,
            request.headers.get("x-session-id"),
            parsed.prompt_text,
            parsed.max_tokens,
            eligible,
        )
        try:
            result = c.lifecycle.route(routing, now, commit=False)
        except NoReplicaError as err:
            raise ApiError(503, f"No healthy replica: {err}", code="no_replica") from None
        route = result.route
        serving = result.colocated if route.kind is RouteKind.COLOCATED else result.decode
        explanation = route.explain(routing, now, result.prefill, serving)
        return _json(
            {
                "kind": kind,
                "tokenized": tokens is not None,
                "prompt_tokens": prompt_tokens,
                "block_keys": len(keys),
                "route": {
                    "pool": route.kind,  # the route kind: pd | local | colocated
                    "disaggregate": route.disaggregate,
                    "prefill_replica": route.prefill_replica,
                    "decode_replica": route.decode_replica,
                },
                "decision": explanation.model_dump(mode="json"),
            }
        )

    @router.post("/pools/{pool}/replicas")
    async def add_replica(pool: str, request: Request) -> Response:
        c = guard(request)
        if c.fixed_fleet is not None:
            raise ApiError(409, c.fixed_fleet, code="fixed_fleet")
        if pool not in POOLS:
            raise ApiError(404, f"Unknown pool {pool!r}; pools: {', '.join(POOLS)}.", param="pool")
        raw = await read_body(request, 1 << 20)
        try:
            spec = StaticEndpointSpec.model_validate_json(raw)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise ApiError(400, f"{where}: {first['msg']}", param=where) from None
        await check_spec(spec, c.settings.replica_allow)  # SSRF guard, before any connect
        replica_id = spec.id or _free_id(c, pool)
        if c.fleet.get(replica_id) is not None:
            raise ApiError(409, f"Replica id {replica_id!r} is already in the fleet.", param="id")
        endpoint = spec.to_endpoint(
            replica_id=replica_id, pool=pool, model=c.served_model, block_size=c.block_size
        )
        healthy = await _probe(c, endpoint.health_endpoint)
        if c.fleet.get(replica_id) is not None:  # added meanwhile
            raise ApiError(409, f"Replica id {replica_id!r} is already in the fleet.", param="id")
        c.fleet.add_replica(endpoint, c.now(), healthy=healthy)
        return _json(_replica_row(c, pool, replica_id), status=201)

    @router.delete("/pools/{pool}/replicas/{replica_id}")
    async def remove_replica(pool: str, replica_id: str, request: Request) -> Response:
        c = guard(request)
        if c.fixed_fleet is not None:
            raise ApiError(409, c.fixed_fleet, code="fixed_fleet")
        replica = c.fleet.get(replica_id)
        if replica is None or replica.pool != pool:
            raise ApiError(404, f"No replica {replica_id!r} in pool {pool!r}.", param="replica_id")
        c.fleet.remove_replica(replica_id, c.now())
        return _json({"removed": replica_id, "pool": pool})

    return router


def _free_id(c: Coordinator, pool: str) -> str:
    n = len(c.fleet.replicas(pool))
    while f"{pool}-{n}" in c.fleet:
        n += 1
    return f"{pool}-{n}"


async def _probe(c: Coordinator, url: str) -> bool:
    try:
        response = await c.client.get(url, timeout=c.config.health.timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _replica_row(c: Coordinator, pool: str, replica_id: str) -> dict[str, Any]:
    view = c.pools_view()["pools"].get(pool, {"replicas": []})
    for row in view["replicas"]:
        if row["id"] == replica_id:
            return dict(row)
    return {"id": replica_id}
