"""The command line, run as a real process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import gbroker

FIXTURE = Path(__file__).parents[1] / "fixtures" / "quirks.swf"


def test_replay_json_prints_one_object_with_the_figures() -> None:
    done = gbroker("replay", str(FIXTURE), "--policy", "fcfs", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["jobs"] == 5
    assert report["skipped"] == 4
    assert report["policy"] == "fcfs"
    assert report["cores"] == 8
    for key in ("avg_wait", "avg_bounded_slowdown", "utilization", "makespan"):
        assert isinstance(report[key], int | float)
    assert 0 < report["utilization"] <= 1


def test_replay_human_output_names_the_skips() -> None:
    done = gbroker("replay", str(FIXTURE), "--limit", "3")
    assert done.returncode == 0, done.stderr
    assert "jobs replayed         3 of" in done.stdout
    assert "unknown run time: 1" in done.stdout
    assert "average wait" in done.stdout


def test_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = gbroker("replay", str(tmp_path / "nope.swf"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 4\n1 0 -1\n")
    malformed = gbroker("replay", str(bad))
    assert malformed.returncode == 2
    assert "bad.swf:2: job line: expected 18 fields, got 3" in malformed.stderr
    usage = gbroker("replay", str(FIXTURE), "--limit", "0")
    assert usage.returncode == 2
    assert "positive integer" in usage.stderr
