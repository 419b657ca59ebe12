from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.errors import InvalidInput
from gbroker.sim.experiment import entry_sites, estimate, run_experiment
from gbroker.topology import load_topology
from tests.conftest import ROOT

PAPER = ROOT / "topologies" / "paper-6.yaml"


def test_estimate_is_the_student_t_interval() -> None:
    e = estimate([1.0, 2.0, 3.0, 4.0, 5.0])
    assert e.mean == 3.0
    # t(0.975, 4) = 2.776; s = sqrt(2.5); half-width = 2.776 * s / sqrt(5)
    assert e.half_width == pytest.approx(2.776445 * (2.5 / 5) ** 0.5, rel=1e-5)
    assert estimate([7.0]).half_width == 0.0
    with pytest.raises(InvalidInput):
        estimate([])


def test_entry_sites_start_at_the_data_site() -> None:
    topology = load_topology(PAPER)
    assert entry_sites(topology, 1, None) == ("Xeon80",)
    assert entry_sites(topology, 3, None) == ("Xeon80", "Core16", "L4001")
    assert len(entry_sites(topology, 6, "L4001")) == 6
    with pytest.raises(InvalidInput, match="streams"):
        entry_sites(topology, 7, None)
    with pytest.raises(InvalidInput, match="entry"):
        entry_sites(topology, 1, "Atlantis")


def test_seeds_are_independent_replications() -> None:
    topology = load_topology(PAPER)
    report = run_experiment(topology, DispatchPolicy(Algorithm.DLO), 0.3, 60, seeds=3)
    b = report.metrics["throughput"]
    assert len(set(b.values)) == 3
    assert b.half_width > 0
    assert report.double_starts == 0


def test_gbroker_sim_cli_json_and_errors() -> None:
    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gbroker", "sim", "--topology", str(PAPER), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = sim(
        "--algorithm",
        "dr",
        "--replicas",
        "3",
        "--rate",
        "0.3",
        "--jobs",
        "60",
        "--streams",
        "2",
        "--seeds",
        "2",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["policy"]["algorithm"] == "dr"
    assert report["policy"]["replicas"] == 3
    assert report["entries"] == ["Xeon80", "Core16"]
    assert report["double_starts"] == 0
    assert len(report["throughput"]["values"]) == 2
    human = sim("--algorithm", "dm", "--rate", "0.2", "--jobs", "30")
    assert human.returncode == 0, human.stderr
    assert "mean wait W (s)" in human.stdout
    bad = sim("--algorithm", "dlo", "--rate", "0.2", "--jobs", "10", "--entry", "Atlantis")
    assert bad.returncode == 2
    assert "entry" in bad.stderr
    assert "Traceback" not in bad.stderr
