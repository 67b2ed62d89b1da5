"""Benchmarks: `python -m bench` (see bench/README.md). Not part of the test suite."""
