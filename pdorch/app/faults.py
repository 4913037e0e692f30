"""Whose fault is a failed leg: the engine's (count it against the replica) or the request's.

One `RequestFaults` per client request; the flow tells it each leg that failed and each
replica that served the request, and it decides what reaches `Coordinator.report_failure`
(`pools.fleet`'s ejection counts). The rule, per failure kind:

- **4xx answer**: the request's fault (bad prompt, out-of-vocabulary token id, too long...).
  Never counted; the answer goes to the client unchanged (`legs.UpstreamAnswer`; a prefill
  leg's 4xx is a `LegFailure` with no kind and is not reported either).
- **connection refused/reset, timeout**: the engine's fault (a request cannot make a process
  vanish or go silent): counted at once, as before (`connection_failures_to_eject` = 1 keeps a
  dead engine's ejection on the first refused leg).
- **5xx answer**: ambiguous. An engine may answer 500 to one request it cannot process (a
  poison prompt) while serving every other one; counting those would let one client eject a
  whole pool by repeating the request (issue 14, hole 1). So a 5xx is *held*, and counted only
  when **another replica then serves the same request** (`served`): the request was fine,
  the first replica was not. When no replica serves it (every attempt failed, or there was no
  other replica to try), the held 5xx are dropped with the request: it is the common factor.
  An engine that is broken for *every* request is still caught: its `/health` (vLLM answers
  non-200 once its engine core is dead) ejects it through the health checker, and each other
  request it fails is retried elsewhere and so confirmed (3 confirmed in a row eject:
  `http_failures_to_eject`).

Parameters: none; pure bookkeeping (no clock, no I/O), the caller's `report` does the counting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pools.fleet import FailureKind

Report = Callable[[str, FailureKind, str], None]


@dataclass(slots=True)
class RequestFaults:
    """The failures of one request's legs, held until the request shows whose fault they were."""

    report: Report
    held: list[tuple[str, str]] = field(default_factory=list)  # (replica, detail) of 5xx

    def failed(self, replica_id: str, kind: FailureKind | None, detail: str) -> None:
        """A leg to `replica_id` failed; `kind` None: not a health signal (a 4xx, bad params)."""
        if kind is None:
            return
        if kind is FailureKind.HTTP_5XX:
            self.held.append((replica_id, detail))
            return
        self.report(replica_id, kind, detail)

    def served(self, replica_id: str) -> None:
        """`replica_id` served the request: the 5xx other replicas answered it were theirs."""
        held, self.held = self.held, []
        for failed_on, detail in held:
            if failed_on != replica_id:
                self.report(failed_on, FailureKind.HTTP_5XX, f"{detail} (served by {replica_id})")
