"""A pod as routing sees it: pure functions over the API's JSON for one pod (no I/O).

- `pod_view(pod)` → `PodView`: name, IP, `ready` (the `Ready` condition is `True`),
  `terminating` (`metadata.deletionTimestamp` set: the kubelet is stopping it; it leaves routing
  at once even while its readiness probe still passes), labels, annotations, resourceVersion;
- `routable(view)`: Ready, not terminating, with a pod IP — the pods discovery adds;
- `endpoint_of(view, pool, settings, model=, block_size=)` → the `ReplicaEndpoint` the fleet
  takes: replica id = pod name (unique in the namespace, stable for the pod's life),
  `url = http://<podIP>:<port>`, KV events `tcp://<podIP>:<kv_events_port>` (the engine binds,
  the coordinator connects; replay likewise), `switchable` when the pod's `role_label` is
  `kv_both` (vLLM) or `both` (simulated engine), `kind = "kubernetes"`. A pod may override
  its pool's ports with annotations (`PORT_ANNOTATIONS`: `pdorch.io/port`,
  `pdorch.io/kv-events-port`, `pdorch.io/kv-events-replay-port`, `pdorch.io/side-channel-port`),
  for engines whose ports differ per pod (host networking, several engines per node);
- `side_channel_of(view, pool, settings)` → `(podIP, port)` of the engine's NIXL side channel.
  The coordinator does not dial it (a prefill engine names its own side channel in the
  `kv_transfer_params` it returns, and the decode engine connects there), so it is shown in
  `/admin/pools`-style views and logs only; pods must be reachable from each other on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pools.kubernetes.settings import ROLE_AGNOSTIC, KubernetesDiscoverySettings
from pools.replica import ReplicaEndpoint

Obj = dict[str, Any]

PORT_ANNOTATIONS = {
    "port": "pdorch.io/port",
    "kv_events_port": "pdorch.io/kv-events-port",
    "kv_events_replay_port": "pdorch.io/kv-events-replay-port",
    "side_channel_port": "pdorch.io/side-channel-port",
}


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    ip: str | None
    ready: bool
    terminating: bool
    labels: dict[str, str]
    annotations: dict[str, str]
    resource_version: str
    created: str = ""  # metadata.creationTimestamp (RFC 3339: sorts in time order)


def pod_view(pod: Obj) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodView(
        name=str(meta.get("name", "")),
        ip=status.get("podIP") or None,
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        resource_version=str(meta.get("resourceVersion") or ""),
        created=str(meta.get("creationTimestamp") or ""),
    )


def routable(view: PodView) -> bool:
    return view.ready and not view.terminating and view.ip is not None


def switchable(view: PodView, settings: KubernetesDiscoverySettings) -> bool:
    return view.labels.get(settings.role_label, "") in ROLE_AGNOSTIC


def _port(view: PodView, name: str, default: int | None) -> int | None:
    """The pod's annotation for port `name` when it holds a valid port, else `default`."""
    raw = view.annotations.get(PORT_ANNOTATIONS[name], "")
    if raw.isdigit() and 0 < int(raw) < 65536:
        return int(raw)
    return default


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def endpoint_of(
    view: PodView,
    pool: str,
    settings: KubernetesDiscoverySettings,
    *,
    model: str,
    block_size: int,
) -> ReplicaEndpoint:
    """The fleet's entry for a routable pod (ValueError without a pod IP)."""
    if view.ip is None:
        raise ValueError(f"pod {view.name!r} has no IP yet")
    host = _host(view.ip)
    port = _port(view, "port", settings.port_of(pool))
    events = _port(view, "kv_events_port", settings.kv_events_port_of(pool))
    replay = _port(view, "kv_events_replay_port", settings.kv_events_replay_port_of(pool))
    return ReplicaEndpoint(
        replica_id=view.name,
        pool=pool,
        url=f"http://{host}:{port}",
        model=model,
        block_size=block_size,
        kv_events_endpoint=f"tcp://{host}:{events}" if events else None,
        kv_events_replay_endpoint=f"tcp://{host}:{replay}" if replay else None,
        kv_events_topic=settings.kv_events_topic,
        kind="kubernetes",
        switchable=switchable(view, settings),
    )


def side_channel_of(
    view: PodView, pool: str, settings: KubernetesDiscoverySettings
) -> tuple[str, int] | None:
    if view.ip is None:
        return None
    port = _port(view, "side_channel_port", settings.side_channel_port_of(pool))
    assert port is not None
    return view.ip, port
