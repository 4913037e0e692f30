"""The Kubernetes actuator against the fake API server, with a real coordinator (discovery on)
in front of simulated engines standing in for the pods: scale up → the scale subresource
patched, new pods pending until Ready; scale down → drained through the coordinator, then the
pod's deletion cost, then the PATCH, and the drained pod is the one removed; limits and the GPU
budget refused; role switch only for role-agnostic pods."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscale.actuators.base import ActuatorError
from autoscale.actuators.kubernetes import (
    DELETION_COST,
    DRAINED_DELETION_COST,
    CoordinatorDrainer,
    KubernetesActuator,
)
from autoscale.policy import parse_policy
from autoscale.signals import PoolStatus
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.cli import app
from pools.http_client import http_client
from pools.replica import ReplicaState
from tests.kube_apiserver import FakeKubeApiServer, RecordedRequest
from tests.kubernetes.helpers import (
    DECODE,
    PREFILL,
    SELECTORS,
    discovery_fleet,
    discovery_section,
    wait_state,
)
from tests.kubernetes.sim_engines import MODEL, SimPodEngine
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

POLICY = {
    "pools": {
        "prefill": {"min": 0, "max": 4, "drain_timeout_s": 5},
        "decode": {"min": 1, "max": 4, "drain_timeout_s": 5},
    },
    "gpu_budget": 3,
}


STREAMS = 6


async def stream(url: str) -> str:
    """One long streamed completion through the coordinator: "done" when it ends with
    `[DONE]` and no error event, else what it ended with."""
    body = {"model": MODEL, "prompt": "tell a long story", "max_tokens": 1500, "stream": True}
    events: list[str] = []
    async with (
        http_client(base_url=url, timeout=120.0) as client,
        client.stream("POST", "/v1/completions", json=body) as answer,
    ):
        if answer.status_code != 200:
            return f"HTTP {answer.status_code}"
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
    if not events or events[-1] != "data: [DONE]" or any('"error"' in e for e in events):
        return f"ended with {events[-2:]}"
    return "done"


class RecordingDrainer(CoordinatorDrainer):
    """The real HTTP drainer, noting when each drain came back and the replica's state then."""

    def __init__(self, pd: RunningCoordinator) -> None:
        super().__init__([pd.url])
        self.pd = pd
        self.drained: list[tuple[float, str, ReplicaState | None]] = []

    async def drain(self, replica_id: str, timeout_s: float) -> None:
        await super().drain(replica_id, timeout_s)
        replica = self.pd.coordinator.fleet.get(replica_id)
        self.drained.append((time.monotonic(), replica_id, replica.state if replica else None))


def patches(kube: FakeKubeApiServer, suffix: str) -> list[RecordedRequest]:
    return [r for r in kube.requests if r.method == "PATCH" and r.path.endswith(suffix)]


def bring_up(kube: FakeKubeApiServer, name: str, engine: SimPodEngine) -> None:
    """The kubelet's part: the pod's container is `engine`; it turns Ready."""
    kube.annotate(name, engine.annotations)
    kube.set_ready(name, True, pod_ip="127.0.0.1")


async def test_scale_up_pending_then_scale_down_drains_before_the_patch(
    kube: FakeKubeApiServer, token_file: Path, sim_pods: list[SimPodEngine]
) -> None:
    a, b, c = sim_pods
    kube.add_deployment("vllm-prefill", PREFILL, replicas=0)
    kube.add_deployment("vllm-decode", DECODE, replicas=2)
    first = [p["metadata"]["name"] for p in kube.pods(SELECTORS["decode"])]
    for name, engine in zip(first, (a, b), strict=True):
        bring_up(kube, name, engine)
    config = discovery_fleet(kube, token_file, deployments=True)
    assert config.discovery is not None
    async with run_coordinator(config, port=0) as pd:
        for name in first:
            await wait_state(pd, name, ReplicaState.HEALTHY)
        drainer = RecordingDrainer(pd)
        actuator = KubernetesActuator(
            config.discovery, drainer, policy=parse_policy(POLICY), settle_s=20, poll_s=0.05
        )
        try:
            await actuator.refresh()
            assert actuator.status("decode") == PoolStatus(ready=2)
            assert actuator.status("prefill") == PoolStatus()

            # scale up: the scale subresource is patched; the new pod is pending until Ready
            actuator.scale("decode", 3, now=0.0)
            assert actuator.status("decode") == PoolStatus(ready=2, pending=1)
            await actuator.idle()
            assert kube.deployment_replicas("vllm-decode") == 3
            (up,) = patches(kube, "/deployments/vllm-decode/scale")
            assert up.body == {"spec": {"replicas": 3}}
            assert up.content_type == "application/merge-patch+json"
            await actuator.refresh()
            assert actuator.status("decode") == PoolStatus(ready=2, pending=1)
            (new,) = {p["metadata"]["name"] for p in kube.pods(SELECTORS["decode"])} - set(first)
            bring_up(kube, new, c)
            await actuator.refresh()
            assert actuator.status("decode") == PoolStatus(ready=3)
            await wait_state(pd, new, ReplicaState.HEALTHY)

            # refused: over the GPU budget (3 decode + 1 prefill > 3), below min, unknown pool
            with pytest.raises(ActuatorError, match="gpu_budget of 3"):
                actuator.scale("prefill", 1, now=0.0)
            with pytest.raises(ActuatorError, match="below its min of 1"):
                actuator.scale("decode", 0, now=0.0)
            with pytest.raises(ActuatorError, match="unknown pool 'colocated'"):
                actuator.scale("colocated", 1, now=0.0)
            assert len(patches(kube, "/scale")) == 1

            # scale down under load: the newest Ready pod is drained through the coordinator
            # (its streams finish), gets the lowest deletion cost, and only then the count is
            # lowered; it is the pod removed, and no request is lost
            streams = [asyncio.create_task(stream(pd.url)) for _ in range(STREAMS)]

            async def victim_busy() -> bool:
                return pd.coordinator.requests.in_flight(new) > 0

            await async_wait_until(victim_busy, timeout=30.0, message=f"streams on {new}")
            actuator.scale("decode", 2, now=0.0)
            assert actuator.status("decode") == PoolStatus(ready=2, draining=1)
            await actuator.idle()
            ((drained_at, victim, seen),) = drainer.drained
            # the newest Ready pod by creationTimestamp, name as the tie-break: the API's
            # timestamps have 1 s resolution, so under load the new pod may tie with the first
            # two (seen in CI) and any of the three may go; what matters is what follows
            assert victim in {*first, new}
            assert seen is ReplicaState.DRAINING  # out of routing when the drain answered
            assert pd.coordinator.requests.in_flight(victim) == 0  # its streams had finished
            outcomes = await asyncio.gather(*streams)
            assert outcomes == ["done"] * STREAMS
            (cost,) = patches(kube, f"/pods/{victim}")
            assert cost.body == {
                "metadata": {"annotations": {DELETION_COST: str(DRAINED_DELETION_COST)}}
            }
            down = patches(kube, "/deployments/vllm-decode/scale")[-1]
            assert down.body == {"spec": {"replicas": 2}}
            assert drained_at < cost.at < down.at
            assert kube.pod(victim) is None
            assert {p["metadata"]["name"] for p in kube.pods(SELECTORS["decode"])} == {
                *first,
                new,
            } - {victim}
            await wait_state(pd, victim, None)
            assert actuator.status("decode") == PoolStatus(ready=2)
            assert actuator.stats.cancelled == []
        finally:
            await actuator.aclose()
            await drainer.aclose()


async def test_switch_role_only_for_role_agnostic_pods(
    kube: FakeKubeApiServer, token_file: Path, sim_pods: list[SimPodEngine]
) -> None:
    a, b, _ = sim_pods
    kube.add_deployment("vllm-prefill", PREFILL, replicas=0)
    kube.add_deployment("vllm-decode", DECODE, replicas=1)
    (both,) = [p["metadata"]["name"] for p in kube.pods(SELECTORS["decode"])]
    bring_up(kube, both, a)
    fixed = {**DECODE, "pdorch.io/kv-role": "kv_consumer"}
    kube.add_pod("decode-fixed", fixed, ready=True, pod_ip="127.0.0.1", annotations=b.annotations)
    config = discovery_fleet(kube, token_file, deployments=True)
    assert config.discovery is not None
    async with run_coordinator(config, port=0) as pd:
        await wait_state(pd, both, ReplicaState.HEALTHY, pool="decode")
        drainer = CoordinatorDrainer([pd.url])
        actuator = KubernetesActuator(config.discovery, drainer, policy=parse_policy(POLICY))
        try:
            await actuator.refresh()
            assert actuator.switchable("decode") == [both]
            with pytest.raises(ActuatorError, match=r"kv_consumer.*is not kv_both"):
                actuator.switch_role("decode-fixed", "prefill", now=0.0)
            actuator.switch_role(both, "prefill", now=0.0)
            await actuator.idle()
            (relabel,) = patches(kube, f"/pods/{both}")
            assert relabel.body == {"metadata": {"labels": {"pdorch.io/pool": "prefill"}}}
            # the coordinator's discovery moved the replica: same id, new pool, routable
            await wait_state(pd, both, ReplicaState.HEALTHY, pool="prefill")
            assert kube.deployment_replicas("vllm-decode") == 0  # no replacement started
            assert actuator.status("prefill").ready == 1
        finally:
            await actuator.aclose()
            await drainer.aclose()


async def test_pdorch_autoscale_with_the_kubernetes_actuator(
    kube: FakeKubeApiServer, token_file: Path, sim_pods: list[SimPodEngine], tmp_path: Path
) -> None:
    a = sim_pods[0]
    kube.add_deployment("vllm-prefill", PREFILL, replicas=0)
    kube.add_deployment("vllm-decode", DECODE, replicas=1)
    (pod,) = [p["metadata"]["name"] for p in kube.pods(SELECTORS["decode"])]
    bring_up(kube, pod, a)
    fleet_file = tmp_path / "fleet.yaml"
    section = discovery_section(kube, token_file, deployments=True)
    fleet_file.write_text(
        json.dumps(
            {
                "served_model_name": MODEL,
                "pools": {"prefill": {}, "decode": {}},
                "discovery": section,
            }
        )
    )
    policy = tmp_path / "slo.yaml"  # decode must have 2: one tick scales it up
    policy.write_text(json.dumps({"pools": {"prefill": {"min": 0}, "decode": {"min": 2}}}))
    runner = CliRunner()
    async with run_coordinator(discovery_fleet(kube, token_file, True), port=0) as pd:
        await wait_state(pd, pod, ReplicaState.HEALTHY)
        args = ["autoscale", "--policy", str(policy), "--url", pd.url, "--once"]
        missing = await asyncio.to_thread(runner.invoke, app, [*args, "--actuator", "kubernetes"])
        assert missing.exit_code == 2
        assert "--actuator kubernetes needs --config" in missing.output
        result = await asyncio.to_thread(
            runner.invoke,
            app,
            [*args, "--interval-s", "0.5", "--actuator", "kubernetes", "--config", str(fleet_file)],
        )
        assert result.exit_code == 0, result.output
        assert "decode: 2" in result.output
        assert [r.body for r in patches(kube, "/deployments/vllm-decode/scale")] == [
            {"spec": {"replicas": 2}}
        ]
        assert kube.deployment_replicas("vllm-decode") == 2
