"""What the tests of malleable jobs on a fleet share: a 1-site fleet of 2 cores brought up by
`gbroker fleet up` with the flags of a malleability policy, a deadline to poll against, and a
job's processes and the CPUs they may run on, read in /proc (by the job's environment)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.harness import ONE_SITE, Fleet, until

__all__ = ["job_cpus", "one_site_fleet", "processes", "until"]


def one_site_fleet(tmp_path: Path, prefix: str, *flags: str) -> Iterator[tuple[Path, str]]:
    """A 1-site fleet of 2 cores (``gbroker fleet up ... FLAGS``); its directory and URL, then
    it goes down and its logs are copied into ``tmp_path``. Outside pytest's temporary
    directory, which is 0700: under a root broker, jobs run as accounts of their own, and
    Python opens a script by its absolute path, through every ancestor."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o711)
    try:
        with Fleet(
            ONE_SITE, home, *flags, topology_file=tmp_path / "one.yaml", logs=tmp_path
        ) as fleet:
            yield fleet.directory, fleet.urls["solo"]
    finally:
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
