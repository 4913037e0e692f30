"""preStop hook of an engine pod: drain it at every coordinator, then let in-flight work end.

Kubernetes runs this before it sends the engine SIGTERM (pod deletion, rollout, node drain,
a scale-down the actuator did not drain itself). Standard library only: it runs inside the
upstream vLLM image as well as pdorch's.

1. At every coordinator (`PDORCH_COORDINATORS`, comma-separated base URLs; the admin token
   from `PDORCH_ADMIN_TOKEN`), all at once (one thread each: a coordinator still routing to
   the pod while another drains it would defeat the drain):
   `POST /admin/replicas/<pod name>/drain {"timeout_s": ...}` (pdorch/app/admin_drain.py):
   the replica leaves that coordinator's routing at once, and the answer comes when none of
   its requests uses the pod AND the engine holds no KV lease (a prefill engine whose blocks
   a decode engine is still pulling over NIXL is not idle, though its own request count is
   0), or at the timeout, when what is left is cut with an OpenAI error event (never
   silently). Then `DELETE /admin/pools/<pool>/replicas/<pod name>` takes it out of the
   fleet (discovery would on the pod's deletion; this also serves a coordinator without it).
   404 (that coordinator does not know it, or discovery removed it already) is fine; an
   unreachable coordinator is retried for up to `PDORCH_LEAVE_TIMEOUT_S` (default 30; it
   may be restarting, and then learns of the pod's deletion from discovery anyway).
2. Poll the engine's own `/metrics` (`PDORCH_ENGINE_URL`, default http://127.0.0.1:8000)
   until `vllm:num_requests_running` + `vllm:num_requests_waiting` is 0: requests that did
   not come through a coordinator finish too. An engine whose `/metrics` does not answer has
   nothing left to drain.
Both steps share one deadline, `PDORCH_DRAIN_TIMEOUT_S` (default 300, the SLO policy's
`drain_timeout_s`; keep `terminationGracePeriodSeconds` above it).

Exits 0 in every case (a failing preStop only delays the kill; the log says what happened).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

POLL_S = 1.0
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def log(message: str) -> None:
    print(f"pdorch-prestop: {message}", file=sys.stderr, flush=True)


def _call(
    base: str,
    method: str,
    path: str,
    token: str | None,
    body: dict[str, object] | None,
    wait_s: float,
) -> int:
    """The HTTP status of one admin call (HTTPError statuses returned, not raised)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base.rstrip('/')}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=wait_s) as answer:
            answer.read()
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def leave_routing(base: str, pool: str, replica: str, token: str | None, drain_s: float) -> bool:
    """Drain, then remove, `replica` at one coordinator. True when the coordinator answered
    (drained and removed, never knew the replica, or refused: retrying would not help)."""
    try:
        # the coordinator answers when the drain ends (at most drain_s): wait a little longer
        status = _call(
            base, "POST", f"/admin/replicas/{replica}/drain", token,
            {"timeout_s": max(0.0, drain_s)}, drain_s + 10,
        )  # fmt: skip
        if status == 404:
            log(f"{base}: {replica} not in {pool} (404)")
            return True
        if status != 200:
            log(f"{base}: HTTP {status}; giving up on this coordinator")
            return True
        log(f"{base}: drained {replica}")
        status = _call(base, "DELETE", f"/admin/pools/{pool}/replicas/{replica}", token, None, 5)
    except (urllib.error.URLError, OSError) as err:
        log(f"{base}: unreachable ({err}); will retry")
        return False
    if status in (200, 404):
        log(f"{base}: removed {replica} from {pool} ({status})")
    else:
        log(f"{base}: removing {replica}: HTTP {status}")
    return True


def leave_everywhere(
    coordinators: list[str], pool: str, replica: str, token: str | None, deadline: float,
    leave_by: float,
) -> None:  # fmt: skip
    """`leave_routing` at every coordinator at once, each retried until `leave_by`."""

    def one(base: str) -> None:
        while True:
            if leave_routing(base, pool, replica, token, deadline - time.monotonic()):
                return
            if time.monotonic() + POLL_S >= leave_by:
                log(f"{base}: never reached; it routes to {replica} until discovery sees it go")
                return
            time.sleep(POLL_S)

    threads = [threading.Thread(target=one, args=(base,), daemon=True) for base in coordinators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 15)


def busy(engine: str) -> float | None:
    """Requests running + waiting in the engine (None: /metrics did not answer)."""
    try:
        with urllib.request.urlopen(f"{engine.rstrip('/')}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(BUSY_GAUGES):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def main() -> int:
    pool = os.environ["PDORCH_POOL"]
    replica = os.environ["POD_NAME"]
    token = os.environ.get("PDORCH_ADMIN_TOKEN") or None
    engine = os.environ.get("PDORCH_ENGINE_URL", "http://127.0.0.1:8000")
    coordinators = [c for c in os.environ.get("PDORCH_COORDINATORS", "").split(",") if c]
    deadline = time.monotonic() + float(os.environ.get("PDORCH_DRAIN_TIMEOUT_S", "300"))
    leave_s = float(os.environ.get("PDORCH_LEAVE_TIMEOUT_S", "30"))
    leave_by = min(deadline, time.monotonic() + leave_s)
    leave_everywhere(coordinators, pool, replica, token, deadline, leave_by)
    while time.monotonic() < deadline:
        left = busy(engine)
        if left is None:
            log(f"{replica}: the engine does not answer /metrics; nothing to drain")
            return 0
        if left == 0:
            log(f"{replica} drained")
            return 0
        time.sleep(POLL_S)
    log(f"{replica}: drain deadline passed; the engine stops with work in flight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
