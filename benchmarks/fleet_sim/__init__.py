"""The virtual-time fleet simulator: simulated engine cores + the real router, no sleeps.

See `benchmarks/fleet_sim/README.md`. Entry points: `run_simulation` (one policy),
`compare_policies` (several policies on the same arrivals), `FleetSpec.parse("4P4D")`.
"""

from __future__ import annotations

from benchmarks.fleet_sim.fleet import FleetSpec
from benchmarks.fleet_sim.policies import POLICY_PAIRS, router_config_for
from benchmarks.fleet_sim.records import SimConfig, SimResult
from benchmarks.fleet_sim.simulator import run_simulation

__all__ = [
    "POLICY_PAIRS",
    "FleetSpec",
    "SimConfig",
    "SimResult",
    "router_config_for",
    "run_simulation",
]
