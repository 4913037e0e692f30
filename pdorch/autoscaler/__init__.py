"""The live control loop: metrics source → planner → the coordinator's scaling (see README)."""
