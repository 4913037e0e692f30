"""Scaling admin endpoints (admin token required when configured, like `admin.py`'s).

- `GET /admin/autoscale`: per pool `ready`/`pending`/`draining`, `recalled` (draining
  replicas a scale-up took back instead of a cold start, `autoscale.actuators.recall`),
  `pinned` (a manual count, or null), `desired`, `min`/`max`, `load` (requests in flight,
  prefill tokens queued, decode blocks: the coordinator's token load summed over the pool),
  `kv_usage` (mean of the last scrapes), `observed` (below), `replicas` (id, state,
  switchable, requests in flight, KV usage), the pool's `last_decision`; then `decisions`:
  the autoscaler's last decisions (newest last) with their inputs and reasons;
  `autoscaler`: `in-process`, `remote` or null. A fleet that launches no engines answers
  the same shape with `pending`/`draining`/`recalled` 0 and `decisions: []`.
  `observed`: the pool's p90 latency, TTFT for prefill, ITL for decode (both for other
  pools; the other metric's fields null): `source` `autoscaler` (its last decision's
  observation, fleet-wide, while at most 60 s old; `window_s` its window, `age_s` since it
  came) else `coordinator` (the coordinator's own requests over the last 60 s,
  `recent_latency.py`; `window_s` 60), `ttft_p90_s` / `itl_p90_s` (null: nothing observed),
  `ttft_samples` / `itl_samples` (coordinator only), and the SLO policy's `ttft_slo_s` /
  `itl_slo_s` with their `..._slo_percentile` (null without a policy).
- `POST /admin/pools/{pool}/scale`: body `{"replicas": N}` or `{"delta": ±k}`; optional
  `"source": "manual" | "autoscaler"` (default manual: the count pins the pool), `"reason"`,
  `"inputs"` (recorded with an autoscaler decision). 200 with `{pool, replicas, applied,
  pinned, reason}`; 404 unknown pool; 400 below min / above max / over the GPU budget / no
  launch spec; 409 when the fleet launches no engines.
- `POST /admin/pools/{pool}/auto`: unpin (the autoscaler drives it again).
- `POST /admin/replicas/{replica}/move`: body `{"to": POOL}`: role switch (drain, re-label).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from pdorch.app.errors import ApiError
from pdorch.app.flow import read_body
from pdorch.app.models import ModelDispatch
from pdorch.app.recent_latency import ITL_POOLS, TTFT_POOLS, WINDOW_S
from pdorch.app.scaling import ScalingControl
from pdorch.app.state import Coordinator
from pools.replica import ReplicaState

_encode = msgspec.json.Encoder().encode


def _json(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int | None = Field(default=None, ge=0)
    delta: int | None = None
    source: Literal["manual", "autoscaler"] = "manual"
    reason: str | None = None
    inputs: dict[str, Any] | None = None


class MoveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str = Field(min_length=1)


M = TypeVar("M", bound=BaseModel)


async def _parse(request: Request, model: type[M]) -> M:
    raw = await read_body(request, 1 << 20)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}", param=where) from None


def _scaling(c: Coordinator) -> ScalingControl:
    if c.fixed_fleet is not None:
        raise ApiError(409, c.fixed_fleet, code="fixed_fleet")
    if not isinstance(c.scaling, ScalingControl):
        raise ApiError(
            409,
            "This fleet launches no engines (static endpoints only): nothing to scale.",
            code="not_scalable",
        )
    return c.scaling


def observed_view(
    c: Coordinator, scaling: ScalingControl | None, pool: str, now: float
) -> dict[str, Any]:
    """A pool's observed p90 latency and its SLO target (the module docstring's `observed`).

    The autoscaler's last report while it is at most `WINDOW_S` old, else the coordinator's
    own last-minute window (`recent_latency.py`); the pool's metric only (prefill: TTFT,
    decode: ITL, other pools both), the other metric's fields null.
    """
    shows_ttft, shows_itl = pool not in ITL_POOLS, pool not in TTFT_POOLS
    reported = scaling.observed.get(pool) if scaling is not None else None
    at = scaling.observed_at.get(pool) if scaling is not None else None
    if reported is not None and at is not None and now - at <= WINDOW_S:
        window = reported.get("window_s")
        out: dict[str, Any] = {
            "source": "autoscaler",
            "window_s": window if isinstance(window, int | float) else None,
            "age_s": round(now - at, 3),
            "ttft_p90_s": reported.get("ttft_p90_s") if shows_ttft else None,
            "ttft_samples": None,
            "itl_p90_s": reported.get("itl_p90_s") if shows_itl else None,
            "itl_samples": None,
        }
    else:
        out = {"source": "coordinator", "window_s": WINDOW_S, "age_s": 0.0}
        out.update(c.metrics.recent.p90(pool))
    policy = scaling.actuator.policy if scaling is not None else None
    slo = policy.slo if policy is not None else None
    for name, target, shown in (
        ("ttft", slo.ttft_ms if slo else None, shows_ttft),
        ("itl", slo.itl_ms if slo else None, shows_itl),
    ):
        out[f"{name}_slo_s"] = target.target / 1000.0 if target and shown else None
        out[f"{name}_slo_percentile"] = target.percentile if target and shown else None
    return out


def autoscale_view(c: Coordinator) -> dict[str, Any]:
    """`GET /admin/autoscale` (see the module docstring)."""
    now = c.clock()
    scaling = c.scaling if isinstance(c.scaling, ScalingControl) else None
    counts: dict[str, Any] = scaling.view()["pools"] if scaling is not None else {}
    pools: dict[str, Any] = {}
    for pool in sorted(set(c.fleet.pools()) | set(counts) | {"prefill", "decode"}):
        replicas = c.fleet.replicas(pool)
        rows = []
        in_flight = queued = blocks = 0
        usages = []
        for r in replicas:
            load = c.token_load.load(r.replica_id, now)
            in_flight += load.requests_in_flight
            queued += load.prefill_tokens_queued
            blocks += load.decode_blocks
            usage = r.metrics.kv_usage if r.metrics is not None else None
            if usage is not None:
                usages.append(usage)
            rows.append(
                {
                    "id": r.replica_id,
                    "state": r.state.value,
                    "switchable": r.endpoint.switchable,
                    "requests_in_flight": c.requests.in_flight(r.replica_id),
                    "kv_usage": usage,
                }
            )
        base = counts.get(pool) or {
            "ready": sum(
                1 for r in replicas if r.state in (ReplicaState.HEALTHY, ReplicaState.UNHEALTHY)
            ),
            "pending": sum(1 for r in replicas if r.state is ReplicaState.PENDING),
            "draining": sum(1 for r in replicas if r.state is ReplicaState.DRAINING),
            "recalled": 0,
            "pinned": None,
            "desired": None,
            "min": None,
            "max": None,
            "last_decision": None,
        }
        pools[pool] = {
            **base,
            "role": pool,
            "load": {
                "requests_in_flight": in_flight,
                "prefill_tokens_queued": queued,
                "decode_blocks": blocks,
            },
            "kv_usage": round(sum(usages) / len(usages), 4) if usages else None,
            "observed": observed_view(c, scaling, pool, now),
            "replicas": rows,
        }
    return {
        "autoscaler": scaling.autoscaler if scaling is not None else None,
        "scalable": scaling is not None,
        "pools": pools,
        "decisions": list(scaling.decisions) if scaling is not None else [],
    }


def admin_scale_router(models: ModelDispatch) -> APIRouter:
    router = APIRouter(prefix="/admin")

    def guard(request: Request) -> Coordinator:
        """Admin auth, then the `?model=` coordinator (`models.py`: default the first)."""
        return models.admin_target(request)

    @router.get("/autoscale")
    async def autoscale(request: Request) -> Response:
        c = guard(request)
        return _json(autoscale_view(c))

    @router.post("/pools/{pool}/scale")
    async def scale(pool: str, request: Request) -> Response:
        c = guard(request)
        body = await _parse(request, ScaleBody)
        scaling = _scaling(c)
        done = scaling.set(
            pool,
            replicas=body.replicas,
            delta=body.delta,
            source=body.source,
            reason=body.reason,
            inputs=body.inputs,
        )
        return _json(done)

    @router.post("/pools/{pool}/auto")
    async def auto(pool: str, request: Request) -> Response:
        c = guard(request)
        return _json(_scaling(c).auto(pool))

    @router.post("/replicas/{replica_id}/move")
    async def move(replica_id: str, request: Request) -> Response:
        c = guard(request)
        body = await _parse(request, MoveBody)
        return _json(_scaling(c).move(replica_id, body.to))

    return router
