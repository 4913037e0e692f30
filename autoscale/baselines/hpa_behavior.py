"""Kubernetes HPA's replica arithmetic, shared by the HPA-driven baselines.

Source: Kubernetes docs "Horizontal Pod Autoscaling" (algorithm details; configurable scaling
behavior) and the `autoscaling/v2` API. Our own implementation of what they document:

- **Metric ratio.** `ratio = mean(metric over ready pods) / target`. Within `tolerance`
  (`|ratio - 1| ≤ 0.1`) nothing changes. Pods not yet ready are counted at 0 of the target when
  scaling up and at 100 % when scaling down, and the ratio is recomputed over all of them;
  if that flips the direction or lands within tolerance, nothing changes. Otherwise
  `desired = ceil(ratio · pods)`.
- **Stabilization.** Every recommendation is remembered; scaling up uses the *minimum*
  recommendation of the last `up_window_s`, scaling down the *maximum* of the last
  `down_window_s` (defaults 0 s and 300 s). The history starts with the current replica count
  at the controller's first decision, as Kubernetes' `normalizeDesiredReplicasWithBehaviors`
  seeds it: the first scale-down is held for `down_window_s`, not taken on the first tick.
- **Rate policies.** Per direction, a list of `(kind, value, period_s)`: `pods` allows `value`
  replicas per period, `percent` allows `value` % of the replicas at the period's start.
  With `select=max` (the default) the most permissive policy wins. Defaults: up
  max(100 %, 4 pods) per 15 s, down 100 % per 15 s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

Kind = Literal["pods", "percent"]


@dataclass(frozen=True, slots=True)
class RatePolicy:
    kind: Kind
    value: float
    period_s: float


@dataclass(frozen=True, slots=True)
class Behavior:
    up_window_s: float = 0.0
    up: tuple[RatePolicy, ...] = (RatePolicy("percent", 100, 15), RatePolicy("pods", 4, 15))
    down_window_s: float = 300.0
    down: tuple[RatePolicy, ...] = (RatePolicy("percent", 100, 15),)


def metric_recommendation(
    ready_values: list[float], pending: int, target: float, current: int, tolerance: float = 0.1
) -> int:
    """HPA's recommendation for one metric (module docstring); `current` when it cannot say."""
    if not ready_values or target <= 0:
        return current
    total = sum(ready_values)
    ratio = total / len(ready_values) / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    pods = len(ready_values)
    if pending > 0:
        filler = 0.0 if ratio > 1.0 else target
        adjusted = (total + filler * pending) / (pods + pending) / target
        if (adjusted > 1.0) != (ratio > 1.0) or abs(adjusted - 1.0) <= tolerance:
            return current
        ratio, pods = adjusted, pods + pending
    return math.ceil(ratio * pods - 1e-9)


class HpaController:
    """Stabilization windows and rate policies of one scale target (module docstring)."""

    def __init__(self, behavior: Behavior) -> None:
        self.behavior = behavior
        self._recs: deque[tuple[float, int]] = deque()
        self._events: deque[tuple[float, int]] = deque()  # (time, replica change)
        self._seeded = False

    def _limit(self, now: float, current: int, policies: tuple[RatePolicy, ...], up: bool) -> int:
        limits: list[int] = []
        for pol in policies:
            changed = sum(d for t, d in self._events if now - t < pol.period_s and (d > 0) == up)
            start = current - changed  # replicas at the start of the period
            if pol.kind == "pods":
                step = int(pol.value)
            else:
                step = math.ceil(start * pol.value / 100.0) if up else int(start * pol.value / 100)
            limits.append(start + step if up else start - step)
        if not limits:
            return 10**9 if up else 0
        return max(limits) if up else min(limits)

    def decide(self, now: float, current: int, recommendation: int) -> tuple[int, str]:
        """Replicas after stabilization and rate limits, and what bound them."""
        b = self.behavior
        if not self._seeded:  # Kubernetes seeds the history with the current count
            self._recs.append((now, current))
            self._seeded = True
        self._recs.append((now, recommendation))
        keep = max(b.up_window_s, b.down_window_s)
        while self._recs and now - self._recs[0][0] > keep:
            self._recs.popleft()
        # Kubernetes counts history strictly inside the window (a 0 s window: only this tick's).
        up_rec = min([recommendation] + [r for t, r in self._recs if now - t < b.up_window_s])
        down_rec = max(r for t, r in self._recs if now - t <= b.down_window_s)
        target, reason = current, "hold"
        if up_rec > current:
            target, reason = up_rec, "metric"
        elif down_rec < current:
            target, reason = down_rec, "metric"
        elif recommendation != current:
            reason = "stabilization"
        if target > current:
            cap = self._limit(now, current, b.up, up=True)
            if target > cap:
                target, reason = max(cap, current), "rate-limit"
        elif target < current:
            floor = self._limit(now, current, b.down, up=False)
            if target < floor:
                target, reason = min(floor, current), "rate-limit"
        if target != current:
            self._events.append((now, target - current))
        period = max([p.period_s for p in (*b.up, *b.down)] or [0.0])
        while self._events and now - self._events[0][0] > period:
            self._events.popleft()
        return target, reason
