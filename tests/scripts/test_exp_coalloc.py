"""scripts/experiments/exp_coalloc.py end to end, small: the four policies' figures as JSON, the
table."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = [sys.executable, "-m", "scripts.experiments.exp_coalloc"]
POLICIES = ["worst-fit", "close-to-files", "cm", "fcm"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_quick_json_compares_the_four_policies_on_the_same_jobs() -> None:
    out = run("--quick", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["seeds"], report["jobs"]) == (2, 60)
    policies = report["policies"]
    assert list(policies) == POLICIES
    for name, row in policies.items():
        for metric in ("mean_wait", "mean_service_time", "utilization"):
            assert len(row[metric]["values"]) == 2, (name, metric)
            assert row[metric]["ci95"] >= 0
        # Response is wait plus a run of 5 to 30 min at speed 1.
        assert 300 <= row["mean_service_time"]["mean"] - row["mean_wait"]["mean"] <= 1800
        assert 0 < row["utilization"]["mean"] < 1
        assert row["placement_tries"]["mean"] >= 1
        assert 1 <= row["coalloc_sites"]["mean"] <= 4
    # CM exists to span fewer clusters than Worst-Fit, and does, seed by seed.
    wf, cm = policies["worst-fit"]["coalloc_sites"], policies["cm"]["coalloc_sites"]
    assert all(c < w for c, w in zip(cm["values"], wf["values"], strict=True))
    # Close-to-Files moves fewer bytes than Worst-Fit, seed by seed.
    wf_bytes, ctf_bytes = (
        policies[p]["file_bytes"]["values"] for p in ("worst-fit", "close-to-files")
    )
    assert all(c < w for c, w in zip(ctf_bytes, wf_bytes, strict=True))
    assert out.stderr == ""  # no progress off a terminal


def test_the_table_and_bad_arguments() -> None:
    out = run("--seeds", "1", "--jobs", "20")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["policy", "wait", "(s)"]
    assert [line.split()[0] for line in lines[1:5]] == POLICIES
    assert "1 seeds, 20 jobs each, load 0.7" in out.stdout
    for argv, message in (
        (("--seeds", "0"), "argument --seeds: takes an integer >= 1, got 0"),
        (("--jobs", "0"), "--jobs takes an integer >= 1, got 0"),
        (("--load", "-1"), "--load takes a number in (0, 10), got -1.0"),
    ):
        bad = run(*argv)
        assert bad.returncode == 2
        assert message in bad.stderr
        assert "Traceback" not in bad.stderr
