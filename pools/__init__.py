"""pdorch: pools."""
