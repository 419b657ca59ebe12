"""``--algorithm sparrow`` and ``federation`` on the command line: ``sim`` runs them, ``serve``
and ``fleet up`` refuse them in one line, ``--probe-ratio`` is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gbroker.cli import main
from tests.conftest import ROOT

PAPER = str(ROOT / "topologies" / "paper-6.yaml")


def test_sim_runs_sparrow_with_its_probe_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--topology", PAPER, "--rate", "0.2", "--jobs", "40", "--json"]
    assert main([*argv, "--algorithm", "sparrow", "--probe-ratio", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"]["algorithm"] == "sparrow"
    assert report["policy"]["probe_ratio"] == 3.0
    assert report["policy"]["stage_reservations"] is False
    assert report["double_starts"] == 0
    assert report["dispatches"]["mean"] == 40 * 3
    assert main([*argv, "--algorithm", "federation", "--stage-reservations"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"]["stage_reservations"] is True
    assert report["dispatches"]["mean"] == 40 * 6


def test_sim_names_a_bad_probe_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--topology", PAPER, "--rate", "0.2", "--jobs", "4", "--algorithm", "sparrow"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--probe-ratio", "0.5"])
    assert exit_.value.code == 2
    assert (
        "argument --probe-ratio: expected a probe ratio: a number >= 1 (probes per task), "
        "got '0.5'" in capsys.readouterr().err
    )


@pytest.mark.parametrize("algorithm", ["sparrow", "federation"])
def test_serve_refuses_the_simulated_baselines_in_one_line(
    algorithm: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    argv = ["serve", "--topology", PAPER, "--site", "L4001", "--data-dir", str(data)]
    assert main([*argv, "--algorithm", algorithm]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gbroker serve: --algorithm: expected an algorithm a broker daemon runs")
    assert f"{algorithm} is a baseline of the simulator (gbroker sim)" in err
    assert err.count("\n") == 1
    assert not data.exists()  # refused before anything was made


def test_fleet_up_does_not_offer_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fleet", "up", "--topology", PAPER, "--algorithm", "sparrow"])
    assert exit_.value.code == 2
    assert "argument --algorithm: invalid choice: 'sparrow'" in capsys.readouterr().err
