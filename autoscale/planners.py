"""Import this to register every planner (pdorch's own, the peers' baselines, the oracle).

from autoscale.planners import planner_factory, planner_names
planner = planner_factory("dynamo-planner")(policy, perf_model, **options)
"""

# the imports register the planners
import autoscale.baselines
import autoscale.planner  # noqa: F401  (import registers it)
from autoscale.planner_base import planner_factory, planner_names

__all__ = ["planner_factory", "planner_names"]
