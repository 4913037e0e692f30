"""Parts of `pdorch bench proxy` (entry point: `benchmarks/proxy_bench.py`)."""
