"""pdorch: benchmarks."""
