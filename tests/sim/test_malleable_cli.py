"""``gbroker replay`` and ``gbroker sim`` with ``--malleability``: what a user runs."""

from __future__ import annotations

import json

import pytest

from gbroker.cli import main
from tests.conftest import ROOT

TRACE = ROOT.parent / "shared" / "data" / "swf" / "CTC-SP2-1996-3.1-cln.swf.gz"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_replay_with_malleability_sets_its_rigid_run_beside_the_plain_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The malleable replay's rigid baseline is the trace as ``gbroker replay`` runs it: the
    same waits and makespan, through the other simulator."""
    plain = run(capsys, "replay", str(TRACE), "--limit", "1500", "--json")
    report = run(
        capsys,
        "replay", str(TRACE), "--limit", "1500", "--json",
        "--malleability", "fpsma", "--initiative", "pwa", "--malleable-fraction", "1",
    )  # fmt: skip
    rigid = report["runs"]["rigid"]
    assert rigid["mean_wait_s"] == pytest.approx(plain["avg_wait"])
    assert rigid["makespan_s"] == pytest.approx(plain["makespan"])
    assert rigid["resizes"] == 0
    malleable = report["runs"]["FPSMA/PWA"]
    assert malleable["jobs"] == plain["jobs"] == 1500
    assert malleable["resizes"] > 0
    assert report["malleable_jobs"] > 0
    none = run(
        capsys,
        "replay", str(TRACE), "--limit", "300", "--json",
        "--malleability", "egs", "--malleable-fraction", "0",
    )  # fmt: skip
    assert none["malleable_jobs"] == 0
    assert none["runs"]["EGS/PRA"]["resizes"] == 0


def test_sim_with_malleability_resizes_jobs_and_serves_every_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = str(ROOT / "topologies" / "das3-5.yaml")
    args = ["sim", "--topology", topology, "--algorithm", "worstfit", "--rate", "2"]
    report = run(
        capsys, *args, "--jobs", "200", "--json", "--malleability", "fpsma", "--initiative", "pwa"
    )
    assert report["throughput"]["mean"] > 0
    assert report["resizes"]["mean"] > 0
    assert report["double_starts"] == 0
    rigid = run(capsys, *args, "--jobs", "200", "--json")
    assert rigid["resizes"]["mean"] == 0


def test_a_bad_fraction_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", str(TRACE), "--malleability", "fpsma", "--malleable-fraction", "1.5"])
    assert "expected a fraction in [0, 1], got '1.5'" in capsys.readouterr().err
