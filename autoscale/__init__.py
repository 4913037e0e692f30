"""pdorch: autoscale."""
