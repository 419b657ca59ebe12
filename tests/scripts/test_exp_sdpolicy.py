"""scripts/experiments/exp_sdpolicy.py end to end on a tiny trace of our own: every run, the JSON,
the plot."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = [sys.executable, "-m", "scripts.experiments.exp_sdpolicy"]


def tiny_trace(path: Path) -> Path:
    """120 jobs on 16 processors, arriving faster than they are served: long wide jobs that
    can be mates and short ones that wait behind them. Requested times overestimate."""
    rng = random.Random(3)
    lines = ["; MaxProcs: 16", "; MaxNodes: 16"]
    submit = 0
    for k in range(1, 121):
        submit += rng.randint(0, 120)
        long = rng.random() < 0.3
        run = rng.randint(2000, 6000) if long else rng.randint(10, 600)
        procs = rng.choice([8, 16]) if long else rng.choice([1, 2, 4, 8])
        requested = int(run * rng.choice([1.0, 1.5, 3.0]))
        fields = [k, submit, -1, run, procs, -1, -1, procs, requested, -1, 1, 1, 1, 1, 1, 1, -1, -1]
        lines.append(" ".join(map(str, fields)))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_every_fraction_and_cut_off_runs_beside_static_easy(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "tiny.swf")
    png = tmp_path / "sd.png"
    out = run("--trace", str(trace), "--seeds", "3", "--json", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["jobs"], report["cores"], report["seeds"]) == (120, 16, 3)
    rows = report["sd_policy"]
    for fraction in ("0%", "25%", "50%", "100%"):
        for cut in ("5", "10", "50", "inf", "dynamic"):
            assert f"{fraction} {cut} ideal" in rows
        assert (f"{fraction} dynamic worst" in rows) == (fraction != "0%")
    for label, row in rows.items():
        seeds = 3 if row["fraction"] in (0.25, 0.5) else 1
        assert len(row["response"]["values"]) == seeds, label
        if row["fraction"] == 0:  # no malleable job: exactly static EASY
            assert all(row[m]["mean"] == 0.0 for m in ("makespan", "response", "slowdown"))
            assert row["shared"]["mean"] == 0
    full = rows["100% inf ideal"]
    assert full["shared"]["mean"] > 0  # jobs did start on their mates' cores
    assert full["slowdown"]["mean"] < 0  # and the slowdown fell
    why = report["breakdown"]
    assert why["run"] == "100% 10 ideal"
    assert 0 <= why["most_response_saved"] <= why["wait_share_of_response"] <= 1
    assert sum(c["jobs"] for c in why["classes"]) == 120
    assert sum(c["share_of_response"] for c in why["classes"]) == pytest.approx(1.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stderr == f"wrote {png}\n"  # no progress bar off a terminal


def test_the_table_and_bad_arguments(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "tiny.swf")
    out = run("--trace", str(trace), "--seeds", "1", "--exact-estimates")
    assert out.returncode == 0, out.stderr
    assert "tiny.swf (exact estimates): 120 jobs, 16 cores" in out.stdout
    assert "the paper's best: makespan -7%, response -50%, slowdown -70%" in out.stdout
    assert "runs in" in out.stdout
    bad = run("--trace", str(trace), "--seeds", "0")
    assert bad.returncode == 2
    assert "argument --seeds: takes an integer >= 1, got 0" in bad.stderr
    missing = run("--trace", str(tmp_path / "none.swf"))
    assert missing.returncode == 2
    assert "--trace: cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
