"""What the tests of malleable jobs on a fleet share: a 1-site fleet of 2 cores brought up by
`gbroker fleet up` with the flags of a malleability policy, a deadline to poll against, and a
job's processes and the CPUs they may run on, read in /proc (by the job's environment)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def until(what: str, check: Callable[[], T | None], timeout: float = 90.0) -> T:
    """``check()`` once it is truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.1)


def one_site_fleet(tmp_path: Path, prefix: str, *flags: str) -> Iterator[tuple[Path, str]]:
    """A 1-site fleet of 2 cores (``gbroker fleet up ... FLAGS``); its directory and URL, then
    it goes down and its logs are copied into ``tmp_path``. Outside pytest's temporary
    directory, which is 0700: under a root broker, jobs run as accounts of their own, and
    Python opens a script by its absolute path, through every ancestor."""
    topology = tmp_path / "one.yaml"
    topology.write_text("name: one\nsites:\n  - {name: solo, cores: 2}\nneighbourhood: full\n")
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o711)
    fleet = home / "fleet"
    command = [sys.executable, "-m", "gbroker", "fleet", "up", "--topology", str(topology)]
    up = subprocess.run(
        [*command, "--dir", str(fleet), *flags], capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stderr
    url = json.loads((fleet / "fleet.json").read_text())["sites"]["solo"]["url"]
    try:
        yield fleet, url
    finally:
        subprocess.run(
            [sys.executable, "-m", "gbroker", "fleet", "down", "--dir", str(fleet)],
            capture_output=True,
            timeout=120,
        )
        for log in fleet.glob("*.log"):  # kept with the test's files, to read after a failure
            shutil.copy(log, tmp_path)
        shutil.rmtree(home, ignore_errors=True)


def processes(job_id: str) -> list[int]:
    """The live processes of the job (by their environment)."""
    marker = f"GBROKER_JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue  # it ended while we looked
    return found


def job_cpus(job_id: str) -> set[frozenset[int]]:
    """The CPU sets of every thread of every live process of the job."""
    found: set[frozenset[int]] = set()
    for pid in processes(job_id):
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                found.add(frozenset(os.sched_getaffinity(int(task.name))))
        except (OSError, ProcessLookupError):
            continue  # it ended while we looked
    return found
