"""Decode fast-forward in the fleet simulator: how far a replica may run on its own, and
applying the steps it ran.

Decode fast-forward (the scheduler's mode, `EngineCore.fast_forward_decode`, tried by the driver
when given a horizon): a replica whose batch is pure decode
advances many steps in one call, up to its *horizon* = the earliest time anything can touch it:
the next arrival or metrics tick (routing reads every replica), a KV transfer into it, the
next step boundary of a prefill replica running a leg whose decode goes to it (and, if that
replica's queue waits, the next transfer anywhere, which may release its held blocks). Nothing that
reads or changes the replica happens inside the horizon, so results equal stepping one by one
(`tests/benchmarks/test_fleet_sim.py::test_fast_forward_equivalence`).

Split out of `simulator.py` (issue 15, which had grown past 500 lines) at this seam: these two
functions read the simulator's state but change only the records, ITL samples and token load
of the requests the fast-forward advanced; the event loop stays in `simulator.py`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from benchmarks.fleet_sim.lifecycle_adapter import SimLifecycle
from benchmarks.fleet_sim.records import RequestRecord
from benchmarks.fleet_sim.replica import SimReplica
from pools.sim.outputs import DecodeFastForward


def decode_horizon(
    rep: SimReplica,
    replicas: Sequence[SimReplica],
    next_tick: float,
    next_arrival: float,
    others_may_bind: bool,
    all_transfers: Sequence[float],
) -> float:
    """The earliest time anything can touch `rep`: the next metrics tick or arrival (routing
    reads every replica), a KV transfer into it, the next step of a prefill replica running a
    leg whose decode goes to it (and, if that replica's queue waits, the next transfer
    anywhere, which may release its held blocks); with requests held by late binding
    (`others_may_bind`), any other replica's next step boundary. `all_transfers` is a heap."""
    h = next_tick
    if next_arrival < h:
        h = next_arrival
    if rep.transfers and rep.transfers[0] < h:
        h = rep.transfers[0]
    if others_may_bind:
        # a held request may be admitted to this replica at any replica's step boundary
        for other in replicas:
            t = other.next_event
            if t is not None and t < h and other is not rep:
                h = t
    for pi, n in rep.inbound.items():
        if n > 0:
            p = replicas[pi]
            t = p.next_event
            if t is not None and t < h:
                h = t
            # A prefill replica whose queue waits for blocks can be woken early by any
            # transfer that releases its held blocks: bound by the next transfer anywhere.
            if p.core.waiting and all_transfers and all_transfers[0] < h:
                h = all_transfers[0]
    return h


def apply_fast_forward(
    ff: DecodeFastForward,
    records: dict[str, RequestRecord],
    routing: SimLifecycle,
    itl: array[float],
    block_size: int,
) -> None:
    """Record the `ff.num_steps` decode steps a replica ran: every sequence's inter-token gaps,
    last token and output count, and a token event wherever its context entered a new KV
    block (as the step-by-step path reports it)."""
    bs = block_size
    ends: list[float] = ff.step_ends
    k = len(ends)
    gaps = [ends[0]] + [ends[j] - ends[j - 1] for j in range(1, k)]
    for rid, n_after in zip(ff.request_ids, ff.num_output_tokens, strict=True):
        rec = records[rid]
        first_gap = ends[0] - (rec.last_token if rec.last_token is not None else ff.start)
        gaps[0] = first_gap
        itl.extend(gaps)
        worst = max(gaps)
        if worst > rec.max_itl:
            rec.max_itl = worst
        n0 = n_after - k
        # on_tokens where the context crosses into a new block: (prompt + n) % bs == 1
        j = (1 - rec.prompt_tokens - n0 - 1) % bs
        while j < k:
            routing.token_output(rid, ends[j], n0 + j + 1)
            j += bs
        rec.last_token = ends[-1]
        rec.num_output = n_after
