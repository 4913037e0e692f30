"""The Kubernetes actuator when a drain cannot happen: no coordinator answers → the count is
not lowered, the chosen pod is left as it was (no deletion cost), the error is counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscale.actuators.kubernetes import DELETION_COST, CoordinatorDrainer, KubernetesActuator
from autoscale.signals import PoolStatus
from pools.kubernetes.settings import KubernetesDiscoverySettings
from tests.kube_apiserver import FakeKubeApiServer
from tests.kubernetes.helpers import DECODE, PREFILL, SELECTORS, discovery_section
from tests.ports import free_port

pytestmark = pytest.mark.integration


async def test_a_failed_drain_lowers_nothing(kube: FakeKubeApiServer, token_file: Path) -> None:
    kube.add_deployment("vllm-prefill", PREFILL, replicas=0)
    kube.add_deployment("vllm-decode", DECODE, replicas=2)
    for pod in kube.pods(SELECTORS["decode"]):
        kube.set_ready(pod["metadata"]["name"], True, pod_ip="127.0.0.1")
    settings = KubernetesDiscoverySettings.model_validate(
        discovery_section(kube, token_file, deployments=True)
    )
    nobody = CoordinatorDrainer([f"http://127.0.0.1:{free_port()}"])
    actuator = KubernetesActuator(settings, nobody)
    try:
        await actuator.refresh()
        assert actuator.status("decode") == PoolStatus(ready=2)
        actuator.scale("decode", 1, now=0.0)
        assert actuator.status("decode") == PoolStatus(ready=1, draining=1)
        await actuator.idle()
        assert actuator.stats.errors == 1 and actuator.stats.drained == []
        assert kube.deployment_replicas("vllm-decode") == 2
        assert not [r for r in kube.requests if r.path.endswith("/scale") and r.method == "PATCH"]
        for pod in kube.pods(SELECTORS["decode"]):
            assert DELETION_COST not in pod["metadata"]["annotations"]
        assert actuator.status("decode") == PoolStatus(ready=2)
    finally:
        await actuator.aclose()
        await nobody.aclose()
