"""Routing inputs as the policy tests build them: requests, replica states, shipped profiles."""

from __future__ import annotations

import random
from typing import Any

from router.plugins.profile import Profile
from router.policies.config import PolicyConfig, build_policy
from router.replica_state import ReplicaSnapshot, RoutingRequest

BS = 16


def request(
    prompt: int = 1600, *, session_key: str | None = None, max_tokens: int | None = None
) -> RoutingRequest:
    return RoutingRequest(
        request_id="req",
        prompt_tokens=prompt,
        block_size=BS,
        block_keys=tuple(range(prompt // BS)),
        session_key=session_key,
        max_tokens=max_tokens,
    )


def make(
    name: str,
    weights: dict[str, float] | None = None,
    rng: random.Random | None = None,
    **params: object,
) -> Profile:
    """The shipped profile `name` with `params` and `weights` adjustments."""
    return build_policy(PolicyConfig(name=name, params=params, weights=weights), rng=rng)


def part(profile: Profile, name: str) -> Any:
    """The profile's filter, scorer or picker called `name`."""
    parts = [*profile.filters, *(s for s, _ in profile.scorers), profile.picker]
    return next(p for p in parts if p.name == name)


# A replica state: its id, then any field by keyword (the snapshot's own typed signature).
rep = ReplicaSnapshot
