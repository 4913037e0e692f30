"""pdorch: router."""
