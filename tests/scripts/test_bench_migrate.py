"""Smoke tests of the migration benchmark, scripts/bench/bench_migrate.py, run as a real subprocess.

Tiny (one size of 1 MB, one repeat): they check that it measures and reports every figure, as
a table and as JSON, and leaves nothing behind; never its speed. Real CRIU
(scripts/setup/ensure_criu.sh builds it; scripts/test.sh runs it), a real 2-site fleet, root (as CI
runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Alone, after the others (scripts/test.sh): it times moves on a fleet of its own.
pytestmark = pytest.mark.serial

BENCH = [sys.executable, "-m", "scripts.bench.bench_migrate"]
STEPS = ("checkpoint", "bundle", "transfer", "unpack", "restore")
TINY = ("--sizes", "1", "--app-sizes", "1", "--repeats", "1")


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]
    return subprocess.run(
        [*BENCH, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=env,
    )


def test_a_tiny_run_reports_every_figure_as_json(tmp_path: Path) -> None:
    done = bench(*TINY, "--json", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["repeats"] == 1
    assert figures["machine"]["cpus"] == len(os.sched_getaffinity(0))
    assert figures["machine"]["criu"].startswith("CRIU ")
    assert [(row["kind"], row["size_mb"]) for row in figures["rows"]] == [
        ("criu", 1),
        ("application", 1),
    ]
    for row in figures["rows"]:
        for key in (*STEPS, "migrate", "bundle_bytes"):
            summary = row[key]
            assert len(summary["samples"]) == 1
            assert summary["min"] == summary["median"] == summary["max"] > 0
        # Every step ran inside the `gbroker migrate` command that waited for the move.
        assert sum(row[step]["median"] for step in STEPS) < row["migrate"]["median"]
        # The bundle holds the state (an image of the process, or the state it saved).
        assert row["bundle_bytes"]["median"] >= 1 << 20
    criu, application = figures["rows"]
    assert criu["criu_dump"]["median"] > 0
    assert criu["criu_restore"]["median"] > 0
    assert "criu_dump" not in application  # CRIU alone is measured beside CRIU's moves only
    assert list(tmp_path.iterdir()) == []  # the fleet went down, its directory with it


def test_a_tiny_run_prints_a_table(tmp_path: Path) -> None:
    done = bench(*TINY, "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["state", "kind"])
    assert header.split()[2:] == [
        "checkpoint", "bundle", "transfer", "unpack", "restore", "migrate", "bundle", "MB",
        "CRIU", "dump", "CRIU", "rest.",
    ]  # fmt: skip
    at = lines.index(header)
    criu, criu_spread, application, app_spread = lines[at + 1 : at + 5]
    assert criu.split()[:3] == ["1", "MB", "criu"]
    assert len(criu.split()) == 3 + 9  # a median in each column
    assert len(criu_spread.split()) == 9  # its min-max
    assert all(cell.count("-") == 1 for cell in criu_spread.split())
    assert application.split()[:3] == ["1", "MB", "application"]
    assert application.split()[-2:] == ["-", "-"]  # no CRIU alone beside it
    assert len(app_spread.split()) == 7
    assert "moving a running job" in lines[0].lower()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--sizes", "1,ten"),
            "--sizes: expected megabytes as integers >= 1 separated by commas (e.g. 1,10,100), "
            "got '1,ten'",
        ),
        (
            ("--app-sizes", "0"),
            "--app-sizes: expected megabytes as integers >= 1 separated by commas "
            "(e.g. 1,10,100), got '0'",
        ),
        (("--repeats", "0"), "--repeats: expected an integer >= 1, got 0"),
    ],
)
def test_a_bad_argument_is_one_precise_line(args: tuple[str, ...], said: str) -> None:
    done = bench(*args, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"bench_migrate.py: error: {said}"
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_without_root_it_says_so() -> None:
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is missing"
    done = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         *BENCH, *TINY],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "bench_migrate: must run as root: CRIU checkpoints, and jobs run as their users, need "
        "it (CI runs as root)"
    ]
