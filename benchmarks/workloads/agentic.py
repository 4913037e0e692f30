"""`agentic`: heterogeneous coding-agent sessions (tool loops over a long, growing context).

Modelled on what public coding-agent traces show (Claude-Code agent traces, the Qwen-Bailian
coder trace, SWE-agent style loops): every request of a session re-sends the whole
conversation; a large system prompt + tool schemas is shared by all sessions of an agent; most
turns append a tool result (file reads, grep/test output: usually hundreds of tokens, sometimes
tens of thousands) and generate a short tool call, a few generate long code; sessions range
from one turn to a hundred; between turns the client runs the tool (seconds) or waits for the
human (tens of seconds).

The parameters below are chosen to be plausible, not fitted: the per-request numbers of the
public agent traces are not available here (the Claude-Code traces are described only by their
schema: per-session requests with input/output tokens and 64-token block ids). A sanity check
against public Claude Code usage records: a typical request re-reads tens of thousands of
cached tokens and appends a few hundred fresh ones, which is the shape this generator makes.

Per session (all draws seeded; lognormal(median, sigma) means exp(N(ln median, sigma²))):

| quantity | distribution (default parameters) |
|---|---|
| arrival | Poisson, `rate` sessions/s (0.2), `sessions` sessions (100); first at t=0 |
| system prompt | one of `system_variants` (2) shared prompts of `system_tokens` (8192) tokens |
| first user message | lognormal(`task_median` 400, `task_sigma` 1.0), clipped [16, 8000] |
| turns | lognormal(`turns_median` 8, `turns_sigma` 1.0), clipped [1, `max_turns` 100] |
| tool result per turn > 0 | lognormal(`tool_median` 500, `tool_sigma` 1.4), clipped [1, 24000] |
| output per turn | lognormal(`output_median` 120, `output_sigma` 1.3), clipped [1, 8192] |
| gap before turn > 0 | tool run: lognormal(`tool_time_median_s` 2.0, 1.0), capped 120 s |
| human turns | with probability `human_turn_prob` (0.1) a turn > 0 is a human message |
|   | (lognormal(`task_median`/4, 1.0) tokens) after lognormal(`human_time_median_s` 15, 1.0) s |

A session ends early when the next prompt would exceed `max_context_tokens` (131072): agents
compact or stop there; compaction is not modelled. With the defaults (seed 0, 1000 sessions):
turns p50/p90/p99 = 8/29/74; prompt tokens over all requests p50/p90/p99 = 20k/62k/117k;
output tokens p50/p90/p99 = 121/606/2587; 1.4 % of sessions reach the context cap.
`rate_scale` divides arrival times.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload, content_id_for
from benchmarks.workloads.sampling import (
    lognormal_float,
    lognormal_int,
    poisson_arrivals,
    rng_for,
)

NAME = "agentic"


class AgenticParams(BaseModel):
    """Parameters of `agentic` (names are the `load_workload(**kw)` keys)."""

    model_config = ConfigDict(extra="forbid")

    sessions: int = Field(100, ge=1, description="Number of sessions.")
    rate: float = Field(0.2, gt=0.0, description="Session arrivals per second (Poisson).")
    system_tokens: int = Field(8192, ge=0, description="Shared system prompt + tool schemas.")
    system_variants: int = Field(2, ge=1, description="Distinct shared system prompts.")
    task_median: float = Field(400.0, gt=0.0, description="First user message, median tokens.")
    task_sigma: float = Field(1.0, ge=0.0)
    turns_median: float = Field(8.0, gt=0.0, description="Turns per session, median.")
    turns_sigma: float = Field(1.0, ge=0.0)
    max_turns: int = Field(100, ge=1)
    tool_median: float = Field(500.0, gt=0.0, description="Tool result tokens, median.")
    tool_sigma: float = Field(1.4, ge=0.0)
    tool_max: int = Field(24000, ge=1)
    output_median: float = Field(120.0, gt=0.0, description="Generated tokens per turn, median.")
    output_sigma: float = Field(1.3, ge=0.0)
    output_max: int = Field(8192, ge=1)
    tool_time_median_s: float = Field(2.0, ge=0.0, description="Tool run time, median seconds.")
    human_turn_prob: float = Field(0.1, ge=0.0, le=1.0)
    human_time_median_s: float = Field(15.0, ge=0.0)
    max_context_tokens: int = Field(131072, ge=1)


def build(*, seed: int = 0, rate_scale: float = 1.0, **kw: object) -> Workload:
    p = AgenticParams.model_validate(kw)
    arrivals = poisson_arrivals(rng_for(seed, 1), p.rate, p.sessions)
    sessions: list[SessionSpec] = []
    for i in range(p.sessions):
        rng = rng_for(seed, 2, i)  # one stream per session: changing `sessions` keeps the others
        sid = f"agentic/s{seed}/{i}"
        n_turns = lognormal_int(rng, p.turns_median, p.turns_sigma, 1, p.max_turns, 1)[0]
        outputs = lognormal_int(rng, p.output_median, p.output_sigma, 1, p.output_max, n_turns)
        tools = lognormal_int(rng, p.tool_median, p.tool_sigma, 1, p.tool_max, n_turns)
        tool_times = lognormal_float(rng, p.tool_time_median_s, 1.0, 120.0, n_turns)
        human = [bool(x) for x in rng.random(n_turns) < p.human_turn_prob]
        human_tokens = lognormal_int(rng, p.task_median / 4, 1.0, 1, 8000, n_turns)
        human_times = lognormal_float(rng, p.human_time_median_s, 1.0, 300.0, n_turns)
        variant = int(rng.integers(p.system_variants))
        task = lognormal_int(rng, p.task_median, p.task_sigma, 16, 8000, 1)[0]

        first: list[Segment] = []
        if p.system_tokens:
            first.append(Segment(content_id_for(NAME, seed, "system", variant), p.system_tokens))
        first.append(Segment(content_id_for(NAME, sid, "task"), task))
        turns = [TurnSpec(first, outputs[0], 0.0)]
        context = p.system_tokens + task + outputs[0]
        for k in range(1, n_turns):
            if human[k]:
                seg = Segment(content_id_for(NAME, sid, "user", k), human_tokens[k])
                gap = human_times[k]
            else:
                seg = Segment(content_id_for(NAME, sid, "tool", k), tools[k])
                gap = tool_times[k]
            if context + seg.num_tokens + outputs[k] > p.max_context_tokens:
                break
            turns.append(TurnSpec([seg], outputs[k], gap))
            context += seg.num_tokens + outputs[k]
        sessions.append(SessionSpec(sid, arrivals[i] / rate_scale, turns))
    return Workload(
        name=NAME,
        sessions=sessions,
        concurrency=None,
        meta={"params": p.model_dump(), "seed": seed, "rate_scale": rate_scale},
    )
