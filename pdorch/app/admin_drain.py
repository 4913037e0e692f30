"""`POST /admin/replicas/{replica_id}/drain`: take one replica out of routing and wait for it.

For whatever removes an engine from outside the coordinator: the Kubernetes actuator before it
lowers a Deployment's count (`autoscale/actuators/kubernetes.py`), an engine pod's `preStop`
hook before the pod stops. Admin token required when configured (`auth.py`).

Body (optional): `{"timeout_s": S}` (default: the discovery section's `drain_timeout_s`, else
30 s) or `{"cancel": true}`. It runs `pools.drain.drain_replica`: the replica leaves routing
for new requests at once; the answer comes when no request of this coordinator uses it and the
engine holds no KV lease, or at the timeout, when requests still on it are cut (streams end
with an OpenAI error event, never silently). 200 `{"replica", "pool", "duration_s",
"timed_out", "cut"}`; the replica stays DRAINING (not routable) until it leaves the fleet (its
pod is deleted, `DELETE /admin/pools/{pool}/replicas/{id}`) or the drain is cancelled
(`{"cancel": true}`: routable again, 200 `{"replica", "pool", "cancelled": true}`). 404 for an
unknown replica (a coordinator that never saw the pod: nothing to drain there).
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from pdorch.app.errors import ApiError
from pdorch.app.flow import read_body
from pdorch.app.models import ModelDispatch
from pools.drain import drain_replica

DEFAULT_DRAIN_TIMEOUT_S = 30.0
_encode = msgspec.json.Encoder().encode


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(default=None, ge=0, le=3600)
    cancel: bool = False


def _json(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


def admin_drain_router(models: ModelDispatch) -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.post("/replicas/{replica_id}/drain")
    async def drain(replica_id: str, request: Request) -> Response:
        c = models.admin_target(request)  # admin auth, then the `?model=` coordinator
        if c.fixed_fleet is not None:
            raise ApiError(409, c.fixed_fleet, code="fixed_fleet")
        raw = await read_body(request, 1 << 16)
        try:
            body = DrainBody.model_validate_json(raw or b"{}")
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise ApiError(400, f"{where}: {first['msg']}", param=where) from None
        replica = c.fleet.get(replica_id)
        if replica is None:
            raise ApiError(404, f"No replica {replica_id!r} in the fleet.", param="replica_id")
        if body.cancel:
            c.fleet.set_draining(replica_id, c.now(), draining=False)
            return _json({"replica": replica_id, "pool": replica.pool, "cancelled": True})
        timeout_s = body.timeout_s
        if timeout_s is None:
            discovery = c.config.discovery
            timeout_s = discovery.drain_timeout_s if discovery else DEFAULT_DRAIN_TIMEOUT_S
        outcome = await drain_replica(c.fleet, replica_id, c.requests, timeout_s, client=c.client)
        return _json(
            {
                "replica": replica_id,
                "pool": replica.pool,
                "duration_s": round(outcome.duration_s, 3),
                "timed_out": outcome.timed_out,
                "cut": outcome.cut,
            }
        )

    return router
