"""`benchmarks/fleet_sim/hit_loss.py`: the split of the hits lost against the pooled-LRU bound."""

from __future__ import annotations

from benchmarks.fleet_sim.hit_loss import measure


def test_the_split_adds_up_and_least_request_gives_hits_away() -> None:
    # least_request ignores the cache, so what it loses was mostly held by another replica.
    got = measure("4C", 3.0, "least_request", 150)
    lost = got["lost_of_prompt"]
    assert isinstance(lost, float) and lost > 0.0
    away, gone = got["routed_away_of_lost"], got["not_in_fleet_of_lost"]
    assert isinstance(away, float) and isinstance(gone, float)
    assert abs(away + gone - 1.0) < 0.002
    assert away > 0.5
    hit, bound = got["hit_rate"], got["pooled_lru_hit_rate"]
    assert isinstance(hit, float) and isinstance(bound, float)
    assert hit <= bound
