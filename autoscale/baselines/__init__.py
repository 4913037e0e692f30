"""The peers' planners as baselines (and the oracle), registered by name on import.

One module each, formula + source + defaults in its docstring: `static` (static-peak,
static-mean), `hpa_kv_util`, `dynamo_planner`, `llmd_slo`, `aibrix_kpa`, `oracle`, `oracle_cold`
(the oracle paying cold starts and drains).
"""

from autoscale.baselines import (  # noqa: F401  (import registers them)
    aibrix_kpa,
    dynamo_planner,
    hpa_kv_util,
    llmd_slo,
    oracle,
    oracle_cold,
    static,
)
