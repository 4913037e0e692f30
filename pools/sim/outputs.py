"""What the engine core hands back: per-request outputs, remote loads, step results (vLLM's
`EngineCoreOutput` / `SchedulerOutput` roles, trimmed to what the callers read)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from transfer.params import KvTransferParams

if TYPE_CHECKING:
    from pools.sim.request import Request


@dataclass(slots=True)
class RequestOutput:
    """What one request produced in one step (see README "API")."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: int | None
    num_prompt_tokens: int
    num_output_tokens: int
    is_first_token: bool
    num_cached_tokens: int
    num_local_cached_tokens: int
    num_external_tokens: int
    num_local_compute_tokens: int
    num_preemptions: int
    kv_transfer_params: KvTransferParams | None = None


@dataclass(slots=True)
class RemoteLoad:
    """KV the caller must move from a prefill engine into this one for a decode-leg request."""

    request_id: str
    kv_transfer_params: KvTransferParams
    remote_engine_id: str | None
    remote_host: str | None
    remote_port: int | None
    remote_request_id: str | None
    remote_block_ids: list[int]
    local_block_ids: list[int]
    num_tokens: int
    prompt_token_ids: list[int]
    first_block: int


@dataclass(slots=True)
class StepResult:
    """One engine step. Outputs are valid at `end = start + duration_s`."""

    start: float
    duration_s: float
    end: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    outputs: list[RequestOutput]
    new_remote_loads: list[RemoteLoad]
    num_preempted: int
    num_scheduled_by_request: dict[str, int]


@dataclass(slots=True)
class DecodeFastForward:
    """What `num_steps` pure-decode steps produced: every running request got one token per step.

    `step_ends[j]` is when step j's outputs are valid; `request_ids` in running order;
    `new_token_ids[i]` the tokens request i generated (one per step; empty for token-free
    requests, whose token ids nobody reads); `num_output_tokens[i]` its total after the last
    step.
    """

    start: float
    end: float
    step_ends: list[float]
    request_ids: list[str]
    new_token_ids: list[list[int]]
    num_output_tokens: list[int]

    @property
    def num_steps(self) -> int:
        return len(self.step_ends)


@dataclass(slots=True)
class SchedulerOutput:
    """One scheduled step (vLLM's `SchedulerOutput`, trimmed), with the step's cost arguments.

    `scheduled`: (request, tokens) in scheduling order; `sampled`: the requests whose last
    scheduled token completes their sequence (they get a token this step); `outputs`: outputs
    already known at scheduling time (failed remote loads); `num_new_seqs`: requests scheduled
    for the first time (charged `per_new_seq_overhead_s`); `attn_ctx_tokens`, `kv_read_tokens`:
    `TimingModel.step_time`'s arguments.
    """

    start: float
    scheduled: list[tuple[Request, int]]
    sampled: list[Request]
    outputs: list[RequestOutput]
    new_remote_loads: list[RemoteLoad]
    num_preempted: int
    num_new_seqs: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    attn_ctx_tokens: float
    kv_read_tokens: int


def make_output(r: Request, toks: list[int], finished: bool, first: bool = False) -> RequestOutput:
    """`r`'s output for this step (`toks`: its new tokens)."""
    local = r.num_local_cached_tokens
    ext = r.num_external_tokens
    prompt = r.num_prompt_tokens
    # Positional, in field order: one of these per request per step (the simulator's hot path).
    return RequestOutput(
        r.request_id,
        toks,
        finished,
        r.status.finish_reason if finished else None,
        r.stop_reason,
        prompt,
        r.num_output_tokens,
        first,
        local + ext,
        local,
        ext,
        prompt - local - ext,
        r.num_preemptions,
    )
