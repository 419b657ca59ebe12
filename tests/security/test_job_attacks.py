"""Jobs as attackers (issue 25): another user's program running beside yours on the same site.

Everything goes through the user's path: a fleet from `gbroker fleet up`, two users made by
`gbroker fleet user add alice` and `bob`, jobs sent with `gbroker submit` under each one's token
(GBROKER_TOKEN), and what they see with `gbroker status`/`wait`/`output`. Each test is one
finding of the issue, as the job that attacked; on the code before the issue each attack
worked (the closing note of issue 25 has the run against it), and here each is refused.

Root only: a broker that is not root cannot give jobs identities or cgroups (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker.security.auth import bearer
from tests.cli.test_fleet_users import gbroker, poll

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="identities and cgroups need a root broker"),
    # A fleet and a few hundred CLI processes, jobs that spin to their CPU limit, a launcher
    # hammered: alone, after the others (scripts/test.sh), not beside tests that time things.
    pytest.mark.serial,
]

TOPOLOGY = "name: pair\nsites:\n  - {name: east, cores: 2, memory_per_core: 1GiB}\n"
TOPOLOGY += "  - {name: west, cores: 2, memory_per_core: 1GiB}\n"
TOPOLOGY += "neighbourhood: full\n"


class Fleet:
    """A fleet from `gbroker fleet up` and its two users."""

    def __init__(self, directory: Path, *up: str) -> None:
        self.directory = directory
        topology = directory.parent / "pair.yaml"
        topology.write_text(TOPOLOGY)
        started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory), *up)
        assert started.returncode == 0, started.stderr
        self.alice = self.add_user("alice")
        self.bob = self.add_user("bob")

    def add_user(self, name: str) -> str:
        added = gbroker("fleet", "user", "add", name, "--dir", str(self.directory))
        assert added.returncode == 0, added.stderr
        return added.stdout.strip()

    def down(self) -> None:
        gbroker("fleet", "down", "--dir", str(self.directory))

    def submit(self, token: str, description: Path, *extra: str) -> str:
        submitted = gbroker("submit", str(description), *extra, token=token, fleet=self.directory)
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip()

    def wait(self, token: str, job_id: str) -> dict[str, Any]:
        """The job's record once it has ended (``gbroker wait --json``)."""
        waited = gbroker("wait", job_id, "--json", token=token, fleet=self.directory)
        assert waited.stdout, waited.stderr
        record: dict[str, Any] = json.loads(waited.stdout)
        if isinstance(record.get("jobs"), list):
            record = record["jobs"][0]
        return record

    def wait_state(self, token: str, job_id: str) -> str:
        """The job's state now (``gbroker status --json``)."""
        shown = gbroker("status", job_id, "--json", token=token, fleet=self.directory)
        if shown.returncode != 0:
            return "unknown"
        return str(json.loads(shown.stdout).get("state"))

    def output(self, token: str, job_id: str) -> str:
        shown = gbroker("output", job_id, token=token, fleet=self.directory)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    def record(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.directory / "fleet.json").read_text())
        return loaded

    def url(self, site: str) -> str:
        return str(self.record()["sites"][site]["url"])

    def admin(self) -> str:
        for line in (self.directory / "tokens").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) == 3:
                return fields[1]
        raise AssertionError("no admin token")


def _fleet(*up: str) -> Iterator[Fleet]:
    home = Path(tempfile.mkdtemp(prefix="gbroker-attacks-"))
    home.chmod(0o711)  # every job's uid may traverse it (Python opens a script by path)
    fleet = Fleet(home / "fleet", *up)
    try:
        yield fleet
    finally:
        fleet.down()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """One fleet for the module: two sites with a 256 MiB memory limit and 64 processes a job."""
    yield from _fleet("--job-memory", "256MiB", "--job-processes", "64")


def job(tmp_path: Path, name: str, program: str, *arguments: str, **fields: Any) -> Path:
    """A job description running ``program`` with Python, at site ``east`` unless said."""
    description = {
        "executable": "python3",
        "arguments": ["-c", program, *arguments],
        "candidate_hosts": [fields.pop("site", "east")],
        **fields,
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(description))
    return path


KILL_LAUNCHERS = """
import os, signal, time
launchers = {os.getppid()}
for entry in os.listdir("/proc"):
    try:
        if open(f"/proc/{entry}/cmdline", "rb").read().startswith(b"gbroker launcher"):
            launchers.add(int(entry))
    except (OSError, ValueError):
        pass
killed = denied = 0
deadline = time.monotonic() + 8
while time.monotonic() < deadline:
    for pid in launchers:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except PermissionError:
            denied += 1
        except ProcessLookupError:
            pass
print(len(launchers), killed, denied)
"""


def test_no_job_can_kill_a_launcher_and_fail_other_users_jobs(fleet: Fleet, tmp_path: Path) -> None:
    # Before: while it spawned, a launcher took the job's uid as its real one: a job looping
    # os.kill(launcher, SIGKILL) killed 21 launchers in 25 s; 20 of 60 other jobs failed with
    # "the launcher has gone away".
    killer = fleet.submit(fleet.bob, job(tmp_path, "killer", KILL_LAUNCHERS))
    poll(lambda: fleet.wait_state(fleet.bob, killer) == "running", "the killer runs")
    victims = [
        fleet.submit(fleet.alice, job(tmp_path, f"v{i}", "pass", site=("east", "west")[i % 2]))
        for i in range(20)
    ]
    ends = [fleet.wait(fleet.alice, v) for v in victims]
    assert [e["state"] for e in ends] == ["done"] * 20, [e.get("error") for e in ends]
    fleet.wait(fleet.bob, killer)
    launchers, killed, denied = map(int, fleet.output(fleet.bob, killer).split())
    assert launchers >= 1
    assert killed == 0
    assert denied > 0


ORPHAN = """
import json, os, signal, sys, time
launcher = os.getppid()
deadline = time.monotonic() + 15
while time.monotonic() < deadline:  # a spawn of another job opens the way, if anything does
    try:
        os.kill(launcher, signal.SIGKILL)
        break
    except PermissionError:
        pass
print("launcher killed" if os.getppid() != launcher else "launcher alive", flush=True)
"""


def spawn_while(fleet: Fleet, tmp_path: Path, running: str) -> None:
    """Start other jobs at its site while job ``running`` is running (spawns, each a moment
    when the launcher of the code before took a job's uid as its real one)."""
    poll(lambda: fleet.wait_state(fleet.bob, running) != "queued", "the attacker starts")
    fillers = [fleet.submit(fleet.alice, job(tmp_path, f"f{i}", "pass")) for i in range(8)]
    for filler in fillers:
        fleet.wait(fleet.alice, filler)


def test_a_job_cannot_forge_its_own_end(fleet: Fleet, tmp_path: Path) -> None:
    # Before: a job that killed its launcher, wrote {"exit_code": 0} to .gbroker-exit and then
    # exited 7 was recorded "done, 0" (its end was read from that file, which it owns).
    forge = (
        ORPHAN + "open('.gbroker-exit', 'w').write(json.dumps({'exit_code': 0, 'signal': None,"
        " 'pid': os.getpid()}))\nsys.exit(7)\n"
    )
    liar = fleet.submit(fleet.bob, job(tmp_path, "liar", forge))
    spawn_while(fleet, tmp_path, liar)
    end = fleet.wait(fleet.bob, liar)
    assert fleet.output(fleet.bob, liar).strip() == "launcher alive"
    assert (end["state"], end["exit_code"]) == ("failed", 7)


STEAL = """
import json, os, sys, time
mine = os.environ["GBROKER_JOB_DIR"]
victim = sys.argv[1]
found = []
for entry in os.listdir("/proc"):
    try:
        environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    for item in environ:
        if item.startswith(b"GBROKER_JOB_DIR=") and item[16:].decode() != mine:
            found.append(item[16:].decode())
target = os.path.join(os.path.dirname(mine), victim)
said = {"environs_of_others": found}
for name, how in (("forge", "w"), ("read", "r")):
    try:
        path = os.path.join(target, ".gbroker-exit" if name == "forge" else "secret")
        with open(path, how) as file:
            if name == "forge":
                file.write(json.dumps({"exit_code": 0, "signal": None, "pid": 1}))
            else:
                said["secret"] = file.read()
        said[name] = "done"
    except OSError as exc:
        said[name] = type(exc).__name__
print(json.dumps(said))
"""


def test_a_job_cannot_read_or_forge_another_users_job(fleet: Fleet, tmp_path: Path) -> None:
    # Before: all jobs ran as nobody: bob's job found alice's job directory in
    # /proc/*/environ, read her files and wrote her end record: her `sleep 12; exit 3`
    # became done, 0 after 1.5 s.
    victim = fleet.submit(
        fleet.alice,
        job(
            tmp_path,
            "victim",
            "import time; open('secret', 'w').write('alice only'); time.sleep(4); exit(3)",
        ),
    )
    poll(lambda: fleet.wait_state(fleet.alice, victim) == "running", "alice's job runs")
    thief = fleet.submit(fleet.bob, job(tmp_path, "thief", STEAL, victim))
    fleet.wait(fleet.bob, thief)
    said = json.loads(fleet.output(fleet.bob, thief))
    assert said["environs_of_others"] == []  # another uid's /proc/PID/environ is closed
    assert said["read"] == "PermissionError"
    assert said["forge"] == "PermissionError"
    end = fleet.wait(fleet.alice, victim)
    assert (end["state"], end["exit_code"]) == ("failed", 3)


def test_a_fifo_in_a_jobs_directory_never_stalls_the_broker(fleet: Fleet, tmp_path: Path) -> None:
    # Before: a job that killed its launcher and left a FIFO named .gbroker-exit made its broker
    # block reading it: HTTP stopped answering until someone wrote to the FIFO.
    fifo = ORPHAN + "os.mkfifo('.gbroker-exit')\n"
    trap = fleet.submit(fleet.bob, job(tmp_path, "fifo", fifo))
    spawn_while(fleet, tmp_path, trap)
    end = fleet.wait(fleet.bob, trap)
    assert end["state"] == "done"
    request = urllib.request.Request(
        fleet.url("east") + "/api/v1/health", headers=bearer(fleet.admin())
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_job_cannot_widen_its_cores(fleet: Fleet, tmp_path: Path) -> None:
    # Before: a 1-core job widened its affinity from {1} to {0, 1}.
    widen = (
        "import os, json; before = sorted(os.sched_getaffinity(0))\n"
        "try: os.sched_setaffinity(0, range(os.cpu_count()))\n"
        "except OSError: pass\n"
        "print(json.dumps([before, sorted(os.sched_getaffinity(0))]))"
    )
    wide = fleet.submit(fleet.bob, job(tmp_path, "widen", widen))
    fleet.wait(fleet.bob, wide)
    before, after = json.loads(fleet.output(fleet.bob, wide))
    assert len(before) == 1
    assert after == before


@pytest.mark.parametrize(
    ("program", "fields", "error"),
    [
        ("while True: pass", {"cpu_time_limit": 2}, "used up its CPU-time limit of 2 s"),
        ("import time; time.sleep(60)", {"wall_time_limit": 2}, "wall-time limit of 2 s"),
        (
            "b = bytearray(600 << 20)",
            {},
            "killed by the kernel at its memory limit of 256 MiB (cgroup memory.max)",
        ),
        (
            "import os, sys\nfor i in range(100):\n"
            "    try: os.fork() or (__import__('time').sleep(30), os._exit(0))\n"
            "    except OSError: sys.exit(3)\n",
            {},
            "refused at its process limit of 64 (cgroup pids.max)",
        ),
        (  # the memory a job asks for is its limit (before: matched to sites, never applied)
            "b = bytearray(300 << 20)",
            {"total_physical_memory": 128 << 20},
            "killed by the kernel at its memory limit of 128 MiB (cgroup memory.max)",
        ),
    ],
    ids=["cpu_time", "wall_time", "memory", "processes", "memory_asked"],
)
def test_a_job_killed_for_a_limit_is_told_which_and_its_value(
    fleet: Fleet, tmp_path: Path, program: str, fields: dict[str, Any], error: str
) -> None:
    # Before: cpu_time_limit was accepted and never applied; no memory or process limit was
    # set by default; a job killed at its wall-time limit ended failed with error null.
    limited = fleet.submit(fleet.bob, job(tmp_path, "limited", program, **fields))
    end = fleet.wait(fleet.bob, limited)
    assert end["state"] == "failed"
    assert error in (end.get("error") or ""), end
    shown = gbroker("status", limited, token=fleet.bob, fleet=fleet.directory)
    assert error in shown.stdout


ESCAPE = "import subprocess; subprocess.Popen(['setsid', 'env', '-i', 'sleep', '1000'])"


def escaped_sleeps() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "cmdline").read_bytes() == b"sleep\x001000\x00":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


SNOOP = """
import json, os, sys
found, prefix = [], b"GBROKER_JOB_DIR=" + sys.argv[1].encode()
for entry in os.listdir("/proc"):
    try:
        environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    found += [item[16:].decode() for item in environ if item.startswith(prefix)]
print(json.dumps(found))
"""


def test_a_user_of_another_fleet_on_the_host_cannot_reach_a_namesake_s_jobs(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Found by this suite while another fleet ran beside it: each site kept its own uid
    # database and both fleets had the same default ranges, so "bob" at "east" got the same
    # uid in either fleet, and one fleet's bob read the other's /proc/PID/environ.
    victim = fleet.submit(fleet.bob, job(tmp_path, "namesake", "import time; time.sleep(6)"))
    poll(lambda: fleet.wait_state(fleet.bob, victim) == "running", "bob's job runs")
    other = _fleet()
    neighbour = next(other)
    try:
        snoop = neighbour.submit(neighbour.bob, job(tmp_path, "snoop", SNOOP, str(fleet.directory)))
        neighbour.wait(neighbour.bob, snoop)
        assert json.loads(neighbour.output(neighbour.bob, snoop)) == []
    finally:
        next(other, None)  # fleet down
    assert fleet.wait(fleet.bob, victim)["state"] == "done"


def test_nothing_a_job_forked_outlives_its_cancel(fleet: Fleet, tmp_path: Path) -> None:
    # Before: a `setsid env -i sleep` outlived cancel (processes were found by environment).
    before = set(escaped_sleeps())
    program = ESCAPE + "; import time; time.sleep(100)"
    leaky = fleet.submit(fleet.bob, job(tmp_path, "leaky", program))
    poll(lambda: set(escaped_sleeps()) - before != set(), "the escaped sleep runs")
    cancelled = gbroker("cancel", leaky, token=fleet.bob, fleet=fleet.directory)
    assert cancelled.returncode == 0, cancelled.stderr
    fleet.wait(fleet.bob, leaky)
    poll(lambda: set(escaped_sleeps()) - before == set(), "the escaped sleep is gone", 10)


def test_nothing_a_job_forked_outlives_fleet_down(tmp_path: Path) -> None:
    # Before: the same `setsid env -i sleep` outlived `fleet down`.
    before = set(escaped_sleeps())
    own = _fleet()
    fleet = next(own)
    try:
        program = ESCAPE + "; import time; time.sleep(100)"
        fleet.submit(fleet.bob, job(tmp_path, "leaky", program))
        poll(lambda: set(escaped_sleeps()) - before != set(), "the escaped sleep runs")
    finally:
        next(own, None)  # fleet down
    poll(lambda: set(escaped_sleeps()) - before == set(), "the escaped sleep is gone", 10)


FORK_BOMB = "for i in $(seq 5000); do sleep 100 & done 2>/dev/null; exit 3"


def test_a_fleet_given_no_limits_still_holds_a_fork_bomb_and_says_its_shares(
    tmp_path: Path,
) -> None:
    # Before: a plain `fleet up` set no memory and no process limit: a 600 MiB job and a job of
    # 100 forks ended done, and a fork bomb met only the host's own limits.
    own = _fleet()
    plain = next(own)
    try:
        shown = gbroker("fleet", "status", "--dir", str(plain.directory))
        rows = [line for line in shown.stdout.splitlines() if line.startswith(("east", "west"))]
        assert len(rows) == 2, shown.stdout
        for row in rows:
            assert row.rstrip().endswith(" a core, processes 512 a core"), row
        bomb = plain.submit(
            plain.bob, job(tmp_path, "bomb", "", executable="/bin/sh", arguments=["-c", FORK_BOMB])
        )
        end = plain.wait(plain.bob, bomb)
        assert end["state"] == "failed", end
        assert "refused at its process limit of 4096 (cgroup pids.max)" in (end["error"] or "")
    finally:
        next(own, None)


def test_fleet_status_shows_how_each_sites_jobs_are_confined(fleet: Fleet) -> None:
    shown = gbroker("fleet", "status", "--dir", str(fleet.directory))
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if line.startswith(("east", "west"))]
    assert len(rows) == 2
    for row in rows:
        assert "a uid per user, cgroup v" in row
        assert row.rstrip().endswith("memory 256 MiB, processes 64")
    members = json.loads(gbroker("fleet", "status", "--json", "--dir", str(fleet.directory)).stdout)
    jobs = next(m["jobs"] for m in members["members"] if m["name"] == "east")
    assert jobs["limits"] == {"memory": 256 << 20, "processes": 64}
    assert jobs["confinement"].startswith("a cgroup per job")
