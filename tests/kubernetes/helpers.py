"""Shared by the Kubernetes tests: pod labels, a discovery fleet file, waiting on replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdorch.app.server import RunningCoordinator
from pdorch.config.fleet import FleetConfig, parse_fleet_config
from pools.replica import ReplicaState
from tests.kube_apiserver import FakeKubeApiServer
from tests.kubernetes.conftest import NAMESPACE
from tests.kubernetes.sim_engines import MODEL, TOPIC
from tests.waiting import async_wait_until

PREFILL = {"app": "engine", "pdorch.io/pool": "prefill", "pdorch.io/kv-role": "both"}
DECODE = {"app": "engine", "pdorch.io/pool": "decode", "pdorch.io/kv-role": "both"}
SELECTORS = {
    "prefill": "app=engine,pdorch.io/pool=prefill",
    "decode": "app=engine,pdorch.io/pool=decode",
}


def discovery_section(
    kube: FakeKubeApiServer, token_file: Path, deployments: bool = False
) -> dict[str, Any]:
    return {
        "kind": "kubernetes",
        "namespace": NAMESPACE,
        "api_url": kube.url,
        "token_file": str(token_file),
        "kv_events_topic": TOPIC,
        "watch_timeout_s": 30,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        "drain_timeout_s": 5,
        "pools": {
            pool: {"label_selector": selector}
            | ({"deployment": f"vllm-{pool}"} if deployments else {})
            for pool, selector in SELECTORS.items()
        },
    }


def discovery_fleet(
    kube: FakeKubeApiServer, token_file: Path, deployments: bool = False
) -> FleetConfig:
    return parse_fleet_config(
        {
            "served_model_name": MODEL,
            "block_size": 16,
            "pools": {"prefill": {}, "decode": {}},
            "discovery": discovery_section(kube, token_file, deployments),
        }
    )


def state(pd: RunningCoordinator, name: str) -> ReplicaState | None:
    replica = pd.coordinator.fleet.get(name)
    return replica.state if replica is not None else None


async def wait_state(
    pd: RunningCoordinator, name: str, want: ReplicaState | None, pool: str | None = None
) -> None:
    async def reached() -> bool:
        replica = pd.coordinator.fleet.get(name)
        return state(pd, name) is want and (pool is None or (replica and replica.pool) == pool)

    await async_wait_until(reached, timeout=20.0, interval=0.05, message=f"{name} {want}")
