"""Co-allocated jobs (issue 28), through the user's path: a fleet from `gbroker fleet up`, a job
of components submitted with `gbroker submit`, followed with `status`, `wait` and `output`, and
brokers SIGKILLed (what `gbroker fleet kill` does) and started again with `gbroker fleet restart`
at each step of the components' claims and start.

Each component appends its rank to a log outside every job directory: a component that ran twice
would write its rank twice, one that never ran would be missing. A job of three components, one at
each site, whose site c is full (a blocker job holds its cores) must start none of them until c
frees up, then all of them, once each.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker.cli.exits import UNREACHABLE
from gbroker.fleet import control as fleet_control
from gbroker.security.auth import Tokens, bearer
from tests.harness import gbroker, poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as their users (CI is root)")

TOPOLOGY = """name: coalloc
sites:
  - {name: a, cores: 2, speed: 1.0}
  - {name: b, cores: 2, speed: 0.5}
  - {name: c, cores: 2, speed: 0.25}
neighbourhood: full
"""

# A component: its rank and how many ranks it was told of, in the shared log; then a pause.
COMPONENT = """
import json, os, sys, time
rank = int(os.environ["GBROKER_RANK"])
ranks = json.loads(os.environ["GBROKER_RANKS"])
with open(sys.argv[1], "a") as f:
    f.write(f"{rank} {len(ranks)} {ranks[rank]['site']}\\n")
key = os.environ.get("GBROKER_RANKS_KEY")
print(json.dumps({"rank": rank, "ranks": ranks, "key": key}), flush=True)
time.sleep(float(sys.argv[2]))
"""


class Fleet:
    def __init__(self, directory: Path, logs: Path) -> None:
        self.directory = directory
        self.logs = logs

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The CLI against this fleet; where no broker answered, its stderr ends with each
        broker's last words (a broker that stopped answering says why only there)."""
        done = gbroker(*args, fleet=self.directory, timeout=timeout)
        if done.returncode == UNREACHABLE:
            done.stderr += self.last_words()
        return done

    def last_words(self, lines: int = 30) -> str:
        """The end of each broker's log."""
        said = []
        for site in ("a", "b", "c"):
            path = self.directory / f"{site}.log"
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            said.append(f"--- {site}.log ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n" + "\n".join(said)

    def url(self, site: str) -> str:
        return str(json.loads((self.directory / "fleet.json").read_text())["sites"][site]["url"])

    def submit(self, description: dict[str, Any], name: str) -> str:
        path = self.logs / f"{name}.json"
        path.write_text(json.dumps(description))
        submitted = self.run("submit", "--broker", self.url("a"), str(path))
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip()

    def coallocated(self, name: str, pause: float = 1.0, **extra: Any) -> tuple[str, Path]:
        """A job of three components (a: 1 core, b: 1, c: 2) submitted to a, and its log."""
        log = self.logs / f"{name}.log"
        log.touch()
        log.chmod(0o666)
        description = {
            "name": name,
            "executable": "python3",
            "arguments": ["-u", "-c", COMPONENT, str(log), str(pause)],
            "components": [
                {"cores": 1, "site": "a"},
                {"cores": 1, "site": "b"},
                {"cores": 2, "site": "c"},
            ],
            **extra,
        }
        return self.submit(description, name), log

    def blocker(self, name: str) -> tuple[str, Path]:
        """A job holding c's two cores until its release file exists."""
        release = self.logs / f"{name}.release"
        script = f"while [ ! -e {release} ]; do sleep 0.1; done"
        job = {
            "executable": "/bin/sh",
            "arguments": ["-c", script],
            "total_cpu_count": 2,
            "candidate_hosts": ["c"],
        }
        job_id = self.submit(job, name)
        poll(lambda: self.status(job_id)["state"] == "running", "the blocker runs")
        return job_id, release

    def status(self, job_id: str) -> dict[str, Any]:
        shown = self.run("status", job_id, "--json")
        assert shown.returncode == 0, shown.stderr
        status: dict[str, Any] = json.loads(shown.stdout)
        return status

    def ranks(self, log: Path) -> list[int]:
        return sorted(int(line.split()[0]) for line in log.read_text().splitlines())

    def journal(self, site: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
        path = self.directory / site / "journal.sqlite"
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                return list(conn.execute(sql, args).fetchall())
        except sqlite3.OperationalError:
            return []

    def granted(self, job_id: str) -> bool:
        """The owner (a) has journaled every component's grant."""
        return bool(self.journal("a", "SELECT 1 FROM gangs WHERE gang = ?", job_id))

    def claiming(self, job_id: str, sites: tuple[str, ...] = ("a", "b")) -> bool:
        """The components at ``sites`` have asked for their start: their cores are held."""
        return all(
            self.component_state(f"{job_id}_{'abc'.index(site) + 1}") == "queued"
            and self.held(site)
            for site in sites
        )

    def component_state(self, component: str) -> str:
        return str(self.status(component)["state"])

    def held(self, site: str) -> bool:
        """Some of ``site``'s cores are held or used (its published free cores are below 2)."""
        token = Tokens.load(self.directory / "tokens").first_token()
        request = urllib.request.Request(f"{self.url(site)}/api/v1/state", headers=bearer(token))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                state = json.loads(response.read())
        except OSError:
            return False
        return int(state["free_cores"]) < 2

    def ends_once(self, job_id: str, log: Path) -> dict[str, Any]:
        waited = self.run("wait", job_id, "--json", "--timeout", "120", timeout=180)
        end: dict[str, Any] = json.loads(waited.stdout)
        assert end["state"] == "done", end
        assert self.ranks(log) == [0, 1, 2], log.read_text()
        return end


def up(home: Path, *options: str) -> Fleet:
    logs = home / "logs"
    logs.mkdir()
    logs.chmod(0o777)  # every job's uid writes its component's line here
    topology = home / "coalloc.yaml"
    topology.write_text(TOPOLOGY)
    directory = home / "fleet"
    started = gbroker(
        "fleet", "up", "--topology", str(topology), "--dir", str(directory), *options,
        fleet=directory,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return Fleet(directory, logs)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    home = Path(tempfile.mkdtemp(prefix="gbroker-coalloc-"))
    home.chmod(0o711)  # every job's uid may traverse it
    try:
        yield up(home)
    finally:
        gbroker("fleet", "down", "--dir", str(home / "fleet"), fleet=home / "fleet")
        shutil.rmtree(home, ignore_errors=True)


def test_every_component_starts_with_the_rank_table_and_the_job_ends_done(fleet: Fleet) -> None:
    # The job's own Environment cannot say another rank: the owner's table wins.
    job_id, log = fleet.coallocated("plain", pause=0.1, environment={"GBROKER_RANK": "7"})
    fleet.ends_once(job_id, log)
    lines = sorted(log.read_text().splitlines())
    assert lines == ["0 3 a", "1 3 b", "2 3 c"]
    tables, keys = [], set()
    for rank in range(3):
        shown = fleet.run("output", f"{job_id}_{rank + 1}")
        assert shown.returncode == 0, shown.stderr
        told = json.loads(shown.stdout)
        assert told["rank"] == rank
        tables.append(told["ranks"])
        keys.add(told["key"])
    # One key for the job's components (they prove it to one another), told to nobody else.
    [key] = keys
    assert len(key) == 64
    assert all(c in "0123456789abcdef" for c in key)
    assert key not in fleet.run("status", job_id, "--json").stdout
    assert key not in fleet.run("history", f"{job_id}_1", "--json").stdout
    assert tables[0] == tables[1] == tables[2]  # one table, the same for every rank
    table = tables[0]
    assert [(r["rank"], r["site"], r["cores"]) for r in table] == [
        (0, "a", 1),
        (1, "b", 1),
        (2, "c", 2),
    ]
    assert len({(r["host"], r["port"]) for r in table}) == 3
    status = fleet.status(job_id)
    assert status["state"] == "done"
    assert status["counts"] == {"done": 3}
    assert status["components"] == [
        {"site": "a", "cores": 1},
        {"site": "b", "cores": 1},
        {"site": "c", "cores": 2},
    ]
    table = fleet.run("status", job_id).stdout
    assert "co-allocated" in table
    assert "component 2" in table
    assert "c, 2 cores" in table


def test_no_component_starts_until_every_site_has_its_cores(fleet: Fleet) -> None:
    blocker, release = fleet.blocker("full-c")
    job_id, log = fleet.coallocated("waits")
    # a and b hold their components' cores while c is full, and neither starts.
    poll(lambda: fleet.claiming(job_id), "a and b claim")
    time.sleep(2)  # long enough for a component that started alone to write its line
    assert log.read_text() == ""
    assert [fleet.component_state(f"{job_id}_{i}") for i in (1, 2, 3)] == ["queued"] * 3
    release.touch()
    fleet.ends_once(job_id, log)
    blocked = fleet.status(blocker)
    starts = [fleet.status(f"{job_id}_{i}")["started_at"] for i in (1, 2, 3)]
    assert min(starts) >= blocked["ended_at"] - 1.0  # none started before c freed up


def test_a_job_with_a_model_is_placed_by_the_apples_planner(fleet: Fleet) -> None:
    """The planner's partition follows what it weighed: each site's speed (1, 0.5, 0.25) times
    its forecast CPU availability (DCSMon's); `gbroker explain` shows those and each set it
    weighed; every rank learns its units."""
    model = {"units": 700, "compute": 0.001, "iterations": 10}
    description = {"executable": "/bin/sh", "arguments": ["-c", "echo $GBROKER_RANKS"]}
    path = fleet.logs / "model.json"
    path.write_text(json.dumps({**description, "model": model}))

    def explained() -> dict[str, Any]:
        shown = fleet.run("explain", "--broker", fleet.url("a"), str(path), "--json")
        assert shown.returncode == 0, shown.stderr
        return dict(json.loads(shown.stdout))

    # Once a sees every site idle (the earlier tests' jobs have ended, and DCSMon says so).
    poll(lambda: all(not c["waits"] for c in explained()["candidates"]), "every site idle")
    answer = explained()
    plan = answer["plan"]
    rate = {r["site"]: r["speed"] * r["cpu"] for r in answer["resources"]}
    assert {r["site"]: r["speed"] for r in answer["resources"]} == {"a": 1, "b": 0.5, "c": 0.25}
    assert plan["locus"] == "a"
    assert plan["sites"][0] == "a"
    assert sum(plan["units"]) == 700
    total = sum(rate[s] for s in plan["sites"])
    for site, units in zip(plan["sites"], plan["units"], strict=True):
        assert abs(units - 700 * rate[site] / total) <= 1  # balanced: units ∝ its rate
    slowest = max(u / rate[s] for s, u in zip(plan["sites"], plan["units"], strict=True))
    assert plan["predicted"] == pytest.approx(10 * 0.001 * slowest, rel=1e-6)
    # The estimator's choice: the least predicted time of every feasible set it weighed.
    weighed = [c["predicted"] for c in plan["candidates"] if c["predicted"] is not None]
    assert plan["predicted"] == pytest.approx(min(weighed))
    assert plan["sites"] in [c["sites"] for c in plan["candidates"]]
    job_id = fleet.submit({**description, "model": model}, "model")
    end = json.loads(fleet.run("wait", job_id, "--json", "--timeout", "60").stdout)
    assert end["state"] == "done", end
    table = json.loads(fleet.run("output", f"{job_id}_1").stdout)
    assert sum(r["units"] for r in table) == 700
    assert [r["rank"] for r in table] == list(range(len(table)))
    shown = fleet.run("explain", job_id)
    assert "AppLeS plan from a: a" in shown.stdout, shown.stdout
    assert "AppLeS weighed a (" in shown.stdout, shown.stdout
    path.write_text(json.dumps({**description, "model": {**model, "rows": 3}}))
    refused = fleet.run("submit", str(path))
    assert "model.rows" in refused.stderr, refused.stderr


def test_a_bad_component_is_refused_naming_it(fleet: Fleet) -> None:
    path = fleet.logs / "bad.json"
    for components, expected in [
        ([{"cores": 1, "site": "zz"}], "components[0].site"),
        ([{"cores": 3, "site": "a"}], "components[0].cores"),
        ([{"cores": 0}], "components[0].cores"),
        ([{"cores": 1, "host": "a"}], "components[0].host"),
        ([{"cores": 3}, {"cores": 3}, {"cores": 3}], "components"),
    ]:
        path.write_text(json.dumps({"executable": "/bin/true", "components": components}))
        refused = fleet.run("submit", str(path))
        assert refused.returncode != 0
        assert expected in refused.stderr, refused.stderr
    path.write_text(
        json.dumps(
            {
                "executable": "/bin/true",
                "component_of": {"gang": "a.1", "size": 1, "index": 0, "site": "a"},
            }
        )
    )
    refused = fleet.run("submit", str(path))
    assert "component_of" in refused.stderr, refused.stderr


def test_a_job_whose_components_never_all_get_cores_fails_and_none_ran() -> None:
    home = Path(tempfile.mkdtemp(prefix="gbroker-coalloc-timeout-"))
    home.chmod(0o711)
    fleet = up(home, "--coalloc-timeout", "2", "--coalloc-rounds", "2")
    try:
        _, release = fleet.blocker("full-c")
        job_id, log = fleet.coallocated("never")
        waited = fleet.run("wait", job_id, "--json", "--timeout", "60", timeout=90)
        end = json.loads(waited.stdout)
        assert end["state"] == "failed", end
        errors = {e["error"] for e in end["elements"]}
        assert errors == {"its 3 components did not all get their cores within 2 s, 2 times"}
        assert log.read_text() == ""
        # a's and b's cores went back: a job of two cores runs at a now.
        job = fleet.submit(
            {"executable": "/bin/true", "total_cpu_count": 2, "candidate_hosts": ["a"]}, "after"
        )
        done = json.loads(fleet.run("wait", job, "--json", "--timeout", "60").stdout)
        assert done["state"] == "done", done
        release.touch()
    finally:
        gbroker("fleet", "down", "--dir", str(fleet.directory), fleet=fleet.directory)
        shutil.rmtree(home, ignore_errors=True)


def started(fleet: Fleet, log: Path, rank: int) -> bool:
    return any(line.split()[0] == str(rank) for line in log.read_text().splitlines())


STEPS: dict[str, tuple[str, Callable[[Fleet, str, Path], bool]]] = {
    # the broker SIGKILLed, and the step of the claims and start it is killed at
    "owner-while-claims-are-held": ("a", lambda f, j, log: f.claiming(j)),
    "component-site-while-claims-are-held": ("b", lambda f, j, log: f.claiming(j)),
    "owner-once-all-are-granted": ("a", lambda f, j, log: f.granted(j)),
    "component-site-once-all-are-granted": ("c", lambda f, j, log: f.granted(j)),
    "component-site-once-its-component-started": ("b", lambda f, j, log: started(f, log, 1)),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_broker_killed_at_a_step_of_the_claims_and_start_leaves_each_component_run_once(
    fleet: Fleet, step: str
) -> None:
    victim, at_step = STEPS[step]
    blocker, release = fleet.blocker(f"full-c-{step}")
    job_id, log = fleet.coallocated(step, pause=2.0)
    held = "held" in step
    if held:
        poll(lambda: at_step(fleet, job_id, log), f"the job at {step}")
    else:
        release.touch()
        poll(lambda: at_step(fleet, job_id, log), f"the job at {step}", 30)
    pid = fleet_control.kill(fleet.directory, victim)
    poll(lambda: not Path(f"/proc/{pid}").exists(), "the broker is gone", 10)
    if held:  # the dead broker's step: no component ran, the claims were never granted
        assert log.read_text() == ""
        assert not fleet.granted(job_id)
        release.touch()
    elif "granted" in step:  # the owner had journaled every grant when the kill landed
        assert fleet.granted(job_id)
    restarted = fleet.run("fleet", "restart", victim)
    assert restarted.returncode == 0, restarted.stderr
    fleet.ends_once(job_id, log)
    # The blocker's end, reported by c to its owner a, is never lost; a report kept for a
    # restarted owner goes once the owner is heard online again (before, it waited out its
    # last backoff, up to 5 s, and a CI run found the blocker still "running" here).
    poll(lambda: fleet.status(blocker)["state"] == "done", "the blocker's end at a", 5)
