"""Issue 36, item 9, "What a new user met", each through the command as a process, against a
fleet from `gbroker fleet up` that is the user's default fleet, used from a directory with no
`.gbroker-fleet` above it:

- a mistyped command gets the nearest one ("did you mean `submit`?");
- `gbroker jobs` says when it cut the list (and `--all` does not cut it);
- a command that used the default fleet says which, and a broker's refusal names the fleet;
- `fleet drain` acts with the caller's own token when given (a clear 403 if not an admin's);
- `fleet drain --migrate` says which jobs it waits for and why (one pinned to the site);
- `fleet up` and `fleet status` say that SD-Policy is on; `fleet up`'s hint names an example
  job that exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

pytestmark = pytest.mark.network


@dataclass
class DefaultFleet:
    directory: Path  # the fleet's directory (`fleet up --dir`)
    elsewhere: Path  # no .gbroker-fleet above it: commands find the fleet as the default
    env: dict[str, str]  # the user's own default fleet (XDG_STATE_HOME)
    up: subprocess.CompletedProcess[str]  # what `fleet up` said

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return gbroker(*args, cwd=self.elsewhere, env={**self.env, **env})

    def submit(self, name: str) -> str:
        done = self.run("submit", str(self.elsewhere / name))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def status(self, job_id: str) -> dict[str, object]:
        done = self.run("status", job_id, "--json")
        assert done.returncode == 0, done.stderr
        answer: dict[str, object] = json.loads(done.stdout)
        return answer


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultFleet]:
    """Sites big (2 cores) and tiny (1 core), SD-Policy on; job files one.yaml (1 core) and
    pinned.yaml (held to big by its candidate hosts, 4 s)."""
    root = tmp_path_factory.mktemp("met")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    sites = [SiteSpec("big", 2), SiteSpec("tiny", 1)]
    save_topology(Topology(sites, "full", name="pair"), elsewhere / "pair.yaml")
    (elsewhere / "one.yaml").write_text("executable: /bin/true\ntotal_cpu_count: {exact: 1}\n")
    (elsewhere / "pinned.yaml").write_text(
        "executable: /bin/sleep\narguments: ['4']\ncandidate_hosts: [big]\n"
    )
    env = {**os.environ, "XDG_STATE_HOME": str(root / "state")}
    directory = root / "fleet"
    up = gbroker(
        "fleet", "up", "--topology", "pair.yaml", "--dir", str(directory), "--sd-policy", "10",
        cwd=elsewhere, env=env,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield DefaultFleet(directory, elsewhere, env, up)
    finally:
        down = gbroker("fleet", "down", "--dir", str(directory), cwd=elsewhere, env=env)
        assert down.returncode == 0, down.stderr


def test_a_mistyped_command_gets_the_nearest_one(tmp_path: Path) -> None:
    typo = gbroker("sumbit", "job.yaml", cwd=tmp_path)
    assert typo.returncode == 2
    assert "invalid choice: 'sumbit': did you mean `submit`?" in typo.stderr
    action = gbroker("fleet", "stauts", cwd=tmp_path)
    assert action.returncode == 2
    assert "invalid choice: 'stauts': did you mean `status` or `restart`?" in action.stderr
    far = gbroker("zzzz", cwd=tmp_path)
    assert far.returncode == 2
    assert "did you mean" not in far.stderr


def test_jobs_says_when_it_cut_the_list(fleet: DefaultFleet) -> None:
    ids = [fleet.submit("one.yaml") for _ in range(2)]
    listed = fleet.run("jobs", "--json")
    count = len(json.loads(listed.stdout))
    cut = fleet.run("jobs", "--limit", "1")
    assert cut.returncode == 0, cut.stderr
    assert (
        f"(showing the newest 1 of {count} jobs: --limit N shows more, --all every one)"
        in cut.stderr
    )
    assert ids[-1] in cut.stdout
    assert ids[0] not in cut.stdout
    every = fleet.run("jobs", "--all", "--json")
    assert every.returncode == 0, every.stderr
    assert {j["id"] for j in json.loads(every.stdout)} >= set(ids)
    assert "showing the newest" not in every.stderr + listed.stderr


def test_the_default_fleet_is_named_and_so_is_it_in_a_broker_s_refusal(
    fleet: DefaultFleet,
) -> None:
    note = (
        f"using the fleet in {fleet.directory}, your most recent one still running (no running "
        ".gbroker-fleet above this directory; $GBROKER_FLEET names one)"
    )
    listed = fleet.run("jobs")
    assert listed.returncode == 0, listed.stderr
    assert f"gbroker jobs: {note}\n" in listed.stderr
    # A job id of another fleet's: refused by this fleet's brokers, which the error names.
    other = fleet.run("status", "elsewhere.17")
    assert other.returncode == 2
    assert "whose owner is a site of the topology" in other.stderr
    assert other.stderr.rstrip().endswith(f"(the fleet in {fleet.directory})")
    # Named, it is not announced.
    named = fleet.run("jobs", GBROKER_FLEET=str(fleet.directory))
    assert (named.returncode, named.stderr) == (0, "")
    # Fleet actions say it too.
    drained = fleet.run("fleet", "undrain", "tiny")
    assert drained.returncode == 0, drained.stderr
    assert f"gbroker fleet undrain: {note}\n" in drained.stderr


def test_drain_acts_with_the_caller_s_token_when_given(fleet: DefaultFleet) -> None:
    added = fleet.run("fleet", "user", "add", "bob")
    assert added.returncode == 0, added.stderr
    bob = added.stdout.strip()
    refused = fleet.run("fleet", "drain", "tiny", "--no-wait", GBROKER_TOKEN=bob)
    assert refused.returncode == 1
    assert "403: drain: only an admin drains a site" in refused.stderr
    assert "(the token of $GBROKER_TOKEN is not an admin's)" in refused.stderr
    admin = fleet.run("fleet", "user", "add", "ops", "--admin").stdout.strip()
    taken = fleet.run("fleet", "drain", "tiny", "--no-wait", GBROKER_TOKEN=admin)
    assert taken.returncode == 0, taken.stderr
    lifted = fleet.run("fleet", "undrain", "tiny")  # no token given: the fleet's admin token
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout == "tiny: taking new work\n"


def test_drain_migrate_says_which_jobs_it_waits_for_and_why(fleet: DefaultFleet) -> None:
    job_id = fleet.submit("pinned.yaml")
    deadline = time.monotonic() + 60
    while (status := fleet.status(job_id))["state"] != "running":
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    try:
        drained = fleet.run("fleet", "drain", "big", "--migrate", "--timeout", "60")
    finally:
        fleet.run("fleet", "undrain", "big")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout == "big: drained\n"
    said = drained.stderr
    assert f"big: {job_id} runs on at big: not moved off draining big: " in said
    assert "tiny: " in said.split(f"{job_id} runs on at big", 1)[1]  # why tiny does not fit
    assert "; waiting for it to end\n" in said
    assert f"big: {job_id} ended at big (done)\n" in said


def test_fleet_up_and_status_say_sd_policy_is_on(fleet: DefaultFleet) -> None:
    policy = (
        "every site: SD-Policy on (max slowdown 10, sharing factor 0.5, up to 2 mates, ideal "
        "run times)"
    )
    assert policy in fleet.up.stdout
    shown = fleet.run("fleet", "status")
    assert shown.returncode == 0, shown.stderr
    assert policy in shown.stdout
    as_json = json.loads(fleet.run("fleet", "status", "--json").stdout)
    assert as_json["policies"].startswith(policy)
    # Its hint names an example job that exists (none is under this directory).
    lines = fleet.up.stdout.splitlines()
    hinted = [Path(line.split()[-1]) for line in lines if "gbroker submit" in line]
    assert hinted == [Path(__file__).resolve().parents[2] / "examples" / "hello.yaml"]
