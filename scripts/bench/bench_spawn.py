"""The physical limit of starting trivial jobs here: a bare loop that starts /bin/true and reaps it.

    python -m scripts.bench.bench_spawn [--count 2000] [--json]

Nothing but the kernel's work per job is left: no scheduling, no journal, no messages. Each
iteration starts ``/bin/true`` and waits for it to exit (checking it exited 0), in two ways:

- ``fork``: ``os.fork`` then ``os.execv`` in the child;
- ``spawn``: ``os.posix_spawn`` (glibc's ``clone(CLONE_VM | CLONE_VFORK)``, no page-table copy);

each run two ways: *serial* (one loop, ``--count`` starts) and *parallel* (one loop per CPU this
process may run on, ``--count`` starts each, all at once). The rate is starts / wall seconds from
the first start to the last reap. The highest of the four is the limit a job starter on this
machine can approach. The loops run in the process that runs this module; run it as a fresh
process (as scripts/bench/bench_daemon.py does) so that a large parent's memory does not slow
``fork``.

With ``--files DIR``, one more run, reported beside the limit but not taken for it: ``spawn``,
one loop per CPU, where each start first makes what any batch system makes for a job, a
directory of its own (in DIR) with its two stream files, and starts ``/bin/true`` with its
output and error going to them. It shows what the file system adds to a start (on ext4 without
a journal, making a file costs tens to hundreds of microseconds while many of its inode table's
blocks wait to be written back). Each loop's directory is marked a top of directory hierarchies
(``chattr +T``) as GBroker's launcher marks its job root, so that the row shows what a launcher
meets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from gbroker.site.launcher import spread_subdirectories
from scripts import options, orderly

TRUE = "/bin/true"
METHODS = ("fork", "spawn")


def _reap(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{TRUE} exited {os.waitstatus_to_exitcode(status)}")


def _start_fork() -> int:
    pid = os.fork()
    if pid == 0:  # the child: become /bin/true, or leave without running the parent's code
        try:
            os.execv(TRUE, [TRUE])
        finally:
            os._exit(127)
    return pid


def _start_spawn() -> int:
    return os.posix_spawn(TRUE, [TRUE], os.environ)


STARTERS: dict[str, Callable[[], int]] = {"fork": _start_fork, "spawn": _start_spawn}
_FILES = "files"  # a spawn with a job directory and its stream files (in _loop's ``under``)


def _start_with_files(under: str, number: int) -> int:
    job = os.path.join(under, f"j{number}")
    os.mkdir(job, 0o700)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    actions += [(os.POSIX_SPAWN_OPEN, fd, os.path.join(job, name), flags, 0o600)
                for fd, name in ((1, "stdout"), (2, "stderr"))]  # fmt: skip
    return os.posix_spawn(TRUE, [TRUE], os.environ, file_actions=actions)


def _loop(method: str, count: int, under: str | None = None) -> None:
    if method == _FILES:
        assert under is not None
        for number in range(count):
            _reap(_start_with_files(under, number))
        return
    start = STARTERS[method]
    for _ in range(count):
        _reap(start())


def measure(method: str, count: int, workers: int, under: str | None = None) -> dict[str, Any]:
    """Start ``/bin/true`` ``count`` times in each of ``workers`` loops (1: in this process);
    ``files`` makes each start's directory and stream files in a directory of ``under``.

    Returns the starts, the seconds and the starts per second.
    """
    if method not in STARTERS and method != _FILES:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    directories: list[str | None] = [None] * workers
    if method == _FILES:
        if under is None:
            raise ValueError("files: a directory to make the jobs' files in")
        made = [tempfile.mkdtemp(prefix="spawn-", dir=under) for _ in range(workers)]
        for job_root in made:  # as GBroker's launcher marks its job root
            spread_subdirectories(job_root)
        directories = list(made)
    began = time.perf_counter()
    if workers == 1:
        _loop(method, count, directories[0])
    else:
        children: list[int] = []
        failed = 0
        try:
            for directory in directories:
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        _loop(method, count, directory)
                        code = 0
                    finally:
                        os._exit(code)
                children.append(pid)
            while children:
                _, status = os.waitpid(children[0], 0)
                children.pop(0)
                failed += os.waitstatus_to_exitcode(status) != 0
        finally:  # stopped (scripts/orderly.py): the loops stop too
            for pid in children:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        if failed:
            raise RuntimeError(f"{failed} of {workers} {method} loops failed")
    seconds = time.perf_counter() - began
    for directory in directories:
        if directory is not None:
            shutil.rmtree(directory)
    starts = count * workers
    return {"starts": starts, "seconds": seconds, "per_s": starts / seconds}


def limit(count: int, files: str | None = None) -> dict[str, Any]:
    """Every method, serial and one loop per usable CPU; the fastest of them as ``limit``.
    With ``files`` (a directory), also ``spawn_files_parallel``, not a candidate for the limit."""
    cpus = len(os.sched_getaffinity(0))
    runs: dict[str, Any] = {}
    for method in METHODS:
        runs[f"{method}_serial"] = measure(method, count, 1)
        runs[f"{method}_parallel"] = measure(method, count, cpus)
    best = max(runs, key=lambda name: runs[name]["per_s"])
    if files is not None:
        runs["spawn_files_parallel"] = measure(_FILES, count, cpus, files)
    return {"cpus": cpus, "count": count, "runs": runs, "limit": best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=2000, help="starts per loop (2000)")
    options.add_json(parser)
    parser.add_argument(
        "--files", metavar="DIR", help="also spawn with a job directory and stream files in DIR"
    )
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count: expected an integer >= 1, got {args.count}")
    if args.files is not None and not os.path.isdir(args.files):
        parser.error(f"--files: no such directory: {args.files}")
    figures = limit(args.count, args.files)
    if args.json:
        print(json.dumps(figures))
    else:
        for name, run in figures["runs"].items():
            mark = "   <- the limit" if name == figures["limit"] else ""
            print(f"{name:16} {run['per_s']:8,.0f} starts/s ({run['starts']:,} starts){mark}")
    return 0


if __name__ == "__main__":
    orderly.run(main)
