"""Benchmarks: each module's `run() -> dict` returns figures with a same-run baseline."""
