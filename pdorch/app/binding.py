"""Late binding in the coordinator: a request waits here, after admission (`admission.py`: its
slot is held, so the admission bound caps how many wait) and tokenization, until
`router/binding_queue.py` admits it to the lifecycle (`router/late_binding.py`: every
prefilling replica had `hold_queued_s` of queued work; it goes when one frees up, shortest
prefill first with aging, to the replica holding or computing its prefix).

`dispatch()` runs on every token-load change (`Coordinator.token_load_changed`: a prefill leg's
return, a finish or abort) and every `BIND_POLL_S` while any request waits (a local prefill's
end shows only as its first streamed token, which triggers nothing here). A request held past
`admission.max_wait_s` is shed like the admission queue's waiters (429 `queue_timeout`); a
client that leaves is withdrawn (or, admitted meanwhile, aborted in the lifecycle).
Off (`late_binding.enabled: false`, the default), `bind` is `lifecycle.admit`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pdorch.app.admission import Shed
from router.binding_queue import BindingQueue
from router.late_binding import LateBindingParams
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import RequestPlan
from router.pd_router import NoReplicaError
from router.replica_state import RoutingRequest

BIND_POLL_S = 0.02


class Binder:
    """Holds requests for late binding and wakes them with their plans (module docstring)."""

    def __init__(
        self,
        lifecycle: RequestLifecycle,
        params: LateBindingParams,
        clock: Callable[[], float],
        max_wait_s: float,
    ) -> None:
        self.lifecycle = lifecycle
        self.clock = clock
        self.max_wait_s = max_wait_s
        self.queue = BindingQueue(lifecycle, params) if params.enabled else None
        self._waiting: dict[str, asyncio.Future[RequestPlan | None]] = {}

    @property
    def held(self) -> int:
        return 0 if self.queue is None else self.queue.held

    async def bind(self, request: RoutingRequest, priority: int = 0) -> RequestPlan:
        """The request's plan once admitted to the lifecycle. Raises `NoReplicaError`, or
        `Shed("queue_timeout")` when held past `max_wait_s`."""
        queue = self.queue
        if queue is None:
            return self.lifecycle.admit(request, self.clock())
        rid = request.request_id
        future: asyncio.Future[RequestPlan | None] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        queue.hold(request, self.clock(), priority)
        self.dispatch()
        deadline = self.clock() + self.max_wait_s
        try:
            while not future.done():
                left = deadline - self.clock()
                if left <= 0:
                    if queue.withdraw(rid):
                        raise Shed("queue_timeout")
                    break  # admitted as the deadline struck: keep it
                try:
                    await asyncio.wait_for(asyncio.shield(future), min(BIND_POLL_S, left))
                except TimeoutError:
                    self.dispatch()
        except asyncio.CancelledError:
            if not queue.withdraw(rid) and future.done() and future.result() is not None:
                self.lifecycle.aborted(rid, self.clock())  # admitted, then the client left
            raise
        finally:
            self._waiting.pop(rid, None)
        plan = future.result()
        if plan is None:
            raise NoReplicaError(f"request {rid}: no healthy replica")
        return plan

    def dispatch(self) -> None:
        """Admit the held requests that may go now; their `bind` returns."""
        queue = self.queue
        if queue is None or not queue.held:
            return
        now = self.clock()
        for rid, plan in queue.dispatch(now):
            future = self._waiting.get(rid)
            if future is not None and not future.done():
                future.set_result(plan)
            elif plan is not None:  # nobody waits for it any more: nothing sends its legs
                self.lifecycle.aborted(rid, now)
