"""pgtick's benchmarks: ``python -m bench <part> [options]`` (see README, Performance)."""
