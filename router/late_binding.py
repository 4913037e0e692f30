"""Late binding: which held request goes now, and where (issue 15). Pure: no clock, no I/O.

A request is held at the router (not queued on an engine) while every replica of the pool that
prefills it (the prefill pool of a P/D fleet, else the colocated pool) already has at least
`hold_queued_s` seconds of queued prefill work; when one frees up (its queued work falls below
that, which the caller sees as the token load dropping at a prefill's end), the router chooses
jointly which held request and which free replica. An engine serves its queue first come, first
served; holding the surplus at the router lets a short prompt that arrives later go before a
long one that waits, and lets every request bind to the replica that frees first instead of the
one that looked best when it arrived.

Inputs per decision (`next_binding`): the free/busy state of each replica (`ReplicaQueue`:
queued prefill tokens from the token load, profiled prefill tokens/s) and each held request
(`HeldRequest`: priority, arrival, per replica the prompt tokens it would still compute there:
not cached (the KV index) and not being computed right now by an earlier request (the
in-flight prefixes, `router/binding_queue.py`)).

Formula (R = a held request, r = a replica, tps(r) its prefill tokens/s):

    queued_s(r)  = prefill_tokens_queued(r) / tps(r)
    free(r)      = healthy(r) and queued_s(r) < hold_queued_s
    cost(R, r)   = queued_s(r) + uncached(R, r) / tps(r)          its prefill finish on r
    own(R)       = min over free r of uncached(R, r) / tps(r)     its shortest prefill
    waits for X: R is held `pin_patience_s` or less and a busy X has cost(R, X) below
                 min over free r of cost(R, r) (X holds or computes enough of R's prefix that
                 waiting for X finishes sooner than recomputing elsewhere): R is skipped
    key(R)       = (-priority(R), own(R) - aging · (now - arrival(R)), arrival order)
    chosen       = the held request with the smallest key among those not waiting for a busy
                   replica; it may go to every free replica (the routing policy picks among
                   them), or only to the free replica with its lowest cost when an in-flight
                   prefix there is what makes it lowest (the index cannot see it yet)

Shortest prefill first minimises mean and tail waiting in a queue of mixed sizes; `aging`
(seconds of priority per second held) bounds a long prompt's extra wait by about
`own(R) / aging`, so nothing starves. The caller repeats `next_binding` after each admission
(the admitted request's tokens make its replica busier) until it returns None.

Parameters (defaults; the router config's `late_binding:` section):
- `enabled` false: off (the caller admits at arrival, as before);
- `hold_queued_s` 0.5 s: about one chunked-prefill step of 8,192 tokens at the H100/H200
  prefill rates (~16-22k tokens/s): a replica keeps one step of work queued, so it never idles
  between a prefill's end and the next binding;
- `aging` 1.0: one second held counts as one second less prefill;
- `pin_patience_s` 2.0 s: a request waits for its busy prefix replica at most this long, then
  takes any free replica;
- `default_prefill_tokens_per_s` 10,000 (the `token_load` scorer's default) for replicas
  without a profiled rate.

Sources: the idea is the issue's ("late binding / a central admission queue"); the ordering is
shortest-job-first with linear aging (classic scheduling; e.g. Kleinrock, *Queueing Systems*
vol. 2, priority queues); llm-d's flow control holds requests centrally with priorities and
fairness but dispatches first come first served. No peer code was read for this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class LateBindingParams(BaseModel):
    """The router config's `late_binding:` section (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    hold_queued_s: float = Field(default=0.5, ge=0.0)
    aging: float = Field(default=1.0, ge=0.0)
    pin_patience_s: float = Field(default=2.0, ge=0.0)
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)


@dataclass(frozen=True, slots=True)
class ReplicaQueue:
    """One replica of the prefilling pool as the decision sees it."""

    replica_id: str
    queued_tokens: int  # uncached prefill tokens admitted and not yet prefilled (token load)
    tokens_per_s: float
    healthy: bool = True

    @property
    def queued_s(self) -> float:
        return self.queued_tokens / self.tokens_per_s


@dataclass(frozen=True, slots=True)
class HeldRequest:
    """One held request: `uncached[r]` = prompt tokens it would compute on r (absent: all
    `prompt_tokens`); `in_flight` = replicas where an earlier request computing part of its
    prefix right now is what lowers `uncached[r]` below the index's answer."""

    request_id: str
    prompt_tokens: int
    arrived: float
    order: int  # arrival order (the tie-break)
    priority: int = 0
    uncached: Mapping[str, int] | None = None
    in_flight: frozenset[str] = frozenset()

    def uncached_on(self, replica_id: str) -> int:
        if self.uncached is None:
            return self.prompt_tokens
        return self.uncached.get(replica_id, self.prompt_tokens)


@dataclass(frozen=True, slots=True)
class Binding:
    """Admit `request_id` now, its prefill on one of `replicas` (the routing policy picks)."""

    request_id: str
    replicas: tuple[str, ...]


def free_replicas(replicas: Sequence[ReplicaQueue], params: LateBindingParams) -> list[str]:
    """The replicas that may take a held request now."""
    hold = params.hold_queued_s
    return [r.replica_id for r in replicas if r.healthy and r.queued_s < hold]


def next_binding(
    held: Sequence[HeldRequest],
    replicas: Sequence[ReplicaQueue],
    params: LateBindingParams,
    now: float,
) -> Binding | None:
    """The next held request to admit and where (module docstring); None: hold them all."""
    hold = params.hold_queued_s
    free = [r for r in replicas if r.healthy and r.queued_s < hold]
    if not free or not held:
        return None
    busy = [r for r in replicas if r.healthy and r.queued_s >= hold]
    aging = params.aging
    patience = params.pin_patience_s
    best_key: tuple[int, float, int] | None = None
    best: tuple[HeldRequest, ReplicaQueue] | None = None
    for req in held:
        own = float("inf")
        cost = float("inf")
        at: ReplicaQueue | None = None
        for r in free:
            work = req.uncached_on(r.replica_id) / r.tokens_per_s
            if work < own:
                own = work
            c = r.queued_s + work
            if c < cost:
                cost, at = c, r
        if busy and now - req.arrived <= patience:
            wait = min(r.queued_s + req.uncached_on(r.replica_id) / r.tokens_per_s for r in busy)
            if wait < cost:
                continue  # its prefix replica is busy: wait for it
        key = (-req.priority, own - aging * (now - req.arrived), req.order)
        if best_key is None or key < best_key:
            best_key = key
            assert at is not None
            best = (req, at)
    if best is None:
        return None
    req, at = best
    if at.replica_id in req.in_flight:
        return Binding(req.request_id, (at.replica_id,))
    return Binding(req.request_id, tuple(r.replica_id for r in free))
