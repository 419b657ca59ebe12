"""``gbroker replay`` and ``gbroker sim`` with ``--malleability``: what a user runs."""

from __future__ import annotations

import json

import pytest

from gbroker.cli import main
from tests.conftest import ROOT, shared_data

TRACE = shared_data() / "swf" / "CTC-SP2-1996-3.1-cln.swf.gz"


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


KTH = shared_data() / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"


def test_replay_with_sd_policy_sets_static_easy_beside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The static run is ``gbroker replay`` itself; SD-Policy shares cores on this busy trace
    and lowers the mean bounded slowdown; with no malleable job it is static EASY."""
    plain = run(capsys, "replay", str(KTH), "--limit", "3000", "--json")
    report = run(
        capsys,
        "replay", str(KTH), "--limit", "3000", "--json",
        "--sd-policy", "inf", "--malleable-fraction", "1",
    )  # fmt: skip
    static, sd = report["runs"]["static EASY"], report["runs"]["SD-Policy"]
    assert static["avg_wait_s"] == pytest.approx(plain["avg_wait"])
    assert static["makespan_s"] == pytest.approx(plain["makespan"])
    assert (static["shared"], static["resizes"]) == (0, 0)
    assert sd["jobs"] == plain["jobs"] == 3000
    assert sd["shared"] > 100
    assert sd["resizes"] >= 2 * sd["shared"]  # each guest's mates shrink and grow back
    assert sd["avg_bounded_slowdown"] < static["avg_bounded_slowdown"]
    assert report["sd_policy"] == {
        "max_slowdown": "inf",
        "sharing_factor": 0.5,
        "max_mates": 2,
        "runtime_model": "ideal",
    }
    none = run(
        capsys,
        "replay", str(KTH), "--limit", "500", "--json",
        "--sd-policy", "dynamic", "--malleable-fraction", "0", "--sd-runtime", "worst",
    )  # fmt: skip
    assert none["malleable_jobs"] == 0
    assert none["sd_policy"]["max_slowdown"] == "dynamic"
    assert none["runs"]["SD-Policy"] == none["runs"]["static EASY"]


def test_replay_with_sd_policy_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", str(KTH), "--limit", "800", "--sd-policy", "10", "--sharing-factor", "0.4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "SD-Policy  MAX_SLOWDOWN 10, SharingFactor 0.4, m 2, ideal runtime model" in out
    assert "SD-Policy against static EASY: makespan " in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sd-policy", "often"], "argument --sd-policy: expected a MAX_SLOWDOWN: a number >= 1"),
        (["--sd-policy", "0.9"], "expected a MAX_SLOWDOWN: a number >= 1 (e.g. 10), inf, or"),
        (["--sd-policy", "5", "--sharing-factor", "0"], "expected a fraction in (0, 1), got '0'"),
        (["--sd-policy", "5", "--sd-mates", "x"], "expected an integer from 1 to 4, got 'x'"),
        (["--sd-policy", "5", "--sd-runtime", "best"], "invalid choice: 'best'"),
    ],
)
def test_bad_sd_options_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", str(KTH), *extra])
    assert message in capsys.readouterr().err


def test_sd_policy_refuses_koala_s_policies_and_fcfs(capsys: pytest.CaptureFixture[str]) -> None:
    both = ["replay", str(KTH), "--sd-policy", "5", "--malleability", "egs"]
    assert main(both) == 2
    assert capsys.readouterr().err == (
        "gbroker replay: --sd-policy and --malleability are two policies for malleable jobs:"
        " give one\n"
    )
    assert main(["replay", str(KTH), "--sd-policy", "5", "--policy", "fcfs"]) == 2
    assert "needs --policy easy (SD-Policy is a backfill variant), got fcfs" in (
        capsys.readouterr().err
    )
    topology = str(ROOT / "topologies" / "das3-5.yaml")
    sim = ["sim", "--topology", topology, "--algorithm", "worstfit", "--rate", "1"]
    assert main([*sim, "--jobs", "10", "--sd-policy", "5", "--queue-policy", "fcfs"]) == 2
    assert "gbroker sim: --sd-policy needs --queue-policy easy" in capsys.readouterr().err


def test_sim_with_sd_policy_shares_cores_and_serves_every_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = str(ROOT / "topologies" / "das3-5.yaml")
    args = ["sim", "--topology", topology, "--algorithm", "worstfit", "--rate", "4"]
    report = run(
        capsys,
        *args, "--jobs", "600", "--json", "--sd-policy", "10", "--malleable-fraction", "1",
    )  # fmt: skip
    assert report["resizes"]["mean"] > 0
    assert report["double_starts"] == 0
    assert report["jobs"]["mean"] == 600
    half = run(capsys, *args, "--jobs", "600", "--json", "--sd-policy", "10")  # default 0.5
    assert half["jobs"]["mean"] == 600
    assert half["double_starts"] == 0


def test_sim_json_keeps_the_count_asked_for_beside_the_jobs_served(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The summary's "jobs" (served) overwrote the count asked for under the same key.
    topology = str(ROOT / "topologies" / "paper-6.yaml")
    args = ["sim", "--topology", topology, "--algorithm", "dlo", "--rate", "0.5"]
    report = run(capsys, *args, "--jobs", "30", "--seeds", "2", "--json")
    assert report["jobs_requested"] == 30
    assert report["jobs"]["mean"] == 30
