"""Actuators: where replicas live (local processes, Kubernetes, the fleet simulator, dry-run)."""
