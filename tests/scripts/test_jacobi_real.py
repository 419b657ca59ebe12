"""scripts/experiments/jacobi_real.py (issue 28, item 4b): the real Jacobi2D, a co-allocated job on
a netns fleet of topologies/jacobi-3.yaml, partitioned by each of AppLeS's four methods. A small
grid, as CI can afford: every method's job ends done, its grid equal to a serial Jacobi's, its rows
summing to the grid's, the AppLeS job placed by the owner's planner (its rows from the rank
table), and a measured and a predicted time per method."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Its fleet takes the host's namespaces and times CPU use: alone, after the others.
pytestmark = [
    pytest.mark.serial,
    pytest.mark.skipif(os.geteuid() != 0, reason="netns fleets need root (CI is root)"),
]


def test_the_quick_real_run_runs_every_method_as_a_coallocated_job() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="gbroker-jacobi-test-"))
    scratch.chmod(0o711)  # its jobs' accounts traverse it to their directories
    try:
        done = subprocess.run(
            [sys.executable, "-m", "scripts.experiments.jacobi_real", "--quick", "--check",
             "--json"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
            | {"TMPDIR": str(scratch)},
        )  # fmt: skip
        left = sorted(p.name for p in scratch.iterdir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert left == []  # its fleet and its jobs' files went with it
    report = json.loads(done.stdout)
    assert report["n"] == 240
    assert set(report["cpu_forecast"]) == {"fast", "half", "quarter"}
    assert all(0 < cpu <= 1 for cpu in report["cpu_forecast"].values())
    assert report["cpu_forecast"]["quarter"] <= 0.25  # capped at its share
    methods = {m["method"]: m for m in report["methods"]}
    assert list(methods) == [
        "blocked",
        "compile-time AppLeS",
        "runtime AppLeS, no selection",
        "runtime AppLeS",
    ]
    for method in methods.values():
        assert sum(method["rows"]) == 240
        assert len(method["sites"]) == len(method["rows"]) == len(set(method["sites"]))
        assert method["measured"][0] > 0
        assert method["predicted"] > 0
    assert methods["blocked"]["rows"] == [80, 80, 80]
    assert len(methods["runtime AppLeS, no selection"]["sites"]) == 3
    assert methods["runtime AppLeS"]["owner_predicted"] > 0
