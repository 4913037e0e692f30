"""Garbage-collector settings for a long-running coordinator process (`pdorch serve`).

Measured (`benchmarks/results/proxy.md`, "GC"): with CPython's defaults (gen0 threshold 700)
a coordinator under `pdorch bench proxy` load spent 270-380 µs of every request in the cyclic
collector, most of it in full (gen2) collections of ~0.3 s each that walk every object built
at start-up (FastAPI/pydantic models, the router, the KV index), long enough to time out
health probes under load. A proxied request frees almost everything it allocates by reference
counting, so the collector finds little to reclaim.

`tune_gc_for_serving()`, called once the coordinator is up:
- `gc.freeze()` after a `gc.collect()`: every object alive after start-up moves to the
  permanent generation, which no collection walks again (they live as long as the process);
- `gc.set_threshold(GEN0_THRESHOLD [20000], 50, 100)`: a young collection after 20,000 net
  container allocations instead of 700 (cyclic garbage waits at most that long; in the run
  above one young collection per ~4,000 requests), and older generations every 50 / 100
  younger ones.
Not used by in-process servers (tests, benchmarks that share a process): freezing there would
keep other tests' garbage for good.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000
GEN1_THRESHOLD = 50
GEN2_THRESHOLD = 100


def tune_gc_for_serving(gen0: int = GEN0_THRESHOLD) -> None:
    """Freeze the start-up heap and raise the young-generation threshold (module docstring)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, GEN1_THRESHOLD, GEN2_THRESHOLD)
