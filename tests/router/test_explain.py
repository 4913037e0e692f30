"""Explain structures: every candidate's numbers, JSON round trip."""

from __future__ import annotations

import json

from router.explain import DecisionExplanation, explain_pd, explain_pick
from router.pd_decision import PdDecisionParams, decide_pd
from router.policies.config import build_policy
from router.replica_state import ReplicaSnapshot, RoutingRequest, build_snapshots
from router.token_load import TokenLoad


def test_full_decision_explained_and_json_serialisable() -> None:
    now = 10.0
    load = TokenLoad()
    load.on_admitted("old", "p1", now, prompt_tokens=5000, uncached_tokens=5000, block_size=16)
    load.observe_metrics(
        "d0", now, num_running=3, num_waiting=0, kv_usage=0.25, kv_capacity_blocks=2000
    )
    req = RoutingRequest(
        request_id="r42", prompt_tokens=2048, block_size=16, block_keys=tuple(range(128))
    )
    prefill_snaps = build_snapshots(["p0", "p1"], {"p1": 100}, load, now)
    prefill = build_policy({"name": "token_load"}).pick(req, prefill_snaps, now)
    pd = decide_pd(req, prefill_snaps, PdDecisionParams(), now)
    decode_snaps = build_snapshots(["d0", "d1"], {}, load, now)
    decode = build_policy({"name": "token_load_decode"}).pick(req, decode_snaps, now)

    explanation = DecisionExplanation(
        request_id=req.request_id,
        now=now,
        prompt_tokens=req.prompt_tokens,
        prompt_blocks=req.prompt_blocks,
        prefill=explain_pick("prefill", prefill, prefill_snaps),
        pd=explain_pd(pd),
        decode=explain_pick("decode", decode, decode_snaps),
    )
    assert explanation.prefill is not None and explanation.decode is not None
    rows = {r.replica_id: r for r in explanation.prefill.replicas}
    assert explanation.prefill.policy == "token_load"
    assert explanation.prefill.chosen == "p0"
    assert rows["p0"].chosen and not rows["p1"].chosen
    assert rows["p1"].overlap_blocks == 100
    assert rows["p1"].prefill_tokens_left == 5000
    assert rows["p1"].score is not None and rows["p0"].score is not None
    assert rows["p1"].score > rows["p0"].score
    assert rows["p1"].terms["uncached_tokens"] == 2048 - 1600
    drow = {r.replica_id: r for r in explanation.decode.replicas}
    assert drow["d0"].kv_usage == 0.25 and drow["d0"].num_running == 3
    assert explanation.pd is not None and explanation.pd.disaggregate

    text = explanation.model_dump_json()
    data = json.loads(text)
    assert data["prefill"]["replicas"][0]["replica_id"] == "p0"
    assert data["pd"]["reason"] == pd.reason
    assert DecisionExplanation.model_validate_json(text) == explanation


def test_rejected_and_unhealthy_rows() -> None:
    req = RoutingRequest(request_id="r", prompt_tokens=160, block_size=16)
    snaps = [ReplicaSnapshot("a", healthy=False), ReplicaSnapshot("b", num_waiting=3)]
    decision = build_policy({"name": "llmd"}).pick(req, snaps, 0.0)
    pick = explain_pick("prefill", decision, snaps)
    rows = {r.replica_id: r for r in pick.replicas}
    assert rows["a"].rejected == "unhealthy" and rows["a"].score is None
    assert rows["b"].chosen and set(rows["b"].terms) == {"prefix", "queue", "kv_utilization"}
    assert pick.higher_is_better
