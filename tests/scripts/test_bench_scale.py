"""Smoke test of the scale benchmark, scripts/bench/bench_scale.py, run as a real subprocess.

It checks the rows the benchmark prints (every torus, the control, the eviction rows) and that
each simulated every job; never its speed (timings belong to the benchmark, not to tests).
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BENCH = [sys.executable, "-m", "scripts.bench.bench_scale"]


def test_prints_a_row_per_torus_the_control_and_each_eviction() -> None:
    done = subprocess.run(
        [*BENCH, "--sides", "2,5", "--jobs-per-site", "5", "--evict", "0.05"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("2D torus, 32 cores per site")
    assert lines[1].split()[:4] == ["sites", "active", "evict", "jobs"]
    columns = ("sites", "active", "evict", "jobs", "wall", "jobs/s", "mean", "mean x", "median")
    rows = [dict(zip(columns, line.split(), strict=False)) for line in lines[2:]]
    # sites, active brokers, eviction and jobs of each row, in order.
    assert [(r["sites"], r["active"], r["evict"], r["jobs"]) for r in rows] == [
        ("4", "4", "-", "20"),
        ("25", "25", "-", "125"),
        ("25", "16", "-", "80"),
        ("4", "4", "0.05MB", "20"),
    ]
    assert rows[0]["mean x"] == "1.00"  # every ratio is to the smallest torus
    assert all(float(r["mean"]) > 0 and float(r["median"]) > 0 for r in rows)
