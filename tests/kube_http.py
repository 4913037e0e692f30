"""The HTTP side of the fake Kubernetes API server: routes, bearer-token auth, `Status`
errors, chunked watch streams (see `tests/kube_apiserver.py`)."""

from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.kube_objects import ApiStatusError, Obj, RecordedRequest, status_body

if TYPE_CHECKING:
    from tests.kube_apiserver import FakeKubeApiServer

PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")
_DEP = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)(?P<scale>/scale)?$"
)


class KubeApiHandler(BaseHTTPRequestHandler):
    server_fake: FakeKubeApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # quiet: tests read `requests`

    def _send_json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake = self.server_fake
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with fake._lock:
            fake.requests.append(
                RecordedRequest(method, split.path, query, body, content_type, time.monotonic())
            )
        try:
            if self.headers.get("Authorization") != f"Bearer {fake.token}":
                raise ApiStatusError(401, "Unauthorized", "Unauthorized")
            if method == "PATCH" and content_type not in PATCH_TYPES:
                raise ApiStatusError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(PATCH_TYPES)}",
                )
            self._route(method, split.path, query, body)
        except ApiStatusError as err:
            self._send_json(err.code, status_body(err.code, err.reason, err.message, err.details))

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        fake = self.server_fake
        if (m := _POD.match(path)) is not None:
            ns, name = m["ns"], m["name"]
            if name is None and method == "GET":
                if query.get("watch") in ("true", "1"):
                    self._stream(
                        fake.watch_pods(
                            ns,
                            query.get("labelSelector"),
                            query.get("resourceVersion"),
                            float(query.get("timeoutSeconds") or 1800),
                            query.get("allowWatchBookmarks") == "true",
                        )
                    )
                    return
                self._send_json(200, fake.list_pods(ns, query.get("labelSelector")))
                return
            if name is not None and method == "GET":
                pod = fake.pod(name) if ns == fake.namespace else None
                if pod is None:
                    raise ApiStatusError(404, "NotFound", f'pods "{name}" not found')
                self._send_json(200, pod)
                return
            if name is not None and method == "PATCH":
                self._send_json(200, fake.patch_pod(ns, name, body or {}))
                return
            if name is not None and method == "DELETE":
                self._send_json(200, fake.delete_pod(name, ns))
                return
        if (m := _DEP.match(path)) is not None:
            ns, name, scale = m["ns"], m["name"], m["scale"]
            if method == "GET":
                self._send_json(
                    200, fake.scale_of(ns, name) if scale else fake.get_deployment(ns, name)
                )
                return
            if method == "PATCH" and scale:
                self._send_json(200, fake.patch_scale(ns, name, body or {}))
                return
        raise ApiStatusError(404, "NotFound", "the server could not find the requested resource")

    def _stream(self, lines: Any) -> None:
        fake = self.server_fake
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        with fake._lock:
            fake._open.add(self.connection)
        try:
            for line in lines:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client went away or the server was restarted
        finally:
            with fake._lock:
                fake._open.discard(self.connection)
        self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")
