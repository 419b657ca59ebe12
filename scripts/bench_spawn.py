"""The physical limit of starting trivial jobs here: a bare loop that starts /bin/true and reaps it.

    python scripts/bench_spawn.py [--count 2000] [--json]

Nothing but the kernel's work per job is left: no scheduling, no journal, no messages. Each
iteration starts ``/bin/true`` and waits for it to exit (checking it exited 0), in two ways:

- ``fork``: ``os.fork`` then ``os.execv`` in the child;
- ``spawn``: ``os.posix_spawn`` (glibc's ``clone(CLONE_VM | CLONE_VFORK)``, no page-table copy);

each run two ways: *serial* (one loop, ``--count`` starts) and *parallel* (one loop per CPU this
process may run on, ``--count`` starts each, all at once). The rate is starts / wall seconds from
the first start to the last reap. The highest of the four is the limit a job starter on this
machine can approach. The loops run in the process that runs this module; run it as a fresh
process (as scripts/bench_daemon.py does) so that a large parent's memory does not slow ``fork``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

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


def _loop(method: str, count: int) -> None:
    start = STARTERS[method]
    for _ in range(count):
        _reap(start())


def measure(method: str, count: int, workers: int) -> dict[str, Any]:
    """Start ``/bin/true`` ``count`` times in each of ``workers`` loops (1: in this process).

    Returns the starts, the seconds and the starts per second.
    """
    if method not in STARTERS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    began = time.perf_counter()
    if workers == 1:
        _loop(method, count)
    else:
        children = []
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    _loop(method, count)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        failed = 0
        for pid in children:
            _, status = os.waitpid(pid, 0)
            failed += os.waitstatus_to_exitcode(status) != 0
        if failed:
            raise RuntimeError(f"{failed} of {workers} {method} loops failed")
    seconds = time.perf_counter() - began
    starts = count * workers
    return {"starts": starts, "seconds": seconds, "per_s": starts / seconds}


def limit(count: int) -> dict[str, Any]:
    """Every method, serial and one loop per usable CPU; the fastest of them as ``limit``."""
    cpus = len(os.sched_getaffinity(0))
    runs: dict[str, Any] = {}
    for method in METHODS:
        runs[f"{method}_serial"] = measure(method, count, 1)
        runs[f"{method}_parallel"] = measure(method, count, cpus)
    best = max(runs, key=lambda name: runs[name]["per_s"])
    return {"cpus": cpus, "count": count, "runs": runs, "limit": best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=2000, help="starts per loop (2000)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count: expected an integer >= 1, got {args.count}")
    figures = limit(args.count)
    if args.json:
        print(json.dumps(figures))
    else:
        for name, run in figures["runs"].items():
            mark = "   <- the limit" if name == figures["limit"] else ""
            print(f"{name:16} {run['per_s']:8,.0f} starts/s ({run['starts']:,} starts){mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
