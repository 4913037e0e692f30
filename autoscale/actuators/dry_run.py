"""`DryRunActuator` (alias `StaticActuator`): says what it would do, changes nothing.

For `pdorch autoscale --dry-run` and for fleets nobody may scale (static endpoints). It reports
the counts its `source` gives (a callable returning `{pool: PoolStatus}`, e.g. read from the
coordinator's `/admin/pools`; default: nothing), writes one line per request to `out`, and keeps
every request in `actions` (tests and `/admin/autoscale` read them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from autoscale.actuators.base import Actuator, PoolKey
from autoscale.signals import Pool, PoolStatus


class DryRunActuator(Actuator):
    """See the module docstring."""

    def __init__(
        self,
        source: Callable[[], dict[Pool, PoolStatus]] | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.source = source
        self.out = out if out is not None else sys.stdout
        self.actions: list[str] = []

    def current(self) -> dict[PoolKey, PoolStatus]:
        return dict(self.source().items()) if self.source is not None else {}

    def _say(self, line: str) -> None:
        self.actions.append(line)
        print(f"dry-run: {line}", file=self.out, flush=True)

    def scale(self, pool: Pool, replicas: int, now: float) -> None:
        have = self.current().get(pool, PoolStatus()).provisioned
        self._say(f"would scale pool {pool} from {have} to {replicas} replicas (t={now:.1f})")

    def switch_role(self, replica_id: str, to_pool: Pool, now: float) -> None:
        self._say(f"would move replica {replica_id} to pool {to_pool} (t={now:.1f})")

    def switchable(self, pool: Pool) -> list[str]:
        # no replica list to pick from: name the move by pool
        return [f"<one {pool} replica>"]


StaticActuator = DryRunActuator
