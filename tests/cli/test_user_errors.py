"""Friction points a new user met (issue 14), each as the command line shows it: errors name the
file and the field and say what was expected, help texts read as written, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import gbroker


def test_a_count_that_is_no_number_says_what_a_count_may_be(tmp_path: Path) -> None:
    job = tmp_path / "four.yaml"
    job.write_text("executable: /bin/true\ntotal_cpu_count: four\n")
    checked = gbroker("jsdl", "check", str(job))
    assert checked.returncode == 1
    assert (
        f"{job}: total_cpu_count: expected an integer >= 1, or a mapping with exact, or lower "
        "and/or upper, got 'four'" in checked.stdout
    )


def test_help_texts_show_percent_signs_and_options_as_typed() -> None:
    shown = gbroker("sim", "--help").stdout
    assert "95% confidence" in shown
    assert "%%" not in shown
    top = gbroker("--help").stdout
    assert "exit status: 0 done; 1 a job failed" in top  # one convention, in the help


def test_a_trace_without_its_machine_size_names_the_option(tmp_path: Path) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text("1 0 0 10 1 -1 -1 1 20 -1 1 1 1 -1 1 -1 -1 -1\n")
    done = gbroker("replay", str(trace))
    assert done.returncode == 2
    assert "--cores N" in done.stderr
    assert "Traceback" not in done.stderr


def test_fleet_up_with_a_missing_topology_names_the_file(tmp_path: Path) -> None:
    done = gbroker("fleet", "up", "--topology", "nope.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert "gbroker fleet up: nope.yaml: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".gbroker-fleet" / "fleet.json").exists()


def test_fleet_commands_without_a_fleet_say_where_they_looked(tmp_path: Path) -> None:
    done = gbroker("fleet", "status", cwd=tmp_path)
    assert done.returncode == 2
    assert "no running fleet found" in done.stderr
    assert "gbroker fleet up --topology FILE" in done.stderr


def test_every_example_job_is_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    examples = sorted(p for p in root.iterdir() if p.suffix in (".jsdl", ".json", ".yaml"))
    assert {p.suffix for p in examples} >= {".jsdl", ".json", ".yaml"}
    checked = gbroker("jsdl", "check", *map(str, examples))
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.count(": ok") == len(examples)


def test_a_slurm_site_without_its_slurm_conf_is_a_usage_error(tmp_path: Path) -> None:
    topology = Path(__file__).resolve().parents[2] / "topologies" / "slurm-3.yaml"
    serve = ("serve", "--site", "alpha", "--topology", str(topology), "--data-dir", str(tmp_path))
    done = gbroker(*serve, "--manager", "slurm")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gbroker serve: --slurm-conf: expected the Slurm cluster's slurm.conf with --manager "
        "slurm, but it is missing"
    ]
    done = gbroker(*serve, "--manager", "slurm", "--slurm-conf", str(tmp_path / "none.conf"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gbroker serve: --slurm-conf: expected an existing slurm.conf file, got "
        f"'{tmp_path / 'none.conf'}'"
    ]
    done = gbroker(*serve, "--slurm-conf", str(topology))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gbroker serve: --manager: expected slurm with --slurm-conf, got 'local'"
    ]
    done = gbroker(*serve, "--manager", "pbs")
    assert done.returncode == 2
    assert (
        "argument --manager: invalid choice: 'pbs' (choose from 'local', 'slurm', 'gridengine')"
        in done.stderr
    )


def test_a_grid_engine_site_without_its_cell_in_the_environment_is_a_usage_error(
    tmp_path: Path,
) -> None:
    """``serve --manager gridengine`` finds its cell as Grid Engine's users give it: SGE_ROOT
    (and SGE_CELL, the ports) in its environment, as the cell's settings.sh sets them."""
    topology = Path(__file__).resolve().parents[2] / "topologies" / "gridengine-2.yaml"
    serve = ("serve", "--site", "oak", "--topology", str(topology), "--data-dir", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGE_")}
    done = gbroker(*serve, "--manager", "gridengine", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gbroker serve: SGE_ROOT: expected the Grid Engine cell's root in the environment with "
        "--manager gridengine (source the cell's settings.sh), but it is not set"
    ]
    done = gbroker(*serve, "--manager", "gridengine", env={**env, "SGE_ROOT": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gbroker serve: SGE_ROOT: expected the root of a Grid Engine cell default (holding "
        f"default/common), got '{tmp_path}'"
    ]


def test_fleet_up_names_a_bad_manager_in_the_topology(tmp_path: Path) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text("sites: [{name: a, cores: 2, manager: pbs}]\nneighbourhood: full\n")
    done = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(tmp_path / "f"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gbroker fleet up: {topology}: sites[0].manager: expected one of local, slurm, "
        "gridengine, got 'pbs'"
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root broker gives users uids of their own")
def test_serve_names_the_uid_database_it_cannot_use_not_the_topology(tmp_path: Path) -> None:
    # Every OSError while the broker was built was said as "cannot read TOPOLOGY".
    topology = tmp_path / "one.yaml"
    topology.write_text("name: one\nsites:\n  - {name: a, cores: 1}\nneighbourhood: full\n")
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a file where the database's directory should be
    env = {**os.environ, "GBROKER_UID_DATABASE": str(blocked / "uids.sqlite")}
    served = gbroker(
        "serve", "--topology", str(topology), "--site", "a", "--data-dir", str(tmp_path / "a"),
        env=env,
    )  # fmt: skip
    assert served.returncode == 2
    assert served.stderr == f"gbroker serve: cannot use {blocked}: File exists\n"
