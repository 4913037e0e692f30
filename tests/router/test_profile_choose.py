"""`Profile.choose` (the hot path's choice-only pick) chooses what `Profile.pick` chooses.

Random 1-8 candidate states drawn from a few values each (so totals tie often, and the
tie-breaks decide), on every shipped profile: `max_score` ones take the lean path, the others
go through `pick`. Neither may change a part's state: the choice is taken before and after.
"""

from __future__ import annotations

import random

import pytest

from router.plugins.profile import Profile
from router.plugins.spec import profile_names
from router.policies.config import build_policy
from router.replica_columns import SCALAR_ROWS
from router.replica_state import ReplicaSnapshot, RoutingRequest


def _state(rng: random.Random) -> list[ReplicaSnapshot]:
    return [
        ReplicaSnapshot(
            replica_id=f"r{i}",
            healthy=rng.random() < 0.85,
            overlap_blocks=rng.choice([0, 0, 2, 4]),
            prefill_tokens_queued=rng.choice([0, 0, 64, 512]),
            decode_blocks=rng.choice([0, 8, 8, 40]),
            kv_usage=rng.choice([0.0, 0.5, 0.97]),
            num_running=rng.choice([0, 1, 3]),
            num_waiting=rng.choice([0, 0, 2]),
            kv_capacity_blocks=rng.choice([0, 1000]),
            requests_in_flight=rng.choice([0, 1, 1, 4]),
            prefill_tokens_per_s=rng.choice([None, 9_000.0]),
            cached_blocks=rng.choice([0, 10, 10]),
            decoding=tuple(
                (rng.choice([4, 16]), rng.choice([2, 8])) for _ in range(rng.randint(0, 2))
            ),
        )
        for i in range(rng.randint(1, SCALAR_ROWS))
    ]


@pytest.mark.parametrize("name", profile_names())
def test_choose_is_picks_choice_on_random_states(name: str) -> None:
    rng = random.Random(name)
    policy: Profile = build_policy({"name": name}, rng=random.Random(7))
    lean = 0
    for i in range(300):
        replicas = _state(rng)
        prompt = rng.choice([16, 64, 200])
        request = RoutingRequest(
            f"q{i}", prompt, 16, list(range(prompt // 16)), None, "hi " * (prompt // 3), 8, None
        )
        now = float(i)
        first = policy.choose(request, replicas, now)
        assert first == policy.pick(request, replicas, now).chosen
        assert policy.choose(request, replicas, now) == first  # no state changed
        lean += sum(r.healthy for r in replicas) > 1
        if first is not None and rng.random() < 0.5:
            policy.on_request_routed(request, first, now)  # stateful parts move on
    assert lean > 100  # most states had a choice to make among several survivors


def test_choose_with_no_healthy_candidate_is_none() -> None:
    policy = build_policy({"name": "token_load"})
    request = RoutingRequest("q", 40, 16)
    down = [ReplicaSnapshot("a", healthy=False), ReplicaSnapshot("b", healthy=False)]
    assert policy.choose(request, down, 0.0) is None
    assert policy.pick(request, down, 0.0).chosen is None
