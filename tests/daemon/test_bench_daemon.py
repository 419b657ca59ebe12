"""Smoke tests of the daemon benchmark, scripts/bench_daemon.py, run as a real subprocess.

They check that it measures and reports every figure and that it leaves no process behind, also
when interrupted; never its speed (timings belong to the benchmark, not to tests).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "scripts" / "bench_daemon.py"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.network
def test_quick_run_reports_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["quick"] is True
    for key in ("running", "busy"):
        a = figures[key]
        assert a["submissions"] == 500
        assert a["submissions_per_s"] > 0
        # Every acknowledged submission was timed by the broker itself: 100 warm-up too, and
        # in "busy" the job that holds the cores.
        assert a["durable"]["count"] == 600 + (key == "busy")
        assert a["durable"]["p50"] <= a["durable"]["p99"]
    assert figures["busy"]["started_per_s"] == 0  # its one core-hogging job holds the site
    decision = figures["running"]["decision"]
    assert decision["count"] == 600
    assert 0 < decision["mean"] <= decision["p99"] < math.inf
    starts = figures["starts"]
    assert starts["jobs"] == 8
    assert 0 < starts["median_s"] <= starts["p90_s"] <= starts["max_s"]
    assert list(tmp_path.iterdir()) == []  # the fleets' directory went with them


@pytest.mark.network
def test_an_interrupted_run_brings_its_fleet_down(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, str(BENCH), "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        records: list[Path] = []
        while not records and time.monotonic() < deadline and bench.poll() is None:
            records = list(tmp_path.glob("gbroker-bench-*/running/fleet.json"))
            time.sleep(0.05)
        assert records, "the benchmark's first fleet never came up"
        record = json.loads(records[0].read_text())
        pids = [record["mqtt"]["pid"], *(m["pid"] for m in record["sites"].values())]
        time.sleep(0.5)  # into the submissions
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, err
    assert "interrupted" in err
    left = [pid for pid in pids if not _gone(pid)]
    for pid in left:  # do not leave them to the next test, whatever the verdict
        os.killpg(pid, signal.SIGKILL)
    assert left == []
    assert list(tmp_path.iterdir()) == []
