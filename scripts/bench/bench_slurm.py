"""A real single-node Slurm, started and stopped here, to run the benchmark's trivial jobs.

Used by scripts/bench/bench_daemon.py and scripts/bench/bench_cli.py; no CLI of its own.

:class:`SingleNodeSlurm` is :class:`gbroker.fleet.slurm.SlurmCluster` (what ``gbroker fleet up``
starts for a site with ``manager: slurm``; its docs say how) with one node, ``bench``, of
``cpus`` CPUs (declared: ``SlurmdParameters=config_overrides`` lets a node claim more CPUs than
the machine has, like the GBroker site it is compared with): a ``munged``, a ``slurmctld`` and a
``slurmd`` from Debian's ``slurm-wlm`` (``bash scripts/setup/ensure_slurm.sh`` installs them, and
:func:`ensure_installed` runs it), every daemon running as the current user.
:func:`running` is the way to use it: a context manager that starts it and stops it however the
block ends, a signal included (scripts/orderly.py). ``start`` waits until the node is idle;
``stop`` lets running jobs end, stops each daemon and kills the cluster's jobs that are left.

:func:`submit_many` submits ``sbatch --wrap /bin/true`` from ``clients`` concurrent workers, each
with its ``--output`` file in ``out_dir``. Slurm's own times are whole seconds (``StartTime``),
too coarse for a start latency of a fraction of a second, so a job's **start** is the
modification time of that output file: ``slurmstepd`` creates it (and ``/bin/true`` never writes
it) in the job's process just before it execs the batch script, as GBroker's supervisor records
a job's start when it launches it. :func:`started_at` reads those times and checks them against
``squeue --states=all``'s ``StartTime`` (no ``sacct``: there is no accounting).
:func:`drained` waits until no job is left to run; :func:`ended_at` reads each job's
``EndTime`` (whole seconds); :func:`command_seconds` times the commands a broker in front of
Slurm runs (``sbatch --hold``, ``scontrol release``, ``squeue --states=all``), each alone.

Variants: ``DEFAULT`` is Slurm as packaged (``SchedulerParameters`` unset: its 3 s
``batch_sched_delay``, info logging); ``TUNED`` sets ``batch_sched_delay=0`` and
``sched_min_interval=0`` (start batch jobs at once) and logs errors only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gbroker.fleet.slurm import ClusterSpec, SlurmCluster, SlurmError, missing_tools, tool
from scripts import orderly

__all__ = [
    "DEFAULT",
    "TUNED",
    "SingleNodeSlurm",
    "SlurmError",
    "Variant",
    "ensure_installed",
    "missing_tools",
    "running",
]

from scripts import ROOT

ENSURE = ROOT / "scripts" / "setup" / "ensure_slurm.sh"
_tool = tool  # what scripts/bench/bench_cli.py imports


@dataclass(frozen=True)
class Variant:
    """A Slurm configuration to compare: its name in the table and what it changes."""

    name: str
    scheduler_parameters: str | None
    debug: str


DEFAULT = Variant("slurm", None, "info")
TUNED = Variant("slurm tuned", "batch_sched_delay=0,sched_min_interval=0", "error")


def ensure_installed() -> None:
    """Install Slurm and munge with scripts/setup/ensure_slurm.sh if any tool is missing."""
    if not missing_tools():
        return
    done = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True)
    if done.returncode != 0 or missing_tools():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SlurmError(
            f"{', '.join(missing_tools()) or 'slurm'} missing and {ENSURE.name} failed "
            f"(exit {done.returncode}): {' / '.join(tail)}"
        )


class SingleNodeSlurm(SlurmCluster):
    """munged, slurmctld and slurmd (node ``bench``, ``cpus`` CPUs), started in ``directory``
    as ``variant`` says; :meth:`stop` stops them."""

    def __init__(self, directory: Path, cpus: int, variant: Variant) -> None:
        spec = ClusterSpec(
            "gbroker-bench",
            cpus,
            nodes=("bench",),
            partition="bench",
            scheduler_parameters=variant.scheduler_parameters,
            debug=variant.debug,
        )
        super().__init__(directory, spec)
        self.variant = variant


def running(
    directory: Path, cpus: int, variant: Variant
) -> contextlib.AbstractContextManager[SingleNodeSlurm]:
    """A single-node Slurm for the block's duration, stopped however the block ends (an
    exception, Ctrl-C, SIGTERM, SIGHUP: :func:`orderly.started`)."""
    slurm = SingleNodeSlurm(directory, cpus, variant)

    def start() -> SingleNodeSlurm:
        slurm.start()
        return slurm

    return orderly.started(start, SingleNodeSlurm.stop)


async def submit_many(
    env: dict[str, str], out_dir: Path, count: int, clients: int, extra: Sequence[str] = ()
) -> tuple[float, dict[str, float]]:
    """``count`` jobs ``sbatch --wrap /bin/true`` from ``clients`` concurrent workers; ``extra``:
    more ``sbatch`` options (``--uid``, say).

    Returns the seconds it took and, by job id, the wall time (``time.time()``) at which its
    ``sbatch`` was started. A failed ``sbatch`` aborts the benchmark.
    """
    issued: dict[str, float] = {}
    remaining = count
    sbatch = tool("sbatch")
    output = str(out_dir / "%j.out")

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            at = time.time()
            process = await asyncio.create_subprocess_exec(
                sbatch, "--parsable", "--job-name=bench", f"--output={output}",
                "--wrap=/bin/true", *extra, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await process.communicate()
            if process.returncode != 0:
                raise SlurmError(f"sbatch exited {process.returncode}: {err.decode()[:200]}")
            issued[out.decode().strip().split(";")[0]] = at

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - began, issued


async def occupy(env: dict[str, str], cpus: int, out_dir: Path, timeout: float = 30.0) -> str:
    """Start a job that holds all ``cpus`` CPUs (``sleep 300``), so that what follows queues;
    its id, once it runs."""
    done = subprocess.run(
        [tool("sbatch"), "--parsable", "--job-name=blocker", f"--ntasks={cpus}",
         f"--output={out_dir / 'blocker.out'}", "--wrap=sleep 300"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SlurmError(f"sbatch (the blocking job) exited {done.returncode}: {done.stderr[:200]}")
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        state = subprocess.run(
            [tool("squeue"), "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
        ).stdout.strip()
        if state == "RUNNING":
            return job
        if time.monotonic() > deadline:
            raise SlurmError(f"the blocking job {job} did not start within {timeout:g} s: {state}")
        await asyncio.sleep(0.1)


def cancel(env: dict[str, str], job: str) -> None:
    """``scancel`` a job (the blocking one: what queued behind it may start)."""
    done = subprocess.run([tool("scancel"), job], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmError(f"scancel {job} exited {done.returncode}: {done.stderr[:200]}")


async def wait_started(out_dir: Path, count: int, timeout: float) -> None:
    """Wait until ``count`` jobs have created their output files in ``out_dir``."""
    deadline = time.monotonic() + timeout
    while sum(1 for _ in os.scandir(out_dir)) < count:
        if time.monotonic() > deadline:
            raise SlurmError(f"{count} jobs did not all start within {timeout:g} s")
        await asyncio.sleep(0.1)


async def start_of(out_dir: Path, job: str, timeout: float) -> float:
    """Wait until ``job`` has started; its start (its output file's mtime)."""
    path = out_dir / f"{job}.out"
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            return path.stat().st_mtime
        if time.monotonic() > deadline:
            raise SlurmError(f"job {job} did not start within {timeout:g} s")
        await asyncio.sleep(0.01)


async def drained(env: dict[str, str], timeout: float) -> float:
    """Wait until the cluster has no job left to run or to finish; when that was first seen
    (``time.time()``, within the 0.25 s between two looks)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            [tool("squeue"), "-h", "-t", "PENDING,CONFIGURING,RUNNING,COMPLETING,SUSPENDED",
             "-o", "%i"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode == 0 and not done.stdout.split():
            return time.time()
        if time.monotonic() > deadline:
            left = len(done.stdout.split())
            raise SlurmError(f"{left} jobs were still queued or running after {timeout:g} s")
        await asyncio.sleep(0.25)


def ended_at(env: dict[str, str], jobs: list[str]) -> dict[str, float]:
    """Each job's end as Slurm records it: its ``EndTime`` (whole seconds, rounded down by
    Slurm), once the job is ``COMPLETED``."""
    done = subprocess.run(
        [tool("squeue"), "--states=all", "-h", "-o", "%i %T %e"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    records = dict(
        (job, (state, end)) for job, state, end in map(str.split, done.stdout.splitlines())
    )
    ends = {}
    for job in jobs:
        state, end = records.get(job, ("unknown to squeue", "N/A"))
        if state != "COMPLETED":
            raise SlurmError(f"job {job} is {state}, not COMPLETED")
        ends[job] = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    return ends


def command_seconds(
    env: dict[str, str], out_dir: Path, count: int, extra: Sequence[str] = ()
) -> dict[str, float]:
    """What each Slurm command a site's broker runs costs, alone: the median wall time of
    ``count`` runs, one after the other, of ``sbatch --hold`` of a trivial job, ``scontrol
    release`` of it, and ``squeue --states=all`` (every job the cluster knows). The released
    jobs run; the caller waits for them (:func:`drained`)."""
    times: dict[str, list[float]] = {
        "sbatch --hold": [],
        "scontrol release": [],
        "squeue --states=all": [],
    }

    def timed(name: str, *command: str) -> str:
        began = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        times[name].append(time.perf_counter() - began)
        if done.returncode != 0:
            raise SlurmError(f"{command[0]} exited {done.returncode}: {done.stderr[:200]}")
        return done.stdout

    output = str(out_dir / "%j.out")
    for _ in range(count):
        out = timed(
            "sbatch --hold", tool("sbatch"), "--parsable", "--hold", "--job-name=probe",
            f"--output={output}", "--wrap=/bin/true", *extra,
        )  # fmt: skip
        timed("scontrol release", tool("scontrol"), "release", out.strip().split(";")[0])
        timed("squeue --states=all", tool("squeue"), "--states=all", "-h", "-o", "%i %T %S %e %k")
    return {name: statistics.median(values) for name, values in times.items()}


def started_at(env: dict[str, str], out_dir: Path, jobs: list[str]) -> dict[str, float]:
    """Each job's start: its output file's mtime, checked against Slurm's StartTime and state."""
    done = subprocess.run(
        [tool("squeue"), "--states=all", "-h", "-o", "%i %T %S"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    records = {}
    for line in done.stdout.splitlines():
        job, state, start = line.split()
        records[job] = (state, start)
    starts = {}
    for job in jobs:
        state, start = records.get(job, ("unknown to squeue", "N/A"))
        if state not in ("COMPLETED", "RUNNING", "COMPLETING"):
            raise SlurmError(f"job {job} is {state}")
        mtime = (out_dir / f"{job}.out").stat().st_mtime
        slurm_start = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        # StartTime is when slurmctld allocated the node; the launch follows within moments.
        if not slurm_start - 1 <= mtime < slurm_start + 60:
            raise SlurmError(f"job {job}: output file time {mtime:.3f} far from StartTime {start}")
        starts[job] = mtime
    return starts
