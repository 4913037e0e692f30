"""The status page: `GET /dashboard` and the JSON it polls, `GET /admin/dashboard.json`.

- `GET /dashboard`: one self-contained HTML page (`dashboard.html`: inline CSS and JS, no
  build step, no CDN, nothing fetched but the JSON below, so it loads offline). It carries no
  fleet data itself, so it is open like `/health`; every 2 s it reads the JSON and shows each
  pool's replicas (state, load, KV usage, prefix hit rate, indexed blocks), the pool's
  observed p90 TTFT/ITL against the SLO policy's targets, the last routing decisions and the
  autoscaler's last decisions. With an admin token configured the page asks for it (a field,
  or `/dashboard#token=...`; the fragment never reaches the server and is cleared from the
  address bar) and sends it as `Authorization: Bearer`; it is never logged.
- `GET /admin/dashboard.json` (admin token when configured, like every `/admin` route;
  read-only): `pools` (`GET /admin/pools`'s body), `autoscale` (`GET /admin/autoscale`'s,
  each decision with `age_s` added) and `routes`: the last `RECENT_ROUTES` routing decisions
  (`recent_routes.py`, newest last, each with `age_s`). A several-model fleet: `?model=NAME`
  (the page passes its own `/dashboard?model=NAME` on), default the first model (`models.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from pdorch.app.admin_scale import autoscale_view
from pdorch.app.models import ModelDispatch
from pdorch.app.scaling import ScalingControl
from pdorch.app.state import Coordinator

_encode = msgspec.json.Encoder().encode
PAGE = (Path(__file__).parent / "dashboard.html").read_bytes()
# the page runs only its own inline script and talks only to this origin
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:"
)


def dashboard_view(c: Coordinator) -> dict[str, Any]:
    """`GET /admin/dashboard.json`'s body (the module docstring)."""
    now = c.clock()
    scale = autoscale_view(c)
    if isinstance(c.scaling, ScalingControl):  # decisions carry the scaling control's clock
        at = c.scaling.clock()
        scale["decisions"] = [{**d, "age_s": round(at - d["at_s"], 3)} for d in scale["decisions"]]
    routes = [{**r, "age_s": round(now - r["at"], 3)} for r in c.recent_routes.rows()]
    return {"pools": c.pools_view(), "autoscale": scale, "routes": routes}


def dashboard_router(models: ModelDispatch) -> APIRouter:
    router = APIRouter()

    @router.get("/dashboard")
    async def page() -> Response:
        headers = {"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"}
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=headers)

    @router.get("/admin/dashboard.json")
    async def data(request: Request) -> Response:
        c = models.admin_target(request)  # admin auth, then the `?model=` coordinator
        return Response(_encode(dashboard_view(c)), media_type="application/json")

    return router
