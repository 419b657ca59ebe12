"""One test harness (docs/STYLE item 20): the command line run as a user runs it, polling against a
deadline, and a fleet of real brokers brought up from a topology's YAML text. A new fleet test is
five lines::

    def test_a_job_runs_on_a_fleet(tmp_path: Path) -> None:
        with Fleet(ONE_SITE, tmp_path) as fleet:
            job_id = fleet.submit({"executable": "/bin/true"})
            assert fleet.wait(job_id)["state"] == "done"

Every command is ``python -m gbroker`` in a process of its own, with the environment of the test
run (tests/conftest.py gives each run its own runtime directory and no token, URL or fleet of the
user's), unless a test names a fleet, a token or an environment of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

ONE_SITE = "name: one\nsites:\n  - {name: solo, cores: 2}\nneighbourhood: full\n"


def environment(fleet: Path | None = None, token: str | None = None) -> dict[str, str]:
    """The test run's environment for a command on ``fleet`` (as ``token``'s user): none of the
    GBROKER_ variables but the test run's runtime directory and the two given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]
    if fleet is not None:
        env["GBROKER_FLEET"] = str(fleet)
    if token is not None:
        env["GBROKER_TOKEN"] = token
    return env


def gbroker(
    *args: str,
    fleet: Path | None = None,
    token: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``gbroker ARGS`` as a process, its output as text. With ``fleet`` or ``token``, in
    :func:`environment` of them; else in ``env`` (default: the test run's). ``check``: it must
    exit 0."""
    if fleet is not None or token is not None:
        assert env is None, "a fleet or a token, or an environment: not both"
        env = environment(fleet, token)
    done = subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def until(what: str, check: Callable[[], T | None], timeout: float = 90.0, every: float = 0.1) -> T:
    """``check()`` once it is truthy, asked every ``every`` s; AssertionError naming ``what``
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def poll(
    condition: Callable[[], bool], what: str, timeout: float = 60.0, every: float = 0.02
) -> None:
    """:func:`until` ``condition()`` holds, for a test that needs no value from it."""
    until(what, condition, timeout, every)


class Fleet:
    """A fleet of ``gbroker fleet up`` from ``topology`` (its YAML text, written to
    ``home/topology.yaml`` unless ``topology_file`` names another place) in ``home/fleet``, with
    ``flags`` for ``fleet up``; down when the ``with`` block ends, its logs copied into ``logs``
    (default ``home``: to read after a failure). ``fleet up`` and ``down`` run in the test run's
    environment; the other commands in :func:`environment` of the fleet."""

    def __init__(
        self,
        topology: str,
        home: Path,
        *flags: str,
        topology_file: Path | None = None,
        logs: Path | None = None,
        timeout: float = 120,
    ) -> None:
        self.home = home
        self.directory = home / "fleet"
        self.topology = topology_file or home / "topology.yaml"
        self.topology.write_text(topology)
        self.flags = flags
        self.logs = logs or home
        self.timeout = timeout
        self.urls: dict[str, str] = {}

    def __enter__(self) -> Fleet:
        up = ("fleet", "up", "--topology", str(self.topology), "--dir", str(self.directory))
        started = gbroker(*up, *self.flags, timeout=self.timeout)
        assert started.returncode == 0, started.stderr
        record = json.loads((self.directory / "fleet.json").read_text())
        self.urls = {name: member["url"] for name, member in record["sites"].items()}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        gbroker("fleet", "down", "--dir", str(self.directory), timeout=self.timeout)
        for log in self.directory.glob("*.log"):
            shutil.copy(log, self.logs)

    def run(
        self, *args: str, token: str | None = None, timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``gbroker ARGS`` on this fleet."""
        return gbroker(*args, fleet=self.directory, token=token, timeout=timeout, check=check)

    def submit(self, description: dict[str, Any], site: str | None = None) -> str:
        """Submit a job (its JSON description) at ``site`` (default: the first); its id."""
        path = self.home / f"job-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(description))
        url = self.urls[site] if site is not None else next(iter(self.urls.values()))
        return self.run("submit", "--broker", url, str(path), check=True).stdout.strip()

    def status(self, job_id: str) -> dict[str, Any]:
        """``gbroker status --json`` of one job."""
        answer = json.loads(self.run("status", job_id, "--json", check=True).stdout)
        found: dict[str, Any] = answer[0] if isinstance(answer, list) else answer
        return found

    def wait(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        """The job's status once it has ended."""
        done = self.run("wait", job_id, "--json", "--timeout", f"{timeout:g}",
                        timeout=timeout + 30)  # fmt: skip
        answer = json.loads(done.stdout)
        found: dict[str, Any] = answer[0] if isinstance(answer, list) else answer
        return found
