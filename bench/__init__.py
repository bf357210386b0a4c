"""Benchmarks for XCLP (run as modules, e.g. `python -m bench.xclp_core`)."""
