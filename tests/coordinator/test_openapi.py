"""`GET /openapi.json` describes every route the coordinator serves, and nothing else."""

from __future__ import annotations

import schemathesis
from fastapi.routing import APIRoute
from schemathesis.core.result import Ok

from pdorch.app.openapi import openapi_document
from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, fleet


async def test_the_description_matches_the_routes_served() -> None:
    config = fleet(coordinator={"admin_token": "t0k", "api_keys": ["k1"]})
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        served = {
            (method.lower(), route.path)
            for route in pd.app.routes
            if isinstance(route, APIRoute)
            for method in route.methods
        }
        response = await client.get("/openapi.json")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        doc = response.json()
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert described == served, (described - served, served - described)
    assert len(served) >= 15  # the OpenAI routes, health, metrics, the description, admin
    assert doc == openapi_document([MODEL], api_keys=True, admin_token=True)
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for status, answer in op["responses"].items():
                if int(status) >= 400:  # every error is the OpenAI shape
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)
            if path.startswith("/admin/"):
                assert op["security"] == [{"AdminToken": []}], path
                assert {"401", "403"} <= set(op["responses"]), path
            elif path.startswith("/v1/"):
                assert op["security"] == [{"ApiKey": []}], path
                assert "401" in op["responses"], path
        if path in ("/v1/completions", "/v1/chat/completions"):
            post = ops["post"]
            assert post["requestBody"]["required"] is True
            for status in ("400", "404", "413", "429", "431", "503"):
                assert status in post["responses"], (path, status)
    # a valid OpenAPI document: schemathesis loads every operation from it
    loaded = schemathesis.openapi.from_dict(doc)
    results = list(loaded.get_all_operations())
    assert all(isinstance(result, Ok) for result in results), results
    assert len(results) == len(served)


def test_without_keys_no_auth_is_described() -> None:
    doc = openapi_document([MODEL])
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "security" not in op
            assert "401" not in op["responses"]
            # the one 403 left: the SSRF guard of run-time replicas
            assert "403" not in op["responses"] or path == "/admin/pools/{pool}/replicas"
    completion = doc["components"]["schemas"]["CompletionRequest"]
    assert completion["properties"]["model"]["enum"] == [MODEL]
