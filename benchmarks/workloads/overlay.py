"""Scale a replayed trace's RATE without shortening it: k time-aligned copies of every request.

`load_trace(..., rate_scale=k)` divides arrival times by k, so a 1-hour trace at x16 lasts
225 s — shorter than two 120 s cold starts, which makes an autoscaling study meaningless (a
static fleet beats a clairvoyant planner). `overlay(workload, k)` keeps the trace's clock and
multiplies its load instead:

- copies `c = 0 .. floor(k) - 1` of every session, and one more copy kept with probability
  `k - floor(k)` per session (seeded: fractional k thins the last copy);
- copy 0 is the original; copy `c >= 1` arrives at `start_s + U(-jitter_s, +jitter_s)`
  (seeded, clipped at 0; default 0.5 s) so copies do not land in the same instant;
- copy `c >= 1` gets session id `"<id>#<c>"` and every content id remapped through a fixed
  mixing of `(content_id, c)`, consistently within the copy: prefix sharing *inside* a copy
  (a Mooncake trace's shared blocks) is preserved, and no copy hits another copy's cache, so
  the prefix-hit rate of the whole is the trace's.

The per-minute load shape is preserved up to the jitter and the thinning: bins are 60 s wide
and arrivals move by at most `jitter_s`, so each copy's per-minute profile equals the
original's except for the requests within `jitter_s` of a bin edge (`load_profile.py`
measures it; tests/benchmarks/test_traces.py checks it).
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload

__all__ = ["overlay"]

_MASK63 = (1 << 63) - 1
_MIX = 0x9E3779B97F4A7C15  # odd: the multiply is a bijection mod 2^64
_COPY_SALT = 0xD1B54A32D192ED03


def _remap(content_id: int, copy: int) -> int:
    return ((content_id * _MIX) ^ (copy * _COPY_SALT)) & _MASK63


def overlay(workload: Workload, k: float, *, seed: int = 0, jitter_s: float = 0.5) -> Workload:
    """`workload` with its open-loop rate multiplied by `k` (>= 1 copies; see the docstring)."""
    if k <= 0:
        raise ValueError(f"overlay factor must be > 0, got {k}")
    if jitter_s < 0:
        raise ValueError(f"jitter_s must be >= 0, got {jitter_s}")
    whole = math.floor(k)
    frac = k - whole
    rng = np.random.default_rng([seed, 0x0E71A7])
    n = len(workload.sessions)
    copies = whole + (1 if frac > 1e-12 else 0)
    out: list[SessionSpec] = []
    for c in range(copies):
        keep = rng.random(n) < (frac if c == whole else 1.0)
        jit = rng.uniform(-jitter_s, jitter_s, n) if c > 0 else np.zeros(n)
        seg_map: dict[Segment, Segment] = {}
        for i, s in enumerate(workload.sessions):
            if not keep[i]:
                continue
            if c == 0:
                out.append(s)
                continue

            def seg(x: Segment, c: int = c, m: dict[Segment, Segment] = seg_map) -> Segment:
                y = m.get(x)
                if y is None:
                    y = m[x] = Segment(_remap(x.content_id, c), x.num_tokens)
                return y

            turns = [
                TurnSpec([seg(x) for x in t.new_segments], t.output_tokens, t.think_time_s)
                for t in s.turns
            ]
            start = None if s.start_s is None else max(0.0, s.start_s + float(jit[i]))
            out.append(SessionSpec(f"{s.session_id}#{c}", start, turns, s.group, s.carry_context))
    out.sort(key=lambda s: s.start_s if s.start_s is not None else 0.0)
    meta = dict(workload.meta)
    meta.update({"rate_mode": "overlay", "overlay_k": k, "overlay_jitter_s": jitter_s})
    return Workload(workload.name, out, workload.concurrency, meta)
