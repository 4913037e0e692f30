"""`KubeApi`: the few Kubernetes API calls pdorch makes, over the official `kubernetes` client.

The asyncio flavour of the official `kubernetes` package (it ships as `kubernetes.aio`), so the
watches run on the coordinator's event loop beside routing. Objects are handed on as the API's
JSON (plain dicts with camelCase keys, exactly what the server sent) because the pure code in
`pools.kubernetes.pods` reads a handful of fields and must not depend on the client's models.

- `list_pods(selector)` → `(resourceVersion, [pod])`;
- `watch_pods(selector, resource_version, timeout_s)` → async iterator of `(type, object)`
  (`ADDED` / `MODIFIED` / `DELETED` / `BOOKMARK`), the client's `Watch` with bookmarks on; an
  expired resourceVersion raises `ApiException` with status 410 (`is_gone`);
- `patch_pod_metadata(name, labels=, annotations=)` (merge patch; `None` values delete);
- `get_scale(deployment)` / `patch_scale(deployment, replicas)` (the `scale` subresource,
  merge patch).

Credentials: `settings.resolved_api_url()`, a bearer token read from `resolved_token_file()`
(the service account's, in a pod; read again whenever the file changes, as the kubelet rotates
it), the CA file in-cluster.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator
from typing import Any

from kubernetes.aio import client as kclient
from kubernetes.aio import watch as kwatch

from pools.kubernetes.settings import KubernetesDiscoverySettings

MERGE_PATCH = "application/merge-patch+json"

ApiException = kclient.exceptions.ApiException
Obj = dict[str, Any]


def warm_up() -> None:
    """Import the client's API modules (~5 s of CPU the first time: they are large). Run it in
    a thread (`asyncio.to_thread(warm_up)`) before the first `KubeApi` on a serving loop."""
    for module in ("apps_v1_api", "core_v1_api"):
        importlib.import_module(f"kubernetes.aio.client.api.{module}")


def is_gone(exc: BaseException) -> bool:
    """410 Gone: the resourceVersion we watch from is older than the server keeps."""
    return isinstance(exc, ApiException) and exc.status == 410


class KubeApi:
    """See the module docstring. `async with KubeApi(settings) as api: ...`"""

    def __init__(self, settings: KubernetesDiscoverySettings, token: str | None = None) -> None:
        self.namespace = settings.namespace
        config = kclient.Configuration(host=settings.resolved_api_url())
        token_file = settings.resolved_token_file()
        config.api_key_prefix = {"authorization": "Bearer"}
        if token is not None:
            config.api_key = {"authorization": token}
        elif token_file is not None:
            # the kubelet rotates a projected service-account token in place: read it again
            # whenever the file changed, before a request
            seen: list[float] = [-1.0]

            def reread(cfg: Any) -> None:
                mtime = token_file.stat().st_mtime
                if mtime != seen[0]:
                    seen[0] = mtime
                    cfg.api_key = {"authorization": token_file.read_text().strip()}

            reread(config)
            config.refresh_api_key_hook = reread  # type: ignore[assignment]  # typed None upstream
        ca = settings.resolved_ca_file()
        if ca is not None:
            config.ssl_ca_cert = str(ca)
        config.verify_ssl = settings.verify_tls
        self._client = kclient.ApiClient(config)
        self.core = kclient.CoreV1Api(self._client)
        self.apps = kclient.AppsV1Api(self._client)

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]

    async def list_pods(self, selector: str) -> tuple[str, list[Obj]]:
        response = await self.core.list_namespaced_pod_without_preload_content(
            self.namespace, label_selector=selector
        )
        try:
            body = await response.read()
            if response.status >= 400:
                raise ApiException(
                    status=response.status,
                    reason=response.reason,
                    body=body.decode(errors="replace"),
                )
        finally:
            response.release()
        listing = json.loads(body)
        return str(listing["metadata"].get("resourceVersion") or ""), list(listing["items"])

    async def watch_pods(
        self, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        async with kwatch.Watch() as watch:  # type: ignore[no-untyped-call]
            stream = watch.stream(
                self.core.list_namespaced_pod,
                self.namespace,
                label_selector=selector,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
            )
            async for event in stream:
                yield str(event["type"]), dict(event["raw_object"])

    async def patch_pod_metadata(
        self,
        name: str,
        labels: dict[str, str | None] | None = None,
        annotations: dict[str, str | None] | None = None,
    ) -> None:
        meta: Obj = {}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        await self.core.patch_namespaced_pod(
            name, self.namespace, {"metadata": meta}, _content_type=MERGE_PATCH
        )

    async def get_scale(self, deployment: str) -> int:
        scale = await self.apps.read_namespaced_deployment_scale(deployment, self.namespace)
        return int(scale.spec.replicas or 0) if scale.spec is not None else 0

    async def patch_scale(self, deployment: str, replicas: int) -> int:
        scale = await self.apps.patch_namespaced_deployment_scale(
            deployment, self.namespace, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH
        )
        return int(scale.spec.replicas or 0) if scale.spec is not None else 0
