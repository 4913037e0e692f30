"""`FakeKubeApiServer`: a FAKE Kubernetes API server for tests (no real kube-apiserver runs here).

No registry this machine reaches ships kube-apiserver (or etcd), so discovery and the Kubernetes
actuator are tested against this stand-in. It is a real HTTP/1.1 server on a free loopback port
that speaks the wire protocol of the calls pdorch makes, driven by the official client
(`kubernetes.aio`):

- `GET /api/v1/namespaces/{ns}/pods[?labelSelector=..&resourceVersion=..]`: a `PodList` whose
  `metadata.resourceVersion` is the store's; `&watch=true`: a chunked stream of newline-delimited
  JSON events `ADDED` / `MODIFIED` / `DELETED` after the given resourceVersion, `BOOKMARK`s every
  `bookmark_interval_s` when `allowWatchBookmarks=true`, closed after `timeoutSeconds`. A
  label-filtered watch turns a change that makes an object match into `ADDED` and one that
  makes it stop matching into `DELETED`, as the API server's watch cache does. A watch from a
  resourceVersion older than the retained history (`compact()`) gets one `ERROR` event carrying
  a 410 `Expired` `Status` (what the API server sends on an open watch).
- `GET|PATCH|DELETE /api/v1/namespaces/{ns}/pods/{name}`: PATCH takes
  `application/merge-patch+json` and `application/strategic-merge-patch+json` (for the
  metadata maps both merge, `null` deletes a key); anything else is 415.
- `GET /apis/apps/v1/namespaces/{ns}/deployments/{name}` and `GET|PATCH .../scale`
  (`autoscaling/v1` `Scale`). A scale change runs a tiny stand-in for the ReplicaSet
  controller: new pods (from the Deployment's template labels, phase Pending, not Ready, no
  podIP) or deletions ranked as the controller ranks them (not Ready before Ready, then lower
  `controller.kubernetes.io/pod-deletion-cost`, then newer).
- Bearer-token auth (401 otherwise) and errors as `Status` objects (401/404/409/415/422).

Test helpers change the store as the cluster would (`add_pod`, `set_ready`, `set_labels`,
`delete_pod`, `add_deployment`), read it (`pod`, `pods`, `deployment_replicas`), record every
request (`requests`: method, path, query, body) and `restart()` the server on the same port
(open watches are cut; the store survives, its history optionally compacted).
The HTTP side is `tests/kube_http.py`; object helpers (selectors, `Status`) `tests/kube_objects.py`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Any

from tests.kube_http import KubeApiHandler
from tests.kube_objects import (
    DELETION_COST,
    ApiStatusError,
    Obj,
    RecordedRequest,
    StoredEvent,
    deletion_rank,
    event_line,
    filtered_type,
    selector_matches,
    selector_text,
    set_status,
    status_body,
)

__all__ = ["DELETION_COST", "ApiStatusError", "FakeKubeApiServer", "RecordedRequest"]


class FakeKubeApiServer:
    """See the module docstring. Use as a context manager (or `start()` / `stop()`)."""

    def __init__(
        self, token: str = "test-token", namespace: str = "pdorch", bookmark_interval_s: float = 0.5
    ) -> None:
        self.token = token
        self.namespace = namespace
        self.bookmark_interval_s = bookmark_interval_s
        self._lock = threading.Condition()
        self._rv = 100
        self._pods: dict[tuple[str, str], Obj] = {}
        self._deployments: dict[tuple[str, str], Obj] = {}
        self._events: list[StoredEvent] = []
        self._oldest_rv = self._rv  # watches from before this get 410
        self.requests: list[RecordedRequest] = []
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self._generation = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeApiServer:
        fake = self

        class Handler(KubeApiHandler):
            server_fake = fake

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-kube", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._generation += 1  # open watches end
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(5)
        self._server = None

    def restart(self, compact: bool = False) -> None:
        """Stop and serve again on the same port; `compact`: forget the event history too."""
        self.stop()
        if compact:
            self.compact()
        self.start()

    def __enter__(self) -> FakeKubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the store ---------------------------------------------------------------------------

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, kind: str, type_: str, old: Obj | None, new: Obj) -> None:
        self._events.append(
            StoredEvent(int(new["metadata"]["resourceVersion"]), kind, type_, old, new)
        )
        self._lock.notify_all()

    def compact(self) -> None:
        """Forget the history: a watch from any resourceVersion handed out so far gets 410
        Gone (the store moves one version on first, as a busy cluster's would)."""
        with self._lock:
            self._bump()
            self._events.clear()
            self._oldest_rv = self._rv

    def expire_watches(self) -> None:
        """`compact()` and end every open watch: the clients' re-watch gets 410 Gone."""
        self.compact()
        with self._lock:
            self._generation += 1
            self._lock.notify_all()

    def add_pod(
        self,
        name: str,
        labels: dict[str, str],
        *,
        ready: bool = False,
        pod_ip: str | None = None,
        annotations: dict[str, str] | None = None,
        namespace: str | None = None,
        owner: str | None = None,
    ) -> Obj:
        ns = namespace or self.namespace
        with self._lock:
            pod: Obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "uid": str(uuid.uuid4()),
                    "labels": dict(labels),
                    "annotations": dict(annotations or {}),
                    "resourceVersion": str(self._bump()),
                    "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                "spec": {"containers": [{"name": "engine", "image": "fake"}]},
                "status": {"phase": "Pending"},
            }
            if owner is not None:
                pod["metadata"]["annotations"]["fake.pdorch/owner"] = owner
            set_status(pod, ready, pod_ip)
            self._pods[(ns, name)] = pod
            self._record("pods", "ADDED", None, pod)
            return copy.deepcopy(pod)

    def _modify_pod(self, name: str, change: Any, namespace: str | None = None) -> Obj:
        ns = namespace or self.namespace
        with self._lock:
            old = self._pods.get((ns, name))
            if old is None:
                raise ApiStatusError(
                    404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}
                )
            new = copy.deepcopy(old)
            change(new)
            new["metadata"]["resourceVersion"] = str(self._bump())
            self._pods[(ns, name)] = new
            self._record("pods", "MODIFIED", old, new)
            return copy.deepcopy(new)

    def set_ready(self, name: str, ready: bool = True, pod_ip: str | None = "127.0.0.1") -> Obj:
        """The kubelet's report: Ready condition (and Running with a podIP when ready)."""
        return self._modify_pod(name, lambda p: set_status(p, ready, pod_ip))

    def annotate(self, name: str, annotations: dict[str, str]) -> Obj:
        return self._modify_pod(name, lambda p: p["metadata"]["annotations"].update(annotations))

    def set_labels(self, name: str, labels: dict[str, str]) -> Obj:
        return self._modify_pod(name, lambda p: p["metadata"].__setitem__("labels", dict(labels)))

    def delete_pod(self, name: str, namespace: str | None = None) -> Obj:
        ns = namespace or self.namespace
        with self._lock:
            old = self._pods.pop((ns, name), None)
            if old is None:
                raise ApiStatusError(
                    404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}
                )
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._bump())
            self._record("pods", "DELETED", old, gone)
            return gone

    def pod(self, name: str) -> Obj | None:
        with self._lock:
            found = self._pods.get((self.namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def pods(self, selector: str | None = None) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(p)
                for p in sorted(self._pods.values(), key=lambda p: p["metadata"]["name"])
                if selector_matches(selector, p["metadata"].get("labels") or {})
            ]

    def add_deployment(self, name: str, labels: dict[str, str], replicas: int = 0) -> None:
        """A Deployment whose pods carry `labels` (its selector and template labels)."""
        with self._lock:
            dep: Obj = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": str(self._bump()),
                },
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": {"labels": dict(labels)}},
                },
                "status": {"replicas": 0},
            }
            self._deployments[(self.namespace, name)] = dep
        self._set_replicas(name, replicas)

    def deployment_replicas(self, name: str) -> int:
        with self._lock:
            return int(self._deployments[(self.namespace, name)]["spec"]["replicas"])

    def _set_replicas(self, name: str, replicas: int) -> None:
        """spec.replicas, then the ReplicaSet stand-in (module docstring) makes pods match."""
        with self._lock:
            dep = self._deployments[(self.namespace, name)]
            dep["spec"]["replicas"] = replicas
            dep["metadata"]["resourceVersion"] = str(self._bump())
            # a pod relabelled out of the selector is released (no longer counted), as the
            # ReplicaSet controller releases it
            owned = [
                p
                for p in self._pods.values()
                if p["metadata"]["annotations"].get("fake.pdorch/owner") == name
                and selector_matches(selector_text(dep), p["metadata"].get("labels") or {})
                and not p["metadata"].get("deletionTimestamp")
            ]
            labels = dep["spec"]["template"]["metadata"]["labels"]
            for _ in range(replicas - len(owned)):
                self.add_pod(f"{name}-{uuid.uuid4().hex[:5]}", labels, owner=name)
            if len(owned) > replicas:
                owned.sort(key=deletion_rank)
                for pod in owned[: len(owned) - replicas]:
                    self.delete_pod(pod["metadata"]["name"])
            dep["status"]["replicas"] = replicas

    # ---- serving (called by the handler) -----------------------------------------------------

    def list_pods(self, ns: str, selector: str | None) -> Obj:
        with self._lock:
            items = [
                copy.deepcopy(p)
                for (pns, _), p in sorted(self._pods.items())
                if pns == ns and selector_matches(selector, p["metadata"].get("labels") or {})
            ]
            return {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def watch_pods(
        self, ns: str, selector: str | None, since: str | None, timeout_s: float, bookmarks: bool
    ) -> Any:
        """Yields event lines (bytes) until the timeout, a restart or the client going away."""
        with self._lock:
            start_rv = int(since) if since not in (None, "", "0") else self._rv
            generation = self._generation
            if since not in (None, "", "0") and start_rv < self._oldest_rv:
                gone = status_body(
                    410,
                    "Expired",
                    f"too old resource version: {start_rv} ({self._oldest_rv})",
                )
                yield event_line({"type": "ERROR", "object": gone})
                return
        deadline = time.monotonic() + timeout_s
        next_bookmark = time.monotonic() + self.bookmark_interval_s
        sent = start_rv
        while True:
            out: list[bytes] = []
            with self._lock:
                if self._generation != generation:
                    return
                for ev in self._events:
                    if ev.rv <= sent or ev.kind != "pods" or ev.new["metadata"]["namespace"] != ns:
                        continue
                    typ = filtered_type(ev, selector)
                    if typ is not None:
                        out.append(event_line({"type": typ, "object": ev.new}))
                sent = max(sent, self._rv)  # every event up to now was looked at
                now = time.monotonic()
                if not out:
                    if now >= deadline:
                        return
                    if bookmarks and now >= next_bookmark:
                        next_bookmark = now + self.bookmark_interval_s
                        bm: Obj = {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self._rv)},
                        }
                        out.append(event_line({"type": "BOOKMARK", "object": bm}))
                    else:
                        self._lock.wait(min(0.1, max(0.0, deadline - now)))
            yield from out

    def patch_pod(self, ns: str, name: str, patch: Obj) -> Obj:
        meta = patch.get("metadata") or {}

        def change(pod: Obj) -> None:
            for field in ("labels", "annotations"):
                if field in meta:
                    merged = dict(pod["metadata"].get(field) or {})
                    for k, v in (meta[field] or {}).items():
                        if v is None:
                            merged.pop(k, None)
                        elif not isinstance(v, str):
                            raise ApiStatusError(
                                422,
                                "Invalid",
                                f'Pod "{name}" is invalid: metadata.{field}[{k}]: must be a string',
                            )
                        else:
                            merged[k] = v
                    pod["metadata"][field] = merged

        return self._modify_pod(name, change, ns)

    def get_deployment(self, ns: str, name: str) -> Obj:
        with self._lock:
            dep = self._deployments.get((ns, name))
            if dep is None:
                raise ApiStatusError(
                    404,
                    "NotFound",
                    f'deployments.apps "{name}" not found',
                    {"name": name, "group": "apps", "kind": "deployments"},
                )
            return copy.deepcopy(dep)

    def scale_of(self, ns: str, name: str) -> Obj:
        dep = self.get_deployment(ns, name)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": dep["metadata"]["uid"],
                "resourceVersion": dep["metadata"]["resourceVersion"],
            },
            "spec": {"replicas": dep["spec"]["replicas"]},
            "status": {"replicas": dep["status"]["replicas"], "selector": selector_text(dep)},
        }

    def patch_scale(self, ns: str, name: str, patch: Obj) -> Obj:
        with self._lock:
            dep = self.get_deployment(ns, name)
            want_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if want_rv is not None and want_rv != dep["metadata"]["resourceVersion"]:
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on deployments.apps "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": "apps", "kind": "deployments"},
                )
            replicas = (patch.get("spec") or {}).get("replicas", dep["spec"]["replicas"])
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise ApiStatusError(
                    422,
                    "Invalid",
                    f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                    f"{json.dumps(replicas)}: must be greater than or equal to 0",
                    {"name": name, "group": "autoscaling", "kind": "Scale"},
                )
            self._set_replicas(name, replicas)
            return self.scale_of(ns, name)
