"""Where a planner's GPU-hours above a reference run go, per pool and phase (exact, from
`results.json`).

    python -m benchmarks.autoscale_sim.attribution REF.json PLANNER.json \
        [--ref-name oracle-cold] [--name pdorch] [--json]

A run's paid GPU-seconds per pool are exactly `∫ provisioned(t) dt + Σ drain seconds`
(`provisioned` = ready + pending, rebuilt from the scale events: the initial fleet plus each
event's `to - from`; a draining replica has left `provisioned` and is paid in
`lifecycle_s[pool]["drained"]`). So the gap to the reference is `∫ (P(t) - R(t)) dt` plus
the difference of the drains, and the integral is split over time by what the *reference*
plan (`R`, normally `oracle-cold`: the cheapest plan for the oracle's need that pays cold
starts) does at `t`, first match wins:

- `opening`: `t < opening_s` (default 300 s: the shared start fleet and the first cold
  starts; no plan ordering at 5 s has a new replica before 125 s);
- `ramp`: `R` is higher somewhere in `(t, t + startup_s]` than at `t` (the reference is
  about to grow: the excess here is ordering earlier or more than the growth needs);
- `hold`: `R` was higher somewhere in `[t - hold_s, t)` than at `t` (default `hold_s` 300 s
  = `scale_down_s` 180 + `startup_s` 120: pdorch's floor hold of a projection one cold
  start ahead; the excess here is holding after a peak);
- `steady`: otherwise (`R` flat over `[t - hold_s, t + startup_s]`).

Each phase reports the part above the reference (`above`, the planner's excess) and below it
(`below`, negative: where the planner ran fewer). `sum(phases) + drain = gap` exactly.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
from dataclasses import dataclass
from typing import Any

POOLS = ("prefill", "decode")
PHASES = ("opening", "ramp", "hold", "steady")


@dataclass(frozen=True)
class Steps:
    """A piecewise-constant count: `initial` until the first of `times`, then `values[i]`
    from `times[i]` on (times sorted, one value per distinct time)."""

    initial: int
    times: list[float]
    values: list[int]

    def at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t + 1e-9)
        return self.initial if i == 0 else self.values[i - 1]

    def max_over(self, lo: float, hi: float, *, lo_open: bool) -> int:
        """Max over `(lo, hi]` (lo_open) or `[lo, hi)` (not lo_open) of the count."""
        if lo_open:
            best = self.at(hi)
            i = bisect.bisect_right(self.times, lo + 1e-9)
            j = bisect.bisect_right(self.times, hi + 1e-9)
        else:
            best = self.at(lo)
            i = bisect.bisect_right(self.times, lo + 1e-9)
            j = bisect.bisect_left(self.times, hi - 1e-9)
        for v in self.values[i:j]:
            best = max(best, v)
        return best


def provisioned(run: dict[str, Any], pool: str) -> Steps:
    """Ready + pending replicas of `pool` over time, from the run's scale events."""
    n = int(run["initial"][pool])
    times: list[float] = []
    values: list[int] = []
    for e in sorted((e for e in run["events"] if e["pool"] == pool), key=lambda e: e["t_s"]):
        n += int(e["to"]) - int(e["from"])
        if times and abs(times[-1] - e["t_s"]) < 1e-9:
            values[-1] = n
        else:
            times.append(float(e["t_s"]))
            values.append(n)
    return Steps(int(run["initial"][pool]), times, values)


def phase(ref: Steps, t: float, *, opening_s: float, startup_s: float, hold_s: float) -> str:
    """The phase of `t` by the reference plan (module docstring)."""
    now = ref.at(t)
    if t < opening_s:
        return "opening"
    if ref.max_over(t, t + startup_s, lo_open=True) > now:
        return "ramp"
    if ref.max_over(max(0.0, t - hold_s), t, lo_open=False) > now:
        return "hold"
    return "steady"


def attribute(
    ref: dict[str, Any],
    run: dict[str, Any],
    *,
    startup_s: float = 120.0,
    opening_s: float = 300.0,
    hold_s: float = 300.0,
) -> dict[str, dict[str, float]]:
    """GPU-hours of `run` above `ref` per pool: `{phase}_above`, `{phase}_below`, `drain`,
    `gap` (the measured difference of `gpu_hours_by_pool`), `rest` (gap minus the parts:
    the runs end at different times), `orders` / `ref_orders` (replicas cold-started)."""
    end = max(float(ref["end_s"]), float(run["end_s"]))
    out: dict[str, dict[str, float]] = {}
    for pool in POOLS:
        r, p = provisioned(ref, pool), provisioned(run, pool)
        cuts = sorted({0.0, end, *r.times, *p.times, opening_s})
        cuts = [c for c in cuts if 0.0 <= c <= end]
        # the phase changes where R changes, or startup_s before / hold_s after a change
        extra = {t - startup_s for t in r.times} | {t + hold_s for t in r.times}
        cuts = sorted(set(cuts) | {c for c in extra if 0.0 < c < end})
        parts = {f"{ph}_{side}": 0.0 for ph in PHASES for side in ("above", "below")}
        for a, b in itertools.pairwise(cuts):
            d = (p.at(a) - r.at(a)) * (b - a)
            if d == 0:
                continue
            ph = phase(r, a, opening_s=opening_s, startup_s=startup_s, hold_s=hold_s)
            parts[f"{ph}_{'above' if d > 0 else 'below'}"] += d
        drain = sum(run["lifecycle_s"][pool]["drained"]) - sum(ref["lifecycle_s"][pool]["drained"])
        gap = (run["gpu_hours_by_pool"][pool] - ref["gpu_hours_by_pool"][pool]) * 3600.0
        row = {k: v / 3600.0 for k, v in parts.items()}
        row["drain"] = drain / 3600.0
        row["gap"] = gap / 3600.0
        row["rest"] = (gap - sum(parts.values()) - drain) / 3600.0
        row["orders"] = float(len(run["lifecycle_s"][pool]["ready"]))
        row["ref_orders"] = float(len(ref["lifecycle_s"][pool]["ready"]))
        out[pool] = row
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--ref-name", default="oracle-cold")
    ap.add_argument("--name", default="pdorch")
    ap.add_argument("--startup-s", type=float, default=120.0)
    ap.add_argument("--opening-s", type=float, default=300.0)
    ap.add_argument("--hold-s", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with open(a.ref) as f:
        ref = json.load(f)["planners"][a.ref_name]
    with open(a.run) as f:
        run = json.load(f)["planners"][a.name]
    res = attribute(ref, run, startup_s=a.startup_s, opening_s=a.opening_s, hold_s=a.hold_s)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    for pool, row in res.items():
        print(pool, " ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print(
        f"{a.name} {run['gpu_hours']:.3f} GPU-h {run['attainment']['both']:.4f}; "
        f"{a.ref_name} {ref['gpu_hours']:.3f} GPU-h {ref['attainment']['both']:.4f}; "
        f"ratio {run['gpu_hours'] / ref['gpu_hours']:.3f}"
    )


if __name__ == "__main__":
    main()
