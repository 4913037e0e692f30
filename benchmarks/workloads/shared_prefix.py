"""`shared-prefix`: many users behind one long system prompt (the hot-spot test).

Every session starts with the same `prefix_tokens` (4096) system prompt (or one of `prefixes`
(1) prompts, chosen uniformly), then a user question; users come back for `turns` (4) turns in
total, each a new question after a think time. A prefix-affinity router sends everything to
the replica holding the prefix (a hot spot); a load-aware one must replicate the prefix.

| quantity | distribution (defaults) |
|---|---|
| arrival | Poisson, `rate` users/s (2.0), `users` users (64); first at t=0 |
| question per turn | lognormal(`question_median` 128, `question_sigma` 0.6), clipped [8, 4096] |
| output per turn | lognormal(`output_median` 256, `output_sigma` 0.6), clipped [1, 4096] |
| think time before turn > 0 | lognormal(`think_median_s` 5.0, 0.8), capped 60 s |

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

NAME = "shared-prefix"


class SharedPrefixParams(BaseModel):
    """Parameters of `shared-prefix` (names are the `load_workload(**kw)` keys)."""

    model_config = ConfigDict(extra="forbid")

    prefix_tokens: int = Field(4096, ge=1, description="Shared system prompt length.")
    prefixes: int = Field(1, ge=1, description="Distinct shared prompts (1 = one hot spot).")
    users: int = Field(64, ge=1, description="Number of user sessions.")
    turns: int = Field(4, ge=1, description="Turns per user session.")
    rate: float = Field(2.0, gt=0.0, description="User arrivals per second (Poisson).")
    question_median: float = Field(128.0, gt=0.0)
    question_sigma: float = Field(0.6, ge=0.0)
    output_median: float = Field(256.0, gt=0.0)
    output_sigma: float = Field(0.6, ge=0.0)
    think_median_s: float = Field(5.0, ge=0.0)


def build(*, seed: int = 0, rate_scale: float = 1.0, **kw: object) -> Workload:
    p = SharedPrefixParams.model_validate(kw)
    arrivals = poisson_arrivals(rng_for(seed, 1), p.rate, p.users)
    prefix_ids = [content_id_for(NAME, seed, "prefix", j) for j in range(p.prefixes)]
    sessions: list[SessionSpec] = []
    for u in range(p.users):
        rng = rng_for(seed, 2, u)
        sid = f"shared-prefix/s{seed}/u{u}"
        questions = lognormal_int(rng, p.question_median, p.question_sigma, 8, 4096, p.turns)
        outputs = lognormal_int(rng, p.output_median, p.output_sigma, 1, 4096, p.turns)
        thinks = lognormal_float(rng, p.think_median_s, 0.8, 60.0, p.turns)
        prefix = prefix_ids[int(rng.integers(p.prefixes))]
        turns: list[TurnSpec] = []
        for k in range(p.turns):
            q = Segment(content_id_for(NAME, sid, "q", k), questions[k])
            segs = [Segment(prefix, p.prefix_tokens), q] if k == 0 else [q]
            turns.append(TurnSpec(segs, outputs[k], thinks[k] if k else 0.0))
        sessions.append(SessionSpec(sid, arrivals[u] / rate_scale, turns))
    return Workload(
        name=NAME,
        sessions=sessions,
        concurrency=None,
        meta={"params": p.model_dump(), "seed": seed, "rate_scale": rate_scale},
    )
