"""What-if autoscaling in the fleet simulator: planners drive a dynamic fleet in virtual time.

`runner.run_planner(workload, policy, name, config)` runs one planner; `observe.py` builds
its observations, `actuator.py` carries out its decisions, `result.py` accounts for the run.
"""
