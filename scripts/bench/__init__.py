"""Benchmarks: each measures one figure of speed or cost of GBroker (docs/BENCHMARKS.md).

Run each from the checkout's root: ``python -m scripts.bench.bench_daemon --quick``.
"""
