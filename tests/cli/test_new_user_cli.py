"""Issue 24, "Tried as a new user would": what a new user of the `gbroker` command tripped on,
each through the command as a process, against a fleet from `gbroker fleet up`:

- a reader that goes away early (`gbroker jobs | head -1`) ends any command silently, as
  SIGPIPE ends a C tool (no traceback, no "Broken pipe", the shell sees 141);
- a job id is checked before any request (`gbroker wait ""` asked for `/api/v1/jobs//wait`);
- `explain FILE` names the file, not a made-up id, and counts in the singular for one;
- `cancel` of a job that had already ended says so and exits 1; several ids: each reported,
  the worst status;
- a wrong flag shows the subcommand's usage, not the top-level one;
- Ctrl-C while waiting says the jobs go on, and exits 130;
- `fleet down` of a fleet already down has nothing to stop (exit 0), and bringing down one
  fleet leaves the one brought up before it the default.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

pytestmark = pytest.mark.network

CLIENT_COMMANDS = ("submit", "status", "wait", "jobs", "output", "cancel", "history", "explain")
ID_SYNTAX = "expected a job id <site>.<digits>"


@dataclass
class Fleet:
    project: Path  # `fleet up` ran here: client commands run here find it
    urls: dict[str, str]  # each site's broker

    @property
    def ports(self) -> list[int]:
        return [int(url.rsplit(":", 1)[1]) for url in self.urls.values()]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return gbroker(*args, cwd=self.project)

    def submit(self, name: str) -> str:
        done = self.run("submit", name)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def status(self, job_id: str) -> dict[str, object]:
        done = self.run("status", job_id, "--json")
        assert done.returncode == 0, done.stderr
        answer: dict[str, object] = json.loads(done.stdout)
        return answer


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Sites big (4 cores) and tiny (1 core); job files one.yaml (1 core), two.yaml (2 cores)
    and slow.yaml (sleeps until cancelled)."""
    project = tmp_path_factory.mktemp("new-user") / "project"
    project.mkdir()
    sites = [SiteSpec("big", 4), SiteSpec("tiny", 1)]
    save_topology(Topology(sites, "full", name="pair"), project / "pair.yaml")
    save_topology(Topology([SiteSpec("solo", 1)], "full", name="one"), project / "one-site.yaml")
    (project / "one.yaml").write_text("executable: /bin/true\ntotal_cpu_count: {exact: 1}\n")
    (project / "two.yaml").write_text("executable: /bin/true\ntotal_cpu_count: {exact: 2}\n")
    (project / "slow.yaml").write_text("executable: /bin/sleep\narguments: ['600']\n")
    up = gbroker("fleet", "up", "--topology", "pair.yaml", cwd=project)
    assert up.returncode == 0, up.stderr
    listed = (project / ".gbroker-fleet" / "brokers").read_text().splitlines()
    urls = dict(line.split(" ", 1) for line in listed if line and not line.startswith("#"))
    try:
        yield Fleet(project, urls)
    finally:
        down = gbroker("fleet", "down", cwd=project)
        assert down.returncode == 0, down.stderr


def _closed_pipe() -> int:
    """The write end of a pipe whose reader has gone away already (`| head` that exited)."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_reader_that_goes_away_ends_every_command_silently(fleet: Fleet) -> None:
    job_id = fleet.submit("one.yaml")
    commands = [
        ("jobs",),
        ("jobs", "--json"),
        ("status", job_id),
        ("submit", "--json", "one.yaml"),
        ("submit", "one.yaml"),  # the Python CLI's own plain submission (the C front: below)
        ("topology", "show", "pair.yaml"),
        ("topology", "ring", "3", "--cores", "2"),
        ("fleet", "status"),
    ]
    for command in commands:
        stdout = _closed_pipe()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "gbroker", *command],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                cwd=fleet.project,
                env={**os.environ, "GBROKER_NO_NATIVE": "1"},
            )
        finally:
            os.close(stdout)
        # Ended by SIGPIPE, as a C tool is (the shell shows 141), with nothing on stderr.
        assert (done.returncode, done.stderr) == (-signal.SIGPIPE, ""), command


def test_waiting_on_a_broker_that_does_not_answer_says_so_once_and_goes_on() -> None:
    # No broker listens at port 9: the wait asks again until its timeout, telling the person
    # once why nothing happens, then ends "no broker answered" (4).
    done = gbroker("wait", "big.1", "--broker", "127.0.0.1:9", "--timeout", "2", cwd=Path.cwd())
    assert done.returncode == 4
    lines = done.stderr.splitlines()
    assert lines[0].startswith("gbroker wait: no broker answers: http://127.0.0.1:9: ")
    assert lines[0].endswith(
        "asking again until the timeout (2 s left; Ctrl-C stops waiting, the jobs go on)"
    )
    assert len(lines) == 2
    assert lines[1].startswith("gbroker wait: no broker answers: http://127.0.0.1:9: ")


def test_job_ids_are_checked_before_any_request() -> None:
    # No broker listens at port 9: a request would end in "no broker answers" (exit 4).
    cwd = Path.cwd()
    for command, wrong in [
        (("wait", ""), ""),
        (("status", "big.1", "x/../metrics"), "x/../metrics"),
        (("cancel", "big."), "big."),
        (("history", "12"), "12"),
        (("output", "big.1_0"), "big.1_0"),
    ]:
        done = gbroker(*command, "--broker", "127.0.0.1:9", cwd=cwd)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr == (
            f"gbroker {command[0]}: ID: {ID_SYNTAX} (a site name, a dot, 1 to 32 digits), or "
            f"an array element's <site>.<digits>_<index>, got {wrong!r}\n"
        )
    explain = gbroker("explain", "nothere.yaml", "--broker", "127.0.0.1:9", cwd=cwd)
    assert explain.returncode == 2
    assert explain.stderr.startswith(
        "gbroker explain: JOB: expected a job description file or a job id <site>.<digits>"
    )
    assert explain.stderr.endswith(", got 'nothere.yaml'\n")
    array = gbroker("jobs", "--array", "7", "--broker", "127.0.0.1:9", cwd=cwd)
    assert array.returncode == 2
    assert array.stderr.startswith(f"gbroker jobs: --array: {ID_SYNTAX}")


def test_explain_names_a_file_and_counts_in_the_singular(fleet: Fleet) -> None:
    one = fleet.run("explain", "one.yaml")
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("one.yaml (not submitted): 1 core, ranked by ")
    two = fleet.run("explain", "two.yaml")
    assert two.returncode == 0, two.stderr
    first, *rows = two.stdout.splitlines()
    assert first.startswith("two.yaml (not submitted): 2 cores, ranked by ")
    [tiny] = [row for row in rows if row.split()[0] == "tiny"]
    assert tiny.endswith("not a candidate: too small: 1 core")
    as_json = json.loads(fleet.run("explain", "one.yaml", "--json").stdout)
    assert as_json["job"] is None  # not submitted: no id, made up or otherwise
    job_id = fleet.submit("one.yaml")
    submitted = fleet.run("explain", job_id)
    assert submitted.stdout.startswith(f"{job_id}: 1 core, ranked by ")
    shown = fleet.run("topology", "show", "one-site.yaml")
    assert shown.stdout.splitlines()[0].split() == ["topology", "one:", "1", "site,", "1", "core"]


def test_cancel_says_which_jobs_had_already_ended(fleet: Fleet) -> None:
    done_id = fleet.submit("one.yaml")
    assert fleet.run("wait", done_id).returncode == 0
    ended_at = fleet.status(done_id)["ended_at"]
    assert isinstance(ended_at, float)
    at = time.strftime("%H:%M:%S", time.localtime(ended_at))
    late = fleet.run("cancel", done_id)
    assert late.returncode == 1
    assert late.stdout == ""
    assert late.stderr == f"gbroker cancel: {done_id}: already done at {at}, not cancelled\n"
    assert fleet.status(done_id)["state"] == "done"
    # Several: each reported (the cancelled one in the table), the worst status (an unknown
    # job: 2).
    running = fleet.submit("slow.yaml")
    several = fleet.run("cancel", running, done_id, "big.999")
    assert several.returncode == 2
    assert running in several.stdout
    assert done_id not in several.stdout
    lines = several.stderr.splitlines()
    assert lines[0] == f"gbroker cancel: {done_id}: already done at {at}, not cancelled"
    assert lines[1].startswith("gbroker cancel: DELETE /api/v1/jobs/big.999: 404: unknown job")
    assert len(lines) == 2
    assert fleet.status(running)["state"] == "cancelled"
    again = fleet.run("cancel", running, "--json")
    assert again.returncode == 1
    # Its end time, once its site has reported the end (which may not have arrived yet).
    assert re.fullmatch(
        rf"gbroker cancel: {re.escape(running)}: already cancelled( at \d\d:\d\d:\d\d)?\n",
        again.stderr,
    ), again.stderr
    assert json.loads(again.stdout)["cancelled_now"] is False
    # A job cancelled now: exit 0, through a broker that does not own it (forwarded).
    fresh = fleet.submit("slow.yaml")
    via = next(url for site, url in fleet.urls.items() if site != fresh.split(".")[0])
    now = fleet.run("cancel", fresh, "--json", "--broker", via)
    assert now.returncode == 0, now.stderr
    assert json.loads(now.stdout)["cancelled_now"] is True
    # An array: cancelled now as a whole, then already cancelled.
    (fleet.project / "sleepers.yaml").write_text(
        "executable: /bin/sleep\narguments: ['600']\nname: s\n"
        "sweep: {assignments: [{parameters: [name], values: [s1, s2]}]}\n"
    )
    array_id = fleet.submit("sleepers.yaml")
    whole = fleet.run("cancel", array_id)
    assert (whole.returncode, whole.stderr) == (0, "")
    assert array_id in whole.stdout
    twice = fleet.run("cancel", array_id)
    assert (twice.returncode, twice.stdout) == (1, "")
    assert twice.stderr == f"gbroker cancel: {array_id}: already cancelled\n"


def test_a_wrong_flag_shows_the_subcommands_usage(fleet: Fleet) -> None:
    cwd = fleet.project
    for command in [*([name] for name in CLIENT_COMMANDS), ["fleet", "status"], ["sim"]]:
        positional = [] if command[0] in ("jobs", "fleet", "sim") else ["big.1"]
        done = gbroker(*command, "--bogus", *positional, cwd=cwd)
        assert done.returncode == 2, command
        name = " ".join(command)
        assert done.stderr.startswith(f"usage: gbroker {name} "), (command, done.stderr)
        if command != ["sim"]:  # sim misses its required options first
            assert done.stderr.endswith(f"gbroker {name}: error: unrecognized arguments: --bogus\n")


def _connected(pid: int, ports: list[int]) -> bool:
    """Whether process ``pid`` holds an established TCP connection to one of ``ports``."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[9] in sockets and fields[3] == "01" and remote_port in ports:
                return True
    return False


def _interrupted(
    command: list[str], fleet: Fleet, first_line: bool = False
) -> subprocess.CompletedProcess[str]:
    """``command`` started, then SIGINT (Ctrl-C) once it waits on a broker's answer (with
    ``first_line``: once it has printed its first line too, and waits)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbroker", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=fleet.project,
    )
    try:
        deadline = time.monotonic() + 60
        printed = ""
        if first_line:
            assert proc.stdout is not None
            printed = proc.stdout.readline()
            assert printed, proc.communicate()
        while not _connected(proc.pid, fleet.ports):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never waited on a broker"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(command, proc.returncode, printed + stdout, stderr)


def test_ctrl_c_while_waiting_says_the_jobs_go_on(fleet: Fleet) -> None:
    job_id = fleet.submit("slow.yaml")
    waited = _interrupted(["wait", job_id], fleet)
    assert waited.returncode == 130
    assert waited.stderr == (
        f"gbroker wait: interrupted; {job_id} goes on: `gbroker status {job_id}` shows it\n"
    )
    assert fleet.status(job_id)["state"] in ("queued", "running")
    submitted = _interrupted(["submit", "--wait", "slow.yaml"], fleet, first_line=True)
    assert submitted.returncode == 130
    new_id = submitted.stdout.strip()
    assert submitted.stderr == (
        f"gbroker submit: interrupted; {new_id} goes on: `gbroker status {new_id}` shows it\n"
    )
    assert fleet.status(new_id)["state"] in ("queued", "running")
    assert fleet.run("cancel", job_id, new_id).returncode == 0


def test_ctrl_c_while_a_drain_waits_says_it_goes_on(fleet: Fleet) -> None:
    job_id = fleet.submit("slow.yaml")
    deadline = time.monotonic() + 60
    while (status := fleet.status(job_id))["state"] != "running":
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    site = str(status["site"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbroker", "fleet", "drain", site],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=fleet.project,
    )
    try:
        # The drain has begun once the broker says so (the job keeps it from ending).
        url = fleet.urls[site]
        tokens = (fleet.project / ".gbroker-fleet" / "tokens").read_text().splitlines()
        token = next(line.split()[1] for line in tokens if line and not line.startswith("#"))
        while not _draining(url, token):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the drain never began"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        fleet.run("fleet", "undrain", site)
        fleet.run("cancel", job_id)
    assert proc.returncode == 130
    said, _, last = stderr.rstrip("\n").rpartition("\n")
    assert last == (
        f"gbroker fleet drain: interrupted; {site} goes on draining: `gbroker fleet drain "
        f"{site}` waits again, `gbroker fleet undrain {site}` lets it take new work again"
    )
    # Before it, if the drain had said it yet, what it waited for (issue 36).
    assert said in ("", f"{site}: {job_id} running at {site}: waiting for it to end"), said


def _draining(url: str, token: str) -> bool:
    import urllib.request

    request = urllib.request.Request(
        f"{url}/api/v1/drain", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return bool(json.loads(answer.read())["draining"])


@pytest.fixture
def private(tmp_path: Path) -> dict[str, str]:
    """The environment of a user of their own: their own default fleet (XDG_STATE_HOME)."""
    save_topology(Topology([SiteSpec("solo", 1)], "full", name="one"), tmp_path / "one.yaml")
    (tmp_path / "elsewhere").mkdir()  # no .gbroker-fleet above it
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}


def test_fleet_down_of_a_fleet_already_down_has_nothing_to_stop(
    tmp_path: Path, private: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    up = gbroker("fleet", "up", "--topology", "../one.yaml", cwd=project, env=private)
    assert up.returncode == 0, up.stderr
    down = gbroker("fleet", "down", cwd=project, env=private)
    assert down.returncode == 0, down.stderr
    fleet_dir = project / ".gbroker-fleet"
    again = gbroker("fleet", "down", cwd=project, env=private)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"no fleet runs in {fleet_dir}: nothing to stop\n"
    named = gbroker("fleet", "down", "--dir", str(fleet_dir), cwd=tmp_path, env=private)
    assert (named.returncode, named.stderr) == (0, "")
    assert named.stdout == f"no fleet runs in {fleet_dir}: nothing to stop\n"
    nowhere = gbroker("fleet", "down", cwd=tmp_path / "elsewhere", env=private)
    assert (nowhere.returncode, nowhere.stderr) == (0, "")
    assert nowhere.stdout == (
        "no fleet runs here (no .gbroker-fleet above this directory, and no fleet of yours runs "
        "elsewhere): nothing to stop\n"
    )
    # A record that cannot be read is not a fleet that is down: an error.
    (fleet_dir / "fleet.json").write_text("{not json")
    broken = gbroker("fleet", "down", cwd=project, env=private)
    assert broken.returncode == 2
    assert f"{fleet_dir / 'fleet.json'}: not a fleet file" in broken.stderr
    # What `fleet up` said: one site, in the singular.
    assert f"fleet up in {fleet_dir}: 1 site, MQTT" in up.stdout


def test_bringing_down_one_fleet_leaves_the_earlier_one_the_default(
    tmp_path: Path, private: dict[str, str]
) -> None:
    """Up A, up B, down B: A, still running, is the default fleet again (client commands run
    outside both find it); a project's own fleet that is down is never confused with it."""
    elsewhere = tmp_path / "elsewhere"

    def run(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return gbroker(*args, cwd=cwd, env=private)

    a, b = tmp_path / "a", tmp_path / "b"
    up_a = run("fleet", "up", "--topology", "one.yaml", "--dir", str(a))
    assert up_a.returncode == 0, up_a.stderr
    try:
        up_b = run("fleet", "up", "--topology", "one.yaml", "--dir", str(b))
        assert up_b.returncode == 0, up_b.stderr
        try:
            assert run("jobs", cwd=elsewhere).returncode == 0  # b
        finally:
            down_b = run("fleet", "down", "--dir", str(b))
        assert down_b.returncode == 0, down_b.stderr
        found = run("jobs", "--json", cwd=elsewhere)
        assert found.returncode == 0, found.stderr  # a, the fleet still running
        assert found.stdout.strip() == "[]"
        # In a project whose .gbroker-fleet is down, `fleet down` stops nothing: not a.
        project = tmp_path / "project"
        (project / ".gbroker-fleet").mkdir(parents=True)
        here = run("fleet", "down", cwd=project)
        assert here.returncode == 0, here.stderr
        assert here.stdout == (
            f"no fleet runs in {project / '.gbroker-fleet'}: nothing to stop (your default "
            f"fleet runs in {a}: --dir names it)\n"
        )
        assert run("jobs", cwd=elsewhere).returncode == 0
    finally:
        down_a = run("fleet", "down", cwd=elsewhere)  # no --dir: the default fleet, a
    assert down_a.returncode == 0, down_a.stderr
    assert down_a.stdout.endswith(f"fleet in {a} is down\n")
    gone = run("jobs", cwd=elsewhere)
    assert gone.returncode == 2
    assert "no running fleet found" in gone.stderr
    # `fleet up --dir a` said where client commands find it: anywhere while it is the most
    # recent, not "from the directories under" (only a .gbroker-fleet is found walking up).
    said = " ".join(up_a.stdout.split())
    assert "They find this one from anywhere while it is that one, or with GBROKER_FLEET=" in said
    assert "directories under it" not in said
