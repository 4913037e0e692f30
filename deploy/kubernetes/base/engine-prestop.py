"""preStop hook of an engine pod: leave routing at every coordinator, then let in-flight work end.

Kubernetes runs this before it sends the engine SIGTERM (pod deletion, rollout, node drain,
a scale-down the actuator did not drain itself). Standard library only: it runs inside the
upstream vLLM image as well as pdorch's.

1. `DELETE /admin/pools/<pool>/replicas/<pod name>` at every coordinator
   (`PDORCH_COORDINATORS`, comma-separated base URLs; the admin token from
   `PDORCH_ADMIN_TOKEN`): the replica leaves routing at once, so no new request reaches it.
   404 (that coordinator does not know it, or discovery removed it already) is fine; an
   unreachable coordinator is retried for up to `PDORCH_LEAVE_TIMEOUT_S` (default 30; it
   may be restarting, and then learns of the pod's deletion from discovery anyway).
2. Poll the engine's own `/metrics` (`PDORCH_ENGINE_URL`, default http://127.0.0.1:8000)
   until `vllm:num_requests_running` + `vllm:num_requests_waiting` is 0, the requests already
   admitted have finished, bounded by `PDORCH_DRAIN_TIMEOUT_S` (default 300, the SLO policy's
   `drain_timeout_s`; keep `terminationGracePeriodSeconds` above it). An engine whose
   `/metrics` does not answer has nothing left to drain.

Exits 0 in every case (a failing preStop only delays the kill; the log says what happened).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request

POLL_S = 1.0
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def log(message: str) -> None:
    print(f"pdorch-prestop: {message}", file=sys.stderr, flush=True)


def leave_routing(base: str, pool: str, replica: str, token: str | None) -> bool:
    """True when the coordinator answered (removed, or never knew the replica)."""
    request = urllib.request.Request(
        f"{base.rstrip('/')}/admin/pools/{pool}/replicas/{replica}", method="DELETE"
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            log(f"{base}: removed {replica} from {pool} ({answer.status})")
            return True
    except urllib.error.HTTPError as err:
        if err.code == 404:
            log(f"{base}: {replica} not in {pool} (404)")
            return True
        log(f"{base}: HTTP {err.code}; giving up on this coordinator")
        return True
    except (urllib.error.URLError, OSError) as err:
        log(f"{base}: unreachable ({err}); will retry")
        return False


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
    pending = list(coordinators)
    while pending and time.monotonic() < leave_by:
        pending = [c for c in pending if not leave_routing(c, pool, replica, token)]
        if pending:
            time.sleep(POLL_S)
    for base in pending:
        log(f"{base}: never reached; it routes to {replica} until discovery sees the deletion")
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
