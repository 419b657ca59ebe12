"""scripts/experiments/exp_dynamite.py end to end, small: every scenario and threshold, the JSON,
the plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = [sys.executable, "-m", "scripts.experiments.exp_dynamite"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_every_scenario_and_threshold_against_no_migration(tmp_path: Path) -> None:
    png = tmp_path / "dynamite.png"
    out = run("--seeds", "2", "--jobs", "40", "--json", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["seeds"], report["jobs"]) == (2, 40)
    scenarios = report["scenarios"]
    assert list(scenarios) == [
        "long, small images",
        "long, large images, slow links",
        "short jobs",
    ]
    moved_somewhere = False
    for rows in scenarios.values():
        assert list(rows) == ["no migration", "T=0.55", "T=0.7", "T=0.85"]
        none = rows["no migration"]
        assert none["moves"]["mean"] == 0
        assert none["image_gb"]["mean"] == 0
        assert none["response_change"]["values"] == [0.0, 0.0]  # itself
        for label, row in rows.items():
            assert len(row["response_h"]["values"]) == 2, label
            assert row["response_h"]["mean"] > 0
            if row["moves"]["mean"] > 0:
                moved_somewhere = True
                assert row["work_moved_ch"]["mean"] > 0
                assert row["downtime_ch"]["mean"] > 0
                assert row["image_gb"]["mean"] > 0
            else:
                assert row["downtime_ch"]["mean"] == 0
    assert moved_somewhere  # the slowed sites did send running jobs away
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stderr == f"wrote {png}\n"  # no progress off a terminal


def test_the_table_and_bad_arguments() -> None:
    out = run("--seeds", "1", "--jobs", "20")
    assert out.returncode == 0, out.stderr
    assert "long, large images, slow links  T=0.85" in out.stdout
    assert "1 seeds, 20 jobs each" in out.stdout
    bad = run("--seeds", "0")
    assert bad.returncode == 2
    assert "argument --seeds: takes an integer >= 1, got 0" in bad.stderr
    assert "Traceback" not in bad.stderr
