"""The live run's accounting, in the what-if's terms, and the side-by-side comparison.

`live_accounting(raw, policy, record_s)` turns `runner.run_live`'s raw result into the keys the
what-if's `planner_result` has (`benchmarks/autoscale_sim/result.py`), all in virtual seconds
(real x 1/t):

- `attainment` / `attainment_p90` / `attainment_loose`: the what-if's definition: the share of
  all requests whose TTFT, mean ITL (`(end - start - TTFT) / (tokens - 1)`), or both are within
  the policy's targets (2x for loose); a failed request is within neither;
- `failed`: requests that did not succeed (non-200, an error event, a truncated stream, a
  transport error, or fewer tokens than asked), with up to 5 distinct messages;
- `timeline`: every `record_s`, per pool ready / pending / draining (the last sample at or
  before that time) and the arrival rate over the window;
- `per_minute`: per virtual minute of arrival, requests and the three attainments;
- `request_rows`: per request `[arrival_s, ttft_s, mean_itl_s, output_tokens, prompt_tokens,
  ok]`, virtual;
- `gpu_hours` (`_by_pool`): the integral of (ready + pending + draining) x GPUs per replica
  over the run, as the what-if pays for replicas;
- `scale_ups` / `scale_downs` per pool: changes of the provisioned count (events);
- `lifecycle_s`: per pool, decision → ready of each replica the actuator started (its
  `ActuatorStats.ready_s`, which includes the emulated cold start) and drain start → drained
  (its `DrainOutcome.duration_s`).

`compare(live, whatif)`: one row per metric, live, what-if and live / what-if; and the
timeline agreement per pool (the share of the what-if's `record_s` samples at which both
fleets had the same provisioned count, and the mean absolute difference).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from autoscale.policy import SloPolicy
from autoscale.signals import Pool
from autoscale.sizing import itl_target_s, ttft_target_s
from benchmarks.autoscale_sim.result import attainment_of
from benchmarks.live.client import RequestResult

LOOSE_FACTOR = 2.0
POOL_NAMES = ("prefill", "decode")


def failed(r: RequestResult) -> bool:
    """Not a success: an error, a cancellation, or fewer tokens than asked (truncated)."""
    return not r.ok or r.output_tokens < r.expected_output_tokens


def _mean_itl_s(r: RequestResult) -> float | None:
    return r.tpot_s


def attainment(
    results: list[RequestResult], time_scale: float, ttft_t: float, itl_t: float, required: float
) -> dict[str, Any]:
    """The what-if's attainment (`attainment_of`) over live requests, latencies stretched x 1/t."""
    samples: list[tuple[float | None, float | None, bool]] = []
    for r in results:
        done = not failed(r)
        t = r.ttft_s / time_scale if done and r.ttft_s is not None else None
        i_real = _mean_itl_s(r) if done else None
        samples.append((t, i_real / time_scale if i_real is not None else None, done))
    return attainment_of(samples, ttft_t, itl_t, required)


def per_minute(
    results: list[RequestResult], time_scale: float, ttft_t: float, itl_t: float
) -> list[dict[str, Any]]:
    """Per virtual minute of arrival: requests and the attainments (the what-if's keys)."""
    buckets: dict[int, list[RequestResult]] = {}
    for r in results:
        buckets.setdefault(int(r.start_s / time_scale // 60), []).append(r)
    out = []
    for minute in sorted(buckets):
        a = attainment(buckets[minute], time_scale, ttft_t, itl_t, 0.0)
        out.append(
            {
                "t_s": minute * 60.0,
                "requests": len(buckets[minute]),
                "attainment_both": a["both"],
                "attainment_ttft": a["ttft"],
                "attainment_itl": a["itl"],
            }
        )
    return out


def _at(timeline: list[dict[str, Any]], t: float) -> dict[str, Any]:
    """The last sample at or before `t` (the first one before any)."""
    row = timeline[0] if timeline else {}
    for sample in timeline:
        if sample["t_s"] > t + 1e-9:
            break
        row = sample
    return row


def _provisioned(row: dict[str, Any], pool: str) -> int:
    counts = row.get(pool, {})
    return int(counts.get("ready", 0)) + int(counts.get("pending", 0))


def _paid(row: dict[str, Any], pool: str) -> int:
    return _provisioned(row, pool) + int(row.get(pool, {}).get("draining", 0))


def live_accounting(raw: dict[str, Any], policy: SloPolicy, record_s: float) -> dict[str, Any]:
    """See the module docstring."""
    ts = raw["time_scale"]
    results: list[RequestResult] = raw["results"]
    tt, it = ttft_target_s(policy), itl_target_s(policy)
    q = policy.slo.ttft_ms.percentile / 100
    bad = [r for r in results if failed(r)]
    fine: list[dict[str, Any]] = raw["timeline"]
    gpu_s = dict.fromkeys(POOL_NAMES, 0.0)
    for a, b in itertools.pairwise(fine):
        for pool in POOL_NAMES:
            gpus = policy.limits(Pool(pool)).gpus_per_replica
            gpu_s[pool] += _paid(a, pool) * (b["t_s"] - a["t_s"]) * gpus
    end = raw["end_s"]
    timeline = []
    arrivals = sorted(r.start_s / ts for r in results)
    t = record_s
    while t <= end + 1e-9:
        row: dict[str, Any] = {"t_s": t}
        n = sum(1 for x in arrivals if t - record_s < x <= t)
        row["arrival_rps"] = n / record_s
        sample = _at(fine, t)
        for pool in POOL_NAMES:
            row[pool] = dict(sample.get(pool, {"ready": 0, "pending": 0, "draining": 0}))
        timeline.append(row)
        t += record_s
    ups: Counter[str] = Counter()
    downs: Counter[str] = Counter()
    for e in raw["events"]:
        (ups if e["to"] > e["from"] else downs)[e["pool"]] += 1
    lifecycle: dict[str, dict[str, list[float]]] = {
        p: {"ready": [], "drained": []} for p in POOL_NAMES
    }
    for pool, s in raw["ready_real_s"]:
        lifecycle.setdefault(pool, {"ready": [], "drained": []})["ready"].append(s / ts)
    for pool, s in raw["drain_real_s"]:
        lifecycle.setdefault(pool, {"ready": [], "drained": []})["drained"].append(s / ts)
    return {
        "planner": "pdorch",
        "requests": len(results),
        "planned": raw["planned"],
        "completed": len(results) - len(bad),
        "failed": len(bad),
        "failed_samples": sorted({r.error or "truncated" for r in bad})[:5],
        "attainment": attainment(results, ts, tt, it, q),
        "attainment_p90": attainment(results, ts, tt, it, 0.90),
        "attainment_loose": attainment(results, ts, LOOSE_FACTOR * tt, LOOSE_FACTOR * it, q),
        "gpu_hours": sum(gpu_s.values()) / 3600.0,
        "gpu_hours_by_pool": {p: v / 3600.0 for p, v in gpu_s.items()},
        "scale_ups": {p: ups[p] for p in POOL_NAMES},
        "scale_downs": {p: downs[p] for p in POOL_NAMES},
        "events": raw["events"],
        "drains": raw["drains"],
        "lifecycle_s": lifecycle,
        "per_minute": per_minute(results, ts, tt, it),
        "request_rows": [
            [
                round(r.start_s / ts, 3),
                None if r.ttft_s is None else round(r.ttft_s / ts, 4),
                None if (i := r.tpot_s) is None else round(i / ts, 5),
                r.output_tokens,
                r.expected_prompt_tokens,
                not failed(r),
            ]
            for r in results
        ],
        "timeline": timeline,
        "timeline_fine": fine,
        "end_s": end,
        "load_end_s": raw["load_end_s"],
        "time_scale": ts,
        "ticks": raw["ticks"],
        "settled": raw["settled"],
        "failed_starts": raw["failed_starts"],
        "decision_reasons": raw["decision_reasons"],
        "load_wall_real_s": raw["load_wall_real_s"],
        "fleet_start_real_s": raw["fleet_start_real_s"],
        "initial": raw["initial"],
    }


def whatif_scale_counts(whatif: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Scale-ups and scale-downs per pool from the what-if's `events`."""
    ups: Counter[str] = Counter()
    downs: Counter[str] = Counter()
    for e in whatif["events"]:
        if e.get("kind", "scale") == "scale":
            (ups if e["to"] > e["from"] else downs)[e["pool"]] += 1
    return {p: ups[p] for p in POOL_NAMES}, {p: downs[p] for p in POOL_NAMES}


def timeline_agreement(live: dict[str, Any], whatif: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per pool, over the what-if's samples: share equal provisioned, mean |difference|."""
    out: dict[str, dict[str, float]] = {}
    fine = live["timeline_fine"]
    for pool in POOL_NAMES:
        diffs = [
            abs(_provisioned(_at(fine, row["t_s"]), pool) - _provisioned(row, pool))
            for row in whatif["timeline"]
            if row["t_s"] <= live["end_s"] + 1e-9
        ]
        out[pool] = {
            "samples": len(diffs),
            "equal_share": sum(1 for d in diffs if d == 0) / len(diffs) if diffs else 1.0,
            "mean_abs_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        }
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def compare(live: dict[str, Any], whatif: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows `{"metric", "live", "whatif", "ratio"}` (ratio = live / what-if)."""
    rows: list[tuple[str, float | None, float | None]] = [
        ("requests", live["requests"], whatif["requests"]),
        ("failed (live) / lost (what-if)", live["failed"], whatif["lost"]),
    ]
    for key, label in (("attainment", "policy pair"), ("attainment_loose", "2x pair")):
        for part in ("both", "ttft", "itl"):
            rows.append((f"within SLO, {label}: {part}", live[key][part], whatif[key][part]))
    rows.append(
        (
            "TTFT at the SLO percentile, s",
            live["attainment"]["ttft_at_percentile_s"],
            whatif["attainment"]["ttft_at_percentile_s"],
        )
    )
    rows.append(
        (
            "mean ITL at the SLO percentile, ms",
            _ms(live["attainment"]["itl_at_percentile_s"]),
            _ms(whatif["attainment"]["itl_at_percentile_s"]),
        )
    )
    rows.append(("GPU-hours", live["gpu_hours"], whatif["gpu_hours"]))
    w_ups, w_downs = whatif_scale_counts(whatif)
    for pool in POOL_NAMES:
        rows.append(
            (
                f"{pool}: GPU-hours",
                live["gpu_hours_by_pool"][pool],
                whatif["gpu_hours_by_pool"][pool],
            )
        )
        rows.append((f"{pool}: scale-ups", live["scale_ups"][pool], w_ups[pool]))
        rows.append((f"{pool}: scale-downs", live["scale_downs"][pool], w_downs[pool]))
        peak_live = max((_provisioned(r, pool) for r in live["timeline_fine"]), default=0)
        peak_wi = max((_provisioned(r, pool) for r in whatif["timeline"]), default=0)
        rows.append((f"{pool}: peak provisioned", peak_live, peak_wi))
        lw, ww = live["lifecycle_s"].get(pool, {}), whatif.get("lifecycle_s", {}).get(pool, {})
        rows.append(
            (
                f"{pool}: decision → ready, mean s",
                _mean(lw.get("ready", [])),
                _mean(ww.get("ready", [])),
            )
        )
        rows.append(
            (
                f"{pool}: decision → drained, mean s",
                _mean(lw.get("drained", [])),
                _mean(ww.get("drained", [])),
            )
        )
    return [{"metric": m, "live": a, "whatif": b, "ratio": _ratio(a, b)} for m, a, b in rows]


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0
