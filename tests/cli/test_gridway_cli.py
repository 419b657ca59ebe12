"""``gbroker sim --algorithm gridway`` and its ``--gw-*`` settings; the daemons refuse it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gbroker.cli import build_parser, main
from gbroker.cli.policy_args import read_dispatch_policy
from gbroker.core.dispatch import Algorithm
from gbroker.core.gridway import GridWayPolicy
from tests.conftest import ROOT

PAPER = str(ROOT / "topologies" / "paper-6.yaml")


def test_the_options_default_to_gridway_s_shipped_values() -> None:
    args = build_parser().parse_args(
        ["sim", "--topology", PAPER, "--algorithm", "gridway", "--rate", "1", "--jobs", "1"]
    )
    policy = read_dispatch_policy(args)
    assert policy.algorithm is Algorithm.GRIDWAY
    assert policy.gridway == GridWayPolicy()


def test_every_setting_has_its_option() -> None:
    argv = ["sim", "--topology", PAPER, "--algorithm", "gridway", "--rate", "1", "--jobs", "1"]
    given = {
        "scheduling_interval": 30.0,
        "discovery_interval": 600.0,
        "monitoring_interval": 60.0,
        "number_of_jobs": 50,
        "dispatch_chunk": 0,
        "max_running_user": 0,
        "max_running_resource": 3,
        "wt_weight": 2.0,
        "sh_weight": 0.5,
        "ug_weight": 0.0,
        "suspension_timeout": 0.0,
        "fr_max_banned": 0.0,
        "fr_banned_c": 100.0,
        "information": "static",
    }
    assert set(given) == {f.name for f in dataclasses.fields(GridWayPolicy)}
    for name, value in given.items():
        argv += [f"--gw-{name.replace('_', '-')}", str(value)]
    assert dataclasses.asdict(read_dispatch_policy(build_parser().parse_args(argv)).gridway) == {
        **given
    }


def test_sim_runs_gridway_with_its_settings(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--topology", PAPER, "--algorithm", "gridway", "--rate", "0.2"]
    argv += ["--jobs", "20", "--streams", "6", "--gw-max-running-resource", "2", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"]["algorithm"] == "gridway"
    assert report["policy"]["gridway"]["max_running_resource"] == 2
    assert report["policy"]["gridway"]["scheduling_interval"] == 15.0
    assert report["jobs"]["mean"] == 20  # served
    assert report["throughput"]["mean"] > 0
    assert report["rejected"]["mean"] == 0
    assert main(argv[:-1]) == 0  # and for people: its settings in the header
    shown = capsys.readouterr().out
    assert "algorithm  gridway scheduling_interval=15.0" in shown
    assert "max_running_resource=2" in shown


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--gw-dispatch-chunk", "-1", "expected an integer >= 0, got -1"),
        ("--gw-scheduling-interval", "0", "expected a number > 0, got '0'"),
        ("--gw-number-of-jobs", "0", "expected a positive integer, got 0"),
        ("--gw-information", "mds", "invalid choice: 'mds'"),
    ],
)
def test_a_bad_setting_names_its_option(
    capsys: pytest.CaptureFixture[str], option: str, value: str, said: str
) -> None:
    argv = ["sim", "--topology", PAPER, "--algorithm", "gridway", "--rate", "1", "--jobs", "1"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, option, value])
    assert exited.value.code == 2
    assert f"argument {option}: {said}" in capsys.readouterr().err


def test_a_daemon_refuses_the_gridway_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--topology", PAPER, "--site", "Xeon80", "--algorithm", "gridway"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gbroker serve: --algorithm: expected an algorithm a broker daemon runs")
    assert "gridway is a baseline of the simulator (gbroker sim)" in err
    with pytest.raises(SystemExit) as exited:
        main(["fleet", "up", "--topology", PAPER, "--algorithm", "gridway"])
    assert exited.value.code == 2
    assert "argument --algorithm: invalid choice: 'gridway'" in capsys.readouterr().err
