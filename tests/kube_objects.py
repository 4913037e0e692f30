"""What the fake Kubernetes API server (`tests/kube_apiserver.py`) stores and answers with:
`Status` errors, label selectors, pod status, the watch cache's event filtering, the ReplicaSet
controller's deletion order. Plain dicts in the API's JSON shape."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

Obj = dict[str, Any]


class ApiStatusError(Exception):
    """Answered as a `Status` object with `code`."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


# ---- label selectors (equality- and set-based, as `kubectl -l` writes them) -------------------

_TERM = re.compile(
    r"^\s*(?P<neg>!)?(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<set>[^)]*)\))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return terms


def selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Does `labels` satisfy `selector`? ApiStatusError 400 for a selector we cannot parse."""
    for term in _split_terms(selector or ""):
        m = _TERM.match(term)
        if m is None:
            raise ApiStatusError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        key, has = m["key"], m["key"] in labels
        if m["neg"]:
            ok = not has
        elif m["op"] in ("=", "=="):
            ok = labels.get(key) == m["val"]
        elif m["op"] == "!=":
            ok = labels.get(key) != m["val"]
        elif m["setop"]:
            values = {v.strip() for v in m["set"].split(",")}
            ok = (
                (labels.get(key) in values) if m["setop"] == "in" else labels.get(key) not in values
            )
        else:
            ok = has
        if not ok:
            return False
    return True


@dataclass
class StoredEvent:
    rv: int
    kind: str  # "pods" | "deployments"
    type: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str | None
    at: float


def event_line(obj: Obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def filtered_type(ev: StoredEvent, selector: str | None) -> str | None:
    new_ok = selector_matches(selector, ev.new["metadata"].get("labels") or {})
    if ev.type == "ADDED":
        return "ADDED" if new_ok else None
    old_ok = ev.old is not None and selector_matches(
        selector, ev.old["metadata"].get("labels") or {}
    )
    if ev.type == "DELETED":
        return "DELETED" if old_ok else None
    if old_ok and new_ok:
        return "MODIFIED"
    if new_ok:
        return "ADDED"
    return "DELETED" if old_ok else None


def set_status(pod: Obj, ready: bool, pod_ip: str | None) -> None:
    status = pod["status"]
    status["phase"] = "Running" if pod_ip else "Pending"
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    else:
        status.pop("podIP", None)
        status.pop("podIPs", None)
    status["conditions"] = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]


def _is_ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod["status"].get("conditions") or []
    )


def deletion_rank(pod: Obj) -> tuple[int, int, str]:
    """ReplicaSet's order of deletion, as far as these pods differ: not Ready first, then the
    lower pod-deletion-cost, then the newer pod (higher resourceVersion at creation)."""
    cost = int(pod["metadata"].get("annotations", {}).get(DELETION_COST, "0"))
    return (1 if _is_ready(pod) else 0, cost, pod["metadata"]["creationTimestamp"])


def selector_text(dep: Obj) -> str:
    return ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
