"""The dry-run actuator says what it would do and changes nothing."""

from __future__ import annotations

import io

from autoscale.actuators.dry_run import DryRunActuator, StaticActuator
from autoscale.decision import RoleMove, ScaleDecision
from autoscale.signals import Pool, PoolStatus


def test_dry_run_prints_each_action_and_keeps_its_counts() -> None:
    counts = {Pool.PREFILL: PoolStatus(ready=1), Pool.DECODE: PoolStatus(ready=2, pending=1)}
    out = io.StringIO()
    actuator = DryRunActuator(lambda: counts, out=out)
    decision = ScaleDecision(
        now=5.0,
        desired={Pool.PREFILL: 2, Pool.DECODE: 3},
        reasons={Pool.PREFILL: "ttft-queue", Pool.DECODE: "hold"},
        moves=(RoleMove(Pool.DECODE, Pool.PREFILL),),
    )
    actuator.apply(decision, 5.0)
    # decode already has 3 provisioned: no action for it; the move and the prefill count print
    assert actuator.actions == [
        "would move replica <one decode replica> to pool prefill (t=5.0)",
        "would scale pool prefill from 1 to 2 replicas (t=5.0)",
    ]
    assert out.getvalue().count("dry-run: ") == 2
    assert actuator.current() == counts  # nothing changed
    assert StaticActuator is DryRunActuator
