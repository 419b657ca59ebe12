"""The native front of `gbroker` (gbroker/cli/native/gbroker.c), as scripts/setup/setup.sh installs
it: a plain `gbroker submit FILE...` done without starting Python, everything else handed to the
Python CLI.

Each behaviour is checked twice over: the native front alone (a copy with no Python CLI beside
it, so a hand-over would fail loudly) does the submission, and the installed `gbroker` answers
exactly as the Python CLI (`GBROKER_NO_NATIVE=1`) does, against a fleet from `gbroker fleet up`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gbroker.topology import SiteSpec, Topology, save_topology

BIN = Path(sys.executable).parent
INSTALLED = BIN / "gbroker"
JOB_ID = re.compile(r"solo\.\d+")


@dataclass
class Fleet:
    project: Path  # `fleet up` ran here: its .gbroker-fleet is the fleet
    env: dict[str, str]  # no GBROKER_* but the test run's runtime dir; a private state dir

    @property
    def directory(self) -> Path:
        return self.project / ".gbroker-fleet"

    @property
    def url(self) -> str:
        return (self.directory / "brokers").read_text().split()[-1]


def run(
    command: Path | str, *args: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(command), *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    project = tmp_path_factory.mktemp("native") / "project"
    (project / "sub" / "deeper").mkdir(parents=True)
    save_topology(Topology([SiteSpec("solo", 8)], "full", name="one"), project / "one.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]
    env["XDG_STATE_HOME"] = str(project.parent / "state")  # this fleet becomes the default
    (project / "job.yaml").write_text("executable: /bin/true\n")
    (project / "other.json").write_text('{"executable": "/bin/true", "name": "other"}\n')
    (project / "typo.yaml").write_text("executabel: /bin/true\n")
    (project / "jobs").mkdir()
    (project / "jobs" / "a.yaml").write_text("executable: /bin/true\n")
    up = run(sys.executable, "-m", "gbroker", "fleet", "up", "--topology", "one.yaml",
             env=env, cwd=project)  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield Fleet(project, env)
    finally:
        down = run(sys.executable, "-m", "gbroker", "fleet", "down", env=env, cwd=project)
        assert down.returncode == 0, down.stderr


@pytest.fixture
def alone(tmp_path: Path) -> Path:
    """The native front with no Python CLI beside it: it must do the work itself."""
    assert INSTALLED.read_bytes()[:4] == b"\x7fELF", "scripts/setup/setup.sh did not build native/"
    copy = tmp_path / "bin" / "gbroker"
    copy.parent.mkdir()
    shutil.copy2(INSTALLED, copy)
    return copy


def test_setup_installs_the_native_front_with_the_python_cli_beside_it() -> None:
    assert INSTALLED.read_bytes()[:4] == b"\x7fELF"
    assert (BIN / "gbroker-py").read_text().startswith("#!")
    shown = run(INSTALLED, "--help", env=dict(os.environ), cwd=BIN)
    assert shown.returncode == 0
    assert shown.stdout.startswith("usage: gbroker ")  # the Python CLI, named as the user typed


def test_the_native_front_submits_and_the_jobs_run(fleet: Fleet, alone: Path) -> None:
    deeper = fleet.project / "sub" / "deeper"  # the fleet found walking up
    one = run(alone, "submit", "../../job.yaml", env=fleet.env, cwd=deeper)
    assert one.returncode == 0, one.stderr
    assert JOB_ID.fullmatch(one.stdout.strip())
    two = run(alone, "submit", "job.yaml", "other.json", env=fleet.env, cwd=fleet.project)
    assert two.returncode == 0, two.stderr
    lines = two.stdout.splitlines()
    assert [line.split("  ")[1] for line in lines] == ["job.yaml", "other.json"]
    for job_id in [one.stdout.strip()] + [line.split()[0] for line in lines]:
        waited = run(INSTALLED, "wait", job_id, "--json", env=fleet.env, cwd=fleet.project)
        assert waited.returncode == 0, waited.stderr
        assert '"state": "done"' in waited.stdout


def test_the_broker_and_token_come_from_the_environment_or_the_default_fleet(
    fleet: Fleet, alone: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"  # no .gbroker-fleet above: the user's default fleet
    elsewhere.mkdir()
    job = str(fleet.project / "job.yaml")
    found = run(alone, "submit", job, env=fleet.env, cwd=elsewhere)
    assert found.returncode == 0, found.stderr
    token = next(
        line.split()[1]
        for line in (fleet.directory / "tokens").read_text().splitlines()
        if line and not line.startswith("#")
    )
    named = {**fleet.env, "GBROKER_URL": fleet.url.removeprefix("http://"), "GBROKER_TOKEN": token}
    assert run(alone, "submit", job, env=named, cwd=elsewhere).returncode == 0
    bare = tmp_path / "bare-token"
    bare.write_text(f"\n{token}\n")
    lines = tmp_path / "token-lines"
    lines.write_text(f"# who\nalice  not-this-one\nadmin {token} admin  # the admin's\n")
    for token_file in (bare, lines):
        env = {**fleet.env, "GBROKER_FLEET": str(fleet.directory)}
        env["GBROKER_TOKEN_FILE"] = str(token_file)
        done = run(alone, "submit", job, env=env, cwd=elsewhere)
        assert done.returncode == 0, (token_file.read_text(), done.stderr)
    wrong = {**fleet.env, "GBROKER_FLEET": str(fleet.directory), "GBROKER_TOKEN": "nope"}
    refused = run(alone, "submit", job, env=wrong, cwd=elsewhere)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"gbroker submit: {job}: 401: ")


def test_the_default_fleet_is_the_first_listed_that_still_runs(
    fleet: Fleet, alone: Path, tmp_path: Path
) -> None:
    """The state file lists the user's fleets, most recent first (gbroker/client/fleetdir.py):
    one that no longer runs is passed over, as the Python CLI does."""
    state = tmp_path / "state"
    (state / "gbroker").mkdir(parents=True)
    gone = tmp_path / "gone"  # brought up last, then its directory removed
    (state / "gbroker" / "default-fleet").write_text(f"{gone}\n{fleet.directory}\n")
    env = {**fleet.env, "XDG_STATE_HOME": str(state)}
    done = run(alone, "submit", str(fleet.project / "job.yaml"), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert JOB_ID.fullmatch(done.stdout.strip())
    assert done.stderr == (  # which fleet, as the Python CLI says it (fleetdir.used_note)
        f"gbroker submit: using the fleet in {fleet.directory}, your most recent one still "
        "running (no running .gbroker-fleet above this directory; $GBROKER_FLEET names one)\n"
    )


@pytest.mark.parametrize("sigpipe", ["default", "ignored"])
def test_a_reader_that_goes_away_ends_the_submission_as_in_the_python_cli(
    fleet: Fleet, alone: Path, sigpipe: str
) -> None:
    """`gbroker submit a.yaml b.yaml | head -0`: the first job is submitted, its id cannot be
    written, and the command ends silently as SIGPIPE ends it, submitting nothing more; the
    same whether whoever started it left SIGPIPE at its default or ignored it (this test's
    Python process ignores it: restore_signals=False passes that on)."""

    def listed() -> int:
        done = run(INSTALLED, "jobs", "--json", "--limit", "100000", env=fleet.env, cwd=BIN)
        assert done.returncode == 0, done.stderr
        return len(json.loads(done.stdout))

    for command, env in ((alone, fleet.env), (INSTALLED, {**fleet.env, "GBROKER_NO_NATIVE": "1"})):
        before = listed()
        read, write = os.pipe()
        os.close(read)  # the reader went away
        try:
            done = subprocess.run(
                [str(command), "submit", "job.yaml", "other.json"],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                env=env,
                cwd=fleet.project,
                restore_signals=sigpipe == "default",
            )
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (-signal.SIGPIPE, ""), command
        assert listed() == before + 1, command


def test_a_dead_broker_is_passed_over(fleet: Fleet, alone: Path, tmp_path: Path) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = dead.getsockname()[1]
    copy = tmp_path / "fleet"
    copy.mkdir()
    for name in ("fleet.json", "tokens"):
        shutil.copy2(fleet.directory / name, copy / name)
    (copy / "brokers").write_text(f"# SITE URL\ndead http://127.0.0.1:{port}\nsolo {fleet.url}\n")
    env = {**fleet.env, "GBROKER_FLEET": str(copy)}
    for _ in range(4):  # each process starts at another broker of the list (its pid's turn)
        done = run(alone, "submit", str(fleet.project / "job.yaml"), env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    dead.close()


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "job.yaml"],
        ["submit", "job.yaml", "other.json"],
        ["submit", "typo.yaml"],  # the broker's 400, naming the file and the field
        ["submit", "job.yaml", "nothere.yaml"],  # unreadable: nothing is sent
        ["submit", "jobs"],  # a directory: the Python CLI's
        ["submit", "--json", "job.yaml"],  # an option: the Python CLI's
        ["submit"],
        ["jobs", "--limit", "1", "--json"],
    ],
)
def test_the_installed_gbroker_answers_as_the_python_cli(fleet: Fleet, args: list[str]) -> None:
    def answers(env: dict[str, str]) -> tuple[int, str, str]:
        done = run(INSTALLED, *args, env=env, cwd=fleet.project)
        return done.returncode, JOB_ID.sub("ID", done.stdout), JOB_ID.sub("ID", done.stderr)

    native = answers(fleet.env)
    python = answers({**fleet.env, "GBROKER_NO_NATIVE": "1"})
    assert native == python
    assert "Traceback" not in native[2]


def test_nothing_sent_means_the_python_cli_says_why(fleet: Fleet, tmp_path: Path) -> None:
    env = {k: v for k, v in fleet.env.items() if k != "XDG_STATE_HOME"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # no default fleet
    lost = run(INSTALLED, "submit", str(fleet.project / "job.yaml"), env=env, cwd=tmp_path)
    assert lost.returncode == 2
    assert "no running fleet found" in lost.stderr
    down = {**env, "GBROKER_URL": "127.0.0.1:9", "GBROKER_TOKEN": "x"}
    refused = run(INSTALLED, "submit", str(fleet.project / "job.yaml"), env=down, cwd=tmp_path)
    assert refused.returncode == 4
    assert "no broker answers: http://127.0.0.1:9: Connection refused" in refused.stderr


class FlakyBroker:
    """A broker whose first answers are lost: it reads a submission, then closes without a
    word (or answers 503); then it answers 201. Records each request's Idempotency-Key."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.keys: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                fields = dict(
                    line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
                )
                while len(body) < int(fields["Content-Length"]):
                    body += conn.recv(65536)
                self.keys.append(fields["Idempotency-Key"])
                failure = self.failures.pop(0) if self.failures else "ok"
                if failure == "lost":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                elif failure == "503":
                    conn.sendall(b'HTTP/1.0 503 Unavailable\r\n\r\n{"error": "busy"}')
                else:
                    conn.sendall(
                        b"HTTP/1.0 201 Created\r\nLocation: /api/v1/jobs/solo.42\r\n\r\n"
                        b'{"id": "solo.42", "owner": "solo"}'
                    )

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize(
    ("failures", "code", "said"),
    [
        (["lost", "503"], 0, "solo.42\n"),  # retried, with the same key: one job
        (["503"] * 6, 4, "gbroker submit: submission: 503: busy\n"),
        (["lost"] * 6, 4, "Connection reset by peer\n"),
    ],
)
def test_a_lost_answer_is_asked_again_with_the_same_key(
    alone: Path, tmp_path: Path, failures: list[str], code: int, said: str
) -> None:
    broker = FlakyBroker(list(failures))
    try:
        job = tmp_path / "job.yaml"
        job.write_text("executable: /bin/true\n")
        env = {**os.environ, "GBROKER_URL": broker.url, "GBROKER_TOKEN": "t"}
        done = run(alone, "submit", str(job), env=env, cwd=tmp_path)
    finally:
        broker.close()
    assert done.returncode == code, done.stderr
    assert (done.stdout if code == 0 else done.stderr).endswith(said)
    assert len(broker.keys) == min(len(failures) + 1, 6)
    assert len(set(broker.keys)) == 1
    assert re.fullmatch(r'"[0-9a-f]{32}"', broker.keys[0])


class HoldingBroker:
    """A broker that answers each submission with ``answer`` and then keeps the connection
    open, saying nothing more, until the test ends (as a proxy or a broken server may); or,
    not ``hold``ing, closes it."""

    def __init__(self, answer: bytes, hold: bool = True) -> None:
        self.answer = answer
        self.hold = hold
        self.held: list[socket.socket] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(self.answer)
            if self.hold:
                self.held.append(conn)  # never closed while the client reads
            else:
                conn.close()

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


def submit_to(
    broker: HoldingBroker, alone: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.yaml"
    job.write_text("executable: /bin/true\n")
    env = {**os.environ, "GBROKER_URL": broker.url, "GBROKER_TOKEN": "t"}
    try:
        # Before: it read until the server closed, 30 s per attempt and 5 retries, then exit 4.
        return subprocess.run(
            [str(alone), "submit", str(job)],
            capture_output=True,
            text=True,
            timeout=20,
            env=env,
            cwd=tmp_path,
        )
    finally:
        broker.close()


def whole(status: str, body: bytes, fields: bytes = b"") -> bytes:
    """An answer with its Content-Length."""
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
    return head + fields + b"\r\n" + body


CREATED = b'{"id": "solo.42", "owner": "solo"}'


@pytest.mark.parametrize(
    "answer",
    [
        whole("201 Created", CREATED, b"Location: /api/v1/jobs/solo.42\r\n"),
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(CREATED), CREATED),
    ],
    ids=["content-length", "chunked"],
)
def test_a_whole_answer_is_taken_though_the_server_keeps_the_connection_open(
    alone: Path, tmp_path: Path, answer: bytes
) -> None:
    done = submit_to(HoldingBroker(answer), alone, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "solo.42\n", "")


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            whole(
                "400 Bad Request",
                json.dumps({"error": "bad \x1b[2J\x1b]0;owned\x07 field\x9b31m\r"}).encode(),
            ),
            "gbroker submit: {job}: 400: bad [2J]0;owned field31m\n",
        ),
        (
            whole("201 Created", b"{}", b"Location: /api/v1/jobs/solo.42\x1b[8m\r\n"),
            "solo.42[8m\n",
        ),
    ],
    ids=["error", "job id"],
)
def test_a_servers_control_characters_never_reach_the_terminal(
    alone: Path, tmp_path: Path, answer: bytes, said: str
) -> None:
    done = submit_to(HoldingBroker(answer, hold=False), alone, tmp_path)
    shown = done.stdout + done.stderr
    assert shown == said.format(job=tmp_path / "job.yaml")
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in shown)
