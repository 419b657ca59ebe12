"""A real single-node Slurm, started and stopped here, to run the benchmark's trivial jobs.

Used by scripts/bench_daemon.py and scripts/bench_cli.py; no CLI of its own.

:class:`SingleNodeSlurm` starts, in a directory of its own: a ``munged`` (its own key and socket,
so a system munged is neither needed nor touched), a ``slurmctld`` and a ``slurmd`` from Debian's
``slurm-wlm`` (``bash scripts/ensure_slurm.sh`` installs them), from a generated ``slurm.conf``:
one node with ``cpus`` CPUs (declared: ``SlurmdParameters=config_overrides`` lets a node claim
more CPUs than the machine has, like the GBroker site it is compared with), one partition,
``select/cons_tres`` by core, no accounting, no job completion log, no cgroups
(``proctrack/linuxproc``, ``task/none``), ports from :func:`gbroker.fleet.ports.free_port`, every
daemon running as the current user. Unix socket paths must stay under 108 bytes, so munged's
socket and slurmd's spool (where each job step makes its socket) live in a short temporary
directory of their own. :func:`running` is the way to use it: a context manager that starts it
and stops it however the block ends, a signal included (scripts/orderly.py).
:meth:`SingleNodeSlurm.start` waits until the node is idle; :meth:`SingleNodeSlurm.stop` lets
running jobs end, sends SIGTERM to each daemon it started
(SIGKILL to its process group after a grace period), kills whatever still carries the
cluster's ``SLURM_CONF`` in its environment (a job step outliving its slurmd keeps retrying to
report its end) and removes that directory.

:func:`submit_many` submits ``sbatch --wrap /bin/true`` from ``clients`` concurrent workers, each
with its ``--output`` file in ``out_dir``. Slurm's own times are whole seconds (``StartTime``),
too coarse for a start latency of a fraction of a second, so a job's **start** is the
modification time of that output file: ``slurmstepd`` creates it (and ``/bin/true`` never writes
it) in the job's process just before it execs the batch script, as GBroker's supervisor records
a job's start when it launches it. :func:`started_at` reads those times and checks them against
``squeue --states=all``'s ``StartTime`` (no ``sacct``: there is no accounting).

Variants: ``DEFAULT`` is Slurm as packaged (``SchedulerParameters`` unset: its 3 s
``batch_sched_delay``, info logging); ``TUNED`` sets ``batch_sched_delay=0`` and
``sched_min_interval=0`` (start batch jobs at once) and logs errors only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orderly  # beside this module, in scripts/

from gbroker.errors import GBrokerError
from gbroker.fleet.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
ENSURE = ROOT / "scripts" / "ensure_slurm.sh"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel")
# Debian installs the daemons in /usr/sbin, which may be missing from a user's PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


@dataclass(frozen=True)
class Variant:
    """A Slurm configuration to compare: its name in the table and what it changes."""

    name: str
    scheduler_parameters: str | None
    debug: str


DEFAULT = Variant("slurm", None, "info")
TUNED = Variant("slurm tuned", "batch_sched_delay=0,sched_min_interval=0", "error")


class SlurmError(GBrokerError):
    """Slurm could not be installed, started or used; the message says what happened."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool, path=SEARCH_PATH) is None]


def ensure_installed() -> None:
    """Install Slurm and munge with scripts/ensure_slurm.sh if any tool is missing."""
    if not missing_tools():
        return
    done = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True)
    if done.returncode != 0 or missing_tools():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SlurmError(
            f"{', '.join(missing_tools()) or 'slurm'} missing and {ENSURE.name} failed "
            f"(exit {done.returncode}): {' / '.join(tail)}"
        )


def _tool(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise SlurmError(f"{name} is not installed; run `bash scripts/ensure_slurm.sh`")
    return path


def slurm_conf(
    directory: Path, sockets: Path, cpus: int, variant: Variant, ports: tuple[int, int]
) -> str:
    """The slurm.conf of a one-node cluster living in ``directory``, its sockets in ``sockets``."""
    host = socket.gethostname().split(".")[0]
    user = getpass.getuser()
    lines = [
        "ClusterName=gbroker-bench",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sockets / 'munge.socket'}",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={sockets / 'spool'}",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory / 'slurmd.pid'}",
        f"SlurmctldLogFile={directory / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'slurmd.log'}",
        f"SlurmctldDebug={variant.debug}",
        f"SlurmdDebug={variant.debug}",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MinJobAge=3600",  # keep finished jobs' records for squeue --states=all
        "MaxJobCount=100000",
        f"NodeName=bench NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=bench Nodes=bench Default=YES MaxTime=INFINITE State=UP",
    ]
    if variant.scheduler_parameters:
        lines.append(f"SchedulerParameters={variant.scheduler_parameters}")
    return "\n".join(lines) + "\n"


class SingleNodeSlurm:
    """munged, slurmctld and slurmd, started in ``directory``; :meth:`stop` stops them."""

    def __init__(self, directory: Path, cpus: int, variant: Variant) -> None:
        self.directory = directory
        self.cpus = cpus
        self.variant = variant
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH}
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._sockets: Path | None = None

    def start(self, timeout: float = 30.0) -> SingleNodeSlurm:
        """Start the daemons and wait until the node is idle; on failure stop what started."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        sockets = self._sockets = Path(tempfile.mkdtemp(prefix="gbroker-slurm-"))
        sockets.chmod(0o711)  # munged wants its socket's directory searchable by all
        munge = self.directory / "munge"
        for sub in (munge, self.directory / "state", sockets / "spool"):
            sub.mkdir(mode=0o700, parents=True)
        key = munge / "munge.key"
        subprocess.run(
            [_tool("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True
        )
        ports = (free_port(), free_port())
        self.conf.write_text(slurm_conf(self.directory, sockets, self.cpus, self.variant, ports))
        self._spawn(
            "munged",
            "--foreground",
            "--force",  # lets it run as root, its socket under a world-writable /tmp
            f"--socket={sockets / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._until(lambda: (sockets / "munge.socket").exists(), timeout, "munged made no socket")
        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", "bench")
        self._until(self._idle, timeout, "the Slurm node did not become idle")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.out", "wb")  # noqa: SIM115 - the child keeps it
        with log:
            process = subprocess.Popen(
                [_tool(name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self._daemons.append((name, process))

    def _idle(self) -> bool:
        done = subprocess.run(
            [_tool("sinfo"), "-h", "-o", "%T"], env=self.env, capture_output=True, text=True
        )
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def _until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, process in self._daemons:
                if process.poll() is not None:
                    raise SlurmError(f"{name} exited {process.returncode}: {self._tail(name)}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what} within {timeout:g} s")
            time.sleep(0.1)

    def _tail(self, name: str) -> str:
        try:
            lines = (self.directory / f"{name}.out").read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return " / ".join(lines[-3:]) or "(no output)"

    def stop(self, grace: float = 10.0) -> None:
        """Stop everything started here, and every process of this cluster's jobs.

        First up to ``grace`` s for running jobs to end (a job step whose slurmd is gone
        would otherwise stay, retrying to report its end); then SIGTERM to each daemon, newest
        first, and SIGKILL to its process group past ``grace``; last, SIGKILL to any process
        left with this cluster's ``SLURM_CONF`` in its environment (job steps, jobs).
        """
        if self._daemons and all(process.poll() is None for _, process in self._daemons):
            deadline = time.monotonic() + grace
            while self._jobs("RUNNING,COMPLETING,CONFIGURING") and time.monotonic() < deadline:
                time.sleep(0.1)
        while self._daemons:
            _, process = self._daemons.pop()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(grace)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        for pid in self._cluster_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None

    def _jobs(self, states: str) -> list[str]:
        """Ids of the jobs in ``states`` (squeue's names, comma-separated); [] if none or if
        squeue fails (slurmctld gone)."""
        done = subprocess.run(
            [_tool("squeue"), "-h", "-t", states, "-o", "%i"],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.split() if done.returncode == 0 else []

    def _cluster_processes(self) -> list[int]:
        """Processes other than this one whose environment names this cluster's slurm.conf."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if marker in environ.split(b"\0"):
                found.append(int(proc.name))
        return found

    def pending_reasons(self) -> str:
        """Why squeue says jobs wait, e.g. ``launch failed requeued held (3)``; for errors."""
        done = subprocess.run(
            [_tool("squeue"), "-h", "-t", "PENDING", "-o", "%r"],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        reasons = collections.Counter(done.stdout.splitlines())
        return ", ".join(f"{reason} ({n})" for reason, n in reasons.most_common(3)) or "none"


def running(
    directory: Path, cpus: int, variant: Variant
) -> contextlib.AbstractContextManager[SingleNodeSlurm]:
    """A single-node Slurm for the block's duration, stopped however the block ends (an
    exception, Ctrl-C, SIGTERM, SIGHUP: :func:`orderly.started`)."""
    slurm = SingleNodeSlurm(directory, cpus, variant)
    return orderly.started(slurm.start, SingleNodeSlurm.stop)


async def submit_many(
    env: dict[str, str], out_dir: Path, count: int, clients: int
) -> tuple[float, dict[str, float]]:
    """``count`` jobs ``sbatch --wrap /bin/true`` from ``clients`` concurrent workers.

    Returns the seconds it took and, by job id, the wall time (``time.time()``) at which its
    ``sbatch`` was started. A failed ``sbatch`` aborts the benchmark.
    """
    issued: dict[str, float] = {}
    remaining = count
    sbatch = _tool("sbatch")
    output = str(out_dir / "%j.out")

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            at = time.time()
            process = await asyncio.create_subprocess_exec(
                sbatch, "--parsable", "--job-name=bench", f"--output={output}",
                "--wrap=/bin/true", env=env,
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
        [_tool("sbatch"), "--parsable", "--job-name=blocker", f"--ntasks={cpus}",
         f"--output={out_dir / 'blocker.out'}", "--wrap=sleep 300"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SlurmError(f"sbatch (the blocking job) exited {done.returncode}: {done.stderr[:200]}")
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        state = subprocess.run(
            [_tool("squeue"), "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
        ).stdout.strip()
        if state == "RUNNING":
            return job
        if time.monotonic() > deadline:
            raise SlurmError(f"the blocking job {job} did not start within {timeout:g} s: {state}")
        await asyncio.sleep(0.1)


def cancel(env: dict[str, str], job: str) -> None:
    """``scancel`` a job (the blocking one: what queued behind it may start)."""
    done = subprocess.run([_tool("scancel"), job], env=env, capture_output=True, text=True)
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


def started_at(env: dict[str, str], out_dir: Path, jobs: list[str]) -> dict[str, float]:
    """Each job's start: its output file's mtime, checked against Slurm's StartTime and state."""
    done = subprocess.run(
        [_tool("squeue"), "--states=all", "-h", "-o", "%i %T %S"],
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
