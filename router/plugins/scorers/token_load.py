"""`token_load` (prefill): when *this* request's prefill would finish on `r`, plus the decode
time it loses next to `r`'s decode batch.

The seeds' lesson: route by the **work left** on each replica, not by cache overlap alone;
overlap only shrinks the prefill part of that work. A step-time model of a chunked-prefill
engine (vLLM's scheduler): every step has a token budget `B` = `max_num_batched_tokens`; each
running decode takes one token of it, prefill chunks fill the rest; a step costs about
`tokens / tps` of compute plus `c · K` to read the decoding sequences' KV:

    W(r)        = prefill_tokens_queued(r) + uncached(r)
    uncached(r) = max(0, prompt_tokens - overlap_blocks(r) · block_size)
    K(r)        = decode_blocks(r) · block_size            KV tokens the decode batch reads
    n(r)        = requests_in_flight(r) if K(r) > 0 else 0    sequences sharing each step
    steps(r)    = max(1, ceil(W(r) / max(1, B - n(r))))
    prefill(r)  = (W(r) + steps(r) · n(r)) / tps(r) + steps(r) · c · K(r)
    decode(r)   = out · (n(r) / tps(r) + c · K(r))       out = min(max_tokens, expected_output)
    t(r)        = prefill(r) + decode(r)                  seconds; lower is better

On a pure prefill replica `K = n = 0`, so `t = W / tps` (explain reports `steps` 0: no
per-step term was charged). On a colocated replica the decode terms let a lighter replica win
over one holding more of the prompt when re-prefilling the missing part costs less than
decoding beside a heavy batch. `tps(r)` is the replica's profiled prefill tokens/s (full
chunks, so the per-step weight read is inside it), else `default_prefill_tokens_per_s`.
`c` = `decode_s_per_kv_token` = KV bytes per token / HBM bandwidth (Llama-3.1-8B bf16,
131,072 B/token, on an H100's 3.35 TB/s ≈ 3.9e-8 s; H200 ≈ 2.7e-8 s).

Parameters (defaults): `default_prefill_tokens_per_s` 10000, `max_num_batched_tokens` 8192
(vLLM's), `decode_s_per_kv_token` 4e-8, `expected_output_tokens` 256, `remaining_decode`
false, `peer_weight` 0.0 (read only with `remaining_decode`), `per_replica_decode_cost` false.
The shipped `token_load` profile (router/profiles/token_load.yaml) sets `per_replica_decode_cost`
and `remaining_decode` true since 2026-12-03: each won or was neutral on every study it was
measured on (benchmarks/results/sim-route-defaults/README.md); `remaining_decode` was opt-in
until its per-sequence sum became array operations ("Columns" below): the Python loop took the
decision p99 at 8k tokens x 256 replicas from 0.82 to 1.5-1.8 ms (router-defaults-7/), the
table keeps it at 0.89 ms vs 0.94 off (median of 5 rounds, router-straggler-vec/).

**Per-replica constants** (`per_replica_decode_cost: true`, issue 15). `tps(r)` is already
each replica's own (profiled) figure. `c` is one global number, the H100's, also on H200
replicas (whose HBM reads the same KV 1.4x faster). With this flag `c(r)` =
`ReplicaSnapshot.decode_s_per_kv_token` where the replica has one (its hardware profile: the
simulator gives `TimingModel.decode_s_per_kv_token`, the coordinator the fleet file's
`hardware:` of the replica or its pool), else `decode_s_per_kv_token`. Off in the scorer, on
in the shipped profile (above; benchmarks/results/sim-latency-predictor/, sim-route-defaults/).

**Straggler-aware decode term** (`remaining_decode: true`, issue 15). The term above assumes
every sequence on `r` outlives this request's `out` tokens. Two sequences that start together
share `min(out, rem_j)` decode steps, where `rem_j` = sequence j's `max_tokens` minus the tokens
it generated so far (`ReplicaSnapshot.decoding`, from the token load; the lifecycle's token
events keep it within one KV block). Each shared step costs this request `1/tps + c · ctx_j`
(j's token of compute and j's KV read) and costs j `1/tps + c · prompt` (ours):

    out         = min(max_tokens, expected_output_tokens), as above (the horizon we price)
    s_j         = out if rem_j unknown (no max_tokens) else min(out, rem_j)
    own(r)      = Σ_j s_j · (1/tps(r) + c · ctx_j)                 ctx_j = blocks_j · block_size
    peers(r)    = Σ_j s_j · (1/tps(r) + c · prompt_tokens)
    decode(r)   = own(r) + peer_weight · peers(r)

A replica that lists no decoding sequence (its decode KV known only from a scrape or a peer,
not from this router's own requests) keeps the plain term above rather than 0.
With no `max_tokens` anywhere, `peer_weight` 0 and decode KV on `r`, this is the term above
(`s_j = out`; it also charges sequences still prefilling there, whose `ctx_j` is 0). It
moves turns off a replica running a long decode (its `rem_j` is large: full overlap) onto one
whose sequences end within our horizon, so the long decode runs in a smaller batch.
`out` keeps the plain term's cap: tried uncapped (`out = max_tokens`, so a long decode seeks
the replica with the least work left), the decode term outweighed the prefix cache (rl-rollouts
4C: hit rate 0.975 -> 0.920, TTFT p95 113 -> 272 ms, strict goodput -9 %) for a smaller gain.
`peer_weight` prices the slow-down we inflict on the sequences already there (1.0: minimise the
total added decode time, not only ours; measured worse than 0.0, so 0.0). Measurements:
benchmarks/results/sim-remaining-decode/. `max_tokens` is an upper bound in production (a
client may stop early or set it high); in `pdorch bench sim` it is the exact output length,
so the simulator shows this term with a perfect length signal.

**Columns** (issue 15): the same formula runs on `ReplicaColumns` as array operations
(`score_columns`), the same IEEE operations in the same order, so every score is bit-identical
to the loop's; a row without decode KV takes the `K = n = 0` branch exactly (`np.where`, not
the general formula with zeros). The straggler-aware term is computed on every path from two
integer sums, `S1 = Σ_j s_j` and `S2 = Σ_j s_j · blocks_j` (exact in any order), as
`S1 · ((1 + peer_weight) / tps + peer_weight · prompt · c) + S2 · (block_size · c)`
(`own + peer_weight · peers` regrouped: within 1e-9 of the per-sequence sum,
tests/router/test_decoding_table.py); the array path takes the sums from a padded
(replica, sequence) table rewritten only where a replica's sequences changed
(`decoding_table.py`; before, a Python loop over every busy row took the decision p99 at 8k
tokens x 256 replicas from 0.82 to 1.5-1.8 ms, benchmarks/results/router-defaults-7/).
At most `SCALAR_ROWS` (8) rows run the loop's Python arithmetic on the rows' values
instead (the same operations, the same result): there each of the ~20 numpy calls costs
1-3 µs, more than the loop (`benchmarks/results/proxy.md`, "leg-client-3": 62 µs per request
with one replica per pool); the terms, read only by explain, come from the array path.

Example::

    scorers: [{name: token_load, params: {default_prefill_tokens_per_s: 12000}}]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import ColumnScores, Scorer, ScorerOutput
from router.plugins.registry import register
from router.plugins.scorers.decoding_table import DecodingTables, shared_sums
from router.replica_columns import SCALAR_ROWS, FloatArray, IntArray, ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest

_TERM_NAMES = (
    "uncached_tokens",
    "queued_tokens",
    "decode_kv_tokens",
    "decode_seqs",
    "steps",
    "prefill_s",
    "decode_s",
    "tokens_per_s",
)


class TokenLoadParams(BaseModel):
    """Parameters of the `token_load` scorer."""

    model_config = ConfigDict(extra="forbid")
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    decode_s_per_kv_token: float = Field(default=4e-8, ge=0.0)
    expected_output_tokens: int = Field(default=256, ge=0)
    remaining_decode: bool = False
    peer_weight: float = Field(default=0.0, ge=0.0)
    per_replica_decode_cost: bool = False


def _remaining_decode(
    s1: int, s2: int, tps: float, c: float, block_size: int, peer_weight: float, prompt: int
) -> float:
    """`own(r) + peer_weight · peers(r)` of the straggler-aware term from the integer sums
    `S1 = Σ s_j`, `S2 = Σ s_j · blocks_j` (module docstring, "Columns"): every path runs these
    operations in this order, so the scores agree bit for bit."""
    return s1 * ((1.0 + peer_weight) / tps + peer_weight * prompt * c) + s2 * (block_size * c)


@register
class TokenLoadScorer(Scorer[TokenLoadParams]):
    """Estimated prefill finish + decode slow-down, in seconds; lower wins."""

    name = "token_load"
    params_model = TokenLoadParams
    higher_is_better = False

    def __init__(self, params: TokenLoadParams) -> None:
        super().__init__(params)
        # `remaining_decode`'s (row, sequence) tables: a cache of the candidates' own state
        self._tables = DecodingTables()

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        params = self.params
        bs, prompt, default_tps, budget_tokens, c, out = self._constants(request)
        remaining = params.remaining_decode
        own_c = params.per_replica_decode_cost
        default_c = c
        peer_weight = params.peer_weight
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        # One tight loop: this scorer sits on every prefill decision (benchmarks/router_bench).
        for r in candidates:
            uncached = prompt - r.overlap_blocks * bs
            if uncached < 0:
                uncached = 0
            work = r.prefill_tokens_queued + uncached
            tps = r.prefill_tokens_per_s or default_tps
            if own_c:
                c = r.decode_s_per_kv_token or default_c
            kv = r.decode_blocks * bs
            if kv > 0:
                n = r.requests_in_flight
                budget = budget_tokens - n if budget_tokens > n else 1
                steps = -(-work // budget) if work > budget else 1
                read = c * kv
                prefill = (work + steps * n) / tps + steps * read
                decode = out * (n / tps + read)
            else:
                n = steps = 0
                prefill = work / tps
                decode = 0.0
            if remaining and r.decoding:
                s1, s2 = shared_sums(r.decoding, out)
                decode = _remaining_decode(s1, s2, tps, c, bs, peer_weight, prompt)
            rid = r.replica_id
            scores[rid] = prefill + decode
            terms[rid] = {
                "uncached_tokens": float(uncached),
                "queued_tokens": float(r.prefill_tokens_queued),
                "decode_kv_tokens": float(kv),
                "decode_seqs": float(n),
                "steps": float(steps),
                "prefill_s": prefill,
                "decode_s": decode,
                "tokens_per_s": tps,
            }
        return ScorerOutput(scores, terms)

    def _constants(self, request: RoutingRequest) -> tuple[int, int, float, int, float, int]:
        """(block size, prompt tokens, default tokens/s, batch budget, s per KV token, output
        tokens) of a request: every path's one preamble (the scalar, column and array paths
        must read the same values to agree bit for bit)."""
        params = self.params
        out = params.expected_output_tokens
        if request.max_tokens is not None and request.max_tokens < out:
            out = request.max_tokens
        return (
            request.block_size,
            request.prompt_tokens,
            params.default_prefill_tokens_per_s,
            params.max_num_batched_tokens,
            params.decode_s_per_kv_token,
            out,
        )

    def supports_columns(self) -> bool:
        return True

    def score_columns(
        self, request: RoutingRequest, candidates: ReplicaColumns, rows: IntArray, now: float
    ) -> ColumnScores:
        """`score` over columns (module docstring, "Columns"): a few rows by the loop's
        arithmetic, more as array operations."""
        if len(rows) > SCALAR_ROWS:
            return self._score_arrays(request, candidates, rows)
        bs, prompt, default_tps, budget_tokens, c, out = self._constants(request)
        picked = candidates.ints[:, rows]
        overlaps, queued, decode_blocks, in_flight = (
            picked[0].tolist(),
            picked[1].tolist(),
            picked[2].tolist(),
            picked[6].tolist(),
        )
        given_tps = candidates.tps[rows].tolist()
        own_c = self.params.per_replica_decode_cost
        given_c = candidates.kv_cost[rows].tolist() if own_c else []
        default_c = c
        remaining = self.params.remaining_decode
        peer_weight = self.params.peer_weight
        row_ids = rows.tolist()
        values: list[float] = []
        for i, overlap in enumerate(overlaps):  # `score`'s loop, on the rows' values
            uncached = prompt - overlap * bs
            if uncached < 0:
                uncached = 0
            work = queued[i] + uncached
            tps = given_tps[i] or default_tps
            if own_c:
                c = given_c[i] or default_c
            kv = decode_blocks[i] * bs
            if kv > 0:
                n = in_flight[i]
                budget = budget_tokens - n if budget_tokens > n else 1
                steps = -(-work // budget) if work > budget else 1
                read = c * kv
                prefill = (work + steps * n) / tps + steps * read
                decode = out * (n / tps + read)
            else:
                prefill = work / tps
                decode = 0.0
            decoding = candidates.decoding(row_ids[i]) if remaining else ()
            if decoding:
                s1, s2 = shared_sums(decoding, out)
                decode = _remaining_decode(s1, s2, tps, c, bs, peer_weight, prompt)
            values.append(prefill + decode)
        return ColumnScores(
            np.array(values, dtype=np.float64),
            lambda: self._score_arrays(request, candidates, rows).terms(),
        )

    def _score_arrays(
        self, request: RoutingRequest, candidates: ReplicaColumns, rows: IntArray
    ) -> ColumnScores:
        """`score` as array operations (module docstring, "Columns")."""
        bs, prompt, default_tps, budget_tokens, c, out = self._constants(request)
        everyone = len(rows) == len(candidates)
        ints = candidates.ints if everyone else candidates.ints[:, rows]
        given_tps = candidates.tps if everyone else candidates.tps[rows]
        overlap = ints[0]
        queued = ints[1]
        uncached = np.maximum(prompt - overlap * bs, 0)
        work = queued + uncached
        tps = np.where(given_tps != 0.0, given_tps, default_tps)  # `tps or default`
        kv = ints[2] * bs
        has_kv = kv > 0
        n = np.where(has_kv, ints[6], 0)
        budget = np.where(budget_tokens > n, budget_tokens - n, 1)
        steps = np.where(has_kv, np.where(work > budget, -(-work // budget), 1), 0)
        c_rows: FloatArray | float = c
        if self.params.per_replica_decode_cost:
            given_c = candidates.kv_cost if everyone else candidates.kv_cost[rows]
            c_rows = np.where(given_c != 0.0, given_c, c)
        read = c_rows * kv
        prefill = np.where(has_kv, (work + steps * n) / tps + steps * read, work / tps)
        decode = np.where(has_kv, out * (n / tps + read), 0.0)
        if self.params.remaining_decode:
            peer_weight = self.params.peer_weight
            # the per-sequence sums as array operations over the candidates' (row, sequence)
            # table, rewritten only where a replica's sequences changed (decoding_table.py);
            # `_remaining_decode`'s operations in its order, `c` per row as the loop resolves it
            table = self._tables.of(candidates)
            s1, s2, busy = table.sums(None if everyone else rows, out)
            if busy.any():
                if peer_weight:
                    term = s1 * ((1.0 + peer_weight) / tps + peer_weight * prompt * c_rows)
                else:  # x + 0.0 is x: `_remaining_decode`'s value with one array op less
                    term = s1 * (1.0 / tps)
                term += s2 * (bs * c_rows)
                decode = np.where(busy, term, decode)
        values = prefill + decode
        ids = candidates.ids if everyone else [candidates.ids[i] for i in rows.tolist()]

        def terms() -> dict[str, dict[str, float]]:
            columns = (
                uncached.astype(np.float64),
                queued.astype(np.float64),
                kv.astype(np.float64),
                n.astype(np.float64),
                steps.astype(np.float64),
                prefill,
                decode,
                tps,
            )
            lists = [column.tolist() for column in columns]
            return {
                rid: dict(zip(_TERM_NAMES, row, strict=True))
                for rid, row in zip(ids, zip(*lists, strict=True), strict=True)
            }

        return ColumnScores(values, terms)

    def describe(self, terms: dict[str, float]) -> str:
        return (
            f"prefill {terms['prefill_s'] * 1e3:.1f} ms ({terms['queued_tokens']:.0f} queued + "
            f"{terms['uncached_tokens']:.0f} uncached at {terms['tokens_per_s']:.0f} tok/s, "
            f"{terms['steps']:.0f} steps beside {terms['decode_seqs']:.0f} decodes / "
            f"{terms['decode_kv_tokens']:.0f} KV tokens) + decode slow-down "
            f"{terms['decode_s'] * 1e3:.1f} ms"
        )
