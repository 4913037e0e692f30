"""`rl-rollouts`: multi-turn RL rollouts with stragglers (the Ray Serve LLM routing study).

Shape (defaults, all parameters below):

- `steps` RL steps (4); each step runs `rollouts_per_step` rollouts (8) of `turns` turns (10).
- A rollout starts with `prompt_tokens` (2048) input tokens; every turn generates
  `output_tokens` (1024), except that in each step `stragglers` rollouts (2, chosen by the
  seed) generate `straggler_output_tokens` (8192) on their *last* turn.
- Turn k > 0 appends `observation_tokens` (0) of environment feedback to the context, so turn
  k's prompt is `prompt_tokens + k·(output_tokens + observation_tokens)`: 2k, 3k, ..., 11k.
  With 0 observation tokens a live run sends the one-word user message " continue" (see
  `text.py`).
- Closed loop with `concurrency` (16) rollouts active at once; a rollout's next turn starts
  `env_time_s` (0) after its previous turn completes.
- Each step is one group (`"rollout/step-K"`): the step's rollout latency is the latest end
  minus the earliest start of its rollouts; the metric is the p99 over steps (`rollout_p99_s`).

Reading of the study (documented choices):

- *Concurrency 16 with 8 rollouts per step*: rollouts are queued step by step and a new one
  starts whenever fewer than 16 are active, so two steps' rollouts are in flight together
  (one-step-off-policy / asynchronous RL). The stragglers of step K then overlap with step
  K+1's short turns, which is what makes load-blind routing put 8k-token decodes next to each
  other. This is our reading: the study's public text found here gives the shape (8 x 10
  turns, 2k in, 1k out, 2 stragglers at 8k, concurrency 16) but not how 16 slots are filled by
  8-rollout steps. Use `concurrency=8` for a strictly synchronous run (one step at a time).
- *Shared prompt* (`shared_prompt=True`): GRPO-style RL samples every rollout of a step from the
  same prompt, so the step's 8 rollouts share their first 2048 tokens (one content id per step);
  their outputs differ (`output_content_id` per rollout). Prefix-affinity policies therefore see
  8 rollouts with the same prefix; token-load policies must spread them. `shared_prompt=False`
  gives each rollout its own prompt.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload, content_id_for

NAME = "rl-rollouts"


class RlRolloutsParams(BaseModel):
    """Parameters of `rl-rollouts` (names are the `load_workload(**kw)` keys)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(4, ge=1, description="RL steps (groups).")
    rollouts_per_step: int = Field(8, ge=1, description="Rollouts per step.")
    turns: int = Field(10, ge=1, description="Turns per rollout.")
    prompt_tokens: int = Field(2048, ge=1, description="Initial prompt of every rollout.")
    output_tokens: int = Field(1024, ge=1, description="Tokens generated per turn.")
    stragglers: int = Field(2, ge=0, description="Rollouts per step with a long last turn.")
    straggler_output_tokens: int = Field(8192, ge=1, description="A straggler's last turn.")
    observation_tokens: int = Field(0, ge=0, description="Environment feedback per turn > 0.")
    env_time_s: float = Field(0.0, ge=0.0, description="Delay between a rollout's turns.")
    concurrency: int = Field(16, ge=1, description="Rollouts active at once (closed loop).")
    shared_prompt: bool = Field(True, description="A step's rollouts share their prompt.")


def build(*, seed: int = 0, rate_scale: float = 1.0, **kw: object) -> Workload:
    """Build the workload (`rate_scale` has no effect: the loop is closed)."""
    p = RlRolloutsParams.model_validate(kw)
    if p.stragglers > p.rollouts_per_step:
        raise ValueError(
            f"stragglers ({p.stragglers}) must be <= rollouts_per_step ({p.rollouts_per_step})"
        )
    rng = np.random.default_rng([seed, 0x52_4C])
    sessions: list[SessionSpec] = []
    for step in range(p.steps):
        stragglers = {int(i) for i in rng.choice(p.rollouts_per_step, p.stragglers, False)}
        step_prompt = content_id_for(NAME, seed, "prompt", step)
        for r in range(p.rollouts_per_step):
            sid = f"rl/s{seed}/step{step}/r{r}"
            prompt_id = step_prompt if p.shared_prompt else content_id_for(NAME, seed, sid)
            turns: list[TurnSpec] = []
            for k in range(p.turns):
                if k == 0:
                    segs = [Segment(prompt_id, p.prompt_tokens)]
                elif p.observation_tokens:
                    segs = [Segment(content_id_for(NAME, sid, "obs", k), p.observation_tokens)]
                else:
                    segs = []
                last = k == p.turns - 1
                out = p.straggler_output_tokens if (last and r in stragglers) else p.output_tokens
                turns.append(TurnSpec(segs, out, p.env_time_s if k else 0.0))
            sessions.append(SessionSpec(sid, None, turns, group=f"rollout/step-{step}"))
    return Workload(
        name=NAME,
        sessions=sessions,
        concurrency=p.concurrency,
        meta={"params": p.model_dump(), "seed": seed, "metric": "rollout_p99_s"},
    )
