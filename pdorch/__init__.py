"""pdorch: pdorch."""
