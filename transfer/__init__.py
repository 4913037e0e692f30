"""pdorch: transfer."""
