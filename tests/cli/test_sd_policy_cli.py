"""`gbroker serve --sd-policy` and `gbroker fleet up --sd-policy`: the simulators' flags, refused
beside KOALA's policies (one line, exit 2, nothing started) and at batch-system sites, and
carried by `fleet up` to every site's `serve` unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from gbroker.cli import main
from gbroker.cli.parser import build_parser
from gbroker.cli.policy_args import read_sd_policy, sd_serve_args
from gbroker.core.sdpolicy import RuntimeModel, SdPolicy
from gbroker.errors import InvalidInput

ONE = "name: one\nsites:\n  - {name: solo, cores: 2}\nneighbourhood: full\n"


def test_serve_and_fleet_up_refuse_sd_policy_beside_koala_s_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = tmp_path / "one.yaml"
    topology.write_text(ONE)
    serve = ["serve", "--site", "solo", "--topology", str(topology), "--data-dir", str(tmp_path)]
    assert main([*serve, "--sd-policy", "10", "--malleability", "fpsma"]) == 2
    assert capsys.readouterr().err == (
        "gbroker serve: --sd-policy and --malleability are two policies for malleable jobs:"
        " give one\n"
    )
    fleet = tmp_path / "fleet"
    up = ["fleet", "up", "--topology", str(topology), "--dir", str(fleet)]
    assert main([*up, "--sd-policy", "dynamic", "--malleability", "egs"]) == 2
    assert capsys.readouterr().err == (
        "gbroker fleet up: --sd-policy and --malleability are two policies for malleable jobs:"
        " give one\n"
    )
    assert not fleet.exists()  # refused before anything started


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sd-policy", "0.5"], "argument --sd-policy: expected a MAX_SLOWDOWN: a number >= 1"),
        (["--sd-policy", "5", "--sharing-factor", "1"], "expected a fraction in (0, 1), got '1'"),
        (["--sd-policy", "5", "--sd-mates", "5"], "expected an integer from 1 to 4, got '5'"),
        (["--sd-policy", "5", "--sd-runtime", "best"], "invalid choice: 'best'"),
    ],
)
def test_bad_sd_options_of_serve_and_fleet_up_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    for command in (
        ["serve", "--site", "s", "--topology", "t"],
        ["fleet", "up", "--topology", "t"],
    ):
        with pytest.raises(SystemExit):
            main([*command, *extra])
        assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "given",
    [
        ["--sd-policy", "10"],
        ["--sd-policy", "dynamic", "--sharing-factor", "0.25", "--sd-mates", "3"],
        ["--sd-policy", "inf", "--sd-runtime", "worst", "--sharing-factor", "0.3333"],
    ],
)
def test_fleet_up_gives_every_site_the_sd_policy_it_was_given(given: list[str]) -> None:
    parser = build_parser()
    fleet = parser.parse_args(["fleet", "up", "--topology", "t", *given])
    site = parser.parse_args(["serve", "--site", "s", "--topology", "t", *sd_serve_args(fleet)])
    policy = read_sd_policy(fleet)
    assert isinstance(policy, SdPolicy)
    assert read_sd_policy(site) == policy
    assert sd_serve_args(parser.parse_args(["fleet", "up", "--topology", "t"])) == ()
    assert read_sd_policy(parser.parse_args(["serve", "--site", "s", "--topology", "t"])) is None


def test_the_defaults_are_the_simulators_and_the_papers() -> None:
    args = build_parser().parse_args(
        ["serve", "--site", "s", "--topology", "t", "--sd-policy", "10"]
    )
    assert read_sd_policy(args) == SdPolicy(10.0, 0.5, 2, RuntimeModel.IDEAL)


@pytest.mark.parametrize("manager", ["slurm", "gridengine"])
def test_a_batch_system_site_refuses_sd_policy(tmp_path: Path, manager: str) -> None:
    from gbroker.daemon.server import BrokerDaemon, DaemonConfig
    from gbroker.topology import SiteSpec, Topology

    topology = Topology([SiteSpec("solo", 2)], "full")
    config = DaemonConfig("solo", topology, tmp_path, manager=manager, sd_policy=SdPolicy())
    with pytest.raises(InvalidInput) as caught:
        BrokerDaemon(config)
    assert caught.value.field == "sd_policy"
    assert "its jobs keep their size" in caught.value.expected
