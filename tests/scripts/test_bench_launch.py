"""scripts/bench/bench_launch.py, small: it runs jobs through a launcher and reports its rates."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_launch_benchmark_runs_and_reports_rates() -> None:
    # 300 jobs: the launcher's CPU (about 0.4 ms a job) spans several 10 ms clock
    # ticks of /proc's accounting; with 30 it could read 0 (CI did).
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.bench.bench_launch",
            "--jobs",
            "300",
            "--concurrency",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    ).stdout
    result = json.loads(out)
    for key in ("started_per_s", "finished_per_s", "bare_fork_exec_reap_per_s"):
        assert result[key] > 0
    assert result["finished_per_s"] <= result["started_per_s"]
    assert result["launcher_cpu_ms_per_job"] > 0
