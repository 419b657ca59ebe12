"""Running jobs that move (issue 27), through the user's path: a fleet from `gbroker fleet up`,
jobs from `gbroker submit`, moves from `gbroker migrate` and `gbroker fleet drain --migrate`,
brokers SIGKILLed with `gbroker fleet kill` at each step of a move and started again with
`gbroker fleet restart`.

The job counts 1..40, printing each number and appending it to a log outside every job
directory (a file all jobs may write): a job that ran twice, or went back, would write a number
twice; one lost would stop short. Moves by CRIU (a plain program) and by the job's own saved
state (gbroker.app.malleable's hooks) are both tried. Real CRIU (scripts/setup/ensure_criu.sh builds
it; these tests need it and fail without it), real brokers, root (jobs run as their users).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gbroker.security.auth import Tokens, bearer
from gbroker.site.criu import find_criu
from tests.harness import gbroker, poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checkpoints need root (CI is root)")

COUNT = 40
PAUSE = 0.25

# A plain program: CRIU moves it.
PLAIN = f"""
import sys, time
log = sys.argv[1]
for i in range(1, {COUNT} + 1):
    print(i, flush=True)
    with open(log, "a") as f:
        f.write(f"{{i}}\\n")
    time.sleep({PAUSE})
"""

# The same, holding 200 MB: its move's steps last long enough for a test to kill a broker in each.
HEAVY = PLAIN.replace(
    "log = sys.argv[1]",
    "log = sys.argv[1]\nimport os\nballast = bytearray(os.urandom(1 << 20)) * 200",
)

# A program that saves its own state: moved without CRIU.
OWN_STATE = f"""
import sys, time
from gbroker.app import malleable
log = sys.argv[1]
state = malleable.restored()
following = 1 if state is None else int(state)
malleable.serve(on_checkpoint=lambda: str(following).encode())
while following <= {COUNT}:
    malleable.safe_point()
    print(following, flush=True)
    with open(log, "a") as f:
        f.write(f"{{following}}\\n")
    following += 1
    time.sleep({PAUSE})
"""

# The same, writing the site it was started at, from its environment, beside its log each time.
OWN_STATE_SITES = OWN_STATE.replace(
    "state = malleable.restored()",
    "import os\nwith open(log + '.sites', 'a') as f:\n    f.write(os.environ['GBROKER_SITE'] + "
    "'\\n')\nstate = malleable.restored()",
)

TOPOLOGY = """name: movers
sites:
  - {name: a, cores: 1}
  - {name: b, cores: 2}
  - {name: c, cores: 2}
neighbourhood: full
"""


class Fleet:
    def __init__(self, directory: Path, logs: Path) -> None:
        self.directory = directory
        self.logs = logs

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return gbroker(*args, fleet=self.directory, timeout=timeout)

    def submit(
        self,
        program: str,
        name: str,
        site: str | None = None,
        wall_time: int | None = None,
        cpu_time: int | None = None,
    ) -> tuple[str, Path]:
        """A counting job (submitted to ``a``; held to ``site`` if given; asking for
        ``wall_time`` and ``cpu_time`` seconds if given) and its log."""
        log = self.logs / f"{name}.log"
        log.touch()
        log.chmod(0o666)
        description: dict[str, Any] = {
            "executable": "python3",
            "arguments": ["-u", "-c", program, str(log)],
        }
        if site is not None:
            description["candidate_hosts"] = [site]
        if wall_time is not None:
            description["wall_time_limit"] = wall_time
        if cpu_time is not None:
            description["cpu_time_limit"] = cpu_time
        path = self.logs / f"{name}.json"
        path.write_text(json.dumps(description))
        url = json.loads((self.directory / "fleet.json").read_text())["sites"]["a"]["url"]
        submitted = self.run("submit", "--broker", url, str(path))
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip(), log

    def status(self, job_id: str) -> dict[str, Any]:
        shown = self.run("status", job_id, "--json")
        assert shown.returncode == 0, shown.stderr
        status: dict[str, Any] = json.loads(shown.stdout)
        return status

    def counted(self, log: Path) -> list[int]:
        return [int(n) for n in log.read_text().split()] if log.exists() else []

    def journal(self, site: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
        path = self.directory / site / "journal.sqlite"
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                return list(conn.execute(sql, args).fetchall())
        except sqlite3.OperationalError:  # not made yet, or locked for the moment
            return []

    def move_phase(self, site: str, job_id: str, role: str) -> str | None:
        rows = self.journal(
            site, "SELECT phase FROM moves WHERE job_id = ? AND role = ?", job_id, role
        )
        return str(rows[0][0]) if rows else None

    def hosted_phase(self, site: str, job_id: str) -> str | None:
        rows = self.journal(site, "SELECT phase FROM hosted WHERE job_id = ?", job_id)
        return str(rows[0][0]) if rows else None

    def ends_once(self, job_id: str, log: Path, site: str) -> None:
        """The job ends done at ``site``, having counted 1..COUNT once each, in order."""
        waited = self.run("wait", job_id, "--json", "--timeout", "180", timeout=240)
        end = json.loads(waited.stdout)
        assert (end["state"], end["site"]) == ("done", site), end
        assert self.counted(log) == list(range(1, COUNT + 1))
        shown = self.run("output", job_id)
        assert shown.stdout.split() == [str(n) for n in range(1, COUNT + 1)]

    def until_counting(self, job_id: str, log: Path) -> str:
        """Where the job runs, once it has counted a few numbers."""
        poll(lambda: len(self.counted(log)) >= 4, f"{job_id} counts")
        return str(self.status(job_id)["site"])


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    assert find_criu() is not None, "CRIU is missing: bash scripts/setup/ensure_criu.sh builds it"
    home = Path(tempfile.mkdtemp(prefix="gbroker-moves-"))
    home.chmod(0o711)  # every job's uid may traverse it
    logs = home / "logs"
    logs.mkdir()
    # Every job writes its log here, whatever its uid: a moved job runs as its user's account
    # at the target, another uid than at its source (each site maps users to its own uids), so
    # the logs are made writable by all beforehand (not sticky: a sticky directory keeps a
    # file from every uid but its owner's).
    logs.chmod(0o777)
    topology = home / "movers.yaml"
    topology.write_text(TOPOLOGY)
    directory = home / "fleet"
    up = gbroker(
        "fleet", "up", "--topology", str(topology), "--dir", str(directory), fleet=directory
    )
    assert up.returncode == 0, up.stderr
    try:
        yield Fleet(directory, logs)
    finally:
        gbroker("fleet", "down", "--dir", str(directory), fleet=directory)
        shutil.rmtree(home, ignore_errors=True)


def other(*sites: str) -> str:
    return next(s for s in ("b", "c") if s not in sites)


@pytest.mark.parametrize("program", [PLAIN, OWN_STATE], ids=["criu", "own_state"])
def test_gbroker_migrate_moves_a_running_job_and_it_counts_on_once(
    fleet: Fleet, program: str, request: pytest.FixtureRequest
) -> None:
    job_id, log = fleet.submit(program, request.node.callspec.id)
    source = fleet.until_counting(job_id, log)
    target = other(source) if source != "a" else "b"
    moved = fleet.run("migrate", job_id, "--to", target)
    assert moved.returncode == 0, moved.stderr
    assert f"runs at {target}" in moved.stderr
    status = fleet.status(job_id)
    assert (status["state"], status["site"]) == ("running", target)
    assert "move" not in status
    fleet.ends_once(job_id, log, target)
    history = json.loads(fleet.run("history", job_id, "--json").stdout)
    assert [(t["state"], t["site"]) for t in history][-3:] == [
        ("running", source),
        ("running", target),
        ("done", target),
    ]


def test_a_job_started_again_from_its_own_state_sees_its_new_site(fleet: Fleet) -> None:
    """`$GBROKER_SITE` of a job moved by its own saved state names the site it runs at now (a
    CRIU-restored job keeps its old environment: docs/MIGRATION.md)."""
    sites = fleet.logs / "sites.log.sites"  # beside its log; every uid writes it
    sites.touch()
    sites.chmod(0o666)
    job_id, log = fleet.submit(OWN_STATE_SITES, "sites")
    source = fleet.until_counting(job_id, log)
    target = other(source) if source != "a" else "b"
    moved = fleet.run("migrate", job_id, "--to", target)
    assert moved.returncode == 0, moved.stderr
    fleet.ends_once(job_id, log, target)
    assert Path(f"{log}.sites") == sites
    assert sites.read_text().split() == [source, target]


def move_steps(fleet: Fleet) -> dict[str, dict[str, float]]:
    """Each broker's ``gbroker_move_step_seconds_count`` by step, from its /metrics."""
    token = Tokens.load(fleet.directory / "tokens").first_token()
    record = json.loads((fleet.directory / "fleet.json").read_text())
    counts: dict[str, dict[str, float]] = {}
    for site, member in record["sites"].items():
        request = urllib.request.Request(f"{member['url']}/metrics", headers=bearer(token))
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
        counts[site] = {
            sample.labels["step"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "gbroker_move_step_seconds_count"
        }
    return counts


def test_each_step_of_a_move_is_timed_where_it_ran(fleet: Fleet) -> None:
    """checkpoint and bundle at the source, transfer, unpack and restore at the target: one
    observation each in ``gbroker_move_step_seconds`` (transfer and unpack were never timed)."""
    job_id, log = fleet.submit(PLAIN, "timed")
    source = fleet.until_counting(job_id, log)
    target = other(source) if source != "a" else "b"
    before = move_steps(fleet)
    moved = fleet.run("migrate", job_id, "--to", target)
    assert moved.returncode == 0, moved.stderr
    after = move_steps(fleet)
    added = {
        site: {step: after[site][step] - before[site][step] for step in after[site]}
        for site in after
    }
    assert added[source] == {
        "checkpoint": 1, "bundle": 1, "transfer": 0, "unpack": 0, "restore": 0,
    }  # fmt: skip
    assert added[target] == {
        "checkpoint": 0, "bundle": 0, "transfer": 1, "unpack": 1, "restore": 1,
    }  # fmt: skip
    fleet.ends_once(job_id, log, target)


def test_a_job_that_cannot_move_runs_on_where_it_was_and_migrate_says_why(fleet: Fleet) -> None:
    job_id, log = fleet.submit(PLAIN, "stays")
    source = fleet.until_counting(job_id, log)
    refused = fleet.run("migrate", job_id, "--to", source)
    assert refused.returncode == 2, refused.stderr
    assert "to: expected a site other than the one the job runs at" in refused.stderr
    unknown = fleet.run("migrate", job_id, "--to", "mars")
    assert unknown.returncode == 2
    assert "to: expected a site of the topology (a, b, c)" in unknown.stderr
    # Only its submitter (here the fleet's admin) or an admin moves a job.
    added = fleet.run("fleet", "user", "add", "mallory")
    assert added.returncode == 0, added.stderr
    env = {
        **os.environ,
        "GBROKER_FLEET": str(fleet.directory),
        "GBROKER_TOKEN": added.stdout.strip(),
    }
    stolen = subprocess.run(
        [sys.executable, "-m", "gbroker", "migrate", job_id, "--to", other(source, "a")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert stolen.returncode == 2, stolen.stderr
    assert "403" in stolen.stderr
    assert "belongs to another user" in stolen.stderr
    # A bad body is a 400 naming the field.
    url = json.loads((fleet.directory / "fleet.json").read_text())["sites"]["a"]["url"]
    token = next(
        line.split()[1]
        for line in (fleet.directory / "tokens").read_text().splitlines()
        if len(line.split("#", 1)[0].split()) == 3
    )
    for body, field in ((b'{"to": 5}', "to"), (b"[1]", "body"), (b'{"to": "b", "x": 1}', "body")):
        request = urllib.request.Request(
            f"{url}/api/v1/jobs/{job_id}/migrate",
            data=body,
            headers={"Authorization": f"Bearer {token}"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(request, timeout=30)
        assert bad.value.code == 400
        assert json.loads(bad.value.read())["field"] == field
    assert fleet.status(job_id)["site"] == source  # nothing of this moved it
    fleet.ends_once(job_id, log, source)
    over = fleet.run("migrate", job_id)
    assert over.returncode == 2
    assert "expected a running job, got 'done'" in over.stderr


def busy_a(fleet: Fleet) -> str:
    """A job that holds a's one core, so that jobs submitted to a run at b or c: owner, source
    and target are then three brokers."""
    filler, _ = fleet.submit("import time; time.sleep(120)", f"filler-{time.monotonic_ns()}", "a")
    poll(lambda: fleet.status(filler)["state"] == "running", "the filler runs")
    return filler


def test_fleet_drain_migrate_empties_a_site_and_every_job_ends_done_once(fleet: Fleet) -> None:
    filler = busy_a(fleet)
    try:
        jobs = [
            fleet.submit(program, f"drained-{i}") for i, program in enumerate([PLAIN, OWN_STATE])
        ]
        sites = [fleet.until_counting(job_id, log) for job_id, log in jobs]
        drained_site = sites[0]
        drained = fleet.run(
            "fleet", "drain", drained_site, "--migrate", "--timeout", "120", timeout=180
        )
        assert drained.returncode == 0, drained.stderr
        assert drained.stdout.strip() == f"{drained_site}: drained"
        for (job_id, _), was in zip(jobs, sites, strict=True):  # none left there, none killed
            site = fleet.status(job_id)["site"]
            assert site != drained_site
            if was == drained_site:  # the drain said where each it moved went (stderr)
                assert f"{drained_site}: {job_id} moved to {site} (running)\n" in drained.stderr
        for job_id, log in jobs:
            waited = fleet.run("wait", job_id, "--json", "--timeout", "180", timeout=240)
            end = json.loads(waited.stdout)
            assert end["state"] == "done", end
            assert fleet.counted(log) == list(range(1, COUNT + 1))
    finally:
        fleet.run("fleet", "undrain", drained_site)
        fleet.run("cancel", filler)


def test_the_owner_moves_a_job_off_a_slow_site_by_dynamites_rule(tmp_path: Path) -> None:
    # `fleet up --migrate-running`: a owns the job; it runs at a (speed 0.5) while b (speed 2)
    # is busy; once b is free, a's decider moves it there (it would save most of its run time).
    home = Path(tempfile.mkdtemp(prefix="gbroker-decider-"))
    home.chmod(0o711)
    logs = home / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    topology = home / "speeds.yaml"
    topology.write_text(
        "name: speeds\nsites:\n  - {name: a, cores: 1, speed: 0.5}\n"
        "  - {name: b, cores: 1, speed: 2.0}\nneighbourhood: full\n"
    )
    directory = home / "fleet"
    policy = "threshold=0.5,interval=1,min_remaining=60"
    up = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory),
                 "--migrate-running", policy, fleet=directory)  # fmt: skip
    assert up.returncode == 0, up.stderr
    fleet = Fleet(directory, logs)
    try:
        filler, _ = fleet.submit("import time; time.sleep(120)", "filler", "b")
        poll(lambda: fleet.status(filler)["state"] == "running", "the filler runs")
        job_id, log = fleet.submit(PLAIN, "slow", wall_time=600)
        assert fleet.until_counting(job_id, log) == "a"
        assert fleet.status(job_id)["site"] == "a"  # b is busy: nowhere better to go
        assert fleet.run("cancel", filler).returncode == 0
        fleet.ends_once(job_id, log, "b")
        history = json.loads(fleet.run("history", job_id, "--json").stdout)
        assert [(t["state"], t["site"]) for t in history][-3:] == [
            ("running", "a"),
            ("running", "b"),
            ("done", "b"),
        ]
    finally:
        gbroker("fleet", "down", "--dir", str(directory), fleet=directory)
        shutil.rmtree(home, ignore_errors=True)
