"""An identity per user, through the user's path: `gbroker fleet up`, `gbroker fleet user add
alice` and `bob`, each submitting with their own token (GBROKER_TOKEN).

Under a root broker each user's jobs run as a uid of their own (gbroker.site.identity): never 0,
nobody, the broker's, or the other user's, gid the same number, the same again after the broker
restarts. A broker that is not root cannot switch users: its jobs run as itself, and it says so
(``jobs_run_as`` in /api/v1/info). Either way, alice cannot see or cancel bob's job, and `fleet
user remove bob` makes bob's next request a 401 with no restart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gbroker.security.auth import bearer

ROOT = os.geteuid() == 0
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def gbroker(
    *args: str, token: str | None = None, fleet: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]  # the test run's
    if fleet is not None:
        env["GBROKER_FLEET"] = str(fleet)
    if token is not None:
        env["GBROKER_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def poll(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.1)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Path]:
    """A 1-site fleet (that resizes malleable jobs) from `gbroker fleet up`, in a directory
    every uid may traverse (Python opens a script by its absolute path)."""
    topology = tmp_path / "one.yaml"
    topology.write_text("name: one\nsites:\n  - {name: solo, cores: 2}\nneighbourhood: full\n")
    home = Path(tempfile.mkdtemp(prefix="gbroker-users-"))
    home.chmod(0o711)
    directory = home / "fleet"
    up = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory),
                 "--malleability", "fpsma", "--initiative", "pwa")  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield directory
    finally:
        gbroker("fleet", "down", "--dir", str(directory))
        shutil.rmtree(home, ignore_errors=True)


def add_user(fleet: Path, name: str) -> str:
    added = gbroker("fleet", "user", "add", name, "--dir", str(fleet))
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert f"GBROKER_TOKEN={token} gbroker submit" in added.stderr
    return token


def run_job(fleet: Path, token: str, description: Path, *extra: str) -> tuple[str, str]:
    """Submit, wait for the end, and the job's id and standard output."""
    submitted = gbroker("submit", str(description), *extra, token=token, fleet=fleet)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    waited = gbroker("wait", job_id, "--json", token=token, fleet=fleet)
    assert waited.returncode == 0, (waited.stdout, waited.stderr)
    output = gbroker("output", job_id, token=token, fleet=fleet)
    assert output.returncode == 0, output.stderr
    return job_id, output.stdout


def broker_pid(fleet: Path) -> int:
    return int(json.loads((fleet / "fleet.json").read_text())["sites"]["solo"]["pid"])


@pytest.mark.slow
def test_each_user_runs_as_a_uid_of_their_own_and_cannot_touch_the_others_jobs(
    fleet: Path, tmp_path: Path
) -> None:
    alice, bob = add_user(fleet, "alice"), add_user(fleet, "bob")
    listed = gbroker("fleet", "user", "list", "--json", "--dir", str(fleet))
    users = json.loads(listed.stdout)
    assert users == [
        {"name": "admin", "admin": True},
        {"name": "alice", "admin": False},
        {"name": "bob", "admin": False},
    ]
    assert alice not in listed.stdout
    assert bob not in listed.stdout

    ids = tmp_path / "id.yaml"
    ids.write_text('executable: /bin/sh\narguments: ["-c", "id -u; id -g; echo $HOME"]\n')
    _, alice_out = run_job(fleet, alice, ids)
    _, bob_out = run_job(fleet, bob, ids)
    (alice_uid, alice_gid, alice_home), (bob_uid, bob_gid, _) = (
        alice_out.split(),
        bob_out.split(),
    )
    url = json.loads((fleet / "fleet.json").read_text())["sites"]["solo"]["url"]
    admin = (fleet / "tokens").read_text().split("\n")[1].split()[1]
    request = urllib.request.Request(f"{url}/api/v1/info", headers=bearer(admin))
    with urllib.request.urlopen(request, timeout=30) as answer:
        run_as = json.load(answer)["jobs_run_as"]
    if ROOT:
        assert alice_uid != bob_uid
        assert alice_gid == alice_uid
        assert bob_gid == bob_uid
        for uid in (int(alice_uid), int(bob_uid)):
            assert uid not in (0, 65534, os.geteuid())
        assert run_as == "a uid per user from 1879048192-1879113727"
    else:  # not root: the broker cannot switch users, and says so
        assert alice_uid == bob_uid == str(os.geteuid())
        assert "(not root)" in run_as
    assert alice_home.startswith(str(fleet))  # HOME is the job's directory, no passwd entry

    # A Python job and a malleable one (gbroker.app.malleable, from the site's copy) run as
    # alice's uid too, writing in their directory.
    python = tmp_path / "python.yaml"
    python.write_text(
        'executable: /usr/bin/python3\narguments: [-c, "import os, gbroker.app.malleable; '
        "open(os.environ['HOME'] + '/x', 'w').write('1'); print(os.getuid())\"]\n"
    )
    assert run_job(fleet, alice, python)[1].split() == [alice_uid]
    malleable = tmp_path / "malleable.yaml"
    malleable.write_text(
        (EXAMPLES / "malleable-pi.yaml")
        .read_text()
        .replace("executable: python3", "executable: /usr/bin/python3")
        .replace('"400"', '"20"')
        .replace('"20000"', '"2000"')
    )
    malleable_id, _ = run_job(
        fleet, alice, malleable, "--upload", str(EXAMPLES / "malleable_pi.py")
    )
    result = fleet / "solo" / "jobs" / malleable_id / "result.json"
    assert json.loads(result.read_text())["samples"] == 20 * 2000
    assert result.stat().st_uid == int(alice_uid)

    # Alice can neither see nor cancel bob's job.
    sleeper = tmp_path / "sleep.yaml"
    sleeper.write_text("executable: /bin/sleep\narguments: ['60']\n")
    submitted = gbroker("submit", str(sleeper), token=bob, fleet=fleet)
    bobs = submitted.stdout.strip()
    assert submitted.returncode == 0, submitted.stderr
    seen = gbroker("status", bobs, token=alice, fleet=fleet)
    assert seen.returncode == 2, (seen.stdout, seen.stderr)
    assert bobs in seen.stderr
    cancelled = gbroker("cancel", bobs, token=alice, fleet=fleet)
    assert cancelled.returncode == 2, (cancelled.stdout, cancelled.stderr)
    assert bobs not in gbroker("jobs", token=alice, fleet=fleet).stdout
    mine = gbroker("status", bobs, "--json", token=bob, fleet=fleet)
    assert json.loads(mine.stdout)["state"] in ("queued", "running"), mine.stdout

    # Bob removed: his next request is refused, by the same broker (no restart).
    pid = broker_pid(fleet)
    removed = gbroker("fleet", "user", "remove", "bob", "--dir", str(fleet))
    assert removed.returncode == 0, removed.stderr
    refused = gbroker("jobs", token=bob, fleet=fleet)
    assert refused.returncode != 0
    assert "401" in refused.stderr, refused.stderr
    assert broker_pid(fleet) == pid
    assert gbroker("jobs", token=alice, fleet=fleet).returncode == 0
    gbroker("cancel", bobs, token=admin, fleet=fleet)

    # A restarted broker gives alice the same uid.
    restarted = gbroker("fleet", "restart", "solo", "--force", "--dir", str(fleet))
    assert restarted.returncode == 0, restarted.stderr
    assert broker_pid(fleet) != pid
    poll(lambda: gbroker("jobs", token=alice, fleet=fleet).returncode == 0, "the broker back")
    assert run_job(fleet, alice, ids)[1].split()[0] == alice_uid


def test_fleet_user_refuses_bad_names_in_one_line(fleet: Path) -> None:
    for args, message in (
        (("add", "Alice"), "NAME: expected a user name"),
        (("add", "x" * 33), "NAME: expected a user name"),
        (("add", "admin"), "expected a user not yet in"),
        (("remove", "carol"), "expected a user of"),
        (("remove", "admin"), "the last admin"),
    ):
        done = gbroker("fleet", "user", *args, "--dir", str(fleet))
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(f"gbroker fleet user {args[0]}: "), done.stderr
        assert message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    nowhere = gbroker("fleet", "user", "list", "--dir", str(fleet.parent / "nowhere"))
    assert nowhere.returncode == 2
    assert "no token file" in nowhere.stderr, nowhere.stderr


def test_concurrent_adds_all_land(fleet: Path) -> None:
    names = [f"user{n}" for n in range(8)]
    adds = [
        subprocess.Popen(
            [sys.executable, "-m", "gbroker", "fleet", "user", "add", name, "--dir", str(fleet)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    tokens = {}
    for name, add in zip(names, adds, strict=True):
        out, err = add.communicate(timeout=60)
        assert add.returncode == 0, err
        tokens[name] = out.strip()
    listed = json.loads(gbroker("fleet", "user", "list", "--json", "--dir", str(fleet)).stdout)
    assert sorted(u["name"] for u in listed) == sorted(["admin", *names])
    assert (fleet / "tokens").stat().st_mode & 0o777 == 0o600
    for name, token in tokens.items():
        jobs = gbroker("jobs", "--json", token=token, fleet=fleet)
        assert jobs.returncode == 0, (name, jobs.stderr)
