"""``gbroker chaos`` on a small real fleet (the CI scenario), and its bookkeeping.

The scenario is what CI runs on every change: a stream of real jobs while brokers are SIGKILLed
and restarted, one MQTT broker restart, and one burst of concurrent clients whose broker is
killed with ``kill -9`` mid-burst. It fails on any lost job, double run or unanswered
submission, read off the jobs' own log.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker import fleet
from gbroker.core.states import JobState
from gbroker.daemon.journal import Journal
from gbroker.errors import InvalidInput
from gbroker.tools.chaos import (
    RUN_LOG,
    ChaosPlan,
    _Chaos,
    _history,
    _Submission,
    format_report,
    parse_partition,
    run_chaos,
)
from gbroker.topology import SiteSpec, Topology, save_topology


@pytest.fixture
def small_fleet(tmp_path: Path, fleet_mqtt: str) -> Iterator[Path]:
    topology = tmp_path / "topology.yaml"
    save_topology(Topology([SiteSpec(n, 4) for n in "abc"], "full", name="ci"), topology)
    directory = tmp_path / "fleet"
    fleet.up(topology, directory, fleet_mqtt, ("--dcsmon-period", "0.2", "--lease", "3"))
    try:
        yield directory
    finally:
        fleet.down(directory)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A run directory the jobs' user can reach (pytest's tmp_path is 0700, for root only)."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-chaos-test-"))
    directory.chmod(0o755)
    try:
        yield directory / "run"
    finally:
        shutil.rmtree(directory)


@pytest.mark.slow
def test_a_stream_with_kills_an_mqtt_restart_and_a_burst_loses_nothing_and_runs_nothing_twice(
    small_fleet: Path, run_dir: Path
) -> None:
    command = [
        sys.executable,
        *("-m", "gbroker", "chaos", "--fleet", str(small_fleet), "--json"),
        *("--jobs", "24", "--rate", "4", "--kill-every", "2.5", "--down-for", "1.5"),
        *("--kill-mqtt-at", "2", "--burst-clients", "24", "--burst-jobs", "96"),
        *("--job-seconds", "0.5:2"),
        *("--settle", "60", "--seed", "7", "--run-dir", str(run_dir)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=150)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    counts = report["counts"]
    anomalies = json.dumps(report["anomalies"], indent=1)[:4000]
    assert counts["submitted"] == 24 + 96
    assert counts["lost"] == 0, anomalies
    assert counts["ran_twice"] == 0, anomalies
    assert counts["unanswered"] == 0, anomalies
    assert counts["accepted"] == 24 + 96
    events = [e["event"] for e in report["events"]]
    assert "burst" in events
    burst = events.index("burst")
    # A kill during the stream (how many depends on how long the stream lasts: 24 jobs at 4/s
    # are about 6 s, with a kill every 2.5 s), and the burst's kill -9.
    assert "killed" in events[:burst]
    assert "killed" in events[burst:]
    assert events.count("restarted") == events.count("killed")
    assert tuple(e for e in events if "mqtt" in e) == ("mqtt killed", "mqtt restarted")
    assert done.returncode == 0, anomalies
    ran = (run_dir / RUN_LOG).read_text().splitlines()
    assert sum(" end " in line for line in ran) >= counts["done"]  # what the jobs wrote
    assert all(row["alive"] for row in fleet.status(small_fleet))  # all back up at the end


# -- the bookkeeping, on a log and answers made up for the purpose ------------------------------


def _fleet_record(directory: Path, **extra: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    sites = {
        n: {"name": n, "pid": 1, "url": f"http://127.0.0.1:{9 + k}"} for k, n in enumerate("ab")
    }
    record = {"sites": sites, "tokens": str(directory / "tokens"), "mqtt": None, **extra}
    (directory / "fleet.json").write_text(json.dumps(record))


def test_the_report_counts_double_runs_losses_and_disagreements(tmp_path: Path) -> None:
    _fleet_record(tmp_path / "fleet")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_LOG).write_text(
        "a.1 start 100.0 11 a\na.1 end 101.0 11 a\n"  # once, done: fine
        "a.2 start 100.0 12 a\nb.2 junk\na.2 start 102.5 19 a\na.2 end 103.0 19 a\n"  # twice
        "b.3 start 100.0 13 b\nb.3 end 104.0 13 b\n"  # ran to its end, owner says failed
        "b.9 start 100.0 14 b\n"  # nobody was told of b.9
    )
    chaos = _Chaos(tmp_path / "fleet", ChaosPlan(jobs=4), run_dir, None)
    for n, job_id in enumerate(("a.1", "a.2", "b.3", "b.4", None)):
        chaos.submissions.append(_Submission(f"k{n}", "a", 99.0, "stream", job_id))
    finals: dict[str, dict[str, Any] | None] = {
        "a.1": {"id": "a.1", "state": "done", "site": "a"},
        "a.2": {"id": "a.2", "state": "done", "site": "a"},
        "b.3": {"id": "b.3", "state": "failed", "site": "b"},
        "b.4": {"id": "b.4", "state": "queued", "site": "a"},  # never started: lost
    }
    report = chaos.report(finals)
    c = report.counts
    assert (c["submitted"], c["accepted"], c["unanswered"]) == (5, 4, 1)
    assert (c["done"], c["failed"], c["not_terminal"]) == (2, 1, 1)
    assert (c["ran_twice"], c["lost"], c["reported_otherwise"]) == (1, 1, 1)
    assert c["ran_unacknowledged"] == 1
    assert report.submit_to_end == {"p50": 4.0, "p99": 5.0}
    assert not report.ok
    problems = {story["job"]: story["problems"] for story in report.stories}
    assert set(problems) == {"a.2", "b.3", "b.4", "b.9", None}
    assert problems["a.2"] == ["ran 2 times"]
    text = format_report(report)
    assert "process 19 starts at a (its log)" in text
    assert "FAILED" in text


def test_partition_is_parsed_and_refused_on_a_fleet_of_processes(tmp_path: Path) -> None:
    assert parse_partition("Xeon80:2.5").seconds == 2.5
    for bad in ("Xeon80", ":3", "a:-1", "a:x", "a/b:3", "a:nan"):
        with pytest.raises(InvalidInput):
            parse_partition(bad)
    _fleet_record(tmp_path / "fleet")
    plan = ChaosPlan(jobs=1, partition=parse_partition("a:3"))
    with pytest.raises(InvalidInput, match="network namespaces"):
        asyncio.run(run_chaos(tmp_path / "fleet", plan))
    plan = ChaosPlan(jobs=1, partition=parse_partition("z:3"))
    with pytest.raises(InvalidInput, match="a site of the fleet"):
        asyncio.run(run_chaos(tmp_path / "fleet", plan))
    with pytest.raises(InvalidInput, match="--kill-mqtt-at"):
        asyncio.run(run_chaos(tmp_path / "fleet", ChaosPlan(jobs=1, kill_mqtt_at=1)))


def test_a_jobs_story_is_read_from_a_fleet_directory_named_with_uri_characters(
    tmp_path: Path,
) -> None:
    """The owner's journal is opened by an escaped ``file:`` URI: a ``#`` in the fleet
    directory's name is not a fragment (which opened another file, with no tables)."""
    directory = tmp_path / "fleet#1"

    async def journal() -> None:
        async with Journal(directory / "a" / "journal.sqlite") as j:
            await j.submit("a.1", "a", b"s", 1.0)
            await j.update("a.1", JobState.QUEUED, 2.0, site="b")

    asyncio.run(journal())
    assert _history(directory, "a.1") == [
        {"state": "submitted", "site": None, "at": 1.0},
        {"state": "queued", "site": "b", "at": 2.0},
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet#1"]
