"""schemathesis over `GET /openapi.json` against a real `pdorch serve` (issue 14 item 3).

`pdorch serve` runs as its own process over two simulated engines that are processes too
(`in_process: false`), with client keys and an admin token configured. Every operation of the
description gets positive cases (valid by the schema) and negative ones (violating it), from
a fixed seed (`derandomize`): 12 per operation and mode (a few hundred cases, ~1 min, in the
fast tier); `PDORCH_FUZZ=1` runs 80 (the long campaign, `benchmarks/results/reliability.md`),
`PDORCH_FUZZ_EXAMPLES=N` any count.

Checks: no 5xx, no hang (30 s per call), status / content type / body as described, every
error the OpenAI shape, negative data rejected with a 4xx. OpenAI and read-only admin routes
are sent with their key / token; admin routes that change the fleet are sent without the
token and must all be refused (401): with it, fuzzing would scale pools and remove replicas
at random. `FUZZ_CASES` is printed for the results page.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.coordinator.helpers import MODEL, sim
from tests.serve_process import serve_process

API_KEY = "sk-fuzz-client"
ADMIN_TOKEN = "fuzz-admin-token"
# PDORCH_FUZZ=1: the long campaign (80 a mode and operation); PDORCH_FUZZ_EXAMPLES: any count
LONG = os.environ.get("PDORCH_FUZZ") == "1"
EXAMPLES = int(os.environ.get("PDORCH_FUZZ_EXAMPLES", "80" if LONG else "12"))
READ_ONLY_ADMIN = {("GET", "/admin/pools"), ("GET", "/admin/autoscale"), ("POST", "/admin/explain")}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """`pdorch serve --json` over a fleet file; its URL."""
    engine = sim(in_process=False, max_model_len=512)
    config = {
        "served_model_name": MODEL,
        "block_size": 16,
        "pools": {"prefill": {"launch": [engine]}, "decode": {"launch": [engine]}},
        "pd": {"min_uncached_tokens": 32},
        "coordinator": {
            "port": 0,
            "api_keys": [API_KEY],
            "admin_token": ADMIN_TOKEN,
            "max_body_bytes": 1 << 20,
        },
        "health": {"timeout_s": 2.0},
    }
    with serve_process(config, tmp_path) as served:
        yield served.url
        assert served.process.poll() is None, served.stderr.read_text()  # it never crashed


def _openai_shaped(response: requests.Response) -> str | None:
    try:
        body: Any = response.json()
    except ValueError:
        return f"{response.status_code} is not JSON: {response.text[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{response.status_code} is not an OpenAI error: {response.text[:200]!r}"
    if not {"type", "param", "code"} <= set(error):
        return f"{response.status_code} misses error fields: {response.text[:200]!r}"
    return None


def _fuzz(url: str, operation: Any, mode: GenerationMode, auth: str | None) -> tuple[Any, Any]:
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {auth}"} if auth else {}
    checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,  # the same cases every run
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if auth is None and case.headers:
            case.headers.pop("Authorization", None)
        try:
            response = case.call(base_url=url, headers=headers, timeout=30)
        except requests.RequestException as err:  # a hang or a dropped connection
            failures.append(f"{operation.label} [{mode.value}]: {type(err).__name__} {err}")
            return
        statuses[response.status_code] += 1
        if auth is None and response.status_code != 401:
            failures.append(f"{operation.label}: {response.status_code} without the token")
        if response.status_code >= 400 and (problem := _openai_shaped(response)) is not None:
            failures.append(f"{operation.label} [{mode.value}]: {problem}")
        try:
            case.validate_response(response, checks=checks)
        except FailureGroup as err:  # keep going, report all
            failures.append(f"{operation.label} [{mode.value}]: {str(err)[:600]}")

    try:
        run()
    except Unsatisfiable:  # negative mode on an operation with nothing to break (GET /health)
        assert mode is GenerationMode.NEGATIVE, operation.label
    return statuses, failures


def test_schemathesis_over_the_openapi_description(served: str) -> None:
    description = requests.get(f"{served}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(description)
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        operations += 1
        key = (operation.method.upper(), operation.path)
        if operation.path.startswith("/admin/"):
            auth = ADMIN_TOKEN if key in READ_ONLY_ADMIN else None
        else:
            auth = API_KEY
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            got, failed = _fuzz(served, operation, mode, auth)
            statuses += got
            failures += failed
    # the fleet is whole after all of it: both engines routable
    health = requests.get(f"{served}/health", timeout=30)
    print(f"FUZZ_CASES {sum(statuses.values())} operations {operations} statuses {dict(statuses)}")
    assert health.status_code == 200
    assert operations >= 15
    assert sum(statuses.values()) >= operations * 2 * min(EXAMPLES, 5)
    assert not any(status >= 500 for status in statuses), statuses
    assert not failures, "\n".join(failures[:40])
