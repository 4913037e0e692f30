"""`KubeApi` (the official client) against the fake API server: auth and a rotated token,
`Status` errors as the API shapes them, the scale subresource, a label-filtered watch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pools.http_client import http_client
from pools.kubernetes.api import ApiException, KubeApi, is_gone
from pools.kubernetes.settings import KubernetesDiscoverySettings
from tests.kube_apiserver import FakeKubeApiServer
from tests.kubernetes.conftest import NAMESPACE

pytestmark = pytest.mark.integration


def settings(kube: FakeKubeApiServer, token_file: Path) -> KubernetesDiscoverySettings:
    return KubernetesDiscoverySettings.model_validate(
        {
            "kind": "kubernetes",
            "namespace": NAMESPACE,
            "api_url": kube.url,
            "token_file": str(token_file),
            "pools": {"decode": {"label_selector": "app=e"}},
        }
    )


def rotate(token_file: Path, token: str) -> None:
    token_file.write_text(token + "\n")
    stat = token_file.stat()  # a later mtime even on a coarse clock
    os.utime(token_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


async def test_auth_errors_scale_and_a_filtered_watch(
    kube: FakeKubeApiServer, token_file: Path
) -> None:
    kube.add_deployment("dec", {"app": "e"}, replicas=1)
    async with KubeApi(settings(kube, token_file)) as api:
        version, pods = await api.list_pods("app=e")
        assert len(pods) == 1 and int(version) > 0
        # the kubelet rotates the token file: the next request carries the new token
        kube.token = "rotated"
        rotate(token_file, "rotated")
        assert await api.get_scale("dec") == 1

        with pytest.raises(ApiException) as info:
            await api.patch_scale("missing", 1)
        status = json.loads(info.value.body or "")
        assert (info.value.status, status["kind"], status["reason"]) == (404, "Status", "NotFound")
        assert status["details"] == {"name": "missing", "group": "apps", "kind": "deployments"}
        with pytest.raises(ApiException) as info:
            await api.patch_scale("dec", -1)
        assert (
            info.value.status == 422
            and "spec.replicas" in json.loads(info.value.body or "")["message"]
        )

        # a relabel out of the selector reads as DELETED, back in as ADDED
        (name,) = [p["metadata"]["name"] for p in kube.pods("app=e")]
        kube.set_labels(name, {"app": "other"})
        kube.set_labels(name, {"app": "e"})
        seen = [
            (kind, obj["metadata"].get("name"))
            async for kind, obj in api.watch_pods("app=e", version, 1)
        ]
        assert [s for s in seen if s[0] != "BOOKMARK"] == [("DELETED", name), ("ADDED", name)]
        kube.compact()
        with pytest.raises(ApiException) as info:
            async for _ in api.watch_pods("app=e", version, 1):
                pass
        assert is_gone(info.value)

    kube.token = "another"
    async with KubeApi(settings(kube, token_file), token="wrong") as api:
        with pytest.raises(ApiException) as info:
            await api.list_pods("")
        assert info.value.status == 401


async def test_the_fake_speaks_strategic_merge_and_conflicts_like_the_api(
    kube: FakeKubeApiServer,
) -> None:
    kube.add_deployment("dec", {"app": "e"}, replicas=1)
    scale = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/dec/scale"
    auth = {"authorization": f"Bearer {kube.token}"}
    async with http_client(base_url=kube.url, headers=auth, timeout=10.0) as client:
        strategic = {"content-type": "application/strategic-merge-patch+json"}
        answer = await client.patch(scale, content=b'{"spec":{"replicas":2}}', headers=strategic)
        assert answer.status_code == 200 and answer.json()["spec"]["replicas"] == 2
        assert answer.json()["kind"] == "Scale"
        stale = {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 3}}
        merge = {"content-type": "application/merge-patch+json"}
        conflict = await client.patch(scale, content=json.dumps(stale), headers=merge)
        assert conflict.status_code == 409 and conflict.json()["reason"] == "Conflict"
        json_patch = {"content-type": "application/json-patch+json"}
        refused = await client.patch(scale, content=b"[]", headers=json_patch)
        assert refused.status_code == 415
        assert kube.deployment_replicas("dec") == 2
