"""Friction points a new user met (issue 14), each as the command line shows it: errors name the
file and the field and say what was expected, help texts read as written, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def gbroker(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


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
