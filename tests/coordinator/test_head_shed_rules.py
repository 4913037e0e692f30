"""The head-shedding rules (`pdorch/app/head_shed.py`), one by one, and their settings: pure."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pdorch.app.head_shed import HeadShed, LagGate
from pdorch.config.fleet import CoordinatorSettings
from pdorch.config.head_shed import HeadShedSettings

pytestmark = pytest.mark.unit


def test_off_never_lags_whatever_the_samples() -> None:
    gate = LagGate(max_lag_s=None)
    gate.expect(1.0)
    assert not gate.lagging(100.0)  # overdue by 99 s
    gate.observe(50.0, 101.0)
    assert not gate.lagging(101.0)


def test_an_overdue_probe_is_lag_before_it_runs() -> None:
    gate = LagGate(max_lag_s=0.1, hold_s=1.0)
    gate.expect(10.0)
    assert not gate.lagging(9.99)  # still sleeping
    assert not gate.lagging(10.1)  # due, 0.1 s late: not past the bound
    assert gate.lagging(10.11)
    assert gate.lag_s(10.5) == pytest.approx(0.5)


def test_a_late_sample_holds_the_gate_shut_for_hold_s_then_it_opens() -> None:
    gate = LagGate(max_lag_s=0.1, hold_s=1.0)
    gate.observe(0.3, 20.0)
    gate.expect(20.05)  # the next probe, on time from here
    assert gate.lagging(20.04)
    assert gate.lagging(20.99)
    gate.observe(0.0, 20.05)
    assert gate.lagging(20.5)  # an on-time sample does not reopen it early
    assert not gate.lagging(21.0)


def test_samples_at_or_under_the_bound_never_shut_it() -> None:
    gate = LagGate(max_lag_s=0.1, hold_s=1.0)
    for i in range(10):
        gate.observe(0.1, float(i))
        assert not gate.lagging(float(i))
    assert gate.lag_s(9.0) == pytest.approx(0.1)


def test_decide_protected_first_then_lag_then_pending() -> None:
    gate = LagGate(max_lag_s=0.1)
    shed = HeadShed(gate, protected_priority=5, max_pending_requests=2)
    assert shed.decide(0, 1.0) is None
    gate.observe(1.0, 1.0)  # lagging from here for hold_s
    assert shed.decide(0, 1.5) == "loop_lag"
    assert shed.decide(4, 1.5) == "loop_lag"
    assert shed.decide(-100, 1.5) == "loop_lag"
    assert shed.decide(5, 1.5) is None  # protected: never, even lagging
    assert shed.decide(100, 1.5) is None
    shed.pending = 2
    assert shed.decide(0, 1.5) == "loop_lag"  # lag named first
    assert shed.decide(0, 3.0) == "pending"  # the lag over, the pending cap still holds
    assert shed.decide(5, 3.0) is None  # protected past the cap too
    shed.pending = 1
    assert shed.decide(0, 3.0) is None


def test_no_pending_cap_when_null() -> None:
    shed = HeadShed(LagGate(max_lag_s=None), max_pending_requests=None, pending=10**6)
    assert shed.decide(0, 0.0) is None


def test_settings_defaults_and_errors_name_the_field() -> None:
    settings = CoordinatorSettings()
    assert settings.listen_backlog == 1024
    shed = settings.head_shed
    assert (shed.max_lag_s, shed.hold_s, shed.probe_interval_s) == (None, 1.0, 0.05)
    assert (shed.protected_priority, shed.max_pending_requests) == (1, 1024)
    built = HeadShed.from_settings(HeadShedSettings(max_lag_s=0.2, protected_priority=7))
    assert (built.gate.max_lag_s, built.protected_priority) == (0.2, 7)
    for field, bad in (
        ("max_lag_s", 0),
        ("hold_s", -1),
        ("probe_interval_s", 0),
        ("protected_priority", 102),
        ("max_pending_requests", 0),
        ("bogus", 1),
    ):
        with pytest.raises(ValidationError, match=field):
            CoordinatorSettings.model_validate({"head_shed": {field: bad}})
    with pytest.raises(ValidationError, match="listen_backlog"):
        CoordinatorSettings.model_validate({"listen_backlog": 0})
