"""Discovery against the fake API server: pods appear → routed, not Ready → removed, 410 →
relist without losing state, API server restart → recovers. A real coordinator (in process,
real HTTP) routes to simulated engines running as processes standing in for the pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from pools.replica import ReplicaState
from tests.kube_apiserver import FakeKubeApiServer
from tests.kubernetes.helpers import DECODE, PREFILL, discovery_fleet, wait_state
from tests.kubernetes.sim_engines import MODEL, SimPodEngine
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration


async def test_pods_are_routed_removed_and_survive_expiry_and_restarts(
    kube: FakeKubeApiServer, token_file: Path, sim_pods: list[SimPodEngine]
) -> None:
    a, b, c = sim_pods
    kube.add_pod("prefill-a", PREFILL, ready=True, pod_ip="127.0.0.1", annotations=a.annotations)
    kube.add_pod("decode-b", DECODE, ready=True, pod_ip="127.0.0.1", annotations=b.annotations)
    kube.add_pod("other", {"app": "unrelated"}, ready=True, pod_ip="127.0.0.1")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        run_coordinator(discovery_fleet(kube, token_file), port=0) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        discovery = pd.coordinator.discovery
        # listed pods are admitted (health + KV events followed) and serve requests
        await wait_state(pd, "prefill-a", ReplicaState.HEALTHY)
        await wait_state(pd, "decode-b", ReplicaState.HEALTHY)
        assert "other" not in pd.coordinator.fleet
        decode = pd.coordinator.fleet.get("decode-b")
        assert decode is not None
        assert decode.url == b.url
        assert decode.endpoint.kv_events_endpoint == f"tcp://127.0.0.1:{b.kv_events_port}"
        assert decode.endpoint.switchable
        assert pd.coordinator.kv_events_live("decode-b")
        answer = await client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text

        # a pod that appears later (scheduled, then Ready) joins only once Ready
        kube.add_pod("decode-c", DECODE, annotations=c.annotations)

        async def listed() -> bool:
            return "decode-c" in discovery.pods["decode"]

        await async_wait_until(listed, timeout=10.0, message="decode-c seen")
        assert "decode-c" not in pd.coordinator.fleet
        kube.set_ready("decode-c", True, pod_ip="127.0.0.1")
        await wait_state(pd, "decode-c", ReplicaState.HEALTHY)

        # not Ready → drained and removed; Ready again → back
        kube.set_ready("decode-c", False)
        await wait_state(pd, "decode-c", None)
        kube.set_ready("decode-c", True, pod_ip="127.0.0.1")
        await wait_state(pd, "decode-c", ReplicaState.HEALTHY)

        # watch expiry: history compacted, open watches cut → 410 on re-watch → relist;
        # a change made meanwhile is seen, the replicas that did not change are kept as they are
        kept = pd.coordinator.fleet.get("prefill-a")
        added_before, lists_before = discovery.stats.added, discovery.stats.lists
        kube.expire_watches()
        kube.delete_pod("decode-c")
        await wait_state(pd, "decode-c", None)
        assert discovery.stats.expired >= 1
        assert discovery.stats.lists > lists_before
        assert pd.coordinator.fleet.get("prefill-a") is kept  # same replica, not re-added
        assert discovery.stats.added == added_before
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

        # API server restart (same port): errors, backoff, a relist that sees what changed
        # while the server was down; replicas that did not change are kept as they are
        errors_before, lists_before = discovery.stats.errors, discovery.stats.lists
        kube.stop()
        kube.set_ready("decode-b", False)
        kube.add_pod("decode-c", DECODE, ready=True, pod_ip="127.0.0.1", annotations=c.annotations)
        kube.start()
        await wait_state(pd, "decode-b", None)
        await wait_state(pd, "decode-c", ReplicaState.HEALTHY)
        assert discovery.stats.errors > errors_before
        assert discovery.stats.lists > lists_before
        assert pd.coordinator.fleet.get("prefill-a") is kept

        # a restart that lost the history too (a new etcd): the relist still recovers
        lists_before = discovery.stats.lists
        kube.stop()
        kube.set_ready("decode-b", True, pod_ip="127.0.0.1")
        kube.restart(compact=True)
        await wait_state(pd, "decode-b", ReplicaState.HEALTHY)
        assert discovery.stats.lists > lists_before
        assert pd.coordinator.fleet.get("prefill-a") is kept
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        # every request to the API server carried the service-account token
        assert all(r.path.startswith("/api/v1/namespaces/pdorch/pods") for r in kube.requests)
