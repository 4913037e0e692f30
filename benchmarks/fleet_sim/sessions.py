"""The workload's sessions as a stream of turn arrivals in virtual time.

- open loop: a session's first turn arrives at its `start_s`;
- closed loop (`start_s` None): sessions start in order while fewer than
  `Workload.concurrency` are active (None: all at once), the next when one ends;
- a later turn arrives `think_time_s` after the previous turn ended (finished, or aborted by
  scaling).

Arrivals sit in their own heap ordered by `(time, sequence number)`, so ties keep push order and
runs are deterministic. Each turn's blocks come from the session's `BlockChain` (`block_ids.py`):
with `carry_context` the chain grows over the turns (prompt and output of turn k are a prefix of
turn k+1's prompt), otherwise every turn starts a fresh chain.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from benchmarks.fleet_sim.block_ids import BlockChain
from benchmarks.workloads.model import Segment, Workload, output_content_id

_INF = float("inf")


@dataclass(slots=True)
class TurnBlocks:
    """One turn's request as block ids: what routing, the cores and the references need."""

    prompt_tokens: int
    prompt_keys: list[int]  # the prompt's full blocks (what the index is asked about)
    all_ids: list[int]  # every block of prompt + output (the chain's own list: read at once)
    seq_hashes: list[bytes]  # the same ids as the cores' block hashes


class SessionArrivals:
    """Turn arrivals of `workload` (module docstring); the event loop pops them in time order."""

    def __init__(self, workload: Workload, block_size: int) -> None:
        self.workload = workload
        self.block_size = block_size
        self.heap: list[tuple[float, int, int, int]] = []  # (t, seq, session, turn)
        self._seq = 0
        self.chains: dict[int, BlockChain] = {}
        self.session_start: dict[int, float] = {}
        self.session_end: dict[int, float] = {}
        self.active_sessions = 0
        self.closed_queue: list[int] = []

    def start(self) -> None:
        """Schedule every open-loop session and the first closed-loop ones at t = 0."""
        for i, s in enumerate(self.workload.sessions):
            if s.start_s is not None:
                self._push(s.start_s, i, 0)
            else:
                self.closed_queue.append(i)
        self.closed_queue.reverse()
        self._start_closed(0.0)

    def next_time(self) -> float:
        """When the next turn arrives (inf: none scheduled)."""
        return self.heap[0][0] if self.heap else _INF

    def pop(self) -> tuple[int, int]:
        """The next arrival's `(session index, turn)`."""
        _, _, session, turn = heapq.heappop(self.heap)
        return session, turn

    def turn_blocks(self, si: int, turn: int, now: float) -> TurnBlocks:
        """Turn `turn` of session `si` arrives at `now`: its prompt and sequence as block ids."""
        s = self.workload.sessions[si]
        spec = s.turns[turn]
        if turn == 0:
            self.session_start[si] = now
        chain = self.chains.get(si)
        if chain is None or not s.carry_context:
            chain = BlockChain(self.block_size)
            self.chains[si] = chain
        chain.extend(spec.new_segments)
        prompt_tokens = chain.num_tokens
        keys = list(chain.ids)
        chain.extend([Segment(output_content_id(s.session_id, turn), spec.output_tokens)])
        seq_hashes = list(chain.as_bytes)
        if not s.carry_context:
            self.chains.pop(si, None)
        return TurnBlocks(prompt_tokens, keys, chain.ids, seq_hashes)

    def turn_ended(self, si: int, turn: int, now: float) -> None:
        """Turn `turn` of session `si` is over at `now`: its next turn, or the session's end."""
        s = self.workload.sessions[si]
        if turn + 1 < len(s.turns):
            self._push(now + s.turns[turn + 1].think_time_s, si, turn + 1)
        else:
            self.session_end[si] = now
            self.chains.pop(si, None)
            if s.start_s is None:
                self.active_sessions -= 1
                self._start_closed(now)

    def _start_closed(self, now: float) -> None:
        cap = self.workload.concurrency
        while self.closed_queue and (cap is None or self.active_sessions < cap):
            i = self.closed_queue.pop()
            self.active_sessions += 1
            self._push(now, i, 0)

    def _push(self, t: float, session: int, turn: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, session, turn))
