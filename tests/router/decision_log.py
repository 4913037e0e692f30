"""Recorded routing decisions: the proof that the plugin profiles decide as the old policies did.

`python -m tests.router.decision_log` regenerates `tests/fixtures/router/decisions/*.json`.
The logs were first written by the per-policy classes that `router/plugins/` replaced; the
replay test (`tests/router/test_decision_replay.py`) feeds the same inputs to today's code and
asserts every decision is identical. Regenerate only on purpose, when a decision is meant to
change (and say why in the commit).

Inputs are built here, deterministically (seeded `random.Random`), and not stored: the fixture
holds only outcomes, so it stays small. They cover varied overlap, token load, KV usage and
capacity (0 = unknown too), queues, unhealthy replicas (all of them, sometimes), exact ties
(clones of a replica under another id), session keys, prompt text with shared prefixes (for
`cache_aware`), and `max_tokens`. Each policy routes a sequence as `PdRouter` does: `pick`,
then `on_request_routed` for the chosen replica (every 13th pick is not recorded as routed, as
an explain call or an unused decode pick, so state must not change in `pick`; sampling configs
route every pick, see `run_picks`).

Per pick the log holds the chosen replica, the scores of the candidates that competed (those
not in `rejected`), the score direction, and the rejected replica ids. `pd_router.json` holds
full `PdRouter.route` outcomes for the benchmark router configs (`benchmarks/fleet_sim`).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.fleet_sim.policies import router_config_for
from router.pd_router import NoReplicaError, PdRouter
from router.policies.config import PolicyConfig, RouterPolicyConfig, build_policy
from router.replica_columns import ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "router" / "decisions"

BLOCK_SIZE = 16

# policy -> parameter variants recorded (the first is the default config).
POLICY_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "round_robin": [{}],
    "least_request": [{}, {"load": "engine"}],
    "consistent_hash": [{}, {"fallback": "round_robin", "virtual_nodes": 7}],
    "cache_aware": [
        {},
        {
            "balance_abs_threshold": 4,
            "balance_rel_threshold": 1.2,
            "cache_threshold": 0.5,
            "eviction_interval_s": 3.0,
            "max_tree_size": 300,
        },
    ],
    "kv_overlap": [{}],
    "llmd": [{}],
    "dynamo": [{}, {"overlap_score_weight": 2.5}, {"temperature": 0.7, "seed": 11}],
    "token_load": [{}, {"decode_s_per_kv_token": 3e-7, "max_num_batched_tokens": 512}],
    "token_load_decode": [{}, {"kv_headroom_margin": 0.2, "prefill_weight": 0.5}],
}
# llmd with other weights, recorded as its own variant.
LLMD_WEIGHTS = {"prefix": 1.0, "queue": 0.5, "kv_utilization": 4.0}

# Params that pin a profile to the formula the logs were recorded with, where its default
# changed since (not part of the label): `token_load`'s straggler-aware term and per-replica
# KV cost became its profile's default on 2026-12-03 (router/profiles/token_load.yaml).
RECORDED_FORMULA: dict[str, dict[str, Any]] = {
    "token_load": {"remaining_decode": False, "per_replica_decode_cost": False},
}
_RECORDED_SUFFIX = "@remaining_decode=false@per_replica_decode_cost=false"

PICKS_DEFAULT = 300
PICKS_VARIANT = 120
ROUTES_PER_CONFIG = 120

TEXTS = [
    "You are a helpful assistant. Summarise the following report about",
    "You are a helpful assistant. Translate into French:",
    "System: tools available: search, calc. User question number",
    "def fibonacci(n):\n    # return the n-th number",
    "Once upon a time",
]


def _request(rng: random.Random, i: int) -> RoutingRequest:
    prompt = rng.choice([0, 5, 16, 40, 300, 520, 1200, 2048, 5000, 12000])
    blocks = prompt // BLOCK_SIZE
    text: str | None = None
    if rng.random() < 0.9:
        text = rng.choice(TEXTS) + " " + str(rng.randrange(0, 40)) * rng.randrange(1, 4)
    return RoutingRequest(
        request_id=f"q{i}",
        prompt_tokens=prompt,
        block_size=BLOCK_SIZE,
        block_keys=tuple(range(blocks)) if rng.random() < 0.8 else (),
        session_key=rng.choice([None, None, "s1", "s2", "s3", "alice", "bob", "s-99"]),
        prompt_text=text,
        max_tokens=rng.choice([None, None, 1, 64, 300, 2000]),
    )


def _snapshot(rng: random.Random, rid: str, request: RoutingRequest) -> ReplicaSnapshot:
    blocks = request.prompt_blocks
    capacity = rng.choice([0, 300, 2000, 8000, 20000]) if rng.random() < 0.85 else 0
    return ReplicaSnapshot(
        replica_id=rid,
        healthy=rng.random() > 0.15,
        overlap_blocks=rng.choice([0, 0, rng.randrange(0, blocks + 1), blocks]) if blocks else 0,
        prefill_tokens_queued=rng.choice([0, 0, rng.randrange(0, 3000), rng.randrange(0, 90000)]),
        decode_blocks=rng.choice([0, rng.randrange(0, 400), rng.randrange(0, 9000)]),
        kv_usage=rng.choice([0.0, round(rng.random(), 3), 0.95, 1.0]),
        num_running=rng.randrange(0, 40),
        num_waiting=rng.choice([0, 0, rng.randrange(0, 35)]),
        kv_capacity_blocks=capacity,
        requests_in_flight=rng.choice([0, rng.randrange(0, 10), rng.randrange(0, 200)]),
        prefill_tokens_per_s=rng.choice([None, None, 8000.0, 15000.0]),
        cached_blocks=rng.choice([0, rng.randrange(0, 50)]),
    )


def _clone(s: ReplicaSnapshot, rid: str) -> ReplicaSnapshot:
    return ReplicaSnapshot(
        rid,
        s.healthy,
        s.overlap_blocks,
        s.prefill_tokens_queued,
        s.decode_blocks,
        s.kv_usage,
        s.num_running,
        s.num_waiting,
        s.kv_capacity_blocks,
        s.requests_in_flight,
        s.prefill_tokens_per_s,
        s.cached_blocks,
    )


def _pool(rng: random.Random, prefix: str, request: RoutingRequest) -> list[ReplicaSnapshot]:
    n = rng.choice([1, 2, 3, 4, 4, 6])
    ids = [f"{prefix}{k}" for k in rng.sample(range(8), n)]  # not always in id order
    snaps: list[ReplicaSnapshot] = []
    for rid in ids:
        if snaps and rng.random() < 0.2:
            snaps.append(_clone(rng.choice(snaps), rid))  # an exact tie under another id
        else:
            snaps.append(_snapshot(rng, rid, request))
    return snaps


def pick_inputs(count: int, seed: int) -> Iterator[tuple[RoutingRequest, list[ReplicaSnapshot]]]:
    """The (request, candidates) sequence one policy is fed; `now` is the index."""
    rng = random.Random(seed)
    for i in range(count):
        request = _request(rng, i)
        yield request, _pool(rng, "r", request)


def route_inputs(
    count: int, seed: int
) -> Iterator[
    tuple[RoutingRequest, list[ReplicaSnapshot], list[ReplicaSnapshot], list[ReplicaSnapshot]]
]:
    """(request, prefill, decode, colocated) for `PdRouter.route`: P/D, P/D + colocated, and
    colocated-only fleets, mixed."""
    rng = random.Random(seed)
    for i in range(count):
        request = _request(rng, i)
        shape = rng.choice(["pd", "pd", "pd", "pdc", "c", "d"])
        prefill = _pool(rng, "p", request) if shape in ("pd", "pdc") else []
        decode = _pool(rng, "d", request) if shape != "c" else []
        colocated = _pool(rng, "c", request) if shape in ("pdc", "c") else []
        yield request, prefill, decode, colocated


def _seed_of(name: str) -> int:
    return sum(ord(c) * (k + 1) for k, c in enumerate(name))


def variant_label(policy: str, params: dict[str, Any], weights: dict[str, float] | None) -> str:
    parts = [policy, *(f"{k}={params[k]}" for k in sorted(params))]
    if weights:
        parts.append("weights=" + ",".join(f"{k}:{weights[k]}" for k in sorted(weights)))
    return "@".join(parts)


def _as(columns: bool, snaps: list[ReplicaSnapshot]) -> Sequence[ReplicaSnapshot]:
    return ReplicaColumns.of(snaps) if columns else snaps


def run_picks(
    config: PolicyConfig, count: int, seed: int, columns: bool = False
) -> list[tuple[str | None, dict[str, float], bool, list[str]]]:
    """Feed `count` picks to a fresh policy built from `config`; the outcome per pick.
    `columns`: the candidates as `ReplicaColumns` (router/replica_columns.py)."""
    policy = build_policy(config, rng=random.Random(seed))
    # A sampling pick draws once per routed request: a pick that is not routed may leave the
    # draw for the next one, so sampling configs route every pick.
    temperature = config.params.get("temperature", 0.0)
    sampling = isinstance(temperature, float | int) and temperature > 0
    out: list[tuple[str | None, dict[str, float], bool, list[str]]] = []
    for i, (request, snaps) in enumerate(pick_inputs(count, seed)):
        now = float(i)
        d = policy.pick(request, _as(columns, snaps), now)
        competing = {rid: s for rid, s in d.scores.items() if rid not in d.rejected}
        out.append((d.chosen, competing, d.higher_is_better, sorted(d.rejected)))
        if d.chosen is not None and (i % 13 != 12 or sampling):
            policy.on_request_routed(request, d.chosen, now)
    return out


def policy_cases() -> Iterator[tuple[str, str, PolicyConfig, int]]:
    """(policy, variant label, config, picks) of every recorded pick log."""
    for policy, variants in POLICY_VARIANTS.items():
        for k, params in enumerate(variants):
            count = PICKS_DEFAULT if k == 0 else PICKS_VARIANT
            yield (
                policy,
                variant_label(policy, params, None),
                PolicyConfig(name=policy, params={**RECORDED_FORMULA.get(policy, {}), **params}),
                count,
            )
        if policy == "llmd":
            label = variant_label(policy, {}, LLMD_WEIGHTS)
            yield policy, label, PolicyConfig(name=policy, weights=LLMD_WEIGHTS), PICKS_VARIANT


def router_cases() -> Iterator[tuple[str, RouterPolicyConfig]]:
    """The benchmark router configs (`benchmarks/fleet_sim/policies.py`) in every P/D mode,
    plus `token_load_decode` for both picks."""
    names = [
        "token_load",
        "round_robin",
        "least_request",
        "consistent_hash",
        "cache_aware",
        "kv_overlap",
        "llmd",
        "dynamo",
    ]
    for name in names:
        suffix = _RECORDED_SUFFIX if name in RECORDED_FORMULA else ""
        for mode in ("", "/always", "/never"):
            yield name + mode, router_config_for(name + mode + suffix)
    yield (
        "token_load@expected_output_tokens=1024",
        router_config_for("token_load@expected_output_tokens=1024" + _RECORDED_SUFFIX),
    )
    yield (
        "token_load_decode",
        RouterPolicyConfig(
            prefill=PolicyConfig(name="token_load_decode"),
            decode=PolicyConfig(name="token_load_decode"),
        ),
    )


_LEGACY_POOL = {"local": "decode"}


def run_routes(
    config: RouterPolicyConfig, count: int, seed: int, columns: bool = False
) -> list[list[Any]]:
    """`PdRouter.route` outcomes: [pool, disaggregate, prefill replica, decode replica, P/D
    decision, prefill pick, decode pick] per request (or ["none"] on `NoReplicaError`).
    `columns`: every pool's candidates as `ReplicaColumns`."""
    router = PdRouter(config, seed=seed)
    out: list[list[Any]] = []
    for i, (request, prefill, decode, colocated) in enumerate(route_inputs(count, seed)):
        try:
            route = router.route(
                request,
                _as(columns, prefill),
                _as(columns, decode),
                float(i),
                colocated=_as(columns, colocated),
                commit=i % 11 != 10,
            )
        except NoReplicaError:
            out.append(["none"])
            continue
        out.append(
            [
                # Recorded before `PdRoute.pool` became `PdRoute.kind`: the old "decode" pool
                # (the decode replica prefills itself) is `RouteKind.LOCAL` now.
                _LEGACY_POOL.get(route.kind.value, route.kind.value),
                route.disaggregate,
                route.prefill_replica,
                route.decode_replica,
                route.pd.disaggregate if route.pd is not None else None,
                route.prefill.chosen if route.prefill is not None else None,
                route.decode.chosen,
            ]
        )
    return out


def _write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


def _group(
    cases: list[tuple[str, str, PolicyConfig, int]],
) -> dict[str, list[tuple[str, PolicyConfig, int]]]:
    grouped: dict[str, list[tuple[str, PolicyConfig, int]]] = {}
    for policy, label, config, count in cases:
        grouped.setdefault(policy, []).append((label, config, count))
    return grouped


def generate(out_dir: Path = FIXTURE_DIR, log: Callable[[str], None] = print) -> None:
    """Write every decision log into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for policy, variants in _group(list(policy_cases())).items():
        data = {
            label: [list(row) for row in run_picks(config, count, _seed_of(label))]
            for label, config, count in variants
        }
        _write(out_dir / f"{policy}.json", data)
        log(f"{policy}: {sum(len(v) for v in data.values())} picks")
    routes = {
        label: run_routes(config, ROUTES_PER_CONFIG, _seed_of(label))
        for label, config in router_cases()
    }
    _write(out_dir / "pd_router.json", routes)
    log(f"pd_router: {sum(len(v) for v in routes.values())} routes")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE_DIR)
