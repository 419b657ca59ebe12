"""How fast the executor starts trivial jobs, beside a bare fork/exec/reap loop in the same run.

Starts ``--jobs`` ``/bin/true`` jobs through :class:`gbroker.site.executor.Executor` directly
(no HTTP, no journal), at most ``--concurrency`` starts in flight, and prints jobs started per
second (until the last ``start`` returned), finished per second (until the last report), and
the CPU each side spent per job: the broker's process and the launcher. Before and after, the
same number of ``fork``/``execv``/``waitpid`` rounds from a small ``python -I -S`` process (the
ceiling a launcher written in Python can reach: it does that much per job and more), serially;
the ratio is against their mean. The executor's launchers and its job root go however the run
ends (Ctrl-C, SIGTERM and SIGHUP included: scripts/orderly.py).

    .venv/bin/python -m scripts.bench.bench_launch --jobs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gbroker.site.backend import ExitResult, JobSpec, Limits
from gbroker.site.executor import Executor
from scripts import options, orderly

BARE_LOOP = r"""
import os, sys, time
n = int(sys.argv[1])
began = time.perf_counter()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.execv("/bin/true", ["/bin/true"])
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
print(n / (time.perf_counter() - began))
"""


def _setter(event: asyncio.Event) -> Callable[[ExitResult], None]:
    """An exit callback that sets ``event``."""
    return lambda _: event.set()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc (in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def through_executor(
    root: Path,
    jobs: int,
    concurrency: int,
    limits: Limits,
    launchers: int | None = None,
    confine: bool = True,
) -> dict[str, float]:
    finished = 0
    failed: list[ExitResult] = []
    all_done = asyncio.Event()

    def on_exit(result: ExitResult) -> None:
        nonlocal finished
        finished += 1
        if not result.succeeded:
            failed.append(result)
        if finished == jobs:
            all_done.set()

    cores = len(os.sched_getaffinity(0))
    executor = Executor(root, site_cores=cores, launchers=launchers, confine=confine)
    async with executor:
        # One job first: the launcher's own start is not what we measure.
        warm = asyncio.Event()
        await executor.start(JobSpec("warm", "/bin/true"), 1, lambda _: warm.set())
        await warm.wait()
        # Every launcher up (one start each, at once), so that their CPU is counted from here.
        warm_all = [asyncio.Event() for _ in range(executor.launcher_count)]
        await asyncio.gather(
            *(
                executor.start(JobSpec(f"warm{i}", "/bin/true"), 1, _setter(e))
                for i, e in enumerate(warm_all)
            )
        )
        await asyncio.gather(*(e.wait() for e in warm_all))
        launcher_pids = executor.launcher_pids
        print(f"{len(launcher_pids)} launchers up; {jobs} jobs ...", file=sys.stderr, flush=True)
        launcher_cpu = sum(_cpu_seconds(pid) for pid in launcher_pids)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        broker_cpu = usage.ru_utime + usage.ru_stime
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                await executor.start(JobSpec(f"j{i}", "/bin/true", limits=limits), 1, on_exit)

        began = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(jobs)))
        started = time.perf_counter() - began
        await all_done.wait()
        ended = time.perf_counter() - began
        usage = resource.getrusage(resource.RUSAGE_SELF)
        broker_cpu = usage.ru_utime + usage.ru_stime - broker_cpu
        launcher_cpu = sum(_cpu_seconds(pid) for pid in launcher_pids) - launcher_cpu
    if failed:
        raise SystemExit(f"{len(failed)} jobs failed, e.g. {failed[0]}")
    return {
        "cgroups": executor.cgroups is not None,
        "started_per_s": jobs / started,
        "finished_per_s": jobs / ended,
        "broker_cpu_ms_per_job": 1000 * broker_cpu / jobs,
        "launcher_cpu_ms_per_job": 1000 * launcher_cpu / jobs,
    }


def bare_loop(jobs: int) -> float:
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BARE_LOOP, str(jobs)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--memory-limit",
        type=int,
        help="bytes of address space per job: jobs with rlimits take the launcher's fork path",
    )
    parser.add_argument(
        "--launchers", type=int, help="launchers side by side (default: the executor's)"
    )
    parser.add_argument(
        "--cgroups",
        choices=("on", "off"),
        default="on",
        help="a cgroup per job, where the host allows it (default on), or none",
    )
    options.add_json(parser, "the figures (one object)")
    args = parser.parse_args()
    # The bare loop before and after: on a shared machine the load moves under a run.
    bare_before = bare_loop(args.jobs)
    with orderly.temporary_directory("gbroker-bench-launch-") as directory:
        limits = Limits(memory=args.memory_limit)
        executor = asyncio.run(
            through_executor(
                directory,
                args.jobs,
                args.concurrency,
                limits,
                args.launchers,
                confine=args.cgroups == "on",
            )
        )
    bare_after = bare_loop(args.jobs)
    bare = (bare_before + bare_after) / 2
    result = {**executor, "bare_fork_exec_reap_per_s": bare}
    result["bare_before_per_s"], result["bare_after_per_s"] = bare_before, bare_after
    result["started_vs_bare"] = executor["started_per_s"] / bare
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"jobs: {args.jobs}, concurrency {args.concurrency}, uid {os.geteuid()},"
        f" memory limit {args.memory_limit}, a cgroup per job: {executor['cgroups']}"
    )
    print(f"executor: {executor['started_per_s']:8.0f} started/s")
    print(f"executor: {executor['finished_per_s']:8.0f} finished/s")
    print(f"executor: {executor['broker_cpu_ms_per_job']:8.3f} ms broker CPU per job")
    print(f"executor: {executor['launcher_cpu_ms_per_job']:8.3f} ms launcher CPU per job")
    print(
        f"bare fork/execv/waitpid (python -I -S): {bare:8.0f} /s"
        f" (before {bare_before:.0f}, after {bare_after:.0f})"
    )
    print(f"started / bare: {result['started_vs_bare']:.2f}")


if __name__ == "__main__":
    orderly.run(main)
