"""Several models behind one endpoint: the request's `model` picks that model's coordinator.

A fleet file with `models:` (pdorch/config/fleet.py) runs one `Coordinator` per model: its
own fleet, pools, tokenizer, routing profiles, KV index and P/D parameters, so nothing one
model learns (cached blocks, token load, policy state) leaks into another's decisions. The HTTP
app is one; for the two OpenAI POST routes it reads the body once, peeks at `model` and hands
the request to that model's coordinator (`ModelDispatch.pick`): a base model by name, a LoRA
adapter through the coordinator whose replicas have it loaded (`pdorch/app/adapters.py`).
An unknown name is an OpenAI 404 naming every served model and adapter.

A one-model fleet has no dispatch at all (the hot path stays as it was).

`/admin/*`, `/admin/dashboard.json` and `GET /metrics` take an optional `?model=NAME`
(`ModelDispatch.admin_target`, `metrics_target`): that model's coordinator (a base model, or
the one serving an adapter of that name); without it the first model's, so one-model fleets
and clients that never name a model are unchanged; an unknown name is the same 404. A
one-model fleet's admin routes use a `ModelDispatch` of its one coordinator for this.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from starlette.requests import Request

from pdorch.app.auth import check_admin
from pdorch.app.errors import ApiError
from pdorch.app.state import Coordinator


class _ModelField(msgspec.Struct):
    """Only `model` is decoded (msgspec skips the rest of the body without building it)."""

    model: object = None


_decode_model = msgspec.json.Decoder(_ModelField).decode


def peek_model(raw: bytes) -> str | None:
    """The body's `model` when it is a string; None when the body is not a JSON object or has
    none (the coordinator that gets it then answers the precise 400)."""
    try:
        model = _decode_model(raw).model
    except (msgspec.DecodeError, RecursionError):
        return None
    return model if isinstance(model, str) else None


class ModelDispatch:
    """The coordinators of a several-model fleet, by served model name (file order)."""

    def __init__(self, coordinators: Sequence[Coordinator]) -> None:
        if not coordinators:
            raise ValueError("a model dispatch needs at least one coordinator")
        self.coordinators = {c.served_model: c for c in coordinators}
        self.primary = coordinators[0]

    def pick(self, model: str | None) -> Coordinator:
        """The coordinator serving `model` (a base model or a loaded adapter); no `model`:
        the first (it answers the 400); unknown: 404 `model_not_found` naming the served."""
        if model is None:
            return self.primary
        found = self.coordinators.get(model)
        if found is not None:
            return found
        for c in self.coordinators.values():
            if c.adapters.holders(model):
                return c
        served = ", ".join(f"`{name}`" for name in self.names())
        raise ApiError(
            404,
            f"The model `{model}` does not exist (this endpoint serves {served}).",
            param="model",
            code="model_not_found",
        )

    def admin_target(self, request: Request) -> Coordinator:
        """An `/admin` request's coordinator: the admin token checked first (every model
        shares the fleet file's `coordinator:` section, so the first model's token is the
        fleet's), then `?model=` (`pick`: absent or empty → the first model)."""
        check_admin(request.headers, self.primary.admin_token)
        return self.pick(_model_query(request))

    def metrics_target(self, request: Request) -> Coordinator:
        """`GET /metrics`' coordinator: `?model=`, else the first (no auth, as before)."""
        return self.pick(_model_query(request))

    def names(self) -> list[str]:
        """Every name a client may send: each base model, then its adapters."""
        return [
            name
            for c in self.coordinators.values()
            for name in (c.served_model, *c.adapter_names())
        ]

    def can_serve(self) -> bool:
        return any(c.can_serve() for c in self.coordinators.values())


def _model_query(request: Request) -> str | None:
    """The `?model=` of an `/admin/*` or `/metrics` request (absent or empty: None). Any other
    query parameter is a 400 naming it: a typo such as `?modle=code-3b` must not silently act
    on the first model's pools."""
    for name in request.query_params:
        if name != "model":
            raise ApiError(
                400,
                f"Unknown query parameter `{name}` (this route takes only `model`).",
                param=name,
            )
    return request.query_params.get("model") or None
