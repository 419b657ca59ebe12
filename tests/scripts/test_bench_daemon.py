"""Smoke tests of the daemon benchmark, scripts/bench/bench_daemon.py, run as a real subprocess.

They check that it measures and reports every figure and that it leaves no process behind, also
when interrupted; never its speed (timings belong to the benchmark, not to tests). The Slurm
part runs a real slurmctld, slurmd and munged (about 15 s); ``bash scripts/test.sh`` installs
them with scripts/setup/ensure_slurm.sh, and the benchmark runs that script itself when they are
missing.
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
from typing import Any

import pytest

from tests.conftest import ROOT

# Alone, after the others (scripts/test.sh): it times starts beside a Slurm of its own.
pytestmark = pytest.mark.serial

BENCH = [sys.executable, "-m", "scripts.bench.bench_daemon"]
DAEMONS = frozenset({"munged", "slurmctld", "slurmd"})
SLURM_PROCESSES = DAEMONS | {"slurmstepd"}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _assert_row(row: dict[str, float], jobs: int, warmup: int) -> None:
    """A row of the comparison: N jobs, every figure measured and consistent."""
    assert row["jobs"] == jobs
    assert row["warmup"] == warmup
    assert row["submissions_per_s"] > 0
    assert row["started_per_s"] > 0
    # Both clocks are the machine's wall clock: a job cannot start before it was sent.
    assert 0 < row["start_median_s"] <= row["start_p90_s"]
    assert row["idle_jobs"] == 1
    assert 0 < row["idle_start_median_s"] <= row["idle_start_p90_s"]


def _assert_backlog(row: dict[str, float], jobs: int, ahead: int) -> None:
    """A backlog row: N jobs released at once, each figure measured and consistent."""
    assert row["jobs"] == jobs
    assert row["ahead"] == ahead
    assert row["started_per_s"] > 0
    # Nothing starts before its blocker is cancelled; the first start comes before the last.
    assert 0 < row["release_to_first_s"] <= row["release_to_last_s"]


def _assert_limit(limit: dict[str, Any], count: int) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert limit["cpus"] == cpus
    assert set(limit["runs"]) == {
        "fork_serial", "fork_parallel", "spawn_serial", "spawn_parallel", "spawn_files_parallel",
    }  # fmt: skip
    for name, run in limit["runs"].items():
        assert run["starts"] == count * (cpus if name.endswith("parallel") else 1)
        assert run["per_s"] == pytest.approx(run["starts"] / run["seconds"])
    bare = {name: run for name, run in limit["runs"].items() if "files" not in name}
    fastest = max(run["per_s"] for run in bare.values())
    assert limit["runs"][limit["limit"]]["per_s"] == fastest  # the one with files is no candidate


@pytest.mark.network
def test_quick_run_reports_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BENCH, "--quick", "--json", "--no-slurm", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
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
    _assert_backlog(figures["busy"]["backlog"], jobs=500, ahead=100)
    # The backlog again with jobs not isolated (--run-as nobody --job-cgroups off), beside.
    assert figures["isolation"] == "both"
    _assert_backlog(figures["busy-shared"]["backlog"], jobs=500, ahead=100)
    # Where the CPU went while the backlog started: every part measured, none negative (but
    # the rest, the machine's busy time less the parts, which /proc's ticks may round below 0).
    split = figures["busy"]["backlog"]["cpu"]
    assert 0 < split["machine_busy"] <= 1
    assert split["broker_ms_per_job"] > 0
    assert split["launchers_ms_per_job"] > 0
    assert split["jobs_ms_per_job"] > 0  # the launchers' reaped children: the jobs
    assert split["other_ms_per_job"] > -0.1
    decision = figures["running"]["decision"]
    assert decision["count"] == 600
    assert 0 < decision["mean"] <= decision["p99"] < math.inf
    starts = figures["starts"]
    assert starts["jobs"] == 8
    assert 0 < starts["median_s"] <= starts["p90_s"] <= starts["max_s"]
    _assert_row(figures["gbroker"], jobs=500, warmup=100)
    _assert_limit(figures["limit"], count=200)
    assert figures["not_run"] == {"slurm": "--no-slurm given"}
    assert figures["slurm"] == {}
    limit = figures["limit"]["runs"][figures["limit"]["limit"]]["per_s"]
    backlog = figures["busy"]["backlog"]["started_per_s"]
    fork_parallel = figures["limit"]["runs"]["fork_parallel"]["per_s"]
    files = figures["limit"]["runs"]["spawn_files_parallel"]["per_s"]
    assert figures["ratios"] == {
        "of_limit": pytest.approx(figures["gbroker"]["started_per_s"] / limit),
        "backlog_of_limit": pytest.approx(backlog / limit),
        "backlog_of_fork_parallel": pytest.approx(backlog / fork_parallel),
        "backlog_of_files": pytest.approx(backlog / files),
    }
    assert figures["slurm_backlog"] == {}
    assert list(tmp_path.iterdir()) == []  # the fleets' directory went with them


def test_the_table_says_what_was_not_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BENCH, "--quick", "--no-slurm", "--no-gbroker"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Each system's row in both tables: the concurrent one and the backlog.
    assert sum("gbroker: not run (--no-gbroker given)" in line for line in lines) == 2
    assert sum("slurm: not run (--no-slurm given)" in line for line in lines) == 4
    assert sum(line.endswith("<- the limit") for line in lines) == 1
    assert sum("limit: spawn + job dir, 2 files" in line for line in lines) == 1


@pytest.mark.network
def test_quick_slurm_run_measures_both_variants(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BENCH, "--quick", "--json", "--no-gbroker", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["not_run"] == {"gbroker": "--no-gbroker given"}
    assert set(figures["slurm"]) == {"slurm", "slurm tuned"}
    for row in figures["slurm"].values():
        _assert_row(row, jobs=40, warmup=10)
    assert set(figures["slurm_backlog"]) == {"slurm", "slurm tuned"}
    for row in figures["slurm_backlog"].values():
        _assert_backlog(row, jobs=40, ahead=0)
    assert figures["ratios"] == {}  # nothing to compare Slurm with
    assert list(tmp_path.iterdir()) == []
    assert _slurm_daemons(tmp_path, SLURM_PROCESSES) == []


@pytest.mark.network
def test_quick_slurm_site_run_measures_both_rows(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BENCH, "--slurm-site", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["quick"] is True
    assert figures["load"] == {"cores": 64, "jobs": 40, "warmup": 5, "clients": 64}
    for key in ("slurm", "gbroker"):
        row = figures[key]
        assert row["jobs"] == 40
        assert row["submissions_per_s"] > 0
        assert row["started_per_s"] > 0
        # One wall clock: no job starts before it was sent, none is seen ended before its end.
        assert 0 < row["start_median_s"] <= row["start_p90_s"]
        assert 0 < row["first_to_last_end_s"] <= row["first_to_seen_done_s"]
        assert row["done_per_s"] == pytest.approx(40 / row["first_to_last_end_s"])
        assert row["seen_done_per_s"] == pytest.approx(40 / row["first_to_seen_done_s"])
    assert set(figures["commands"]) == {"sbatch --hold", "scontrol release", "squeue --states=all"}
    assert all(seconds > 0 for seconds in figures["commands"].values())
    assert set(figures["load_average"]) == {"before", "between", "after"}
    assert list(tmp_path.iterdir()) == []
    assert _slurm_daemons(tmp_path, SLURM_PROCESSES) == []


def test_slurm_site_refuses_to_leave_a_system_out() -> None:
    done = subprocess.run(
        [*BENCH, "--slurm-site", "--no-gbroker"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        "--slurm-site: measures both GBroker and Slurm, without --no-gbroker"
    )


def _slurm_daemons(under: Path, names: frozenset[str] = DAEMONS) -> list[int]:
    """Live processes named in ``names`` whose command line or environment mentions ``under``
    (a job step names its cluster's slurm.conf in its environment only)."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "comm").read_text().strip()
            mentions = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if name in names and str(under).encode() in mentions and not _gone(int(proc.name)):
            left.append(int(proc.name))
    return left


@pytest.mark.network
def test_an_interrupted_run_brings_its_fleet_down(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [*BENCH, "--no-slurm", "--spawns", "50", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
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


@pytest.mark.network
def test_an_interrupted_run_stops_its_slurm(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [*BENCH, "--quick", "--no-gbroker", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not _slurm_daemons(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while len(_slurm_daemons(tmp_path)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        daemons = _slurm_daemons(tmp_path)
        assert len(daemons) == 3, "munged, slurmctld and slurmd never all ran"
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, err
    assert "interrupted" in err
    left = _slurm_daemons(tmp_path, SLURM_PROCESSES)
    for pid in left:  # do not leave them to the next test, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert left == []
    assert list(tmp_path.iterdir()) == []
