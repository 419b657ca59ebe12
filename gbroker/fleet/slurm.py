"""A Slurm cluster of its own on this host: a ``munged``, a ``slurmctld`` and a ``slurmd`` per
node, started in a directory and stopped again; what ``fleet up`` starts for a site with
``manager: slurm`` (and what scripts/bench/bench_slurm.py compares GBroker with).

Theory of operation. :class:`SlurmCluster` writes, in its directory, a ``slurm.conf`` for
:class:`ClusterSpec`'s nodes and starts each daemon detached, in a session of its own, from that
file: its own ``munged`` (a system one is neither needed nor touched), a ``slurmctld`` and a
``slurmd`` per node on ports of their own (:func:`gbroker.fleet.ports.free_port`), so that
several nodes of one cluster run on one host and a job may span them. Every daemon runs as the
current user, so as root a job submitted with ``sbatch --uid`` runs as that user.

Unix socket paths must stay under 108 bytes, so the sockets, ``slurm.conf`` and the site's job
directories live in a short temporary directory (:attr:`SlurmCluster.sockets`,
:attr:`SlurmCluster.jobs_dir`, mode 0711) that the jobs' accounts can reach wherever the fleet's
directory is. A cluster is known by what :meth:`SlurmCluster.record` says, so that another
process can stop it (:meth:`SlurmCluster.from_record`); :meth:`SlurmCluster.stop` lets running
jobs end for a grace period, then kills the daemons it can prove are its own and whatever still
carries the cluster's ``SLURM_CONF``.

The configuration chosen, and why: docs/SITES.md, "The clusters a local fleet starts".
"""

from __future__ import annotations

import collections
import contextlib
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gbroker.fleet.members import (
    FleetError,
    is_alive,
    shared_directory,
    signal_group,
    wait_gone,
)
from gbroker.fleet.ports import free_port

__all__ = [
    "CONF_FILE",
    "SEARCH_PATH",
    "TOOLS",
    "ClusterSpec",
    "SlurmCluster",
    "SlurmError",
    "cluster_name",
    "missing_tools",
    "tool",
]

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel")
"""What a cluster needs (scripts/setup/ensure_slurm.sh installs them)."""

# Debian installs the daemons in /usr/sbin, which may be missing from a user's PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])

CONF_FILE = "slurm.conf"


class SlurmError(FleetError):
    """A Slurm cluster could not be started or used; the message says what happened."""


def missing_tools() -> list[str]:
    return [name for name in TOOLS if shutil.which(name, path=SEARCH_PATH) is None]


def tool(name: str) -> str:
    """The path of one of :data:`TOOLS`."""
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise SlurmError(f"{name} is not installed; run `bash scripts/setup/ensure_slurm.sh`")
    return path


def cluster_name(site: str) -> str:
    """A Slurm ``ClusterName`` for a site: lower case, letters, digits, ``-`` and ``_``."""
    return re.sub(r"[^a-z0-9_-]", "-", site.lower())[:40] or "gbroker"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What a cluster is: its name, its nodes (each declaring ``cpus`` CPUs), its one (default)
    partition, and how slurmctld schedules and logs.

    ``scheduler_parameters`` None is Slurm as packaged (its 3 s ``batch_sched_delay``); a fleet
    starts batch jobs at once (:data:`PROMPT`)."""

    name: str
    cpus: int
    nodes: tuple[str, ...] = ("node1",)
    partition: str = "batch"
    scheduler_parameters: str | None = None
    debug: str = "info"
    extra: tuple[str, ...] = field(default=())  # more slurm.conf lines

    def __post_init__(self) -> None:
        if self.cpus < 1 or not self.nodes:
            raise ValueError(f"a cluster needs nodes and CPUs ({self.nodes}, {self.cpus})")


PROMPT = "batch_sched_delay=0,sched_min_interval=0"
"""``SchedulerParameters`` that start batch jobs at once (not one a second)."""


def slurm_conf(spec: ClusterSpec, directory: Path, sockets: Path, ports: Sequence[int]) -> str:
    """The ``slurm.conf`` of ``spec``'s cluster in ``directory``, its sockets in ``sockets``;
    ``ports``: slurmctld's, then each node's slurmd's."""
    host = socket.gethostname().split(".")[0]
    user = getpass.getuser()
    lines = [
        f"ClusterName={spec.name}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sockets / 'munge.socket'}",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={sockets / 'spool' / '%n'}",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={directory / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'slurmd-%n.log'}",
        f"SlurmctldDebug={spec.debug}",
        f"SlurmdDebug={spec.debug}",
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
    ]
    for node, port in zip(spec.nodes, ports[1:], strict=True):
        lines.append(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={spec.cpus} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={spec.partition} Nodes={','.join(spec.nodes)} Default=YES "
        "MaxTime=INFINITE State=UP"
    )
    if spec.scheduler_parameters:
        lines.append(f"SchedulerParameters={spec.scheduler_parameters}")
    lines.extend(spec.extra)
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """munged, slurmctld and a slurmd per node, started in ``directory``; :meth:`stop` stops
    them (see the module's docs)."""

    def __init__(self, directory: Path, spec: ClusterSpec) -> None:
        self.directory = directory
        self.spec = spec
        self.conf = directory / CONF_FILE
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH}
        self.sockets: Path | None = None
        self.daemons: list[tuple[str, int]] = []  # (name, pid), in the order started
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # those this process started

    @property
    def jobs_dir(self) -> Path:
        """The job directories of the site in front of this cluster (``serve --jobs-dir``)."""
        assert self.sockets is not None, "the cluster was not launched"
        return self.sockets / "jobs"

    @property
    def cpus(self) -> int:
        """The CPUs of one node."""
        return self.spec.cpus

    # -- what the site's broker is told (gbroker.fleet.batch) -------------------------------------

    def serve_args(self) -> tuple[str, ...]:
        """``gbroker serve``'s arguments for the site in front of this cluster."""
        return (
            *("--manager", "slurm", "--slurm-conf", str(self.conf)),
            *("--jobs-dir", str(self.jobs_dir)),
        )

    def environment(self) -> dict[str, str]:
        """What the site's broker needs in its environment: nothing (``--slurm-conf`` says)."""
        return {}

    def setting(self) -> str:
        """Where the cluster is, as its users would set it (``fleet status``)."""
        return f"SLURM_CONF={self.conf}"

    # -- a record other processes can stop it from --------------------------------------------

    def record(self) -> dict[str, Any]:
        """What ``fleet.json`` keeps of the cluster: enough for :meth:`from_record`."""
        return {
            "name": self.spec.name,
            "directory": str(self.directory),
            "conf": str(self.conf),
            "sockets": None if self.sockets is None else str(self.sockets),
            "nodes": list(self.spec.nodes),
            "cpus": self.spec.cpus,
            "partition": self.spec.partition,
            "daemons": [{"name": name, "pid": pid} for name, pid in self.daemons],
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SlurmCluster:
        spec = ClusterSpec(
            record["name"], record["cpus"], tuple(record["nodes"]), record["partition"]
        )
        cluster = cls(Path(record["directory"]), spec)
        cluster.sockets = Path(record["sockets"]) if record.get("sockets") else None
        cluster.conf = Path(record["conf"])
        cluster.env["SLURM_CONF"] = record["conf"]
        cluster.daemons = [(d["name"], int(d["pid"])) for d in record["daemons"]]
        return cluster

    # -- starting ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        """Start the daemons and wait until every node is idle; on failure (or an interrupt)
        stop what started."""
        try:
            self.launch()
            self.wait_idle(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Write ``slurm.conf`` and start the daemons, without waiting for the nodes; a daemon
        that started is in :attr:`daemons` at once (:meth:`stop` stops it)."""
        missing = missing_tools()
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not installed; run `bash scripts/setup/ensure_slurm.sh`"
            )
        # munged wants its socket's directory searchable by all (0711)
        sockets = self.sockets = shared_directory("gbroker-slurm-")
        # Where jobs' accounts reach it: srun in a job (an MPI job's mpiexec) reads slurm.conf,
        # and the site's job directories (:attr:`jobs_dir`) live here, as on a shared file
        # system, wherever the fleet's own directory is (a user's 0700 home, say).
        self.conf = sockets / CONF_FILE
        self.env["SLURM_CONF"] = str(self.conf)
        self.jobs_dir.mkdir(mode=0o711)
        munge = self.directory / "munge"
        for sub in (munge, self.directory / "state"):
            sub.mkdir(mode=0o700, parents=True, exist_ok=True)
        for node in self.spec.nodes:  # slurmd makes its spool, but wants its parent first
            (sockets / "spool" / node).mkdir(mode=0o700, parents=True)
        key = munge / "munge.key"
        subprocess.run(
            [tool("mungekey"), "--create", "--force", f"--keyfile={key}"],
            check=True,
            capture_output=True,
        )
        ports = [free_port() for _ in range(1 + len(self.spec.nodes))]
        self.conf.write_text(slurm_conf(self.spec, self.directory, sockets, ports))
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
        self._until(
            lambda: (sockets / "munge.socket").exists(),
            time.monotonic() + 10,
            "munged made no socket",
        )
        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        for node in self.spec.nodes:
            self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", node)

    def wait_idle(self, deadline: float) -> None:
        """Wait until every node is idle (``deadline``: a ``time.monotonic()`` value)."""
        self._until(self.idle, deadline, "the Slurm nodes did not all become idle")

    def _spawn(self, name: str, *args: str) -> None:
        out = self.directory / f"{name}.out"
        with out.open("ab") as log:
            process = subprocess.Popen(
                [tool(name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its directory in its environment: what finds a daemon of this cluster (its
                # command line names the slurm.conf under /tmp, not the cluster's directory).
                env={**self.env, "GBROKER_SLURM_CLUSTER": str(self.directory)},
                start_new_session=True,
            )
        self.daemons.append((name, process.pid))
        self._children[process.pid] = process

    def idle(self) -> bool:
        """Whether slurmctld answers and every node is idle."""
        done = subprocess.run(
            [tool("sinfo"), "-h", "-N", "-o", "%N %T"],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            return False
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return set(states) == set(self.spec.nodes) and set(states.values()) == {"idle"}

    def _until(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        began = time.monotonic()
        while not ready():
            for name, pid in self.daemons:
                if not self._alive(pid):
                    raise SlurmError(f"{name} exited{self._status(pid)}: {self._tail(name)}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what} within {time.monotonic() - began:.0f} s")
            time.sleep(0.1)

    def _alive(self, pid: int) -> bool:
        child = self._children.get(pid)
        return child.poll() is None if child is not None else is_alive(pid)

    def _status(self, pid: int) -> str:
        child = self._children.get(pid)
        return "" if child is None or child.returncode is None else f" {child.returncode}"

    def _tail(self, name: str) -> str:
        try:
            lines = (self.directory / f"{name}.out").read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return " / ".join(lines[-3:]) or "(no output)"

    # -- stopping ------------------------------------------------------------------------------

    def alive(self) -> dict[str, bool]:
        """Each daemon (``munged``, ``slurmctld``, ``slurmd NODE``): whether it still runs."""
        nodes = iter(self.spec.nodes)
        return {
            (f"slurmd {next(nodes)}" if name == "slurmd" else name): self._ours(pid)
            for name, pid in self.daemons
        }

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` runs and is a daemon of this cluster (its command line names the
        cluster's slurm.conf or sockets: a pid in an old record may be another process's)."""
        if not self._alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        markers = [str(self.conf)] + ([str(self.sockets)] if self.sockets else [])
        return any(marker.encode() in cmdline for marker in markers)

    def stop(self, grace: float = 10.0, cancel: bool = False) -> int:
        """Stop everything started here, and every process of this cluster's jobs; returns
        how many jobs were cancelled.

        First the jobs: with ``cancel``, ``scancel`` every job not yet ended; then up to
        ``grace`` s for running jobs to end (a job step whose slurmd is gone would otherwise
        stay, retrying to report its end). Then SIGTERM to each daemon, newest first, and
        SIGKILL to its process group past ``grace``; last, SIGKILL to the cluster's job steps
        and jobs still left (:meth:`cluster_processes`).
        """
        ours = [(name, pid) for name, pid in self.daemons if self._ours(pid)]
        cancelled = 0
        if ours and len(ours) == len(self.daemons):
            if cancel:
                cancelled = self._cancel_all()
            deadline = time.monotonic() + grace
            while self.jobs("RUNNING,COMPLETING,CONFIGURING") and time.monotonic() < deadline:
                time.sleep(0.1)
        for _, pid in reversed(ours):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if self._wait(pid, grace):
                signal_group(pid, signal.SIGKILL)
                self._wait(pid, grace)
        self.daemons = []
        for pid in self.cluster_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None
        return cancelled

    def _cancel_all(self) -> int:
        """``scancel`` every job that has not ended; how many there were."""
        jobs = self.jobs("PENDING,RUNNING,SUSPENDED,CONFIGURING,REQUEUED,RESIZING")
        if jobs:
            subprocess.run([tool("scancel"), *jobs], env=self.env, capture_output=True, check=False)
        return len(jobs)

    def _wait(self, pid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``pid`` to end (reaping it if it is our child); whether
        it still runs."""
        child = self._children.get(pid)
        if child is None:
            return bool(wait_gone([pid], timeout))
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            return True
        return False

    def jobs(self, states: str) -> list[str]:
        """Ids of the jobs in ``states`` (squeue's names, comma-separated); [] if none or if
        squeue fails (slurmctld gone)."""
        done = subprocess.run(
            [tool("squeue"), "-h", "-t", states, "-o", "%i"],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.split() if done.returncode == 0 else []

    def cluster_processes(self) -> list[int]:
        """The cluster's job steps and jobs still running: processes whose environment names
        this cluster's slurm.conf, and that are a ``slurmstepd`` or a job (``SLURM_JOB_ID``).
        Not any process with that ``SLURM_CONF``: a user's shell that exported it to ask
        ``sinfo`` is not the cluster's to kill."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                name = (proc / "comm").read_bytes().strip()
            except OSError:  # gone, or not ours to read
                continue
            if marker not in environ:
                continue
            if name == b"slurmstepd" or any(v.startswith(b"SLURM_JOB_ID=") for v in environ):
                found.append(int(proc.name))
        return found

    def pending_reasons(self) -> str:
        """Why squeue says jobs wait, e.g. ``launch failed requeued held (3)``; for errors."""
        done = subprocess.run(
            [tool("squeue"), "-h", "-t", "PENDING", "-o", "%r"],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        reasons = collections.Counter(done.stdout.splitlines())
        return ", ".join(f"{reason} ({n})" for reason, n in reasons.most_common(3)) or "none"
