"""Replay the recorded decision logs (`tests/router/decision_log.py`) through today's router.

The logs were written by the per-policy classes before routing became a pipeline of plugins
(`router/plugins/`); every profile must reproduce every recorded pick (chosen replica, scores
of the competing candidates, score direction, rejected replicas) and every `PdRouter.route`
outcome exactly. Float scores are compared for equality on purpose: the profiles compute the
same formulas in the same order.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.router.decision_log import (
    FIXTURE_DIR,
    ROUTES_PER_CONFIG,
    _seed_of,
    policy_cases,
    router_cases,
    run_picks,
    run_routes,
)


def _load(name: str) -> Any:
    return json.loads((FIXTURE_DIR / f"{name}.json").read_text())


POLICY_CASES = list(policy_cases())


@pytest.mark.parametrize("columns", [False, True], ids=["snapshots", "columns"])
@pytest.mark.parametrize(
    ("policy", "label", "config", "count"), POLICY_CASES, ids=[c[1] for c in POLICY_CASES]
)
def test_profile_reproduces_recorded_picks(
    policy: str, label: str, config: Any, count: int, columns: bool
) -> None:
    """Also with the candidates as columns (`router/replica_columns.py`): the profiles whose
    parts all have a column path take it, the others read the snapshots built from them."""
    recorded = _load(policy)[label]
    replayed = [list(row) for row in run_picks(config, count, _seed_of(label), columns)]
    assert len(recorded) == count
    mismatches = [i for i, (a, b) in enumerate(zip(recorded, replayed, strict=True)) if a != b]
    assert not mismatches, (
        f"{label}: {len(mismatches)}/{count} picks differ, first #{mismatches[0]}: "
        f"recorded {recorded[mismatches[0]]} replayed {replayed[mismatches[0]]}"
    )


ROUTER_CASES = list(router_cases())


@pytest.mark.parametrize("columns", [False, True], ids=["snapshots", "columns"])
@pytest.mark.parametrize(("label", "config"), ROUTER_CASES, ids=[c[0] for c in ROUTER_CASES])
def test_pd_router_reproduces_recorded_routes(label: str, config: Any, columns: bool) -> None:
    recorded = _load("pd_router")[label]
    replayed = run_routes(config, ROUTES_PER_CONFIG, _seed_of(label), columns)
    mismatches = [i for i, (a, b) in enumerate(zip(recorded, replayed, strict=True)) if a != b]
    assert not mismatches, (
        f"{label}: {len(mismatches)} routes differ, first #{mismatches[0]}: "
        f"recorded {recorded[mismatches[0]]} replayed {replayed[mismatches[0]]}"
    )


def test_every_recorded_log_is_replayed() -> None:
    files = {p.stem for p in FIXTURE_DIR.glob("*.json")}
    assert files == {c[0] for c in POLICY_CASES} | {"pd_router"}
    for policy in {c[0] for c in POLICY_CASES}:
        assert set(_load(policy)) == {c[1] for c in POLICY_CASES if c[0] == policy}
    assert set(_load("pd_router")) == {c[0] for c in ROUTER_CASES}
