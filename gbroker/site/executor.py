"""The ``local`` back-end: each job a process group in its own directory (ARCHITECTURE §7).

Theory of operation. The core's local scheduler decides *when* a job starts and on how many
cores; :class:`Executor` makes it happen with real processes and reports *how it ended*, exactly
once, through the job's ``on_exit`` (never from inside :meth:`~Executor.start`, never as an
exception into the loop). It is the :class:`~gbroker.site.backend.Backend` seam's ``local``
implementation, and a house of small rooms:

- the root's **launchers** (:mod:`.launcher`, reached through :mod:`.launcher_client`) fork
  every job: a job's launcher is its parent, so its end is heard and recorded (its launch
  record, in a directory no job can reach) whether or not a broker is there;
- who a job runs as (:mod:`.identity`: ``accounts``, a uid per user, ``run_as``), its
  :class:`~gbroker.site.backend.Limits` as rlimits, its cgroup (:mod:`.cgroups`), its core
  slots and the CPUs they are bound to (which :mod:`.resize` changes under malleable jobs);
- checkpoints to move a running job (:mod:`.criu`, :mod:`.appstate`).

Jobs outlive their broker: a successor :meth:`~Executor.adopt` takes them over, taking a
process group for a job's only when one of its members carries the job's id and directory in
its environment (:mod:`.procfs`), and asks its launcher to ``watch`` it, or polls ``/proc`` if
the launcher is gone. Stopping a job sends SIGTERM to its group, then SIGKILL after the grace
period; when its leader exits, whatever is left of its group and cgroup is killed. Nothing
blocks the loop: each job is a task waiting for its launcher's word; timers are loop callbacks
on the monotonic clock, and the wall clock only stamps results. Linux only.

The manual (the environment a job sees, least privilege, confinement, adoption's corner
cases, what escapes without cgroups) is docs/SITES.md, "The ``local`` back-end".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import math
import mmap
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGCONT, SIGKILL, SIGTERM, SIGXCPU, SIGXFSZ, Signals
from types import MappingProxyType, TracebackType
from typing import Any, Self

from gbroker.app.malleable import CONTROL_ENV
from gbroker.core.limits import NOTHING, Used, cpu_left, in_all, wall_left
from gbroker.core.requirements import format_bytes
from gbroker.errors import InternalError, InvalidInput
from gbroker.site import app_library, appstate, bundles, cgroups, criu, launcher, procfs, spmd
from gbroker.site.backend import (
    ExitCallback,
    ExitResult,
    JobSpec,
    LaunchRecord,
    Limits,
    RunningJob,
    StopReason,
    check_job_id,
    check_text,
    check_token,
)
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.identity import LocalAccount, UidAllocator, closed_ancestor, local_account
from gbroker.site.launcher_client import LauncherLink, LaunchFailed, read_to_end
from gbroker.site.safe_paths import Account

__all__ = ["DEFAULT_GRACE_PERIOD", "MIN_PROCESSES", "PROCESSES_PER_CORE", "Executor", "host_memory"]

log = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD = 5.0
"""Seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of time."""

PROCESSES_PER_CORE = 512
"""A job's process limit where neither it nor the site sets one (with cgroups): this many a
core, and at least :data:`MIN_PROCESSES` (a fork bomb stops there; MPI ranks and their threads
do not come near it)."""
MIN_PROCESSES = 4096


def host_memory() -> int:
    """The host's physical memory, bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


CONTROL_SOCKET = ".gbroker-control"
"""A malleable job's control socket, in its directory (:meth:`Executor.control_path`)."""

_POLL_INTERVAL = 0.2  # seconds between looks at a job whose launcher is not ours to ask
_ENVIRON_READS, _ENVIRON_PAUSE = 20, 0.0005  # an empty /proc/<pid>/environ, read again (10 ms)

_UNKNOWN_WHILE_DOWN = "the job ended while its broker was down; its exit status is unknown"
_UNKNOWN_UNRECORDED = (
    "the job's launcher ended without recording how the job ended (was it killed?); "
    "its exit status is unknown"
)
_UNKNOWN_UNTOLD = "its launcher is gone: how the job ended is unknown"

_LAUNCHER_SCRIPT = str(Path(launcher.__file__).resolve())


def _exec_helper() -> str | None:
    """``gbroker-exec`` (gbroker/site/native/gbroker-exec.c, built by scripts/setup/build_native.sh)
    beside the interpreter, else on ``PATH``; None: the launcher forks jobs instead."""
    beside = Path(sys.executable).parent / "gbroker-exec"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("gbroker-exec")


EXEC_HELPER = _exec_helper()
"""What the launcher spawns to start a job under its ids, cgroups and rlimits (None: it forks)."""

MAX_LAUNCHERS = 4
"""The most launchers an executor starts by default (one per CPU up to that)."""

SITE_GROUP_WAIT = 3.0
"""How long a closing executor waits for its leaving launchers to remove their jobs' cgroups
before it removes the site's (each launcher gives its killed jobs' members 2 s to go)."""


def _title_path() -> tuple[str, ...]:
    """Where ``setproctitle`` is, for the launcher to show a short title in ``ps`` (it runs
    without ``site``); nothing if it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("setproctitle")
    if spec is None or spec.origin is None:
        return ()
    origin = Path(spec.origin)
    return (str(origin.parent.parent if origin.name == "__init__.py" else origin.parent),)


_LAUNCHERS: list[subprocess.Popen[bytes]] = []
"""Launchers this process spawned. One is our child until it ends (when its root has neither
jobs nor brokers); kept here, it is reaped then instead of staying a zombie (and a Popen dropped
while its process runs would warn)."""


def _reap_launchers() -> None:
    _LAUNCHERS[:] = [child for child in _LAUNCHERS if child.poll() is None]


_NOT_LOWERED = (
    "job %s: its RLIMIT_CPU could not be lowered to the %d s left of its CPU-time limit: %s"
)


@dataclass(slots=True, eq=False)
class _Run:
    """One accepted start or adoption, from validation to its report."""

    job_id: str
    cores: int
    time_limit: float | None
    on_exit: ExitCallback
    job_dir: Path
    started_at: float = 0.0
    token: str | None = None
    """The launch token its start carried: the launcher records its end in that launch record."""
    own_token: bool = False
    """The executor made the token (the caller gave none): its record goes once reported."""
    cgroup: str | None = None
    """The name of its cgroup (:mod:`.cgroups`), as its launcher told; None: none known."""
    slots: tuple[int, ...] = ()
    """The executor's core slots the job holds (see :class:`Executor`)."""
    ns_pid: int | None = None
    """A restored job's pid in its own PID namespace (its handle, :attr:`pgid`, is then its
    init's); None: a job started here, whose pid is :attr:`pgid`."""
    frozen_at: float | None = None
    """When its checkpoint froze it (monotonic); None: not frozen."""
    checkpoint_kind: str | None = None
    """How it was checkpointed while frozen (``criu`` or ``application``)."""
    released: bool = False
    """:meth:`Executor.release`\\ d: it runs elsewhere now, its end is never reported."""
    pgid: int | None = None
    """The job's process group, once it exists and is known to be the job's: set, the executor
    may signal it and :meth:`Executor.running` shows the job."""
    link: LauncherLink | None = None
    """The launcher that is the job's parent, to signal it through; None: signal it ourselves."""
    stop_reason: StopReason | None = None
    killed: bool = False
    """This executor sent the group SIGKILL (the status an adopted job's missing file implies)."""
    grace_period: float = DEFAULT_GRACE_PERIOD
    """Between SIGTERM and SIGKILL when the executor stops it (the executor's)."""
    limits: Limits | None = None
    """The rlimits it started under; None: not known (an adopted job)."""
    used: Used = NOTHING
    """What it used at the sites it ran at before this one (:attr:`JobSpec.used`): its
    limits here are what is left of :attr:`time_limit` and of :attr:`limits`' CPU time."""
    stopped_at: float | None = None
    """When the executor began to stop it (wall clock)."""
    detached: bool = False
    """Left running by ``aclose(detach=True)``: never signalled, never reported."""
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    spawned: asyncio.Future[None] | None = None
    """For a start: done once the spawn has succeeded or failed."""
    returned: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once :meth:`Executor.start` has returned (at once for an adoption): a caller that
    looks at :meth:`Executor.running` right after ``start`` sees the job, however short."""

    def time_left(self) -> float | None:
        """Seconds it may run here from its start here: what is left of its wall-time limit."""
        return wall_left(self.time_limit, self.used)

    def cpu_left(self) -> int | None:
        """Its RLIMIT_CPU here: what is left of its CPU-time limit (0: none is)."""
        return cpu_left(None if self.limits is None else self.limits.cpu_time, self.used)

    def view(self) -> RunningJob:
        assert self.pgid is not None
        left = self.time_left()
        return RunningJob(
            job_id=self.job_id,
            pid=self.pgid,
            cores=self.cores,
            started_at=self.started_at,
            deadline=None if left is None else self.started_at + left,
            stopping=self.stop_reason,
            launch_token=self.token,
        )

    def result(
        self,
        ended_at: float,
        exit_code: int | None = None,
        signal: int | None = None,
        error: str | None = None,
        hit: Mapping[str, int] | None = None,
        cpu_time: float | None = None,
    ) -> ExitResult:
        ended_by = self.ended_by(signal, cpu_time)
        if hit and ended_by is None and not (exit_code == 0 and error is None):
            ended_by = _limit_hit(hit, self.limits)
        return ExitResult(
            self.job_id,
            exit_code=exit_code,
            signal=signal,
            started_at=self.started_at,
            ended_at=ended_at,
            timed_out=self.stop_reason is StopReason.TIMED_OUT,
            cancelled=self.stop_reason in (StopReason.CANCELLED, StopReason.SHUTDOWN),
            error=error,
            ended_by=ended_by,
        )

    def ended_by(self, signal: int | None, cpu_time: float | None = None) -> str | None:
        """What the site did to end the job, if it was the site (:attr:`ExitResult.ended_by`)."""
        reason = self.stop_reason
        if reason is None:
            return _limit_signal(signal, self.limits, cpu_time, self.used)
        grace = f"{self.grace_period:g} s grace period"
        if self.killed:
            sent = f"SIGTERM, then SIGKILL after the {grace}"
        else:
            sent = f"SIGTERM, and it ended within the {grace}"
        used = self.used
        if reason is StopReason.TIMED_OUT:
            assert self.time_limit is not None
            said = ""
            if used.moves:  # what it ran here, to its stop, and at the sites before
                here = (self.stopped_at or self.started_at) - self.started_at
                said = f" ({in_all(used.wall, max(0.0, here), used.moves)})"
            return f"killed at its wall-time limit of {self.time_limit:g} s{said}: {sent}"
        if reason is StopReason.CPU_LIMIT:
            assert self.limits is not None
            said = in_all(used.cpu, 0.0, used.moves)
            return f"killed at its CPU-time limit of {self.limits.cpu_time} s ({said}): {sent}"
        if reason is StopReason.SHUTDOWN:
            return f"stopped as its site's broker shut down: {sent}"
        return f"stopped by a cancel: {sent}"


def _limit_signal(
    signal: int | None,
    limits: Limits | None,
    cpu_time: float | None = None,
    used: Used = NOTHING,
) -> str | None:
    """The resource limit whose signal ended a job, said for people; None for another end.
    A SIGKILL is RLIMIT_CPU's (its hard limit, which the kernel enforces so) only if the job
    used that much CPU time. A moved job's CPU-time limit is what was left of it here
    (:attr:`_Run.used`): the limit named is the job's, with what it used in all."""
    cpu_limit = None if limits is None else limits.cpu_time
    left = cpu_left(cpu_limit, used)
    if (
        signal == SIGKILL
        and cpu_limit is not None
        and left is not None
        and cpu_time is not None
        and cpu_time >= left  # its hard limit is a second later (SIGXCPU first)
    ):
        if used.moves:
            said = in_all(used.cpu, cpu_time, used.moves)
            return (
                f"killed at its CPU-time limit of {cpu_limit} s ({said}; RLIMIT_CPU: SIGXCPU, "
                "then SIGKILL a second later)"
            )
        return (
            f"killed at its CPU-time limit of {cpu_limit} s (RLIMIT_CPU: SIGXCPU, then SIGKILL "
            f"a second later; it used {cpu_time:g} s)"
        )
    if signal == SIGXCPU:
        of = "" if cpu_limit is None else f" of {cpu_limit} s"
        said = ""
        if used.moves and left is not None:
            said = f"; {in_all(used.cpu, left if cpu_time is None else cpu_time, used.moves)}"
        return f"killed by SIGXCPU: it used up its CPU-time limit{of} (RLIMIT_CPU{said})"
    if signal == SIGXFSZ:
        limit = None if limits is None else limits.file_size
        of = "" if limit is None else f" of {limit} bytes"
        return f"killed by SIGXFSZ: it wrote beyond its file-size limit{of} (RLIMIT_FSIZE)"
    return None


def _limit_hit(hit: Mapping[str, int], limits: Limits | None) -> str | None:
    """What the kernel did at a job's cgroup limits (:meth:`.cgroups.Group.limits_hit`), said
    for people: the OOM killer at its memory limit, forks refused at its process limit."""
    said = []
    if hit.get("oom_kill"):
        limit = None if limits is None else limits.memory
        of = "" if limit is None else f" of {format_bytes(limit)}"
        said.append(f"killed by the kernel at its memory limit{of} (cgroup memory.max)")
    if hit.get("pids_max"):
        limit = None if limits is None else limits.processes
        of = "" if limit is None else f" of {limit}"
        refused = hit["pids_max"]
        said.append(
            f"{refused} fork{'s' if refused != 1 else ''} refused at its process limit{of} "
            "(cgroup pids.max)"
        )
    return "; ".join(said) or None


def _check_number(name: str, value: object, expected: str, *, positive: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise InvalidInput(name, expected, value)
    return float(value)


_LIMITS_LOGGED = False


class Executor:
    """Runs a site's jobs as process groups under ``root``, one directory per job.

    Args:
        root: the directory that holds the job directories (and the launcher's socket, lock and
            log); created when needed. A broker that takes over its predecessor's jobs must use
            the same root.
        site: the site's name, given to jobs as ``GBROKER_SITE``.
        grace_period: seconds between SIGTERM and SIGKILL when a job is stopped.
        path: the ``PATH`` jobs start with; the broker's own ``PATH`` by default.
        site_cores: the cores the site declares (the local scheduler's count); the executor's
            core slots are ``0..site_cores-1``, slot ``i`` running on host CPU
            ``cpus[i % len(cpus)]``, ``cpus`` being the broker's own affinity set. Default: as
            many as ``cpus``.
        run_as: the account jobs run as when the broker runs as root (default ``nobody``);
            ignored otherwise (jobs then run as the broker's user).
        allow_root: let ``run_as`` (or a job's ``user``) be root.
        accounts: submitter name to local account; :meth:`account_for` reads it, and a job's
            ``user`` must be one of its accounts (or ``run_as``). None: no job may choose.
        uids: gives each submitter not in ``accounts`` a uid of its own (when the broker runs
            as root); None: they run as ``run_as``.
        default_limits: the site's limits, for each one a job does not set itself.
        launchers: how many launchers start the jobs, side by side (see :meth:`_pick`);
            default: one per CPU of ``cpus``, at most :data:`MAX_LAUNCHERS`.
        confine: run each job in a cgroup of its own (:mod:`.cgroups`: its cores, memory and
            process limits held by the kernel; cancels and limits kill all it forked) where
            the host allows it, as a root broker does; False: rlimits and CPU affinity only.
        cpu_share: the share of each of its cores a job's CPU time is capped at, 0 < share <= 1
            (the topology site's ``cpu_share``; 1: uncapped), through its cgroup.
    """

    name = "local"
    """The back-end's manager name (:class:`~gbroker.site.backend.Backend`)."""
    checkpoints: tuple[str, ...] = ("application",)  # with CRIU where it runs: "criu" too
    """``("criu",)`` where jobs can be checkpointed and restored here (:mod:`.criu`: a root
    broker, a cgroup per job, a ``criu`` found); set per executor."""
    resizes = True
    """Malleable jobs' cores change while they run (:mod:`.resize`)."""
    dump_timeout = 120.0
    """Seconds a CRIU dump may take before it is killed and the job runs on."""

    def __init__(
        self,
        root: Path,
        *,
        site: str = "local",
        grace_period: float = DEFAULT_GRACE_PERIOD,
        path: str | None = None,
        site_cores: int | None = None,
        hosts: Sequence[str] = (),
        run_as: str | None = None,
        allow_root: bool = False,
        accounts: Mapping[str, str] | None = None,
        uids: UidAllocator | None = None,
        default_limits: Limits | None = None,
        launchers: int | None = None,
        confine: bool = True,
        cpu_share: float = 1.0,
    ) -> None:
        if (
            isinstance(grace_period, bool)
            or not isinstance(grace_period, int | float)
            or not math.isfinite(grace_period)
            or grace_period < 0
        ):
            raise InvalidInput("grace_period", "seconds >= 0", grace_period)
        self.root = Path(root).absolute()  # once: job directories are named from it
        if (
            isinstance(cpu_share, bool)
            or not isinstance(cpu_share, int | float)
            or not 0 < cpu_share <= 1
        ):
            raise InvalidInput("cpu_share", "a share of the cores, 0 < share <= 1", cpu_share)
        self.cpu_share = float(cpu_share)
        self.site = check_text("site", site)
        self.grace_period = float(grace_period)
        self._base_environment = {
            "PATH": path if path is not None else os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        self.cpus = tuple(sorted(os.sched_getaffinity(0)))
        if site_cores is None:
            site_cores = len(self.cpus)
        if isinstance(site_cores, bool) or not isinstance(site_cores, int) or site_cores < 1:
            raise InvalidInput("site_cores", "an integer >= 1 or None", site_cores)
        self._slot_use = [0] * site_cores
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise InvalidInput("hosts", "a sequence of host names", hosts)
        if len(hosts) > site_cores:
            raise InvalidInput("hosts", f"at most one per core ({site_cores})", len(hosts))
        # Each declared host is a run of consecutive slots (the site's cores shared evenly, the
        # first hosts one more where they do not divide): a job held to some hosts takes its
        # slots there (JobSpec.hosts).
        share, extra = divmod(site_cores, max(1, len(hosts)))
        self.host_slots: dict[str, range] = {}
        first = 0
        for i, host in enumerate(hosts):
            size = share + (1 if i < extra else 0)
            self.host_slots[host] = range(first, first + size)
            first += size
        if launchers is None:
            launchers = min(len(self.cpus), MAX_LAUNCHERS)
        if isinstance(launchers, bool) or not isinstance(launchers, int) or launchers < 1:
            raise InvalidInput("launchers", "an integer >= 1 or None", launchers)
        self.allow_root = bool(allow_root)
        self._privileged = os.geteuid() == 0
        if self._privileged:
            self.run_as = self._allowed("run_as", check_text("run_as", run_as or "nobody"))
        else:  # we cannot become anyone else: jobs run as we do
            self.run_as = LocalAccount(
                pwd.getpwuid(os.geteuid()).pw_name, os.geteuid(), os.getegid()
            )
        if accounts is not None and not isinstance(accounts, Mapping):
            raise InvalidInput("accounts", "a mapping of submitter names to local accounts")
        self.accounts = MappingProxyType(
            {
                check_text("accounts", submitter): check_text(f"accounts.{submitter}", local)
                for submitter, local in (accounts or {}).items()
            }
        )
        if uids is not None and not isinstance(uids, UidAllocator):
            raise InvalidInput("uids", "a UidAllocator or None", uids)
        self.uids = uids if self._privileged else None
        if default_limits is not None and not isinstance(default_limits, Limits):
            raise InvalidInput("default_limits", "a Limits", default_limits)
        self.default_limits = default_limits or Limits()
        self._host_memory = host_memory()
        # Whole pages: the kernel rounds a memory limit down to them (the share shown is
        # the share set).
        share = self._host_memory // max(1, len(self.cpus))
        self.memory_per_cpu = share - share % mmap.PAGESIZE
        """A job's memory limit per core where neither it nor the site sets one (with
        cgroups): the host's memory shared over its CPUs, so no job of a few cores can take the
        whole host (a job of as many cores as the host has CPUs gets all of it)."""
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._links: list[LauncherLink | None] = [None] * launchers
        self._linking: list[asyncio.Lock] = []  # one per launcher, made in the loop
        self._in_flight = [0] * launchers  # starts sent to each launcher, not yet answered
        self._root_fd: int | None = None
        self._forgotten: list[Path] = []  # launch records to remove (forget_launch)
        self._app_library: asyncio.Future[str | None] | None = None  # made once, by a thread
        self._app_path: str | None = None
        self._sweeps: set[asyncio.Future[None]] = set()
        self.cgroups: cgroups.Tree | None = None
        """Where the site's job cgroups live; None: jobs have rlimits and affinity only."""
        why = "turned off"
        if confine:
            try:
                self.cgroups = cgroups.detect(str(self.root), make=False)
            except cgroups.Unavailable as exc:
                why = str(exc)
        if self.cgroups is not None:
            try:  # what a crash of an earlier broker or launcher left, now empty
                self.cgroups.sweep()
            except OSError as exc:
                log.warning("the site's cgroups: %s", exc)
        self._criu = criu.find_criu()
        if self._privileged and self.cgroups is not None and self._criu is not None:
            self.checkpoints = ("criu", "application")
        self.confinement = (
            f"a cgroup per job: {self.cgroups.describe()}"
            if self.cgroups is not None
            else f"no cgroups ({why}): rlimits and CPU affinity"
        )
        """How jobs are confined here, for people (``fleet status``, the health report)."""
        self._capped = False
        """Whether jobs' CPU time is capped at :attr:`cpu_share` of their cores."""
        if self.cpu_share < 1:
            no_cpu = f"no cgroups: {why}" if self.cgroups is None else self.cgroups.cpu_unavailable
            if no_cpu is None:
                self._capped = True
                self.confinement += f"; CPU time capped at {self.cpu_share:g} of each core"
                log.info("site %s: jobs' CPU time capped at %g of each core", site, cpu_share)
            else:
                self.confinement += f"; cpu_share {self.cpu_share:g} not applied ({no_cpu})"
                log.warning(
                    "site %s: cpu_share %g not applied, jobs run uncapped: the cpu controller "
                    "cannot be used (%s)",
                    site,
                    cpu_share,
                    no_cpu,
                )
        global _LIMITS_LOGGED
        if not _LIMITS_LOGGED:
            _LIMITS_LOGGED = True
            if self.cgroups is not None:
                log.info("jobs confined: a cgroup each, %s", self.cgroups.describe())
            else:
                log.warning(
                    "jobs not confined by cgroups (%s): rlimits and CPU affinity on %s only; "
                    "a job's processes can leave its process group",
                    why,
                    self.cpus,
                )
        closed = closed_ancestor(self.root, self.run_as) if self._privileged else None
        if closed is not None:
            log.warning(
                "jobs run as %s, who may not search %s: a job can reach its directory only as "
                "its working directory, never by absolute path (python3 script.py opens it so, "
                "and fails); make that directory searchable (chmod o+x) or keep the data "
                "directory elsewhere",
                self.run_as.name,
                closed,
            )

    def _allowed(self, field_name: str, name: str) -> LocalAccount:
        account = local_account(field_name, name)
        if account.uid == 0 and not self.allow_root:
            raise InvalidInput(field_name, "an unprivileged account (allow_root is off)", name)
        return account

    # -- the public face ----------------------------------------------------------------------

    def capacity(self) -> None:
        """None: only GBroker runs jobs here, so the site's own scheduler knows every core."""
        return None

    def resizable(self) -> Self:
        """Itself: its core slots change under running jobs (:mod:`.resize`)."""
        return self

    def jobs_run_as(self) -> str:
        """Who its jobs run as, in words; a broker that is not root says, once, in its log
        that it cannot switch users."""
        mapped = "the account --accounts maps a user to, else " if self.accounts else ""
        if os.geteuid() != 0:
            logging.getLogger("gbroker.daemon").warning(
                "%s: the broker is not root, so it cannot switch users: every job runs as the "
                "broker's own account %s",
                self.site,
                self.run_as.name,
            )
            return f"the broker's own account {self.run_as.name} (not root)"
        if self.uids is not None:
            first, last = self.uids.uids.start, self.uids.uids.stop - 1
            return f"{mapped}a uid per user from {first}-{last}"
        return f"{mapped}one account for all: {self.run_as.name} (--run-as)"

    def health(self) -> dict[str, Any]:
        """Its launchers, who its jobs run as, how they are confined and limited."""
        return {
            "launcher_pids": list(self.launcher_pids),  # none before a first job
            "uid_per_user": self.uids is not None,
            "cgroups": None if self.cgroups is None else self.cgroups.version,
            "limits": self.default_limits.rlimits(),
            # What a job that neither it nor the site limits gets.
            "shares": None
            if self.cgroups is None
            else {
                "memory_per_core": self.memory_per_cpu,
                "processes_per_core": PROCESSES_PER_CORE,
                "min_processes": MIN_PROCESSES,
            },
        }

    def _criu_here(self) -> str:
        """The ``criu`` this site checkpoints with; :class:`CheckpointError` where it cannot."""
        if "criu" not in self.checkpoints or self._criu is None:
            why = (
                "the broker is not root"
                if not self._privileged
                else "jobs have no cgroups here"
                if self.cgroups is None
                else "no criu found (scripts/setup/ensure_criu.sh builds one; or set GBROKER_CRIU)"
            )
            raise CheckpointError(f"site {self.site} cannot checkpoint jobs: {why}")
        if not criu.criu_works(self._criu):
            raise CheckpointError(f"site {self.site}: `{self._criu} check` fails on this host")
        return self._criu

    async def checkpoint(self, job_id: str, into: Path) -> Checkpoint:
        """Freeze the running job ``job_id`` and write its state into ``into`` (an existing,
        empty directory): the job's own (``application``, :mod:`.appstate`) if it says on its
        control socket that it saves its state, else a CRIU image of its process tree
        (``criu``, :meth:`_criu_checkpoint`). The job stays stopped, holding its cores and shown
        running, until :meth:`resume` or :meth:`release`. :class:`CheckpointError` if it
        cannot (the job then runs on)."""
        run = self._runs.get(job_id)
        if run is None or run.pgid is None:
            raise CheckpointError(f"job {job_id!r} is not running here")
        if run.frozen_at is not None:
            raise CheckpointError(f"job {job_id!r} is frozen already (checkpointed)")
        control = self.control_path(job_id)
        if os.path.lexists(control):
            try:
                hello = await appstate.supports_checkpoint(job_id, control, run.pgid, 5.0)
            except CheckpointError:
                hello = None
            if hello is not None and hello.checkpoint:
                into = Path(into)
                argv = procfs.cmdline(run.pgid) or (job_id,)
                run.frozen_at = time.monotonic()
                try:
                    taken = await appstate.take(job_id, control, run.pgid, run.job_dir, argv, into)
                except CheckpointError:
                    run.frozen_at = None
                    raise
                run.checkpoint_kind = appstate.KIND
                # Stopped at its safe point, but its other threads would run on while its
                # directory is packed: the whole job is frozen until resumed or released.
                group = self.cgroup_of(job_id)
                if group is not None:
                    try:
                        group.freeze()
                    except OSError as exc:
                        await self.resume(job_id)
                        raise CheckpointError(f"job {job_id!r}: freezing it: {exc}") from None
                taken = dataclasses.replace(taken, account=self._account_of_run(run))
                return self._ran_here(run, taken)
        return self._ran_here(run, await self._criu_checkpoint(job_id, into))

    def _ran_here(self, run: _Run, taken: Checkpoint) -> Checkpoint:
        """``taken``, with what the frozen job ran and used here: wall seconds from its start
        (or restore) here to its freeze, and its processes' CPU seconds (a restored job's init,
        ours, not counted)."""
        frozen_at = time.monotonic() if run.frozen_at is None else run.frozen_at
        frozen = time.time() - (time.monotonic() - frozen_at)
        group = self.cgroup_of(run.job_id)
        if group is not None:
            pids = group.members()
        else:
            pids = [] if run.pgid is None else procfs.group_members(run.pgid)
        init = run.pgid if run.ns_pid is not None else None
        cpu = sum(procfs.cpu_seconds(pid) for pid in pids if pid != init)
        ran = max(0.0, frozen - run.started_at)
        return dataclasses.replace(taken, ran_for=round(ran, 3), cpu_time=round(cpu, 3))

    def _account_of_run(self, run: _Run) -> tuple[int, int] | None:
        """Who a running job's processes run as (for reading its directory as them); None:
        the broker itself, or not known."""
        if not self._privileged or run.pgid is None:
            return None
        uid, gid = self._account_of_pid(
            run.pgid if run.ns_pid is None else procfs.child_of(run.pgid)
        )
        return None if uid < 0 else (uid, gid)

    async def _criu_checkpoint(self, job_id: str, into: Path) -> Checkpoint:
        """Freeze the running job ``job_id`` and dump its process tree with CRIU into ``into``
        (an existing, empty directory), with its manifest (:mod:`.criu`). The job stays frozen,
        holding its cores and shown running, until :meth:`resume` or :meth:`release`. Raises
        :class:`CheckpointError` (the job then runs on, thawed) with CRIU's reason."""
        run = self._runs.get(job_id)
        if run is None or run.pgid is None:
            raise CheckpointError(f"job {job_id!r} is not running here")
        if run.frozen_at is not None:
            raise CheckpointError(f"job {job_id!r} is frozen already (checkpointed)")
        if run.stop_reason is not None:
            raise CheckpointError(f"job {job_id!r} is being stopped ({run.stop_reason})")
        binary = self._criu_here()
        group = self.cgroup_of(job_id)
        if group is None:
            raise CheckpointError(f"job {job_id!r} has no cgroup to freeze")
        into = Path(into)
        if not into.is_dir() or any(into.iterdir()):
            raise CheckpointError(f"{into}: expected an existing, empty directory")
        freezer = group.paths["" if group.version == 2 else "freezer"]
        with contextlib.suppress(OSError):  # CRIU runs with the job's real uid (criu.py)
            for directory in (freezer, os.path.dirname(freezer)):
                os.chmod(directory, 0o755)  # made under the launcher's umask 077
        pid = run.ns_pid if run.ns_pid is not None else run.pgid
        inside_of = run.pgid if run.ns_pid is not None else None
        account = self._account_of_pid(run.pgid if inside_of is None else procfs.child_of(run.pgid))
        argv = criu.dump_argv(binary, pid, str(into), freezer, inside_of, account)
        frozen_at = time.monotonic()
        run.frozen_at = frozen_at
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            # It runs as the job's account, so the job's user can stop it: bounded.
            _, stderr = await asyncio.wait_for(process.communicate(), self.dump_timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            stderr = f"it did not finish within {self.dump_timeout:g} s".encode()
        if process.returncode != 0 or run.pgid is None:
            run.frozen_at = None
            with contextlib.suppress(OSError):
                self._thaw(group)
            tail = criu.log_tail(str(into / criu.DUMP_LOG))
            said = stderr.decode(errors="replace").strip()[-300:]
            raise CheckpointError(
                f"criu dump of job {job_id!r} failed (exit {process.returncode}): "
                f"{tail}{' | ' + said if said else ''}"
            )
        with contextlib.suppress(OSError):
            group.freeze()  # left stopped by CRIU; frozen too, whatever CRIU left of its freezer
        frozen_for = time.monotonic() - frozen_at
        run.checkpoint_kind = "criu"
        criu.write_manifest(
            str(into),
            {
                "job_id": job_id,
                "job_dir": str(run.job_dir),
                "pid": pid,
                "uid": account[0],
                "gid": account[1],
                "site": self.site,
                "taken_at": time.time(),
            },
        )
        return Checkpoint(
            job_id,
            "criu",
            into,
            run.job_dir,
            criu.image_size(str(into)),
            round(frozen_for, 3),
            account if account[0] >= 0 and self._privileged else None,
        )

    @staticmethod
    def _thaw(group: cgroups.Group) -> None:
        """Thaw a job's cgroup and continue its processes (CRIU left them stopped)."""
        group.freeze(False)
        for pid in group.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, SIGCONT)

    @staticmethod
    def _account_of_pid(pid: int) -> tuple[int, int]:
        """The real uid and gid of a process (a job's, for its checkpoint's manifest)."""
        try:
            info = os.stat(f"/proc/{pid}")
        except OSError:
            return (-1, -1)
        return (info.st_uid, info.st_gid)

    def _frozen_run(self, job_id: str) -> _Run:
        run = self._runs.get(job_id)
        if run is None or run.pgid is None or run.frozen_at is None:
            raise CheckpointError(f"job {job_id!r} is not frozen here (no checkpoint of it)")
        return run

    async def resume(self, job_id: str) -> None:
        """Let a job frozen by :meth:`checkpoint` run on here (its move was abandoned); after
        a restart (an adopted job), whatever stopped it: its own checkpoint, or CRIU's."""
        run = self._runs.get(job_id)
        if run is None or run.pgid is None:
            raise CheckpointError(f"job {job_id!r} is not running here")
        control = self.control_path(job_id)
        if run.checkpoint_kind != "criu" and os.path.lexists(control):
            group = self.cgroup_of(job_id)
            if group is not None:  # frozen while its directory was packed
                with contextlib.suppress(OSError):
                    group.freeze(False)
            try:
                await appstate.ask_resume(job_id, control, run.pgid, 10.0)
            except CheckpointError:
                if run.checkpoint_kind == appstate.KIND:
                    raise
            if run.checkpoint_kind == appstate.KIND:
                run.frozen_at = run.checkpoint_kind = None
                return
        run.frozen_at = run.frozen_at or time.monotonic()  # an adopted job: thaw it all the same
        group = self.cgroup_of(job_id)
        if group is not None:
            try:
                self._thaw(group)
            except OSError as exc:
                raise CheckpointError(f"job {job_id!r}: thawing its cgroup: {exc}") from None
        run.frozen_at = run.checkpoint_kind = None

    async def release(self, job_id: str) -> None:
        """A job frozen by :meth:`checkpoint` runs elsewhere now: kill it here, free its cores,
        never call its ``on_exit``; its launch record's end line says ``migrated``, so that a
        restarted broker does not take it for a failure (:attr:`ExitResult.migrated`)."""
        run = self._runs.get(job_id)
        if run is not None and run.pgid is not None and run.frozen_at is None:
            run.frozen_at = time.monotonic()  # adopted after a restart: stopped, not known so
        run = self._frozen_run(job_id)
        run.released = True
        for timer in run.timers:
            timer.cancel()
        if run.link is not None and not run.link.lost:
            run.link.post({"op": "release", "pid": run.pgid})
        else:
            self._signal(run, SIGKILL)
            group = self.cgroup_of(job_id)
            if group is not None:
                with contextlib.suppress(OSError):
                    group.freeze(False)
        if run.task is not None:
            await asyncio.wait({run.task})

    async def restore(self, spec: JobSpec, image: Path, cores: int, on_exit: ExitCallback) -> None:
        """Start a job from a checkpoint's ``image``: one its application saved (started again
        with ``GBROKER_RESTORE`` naming its state file, in its directory moved here), else a
        CRIU image (:meth:`_criu_restore`)."""
        await self._place(spec, Path(image))
        if (Path(image) / appstate.MANIFEST).exists():
            manifest = appstate.read_manifest(Path(image))
            job_dir = self.root / spec.job_id
            if not stat.S_ISREG(_lstat_mode(job_dir / manifest.state)):
                raise CheckpointError(f"{job_dir}: the job's saved state is not in place")
            environment = {**spec.environment, **appstate.restore_environment(job_dir, manifest)}
            # Started again where it stopped: what it wrote before its move stays in its streams.
            again = dataclasses.replace(spec, environment=environment, append_output=True)
            await self.start(again, cores, on_exit)
            return
        await self._criu_restore(spec, image, cores, on_exit)

    async def _place(self, spec: JobSpec, image: Path) -> None:
        """The job's directory, staged beside ``image`` (:func:`.bundles.unpack`), given to
        the job's account here and moved into place; already in place after a restart."""
        staged = bundles.staged_job(image)
        job_dir = self.root / check_job_id(spec.job_id)
        if not os.path.lexists(staged):
            if not job_dir.is_dir():
                raise CheckpointError(f"{job_dir}: the job's directory is not in place")
            return
        account = self._account_of(spec)
        try:
            await asyncio.to_thread(bundles.place, staged, job_dir, account.uid, account.gid)
        except (OSError, bundles.BundleError) as exc:
            raise CheckpointError(f"{job_dir}: placing the moved directory: {exc}") from None

    async def _criu_restore(
        self, spec: JobSpec, image: Path, cores: int, on_exit: ExitCallback
    ) -> None:
        """Start a job from a CRIU image (:meth:`checkpoint`'s, at this site or another), its
        directory already copied to :meth:`job_dir`; as :meth:`start` otherwise: ``spec``
        (its ``launch_token`` above all, recorded before CRIU runs, so that
        :meth:`settle_launch` finds it exactly once), its account and cgroup here (its
        ``cores`` and limits); ``on_exit`` hears its real exit status. The job runs in a PID
        namespace of its own (:mod:`.criu`). Raises :class:`CheckpointError` if it cannot be
        restored (a token used before, CRIU's failure: ``on_exit`` is then never called), and
        :class:`InvalidInput` for bad values, as :meth:`start`."""
        if not isinstance(spec, JobSpec):
            raise InvalidInput("spec", "a JobSpec", spec)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{spec.job_id}].cores", "an integer >= 1", cores)
        if not callable(on_exit):
            raise InvalidInput("on_exit", "a callable taking an ExitResult", on_exit)
        account = self._account_of(spec)
        self._check_new(spec.job_id)
        binary = self._criu_here()
        job_dir = self.root / spec.job_id
        if not job_dir.is_dir():
            raise CheckpointError(f"{job_dir}: the job's directory is not in place")
        loop = asyncio.get_running_loop()
        try:
            manifest = await loop.run_in_executor(
                None,
                criu.prepare_restore,
                str(Path(image).absolute()),
                str(job_dir),
                account.uid,
                account.gid,
                binary,
            )
        except criu.CriuFailed as exc:
            raise CheckpointError(str(exc)) from None
        self._check_new(spec.job_id)  # the preparation took a while
        run = _Run(
            spec.job_id,
            cores,
            spec.time_limit,
            on_exit,
            job_dir,
            token=spec.launch_token or secrets.token_hex(12),
            own_token=spec.launch_token is None,
            grace_period=self.grace_period,
            limits=self.limits_for(spec, cores),
            used=spec.used,
        )
        run.ns_pid = int(manifest["pid"])
        run.slots = self._take_slots(cores, within=self._slots_of_hosts(spec))
        run.spawned = spawned = loop.create_future()
        self._runs[spec.job_id] = run
        self._watch(run, self._run_restored(run, spec, str(Path(image).absolute()), spawned))
        try:
            failed = await asyncio.shield(spawned)
        finally:
            run.returned.set()
        if failed is not None:
            raise CheckpointError(failed)

    async def _run_restored(
        self, run: _Run, spec: JobSpec, image: str, spawned: asyncio.Future[Any]
    ) -> None:
        """A restored job: have a launcher restore it, then wait for its word, as for a start."""
        run.started_at = time.time()
        try:
            if self._app_library is None or not self._app_library.done():
                await self._prepare_app_library()
            index = self._pick()
            self._in_flight[index] += 1
            try:
                link = await self._launcher(index)
                reply = await link.request(self._restore_request(run, spec, image))
            finally:
                self._in_flight[index] -= 1
            if reply["op"] != "started":
                step, code = (reply.get("error") or ("launcher", 0))[:2]
                if step == "launch record" and code == errno.EEXIST:
                    why = f"launch token {run.token} was used already (settled or restored)"
                else:
                    why = f"{step}: {os.strerror(code)}" if code else str(step)
                raise LaunchFailed(why)
        except Exception as exc:
            if not isinstance(exc, LaunchFailed):
                log.exception("job %s: unexpected failure while restoring it", run.job_id)
            self._give_back(run)
            del self._runs[run.job_id]
            spawned.set_result(f"cannot restore job {run.job_id!r}: {exc}")
            return
        pid = int(reply["pid"])
        run.started_at = float(reply.get("at") or time.time())
        cgroup = reply.get("cgroup")
        run.cgroup = cgroup if isinstance(cgroup, str) else None
        run.pgid = pid
        run.link = link
        await self._lower_cpu_limit(run, spec)
        self._arm_limits(run)
        spawned.set_result(None)
        await self._until_ended(run, link, pid, None)

    def _restore_request(self, run: _Run, spec: JobSpec, image: str) -> dict[str, Any]:
        limits = run.limits or self.limits_for(spec, len(run.slots))
        rlimits = limits.rlimits()
        assert self._criu is not None
        account = self._account_of(spec)
        return {
            "op": "restore",
            "job_id": spec.job_id,
            "uid": account.uid,
            "gid": account.gid,
            "image": image,
            "criu": self._criu,
            "ns_pid": run.ns_pid,
            # The init's environment: what adopt() reads in /proc to know the job's handle.
            "env": {
                "PATH": self._base_environment["PATH"],
                "GBROKER_JOB_ID": spec.job_id,
                "GBROKER_JOB_DIR": str(run.job_dir),
                "GBROKER_SLOTS": ",".join(map(str, run.slots)),
            },
            "cpus": self.cpus_for(run.slots),
            "cgroup": {
                "memory": rlimits.get("memory"),
                "pids": rlimits.get("processes"),
                "cpu": self._cpu_quota(len(run.slots)),
            },
            "token": run.token,
        }

    def job_dir(self, job_id: str) -> Path:
        """The directory of a job (where its input files are staged before it starts)."""
        return self.root / check_job_id(job_id)

    async def settle_launch(self, token: str, patience: float = 5.0) -> LaunchRecord | None:
        """Decide, once and for all, whether the launch journaled under ``token`` began.

        None: it never began, and now never will (the token's record is made void here, so a
        start request still on its way to the launcher is refused). Otherwise the launcher's
        record: the job started (``pid``, ``started_at``) or failed to (``error``). A record the
        launcher has begun but not yet filled in is waited for, ``patience`` seconds at most;
        then the launch is taken as begun with an unknown outcome (``pid`` None).
        """
        check_token(token)
        launches = self.root / launcher.LAUNCHES
        launches.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(launches / token, flags, 0o600)
        except FileExistsError:
            pass
        else:
            os.write(fd, b'{"void": true}\n')
            os.close(fd)
            return None
        deadline = time.monotonic() + patience
        while True:
            text = (launches / token).read_bytes()
            if b"\n" in text:
                break
            if time.monotonic() >= deadline:
                return LaunchRecord(None, error="the launcher did not record how the start went")
            await asyncio.sleep(0.05)
        # Its first line; the launcher appends how the job ended as a second one.
        record = json.loads(text.split(b"\n", 1)[0])
        if record.get("void"):  # settled before, by an earlier recovery: it never began
            return None
        if record.get("pid") is None:
            step, code = (record.get("error") or ("launcher", 0))[:2]
            return LaunchRecord(None, error=f"{step}: {os.strerror(code) if code else 'failed'}")
        return LaunchRecord(int(record["pid"]), float(record["started_at"]))

    def forget_launch(self, token: str) -> None:
        """Delete a launch's record, once its end is acknowledged by the job's owner.

        Soon, not at once, and not in the event loop's thread: removing a file costs tens of
        microseconds on some file systems (ext4 without a journal), one per job. The records
        of a round go together to a worker thread; :meth:`aclose` waits for them. A record
        left by a crash before its removal is harmless: its token is never used again."""
        self._forgotten.append(self.root / launcher.LAUNCHES / check_token(token))
        if len(self._forgotten) == 1:
            asyncio.get_running_loop().call_soon(self._sweep)

    def _sweep(self) -> None:
        paths, self._forgotten = self._forgotten, []
        if paths:
            sweep = asyncio.get_running_loop().run_in_executor(None, _unlink_all, paths)
            self._sweeps.add(sweep)
            sweep.add_done_callback(self._sweeps.discard)

    def account_for(self, submitter: str) -> str | None:
        """Who ``submitter``'s jobs run as, for :attr:`JobSpec.user`: the local account
        ``accounts`` maps it to, else ``#UID``, its own uid from ``uids``, else None
        (``run_as``). Raises :class:`InvalidInput` when ``uids`` has no uid left for it."""
        local = self.accounts.get(submitter)
        if local is not None or self.uids is None:
            return local
        return f"#{self.uids.uid_for(submitter)}"

    async def start(self, spec: JobSpec, cores: int, on_exit: ExitCallback) -> None:
        """Start ``spec`` on ``cores`` cores; ``on_exit`` hears how it ended, exactly once.

        Returns as soon as the job's program runs or the launch has failed (the failure then
        goes to ``on_exit`` too). Raises :class:`InvalidInput` for bad values (a job id that is
        already running here, a ``user`` that is no allowed local account), and
        :class:`InternalError` once the executor is closing; in both cases ``on_exit`` is never
        called. If the caller is cancelled while this waits for the spawn, the job still starts
        and is still reported.
        """
        if not isinstance(spec, JobSpec):
            raise InvalidInput("spec", "a JobSpec", spec)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{spec.job_id}].cores", "an integer >= 1", cores)
        if not callable(on_exit):
            raise InvalidInput("on_exit", "a callable taking an ExitResult", on_exit)
        account = self._account_of(spec)
        self._check_new(spec.job_id)
        loop = asyncio.get_running_loop()
        run = _Run(
            spec.job_id,
            cores,
            spec.time_limit,
            on_exit,
            self.root / spec.job_id,
            # Every start has a launch record, where the launcher records how the job ended
            # (outside the job's reach): the caller's token, else one of ours.
            token=spec.launch_token or secrets.token_hex(12),
            own_token=spec.launch_token is None,
            grace_period=self.grace_period,
            limits=self.limits_for(spec, cores),
            used=spec.used,
        )
        run.slots = self._take_slots(cores, within=self._slots_of_hosts(spec))
        run.spawned = spawned = loop.create_future()
        self._runs[spec.job_id] = run
        self._watch(run, self._run(run, spec, account, spawned))
        # Shielded: cancelling this await must not cancel the launch, which is already ours to
        # report; the task carries on and on_exit still hears of it.
        try:
            await asyncio.shield(spawned)
        finally:
            run.returned.set()  # a job that ended at once is reported only now

    def adopt(
        self,
        job_id: str,
        pgid: int,
        cores: int,
        started_at: float,
        time_limit: float | None,
        on_exit: ExitCallback,
        launch_token: str | None = None,
        slots: tuple[int, ...] = (),
        used: Used = NOTHING,
    ) -> None:
        """Take over a job that an earlier executor over the same root started.

        A plain (not async) method, to be called from within the event loop, typically by a
        restarted broker for each job its journal shows running. ``pgid`` is the job's process
        group (:attr:`RunningJob.pid` as the earlier executor showed it); ``cores``,
        ``started_at`` (wall clock) and ``time_limit`` are the job's as recorded at its start;
        ``launch_token`` the token its start carried, if any, whose launch record tells how it
        ended; ``slots`` its core slots as journaled after it was resized (default: as its
        environment recorded them at its start); ``used`` what a job moved here had used
        before (:attr:`JobSpec.used`: its time limit holds for what is left of it).

        If the group still holds the job (checked in ``/proc``: see the module's docstring),
        the job is watched, shows in :meth:`running`, keeps its core slots, can be cancelled,
        and its time limit holds from ``started_at`` (one already past stops it at once);
        ``on_exit`` hears how it ended, exactly once. If the job has ended (or the group is not
        the job's any more), it is reported from its launch record, or with an unknown status
        (``exit_code`` None and ``error`` saying so) if it has none; never from inside this
        call, and a group that is not the job's is never signalled.

        Raises :class:`InvalidInput` for bad values, a job id already running here included,
        and :class:`InternalError` once the executor is closing; ``on_exit`` is then never
        called.
        """
        job_id = check_job_id(job_id)
        if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid <= 1:
            raise InvalidInput(f"job[{job_id}].pgid", "a process group id > 1", pgid)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{job_id}].cores", "an integer >= 1", cores)
        started = _check_number(
            f"job[{job_id}].started_at", started_at, "a wall-clock time (seconds)", positive=False
        )
        limit = None
        if time_limit is not None:
            limit = _check_number(
                f"job[{job_id}].time_limit", time_limit, "seconds > 0 or None", positive=True
            )
        if not callable(on_exit):
            raise InvalidInput("on_exit", "a callable taking an ExitResult", on_exit)
        token = None if launch_token is None else check_token(launch_token)
        self._check_new(job_id)
        loop = asyncio.get_running_loop()
        if not isinstance(used, Used):
            raise InvalidInput(f"job[{job_id}].used", "a Used", used)
        run = _Run(job_id, cores, limit, on_exit, self.root / job_id, started, token, used=used)
        run.cgroup = self._recorded_cgroup(token)
        run.grace_period = self.grace_period
        run.returned.set()
        leader = procfs.proc_stat(pgid)
        if procfs.alive(leader) and leader.pgrp == pgid:
            environ = self._job_environ(pgid, run, leader=True)
            if environ is not None:
                run.pgid = pgid
                valid = tuple(slot for slot in slots if 0 <= slot < len(self._slot_use))
                wanted = valid if len(valid) == cores else _slots_of(environ, len(self._slot_use))
                run.slots = self._take_slots(cores, wanted)
                self._runs[job_id] = run
                left = run.time_left()
                if left is not None:
                    delay = max(0.0, started + left - time.time())
                    run.timers.append(loop.call_later(delay, self._stop, run, StopReason.TIMED_OUT))
                self._watch(run, self._follow(run, leader.starttime))
                log.info("job %s: adopted process group %d", job_id, pgid)
                return
            log.warning("job %s: process group %d is not the job's any more", job_id, pgid)
        elif any(self._job_environ(pid, run) is not None for pid in procfs.group_members(pgid)):
            # The leader is gone but some of what the job forked is not: it goes now, as it
            # would have gone with the leader had a launcher been watching.
            self._killpg(job_id, pgid, SIGKILL)
        # Ended, or the group is someone else's now: all there is to tell is in the file.
        result = self._recorded_end(run, pgid, _UNKNOWN_WHILE_DOWN)
        self._watch(run, self._deliver(run, result))

    def cancel(self, job_id: str) -> bool:
        """Stop a job: SIGTERM to its group, SIGKILL after the grace period.

        Returns False if no such job is running (it ended already or never started here);
        True if it is being stopped, by this call or by an earlier one. Its result comes
        through ``on_exit``, marked cancelled (unless a time-out was first).
        """
        run = self._runs.get(job_id)
        if run is None:
            return False
        self._stop(run, StopReason.CANCELLED)
        return True

    def limits_for(self, spec: JobSpec, cores: int) -> Limits:
        """The limits a job of ``cores`` cores runs under: its own, over the site's; with
        cgroups, memory and processes that neither sets get a share of the host
        (:attr:`memory_per_cpu`, :data:`PROCESSES_PER_CORE`), never none."""
        limits = self.default_limits.over(spec.limits)
        if self.cgroups is None or (limits.memory is not None and limits.processes is not None):
            return limits
        return dataclasses.replace(
            limits,
            memory=limits.memory or min(self._host_memory, self.memory_per_cpu * cores),
            processes=limits.processes or max(MIN_PROCESSES, PROCESSES_PER_CORE * cores),
        )

    def control_path(self, job_id: str) -> Path:
        """Where a malleable job listens for its site (:mod:`gbroker.app.malleable`)."""
        return self.root / check_job_id(job_id) / CONTROL_SOCKET

    def slots_of(self, job_id: str) -> tuple[int, ...]:
        """The core slots a running job holds (journaled with its size: see :meth:`adopt`)."""
        run = self._running_run(job_id)
        return run.slots

    def resize_slots(self, job_id: str, cores: int) -> tuple[int, ...]:
        """Give a running job ``cores`` core slots: the ones it holds and the least used
        others (growing), or the first ``cores`` of its own (shrinking). Only the executor's
        bookkeeping changes; :meth:`pin` moves the job's processes. The job's CPUs after."""
        run = self._running_run(job_id)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{job_id}].cores", "an integer >= 1", cores)
        held = run.slots
        use = self._slot_use
        if cores < len(held):
            for slot in held[cores:]:
                use[slot] -= 1
            run.slots = held[:cores]
        elif cores > len(held):
            others = sorted((s for s in range(len(use)) if s not in held), key=use.__getitem__)
            added = tuple(others[: cores - len(held)])
            for slot in added:
                use[slot] += 1
            run.slots = held + added
        run.cores = cores
        return self.cpus_for(run.slots)

    def pin(self, job_id: str) -> tuple[int, ...]:
        """Move every thread of every process of a running job to exactly the CPUs of its
        slots (``sched_setaffinity``); the CPUs. Twice over: a process forked meanwhile took
        its parent's set before that parent moved."""
        run = self._running_run(job_id)
        cpus = self.cpus_for(run.slots)
        assert run.pgid is not None
        if self.cgroups is not None:  # the kernel moves every task of the cgroup, forks too
            group = self.cgroup_of(job_id)
            if group is not None and group.exists():
                group.set_cpus(cpus)
                if self._capped:
                    group.set_cpu_quota(self._cpu_quota(len(run.slots)))
                return cpus
        for _ in range(2):
            for pid in procfs.group_members(run.pgid):
                try:
                    tasks = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue  # it ended meanwhile
                for tid in tasks:
                    with contextlib.suppress(ProcessLookupError):
                        os.sched_setaffinity(int(tid), cpus)
        return cpus

    def _running_run(self, job_id: str) -> _Run:
        run = self._runs.get(job_id)
        if run is None or run.pgid is None:
            raise InvalidInput("job_id", "a job running here", job_id)
        return run

    def running_job(self, job_id: str) -> RunningJob | None:
        """The running job ``job_id`` (None: not running here): :meth:`running` for one job,
        without a snapshot of all of them."""
        run = self._runs.get(job_id)
        return None if run is None or run.pgid is None else run.view()

    def running(self) -> Mapping[str, RunningJob]:
        """A snapshot of the jobs whose processes are alive, by job id."""
        return MappingProxyType(
            {job_id: run.view() for job_id, run in self._runs.items() if run.pgid is not None}
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has begun: no job may start any more."""
        return self._closed

    @property
    def launcher_count(self) -> int:
        """How many launchers start this executor's jobs, side by side."""
        return len(self._links)

    @property
    def launcher_pids(self) -> tuple[int, ...]:
        """The pids of the launchers this executor is connected to (none before a first job)."""
        return tuple(link.pid for link in self._links if link is not None and not link.lost)

    def cpus_of(self, job_id: str) -> tuple[int, ...]:
        """The host CPUs a running job is bound to (its slots mapped onto ``cpus``)."""
        run = self._runs.get(job_id)
        if run is None:
            raise InvalidInput("job_id", "a job running here", job_id)
        return self.cpus_for(run.slots)

    async def aclose(self, detach: bool = False) -> None:
        """Refuse new jobs, then stop every running job and wait until each has been reported.

        With ``detach=True`` (a broker shutting down to restart), the running jobs are left
        alone instead: they keep running under their launcher, which still records how they
        end, for the next executor over the same root to :meth:`adopt`; nothing is reported for
        them. Starts in progress finish first (a job then either runs, detached, or is reported
        as failed), and jobs already being stopped are still stopped and reported: a job that
        was cancelled or timed out must not outlive the broker for that.
        """
        self._closed = True
        if detach:
            pending = {
                run.spawned
                for run in self._runs.values()
                if run.spawned is not None and not run.spawned.done()
            }
            if pending:
                await asyncio.wait(pending)
            for run in list(self._runs.values()):
                if run.pgid is not None and run.stop_reason is None:
                    self._detach(run)
        while self._tasks:
            for run in list(self._runs.values()):
                self._stop(run, StopReason.SHUTDOWN)
            await asyncio.wait(set(self._tasks))
        self._sweep()
        if self._sweeps:
            await asyncio.wait(set(self._sweeps))
        for index, link in enumerate(self._links):
            if link is not None:
                await link.aclose()  # a launcher with neither jobs nor brokers ends
                self._links[index] = None
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        _reap_launchers()
        if self.cgroups is not None and not detach:
            await self._remove_site_group(self.cgroups)

    async def _remove_site_group(self, tree: cgroups.Tree) -> None:
        """Remove the site's cgroup once its launchers, leaving, have removed their jobs'
        groups (they do so as they end, after we closed their links); a job left running
        keeps it."""
        deadline = time.monotonic() + SITE_GROUP_WAIT
        while True:
            try:
                if tree.remove():
                    return
            except OSError as exc:
                log.warning("the site's cgroup: %s", exc)
                return
            if time.monotonic() >= deadline:
                log.info("the site's cgroup stays: %s is still in use", tree.describe())
                return
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- core slots and accounts --------------------------------------------------------------

    def _slots_of_hosts(self, spec: JobSpec) -> tuple[int, ...] | None:
        """The slots of the hosts ``spec`` is held to (None: any); refused when the site has
        no such host or they have fewer slots than the job's cores."""
        if not spec.hosts or not self.host_slots:
            return None
        unknown = [h for h in spec.hosts if h not in self.host_slots]
        if unknown:
            raise InvalidInput(
                f"job[{spec.job_id}].hosts", f"hosts of {self.site}: {', '.join(self.host_slots)}",
                ", ".join(unknown),
            )  # fmt: skip
        return tuple(slot for h in spec.hosts for slot in self.host_slots[h])

    def _take_slots(
        self, cores: int, wanted: tuple[int, ...] = (), within: tuple[int, ...] | None = None
    ) -> tuple[int, ...]:
        """``wanted`` if it names ``cores`` slots, else the ``cores`` least used ones (of
        ``within``, if given: the slots of the hosts a job is held to).

        Least used rather than free: a scheduler that believes cores free before the executor
        has seen their job end (or a site that declares more cores than it has) shares a slot
        rather than failing a start.
        """
        use = self._slot_use
        if len(wanted) != cores:
            pool = range(len(use)) if within is None else within
            wanted = tuple(sorted(sorted(pool, key=use.__getitem__)[:cores]))
        for slot in wanted:
            use[slot] += 1
        return wanted

    def _give_back(self, run: _Run) -> None:
        for slot in run.slots:
            self._slot_use[slot] -= 1
        run.slots = ()

    def cpus_for(self, slots: tuple[int, ...]) -> tuple[int, ...]:
        """The host CPUs of core slots."""
        cpus = self.cpus
        return tuple(sorted({cpus[slot % len(cpus)] for slot in slots}))

    def owner_for(self, submitter: str | None) -> Account:
        """The uid and gid ``submitter``'s jobs run as here (:class:`~.backend.Backend`)."""
        if not self._privileged:  # every job runs as we do
            return Account(self.run_as.uid, self.run_as.gid)
        user = None if submitter is None else self.account_for(submitter)
        account = self._account_named(user, "submitter")
        return Account(account.uid, account.gid)

    def _account_of(self, spec: JobSpec) -> LocalAccount:
        return self._account_named(spec.user, f"job[{spec.job_id}].user")

    def _account_named(self, user: str | None, field_name: str) -> LocalAccount:
        if user is None or user == self.run_as.name:
            return self.run_as
        if not self._privileged:
            raise InvalidInput(
                field_name,
                f"the broker's own account {self.run_as.name!r} (the broker is not root)",
                user,
            )
        if user.startswith("#") and self.uids is not None:  # a uid of a user's own
            number = user[1:]
            if not (number.isdigit() and self.uids.owns(int(number))):
                raise InvalidInput(field_name, "a uid the site gave a user", user)
            return LocalAccount(user, int(number), int(number))
        if user not in self.accounts.values():
            raise InvalidInput(field_name, "an account named in the site's accounts", user)
        return self._allowed(field_name, user)

    # -- the launcher -------------------------------------------------------------------------

    def _pick(self) -> int:
        """The launcher for the next start: the first with no start in flight, else the one
        with the fewest. A launcher waits on the kernel for much of a start (the job's
        directory and files, the spawn until the child has executed); side by side, their
        waits overlap. One start at a time always goes to launcher 0."""
        in_flight = self._in_flight
        return min(range(len(in_flight)), key=in_flight.__getitem__)

    async def _launcher(self, index: int = 0) -> LauncherLink:
        """The link to the root's launcher number ``index``: the running one, else one we
        start."""
        link = self._links[index]
        if link is not None and not link.lost:
            return link
        while len(self._linking) < len(self._links):
            self._linking.append(asyncio.Lock())
        async with self._linking[index]:
            link = self._links[index]
            if link is None or link.lost:
                link = self._links[index] = await self._connect(index)
            return link

    async def _parent_link(self, pid: int) -> LauncherLink | None:
        """The link to the launcher that is the parent of process ``pid`` (an adopted job's
        leader), reaching the root's launchers as needed; None if none of them is."""
        stat = procfs.proc_stat(pid)
        if stat is None:
            return None
        for index in range(len(self._links)):
            try:
                link = await self._launcher(index)
            except LaunchFailed:
                continue
            if link.pid == stat.ppid:
                return link
        return None

    async def _connect(self, index: int) -> LauncherLink:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._root_fd is None:
            self._root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        # Through the directory's descriptor: a socket's path may not exceed 107 bytes.
        address = f"/proc/self/fd/{self._root_fd}/{launcher.socket_name(index)}"
        for _attempt in range(5):
            try:
                reader, writer = await asyncio.open_unix_connection(address)
            except (FileNotFoundError, ConnectionRefusedError):
                await self._spawn_launcher(index)
                continue
            try:
                line = await reader.readline()
            except ConnectionError:
                line = b""
            if not line:
                # It retired (idle) with our connection still in its backlog: another try
                # finds its socket gone and starts a new launcher.
                writer.close()
                continue
            hello = json.loads(line)
            link = LauncherLink(reader, writer, int(hello.get("pid", 0)))
            if hello.get("version") == launcher.PROTOCOL:
                return link
            # An older launcher: it keeps its jobs, we start ours beside it.
            log.info("retiring launcher %s (protocol %s)", hello.get("pid"), hello.get("version"))
            try:
                await link.request({"op": "retire"})
            finally:
                await link.aclose()
        raise LaunchFailed(f"cannot reach a launcher at {self.root / launcher.socket_name(index)}")

    async def _spawn_launcher(self, index: int) -> None:
        _reap_launchers()
        ready, ready_writer = os.pipe()
        try:
            log_fd = os.open(
                self.root / launcher.LOG_NAME,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            with open(log_fd, "ab") as log_file:
                os.fchmod(log_fd, 0o600)  # one an older release made 0644 too
                child = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",  # nothing from our PYTHON* variables or the cwd
                        "-S",  # no site: a small interpreter to fork jobs from
                        _LAUNCHER_SCRIPT,
                        str(self.root),
                        str(ready_writer),
                        str(index),
                        *_title_path(),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file,
                    start_new_session=True,  # beyond a killpg of the broker's group
                    close_fds=True,
                    pass_fds=(ready_writer,),
                )
        except BaseException:
            os.close(ready)
            raise
        finally:
            os.close(ready_writer)
        _LAUNCHERS.append(child)
        told = await read_to_end(ready)
        if told not in (b"ok", b"busy"):  # busy: another one took the root; we use it
            raise LaunchFailed(f"the launcher did not start; see {self.root / launcher.LOG_NAME}")
        log.info("launcher %d (#%d) started for %s", child.pid, index, self.root)

    # -- one job's life -----------------------------------------------------------------------

    def _check_new(self, job_id: str) -> None:
        if self._closed:
            raise InternalError("the executor is closed: no job may start")
        if job_id in self._runs:
            raise InvalidInput("job_id", "a job that is not already running here", job_id)

    def _watch(self, run: _Run, watcher: Coroutine[Any, Any, None]) -> None:
        """Run ``watcher`` (a coroutine that ends with the job's report) as the job's task."""
        task = asyncio.get_running_loop().create_task(
            watcher, name=f"gbroker.executor:{run.job_id}"
        )
        run.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, run: _Run, spec: JobSpec, account: LocalAccount, spawned: asyncio.Future[None]
    ) -> None:
        """A started job: have the launcher fork it, then wait for the launcher's word."""
        run.started_at = time.time()
        try:
            if self._app_library is None or not self._app_library.done():
                await self._prepare_app_library()
            index = self._pick()
            self._in_flight[index] += 1
            try:
                try:
                    link = await self._launcher(index)
                    pid = await self._spawn(link, run, spec, account)
                finally:
                    self._in_flight[index] -= 1
            except Exception as exc:
                if isinstance(exc, LaunchFailed):
                    error = f"cannot start job {run.job_id!r}: {exc}"
                else:  # our bug or the platform's; the job is still reported, once
                    log.exception("job %s: unexpected failure while starting it", run.job_id)
                    error = f"cannot start job {run.job_id!r}: internal error: {exc!r}"
                self._give_back(run)
                del self._runs[run.job_id]
                ended_at = time.time()
                spawned.set_result(None)
                await run.returned.wait()
                self._report(run, run.result(ended_at, error=error))
                return
            run.pgid = pid  # the job leads its own session, hence its own group
            run.link = link
            if run.stop_reason is not None:  # cancelled while it was being spawned
                reason, run.stop_reason = run.stop_reason, None
                self._stop(run, reason)
            self._arm_limits(run)
        finally:
            if not spawned.done():
                spawned.set_result(None)
        await self._until_ended(run, link, pid, None)

    async def _until_ended(
        self, run: _Run, link: LauncherLink, pid: int, leader_starttime: int | None
    ) -> None:
        """Wait for the launcher's word of the job's end (or poll, if it goes), then report."""
        exited = link.exits.get(pid)
        try:
            message = None if exited is None else await asyncio.shield(exited)
            if link.exits.get(pid) is exited:
                del link.exits[pid]
            if message is None:  # the launcher is gone: the job is init's now
                run.link = None
                if leader_starttime is None:
                    stat = procfs.proc_stat(pid)
                    leader_starttime = stat.starttime if stat is not None else -1
                await self._poll(run, pid, leader_starttime)
            await run.returned.wait()
        except asyncio.CancelledError:
            if not run.detached:  # the loop is being torn down under us: leave nothing running
                self._signal(run, SIGKILL)
            raise
        self._end(run)
        if run.released:  # it runs elsewhere now: its end here is nobody's business
            return
        if message is None:
            await self._end_recorded(run)
            self._report(run, self._recorded_end(run, pid, _UNKNOWN_UNRECORDED))
            return
        ended_at = max(run.started_at, message["ended_at"])
        result = run.result(
            ended_at,
            exit_code=message["exit_code"],
            signal=message["signal"],
            hit=message.get("limits"),
            cpu_time=message.get("cpu_time"),
        )
        self._report(run, result)

    async def _follow(self, run: _Run, leader_starttime: int) -> None:
        """An adopted job: ask the launcher to tell us of its end, else poll ``/proc``."""
        assert run.pgid is not None
        pgid = run.pgid
        link: LauncherLink | None = None
        reply: dict[str, Any] = {"running": False}
        try:
            # Its parent: one of the root's launchers (whose watch says whether it still is),
            # else nobody who could tell us of its end (a launcher killed, or retired).
            link = await self._parent_link(pgid)
            if link is not None:
                reply = await link.request({"op": "watch", "pid": pgid}, watch=pgid)
        except LaunchFailed:
            reply = {"running": False}
        except asyncio.CancelledError:
            if not run.detached:
                self._signal(run, SIGKILL)
            raise
        if link is not None and reply.get("running"):
            run.link = link
            await self._until_ended(run, link, pgid, leader_starttime)
            return
        try:
            await self._poll(run, pgid, leader_starttime)
        except asyncio.CancelledError:
            if not run.detached:
                self._signal(run, SIGKILL)
            raise
        self._end(run)
        await self._end_recorded(run)
        self._report(run, self._recorded_end(run, pgid, _UNKNOWN_UNRECORDED))

    @staticmethod
    async def _poll(run: _Run, pid: int, leader_starttime: int) -> None:
        """Until the leader has gone. A zombie has ended, but an absent one has been reaped,
        hence recorded by its launcher if it had one: wait for that, briefly."""
        zombie_polls = 0
        while True:
            leader = procfs.proc_stat(pid)
            if leader is None or leader.starttime != leader_starttime:
                return
            if not procfs.alive(leader):
                zombie_polls += 1
                if zombie_polls > 5:  # a parent that does not reap: no record to wait for
                    return
            await asyncio.sleep(_POLL_INTERVAL)

    async def _end_recorded(self, run: _Run, patience: float = 1.0) -> None:
        """Until the launch record has the job's end, ``patience`` seconds at most: a launcher
        that reaped the leader writes it a moment later (a launcher that is gone never will)."""
        deadline = time.monotonic() + patience
        while self._end_record(run)[0] is None and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_INTERVAL / 4)

    async def _deliver(self, run: _Run, result: ExitResult) -> None:
        """Report an adopted job that had already ended: from a task, never inside adopt()."""
        self._report(run, result)

    def _end(self, run: _Run) -> None:
        """The leader has ended: stop the timers, kill what is left of the group, forget it."""
        for timer in run.timers:
            timer.cancel()
        if run.link is None:  # the launcher killed the rest already, if it was there
            self._signal(run, SIGKILL)
            self._close_group(run)
        run.pgid = None
        self._give_back(run)
        del self._runs[run.job_id]

    def _detach(self, run: _Run) -> None:
        """Leave a running job alone for good: no signal, no report, no watcher."""
        run.detached = True
        for timer in run.timers:
            timer.cancel()
        self._give_back(run)
        del self._runs[run.job_id]
        if run.task is not None:
            run.task.cancel()
        log.info("job %s: left running in process group %s", run.job_id, run.pgid)

    def _end_record(self, run: _Run) -> tuple[dict[str, Any] | None, float, Path | None]:
        """What the launcher recorded of a job's end, when, and where: the end line of its
        launch record (in the root's records directory, out of every job's reach). Never a
        file in the job's directory: a job could write that, and forge how it ended."""
        if run.token is None:
            return None, 0.0, None
        path = self.root / launcher.LAUNCHES / run.token
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            lines = []
        for line in lines[1:]:  # the first line is the start's
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash of the host: not the one we want
            if isinstance(record, dict) and isinstance(record.get("ended_at"), float):
                return record, record["ended_at"], path
        return None, 0.0, path

    def _recorded_end(self, run: _Run, pgid: int, unknown: str) -> ExitResult:
        """How an adopted job ended, from the launcher's record of it (its launch record's end
        line); ``unknown`` as the error without one."""
        self._close_group(run)
        record, recorded_at, path = self._end_record(run)
        ended_at = max(run.started_at, recorded_at)  # a job never ends before it starts
        if (
            isinstance(record, dict)
            and record.get("pid") == pgid  # not a file left by an earlier run of the same id
            and all(
                key in record
                and (record[key] is None or type(record[key]) is int)  # bool is not an int here
                for key in ("exit_code", "signal")
            )
        ):
            hit = record.get("limits")
            used = record.get("cpu_time")
            return run.result(
                ended_at,
                exit_code=record["exit_code"],
                signal=record["signal"],
                hit=hit if isinstance(hit, dict) else None,
                cpu_time=used if isinstance(used, int | float) else None,
            )
        if record is not None:
            log.warning("job %s: end record %s is not the one of group %d", run.job_id, path, pgid)
        if run.killed:  # we killed the group before anything could write
            return run.result(time.time(), signal=SIGKILL)
        return run.result(time.time(), error=unknown)

    def _job_environ(self, pid: int, run: _Run, leader: bool = False) -> dict[bytes, bytes] | None:
        """Process ``pid``'s environment if it was started for ``run``'s job over our root.

        A ``leader``'s empty environment is read again, for a few milliseconds: a process in
        the middle of its ``exec`` shows none, and a job spawned an instant ago may still be
        there (a vfork parent, the launcher, resumes once the child's new memory is in place,
        before the kernel has put its environment in it), so an adoption right after a start
        saw its own job as a stranger's (tests/site/test_launchers.py, about one run in ten).
        Not the other members of a group: a job's children may have no environment at all."""
        raw = b""
        for _attempt in range(_ENVIRON_READS if leader else 1):
            try:
                with open(f"/proc/{pid}/environ", "rb") as file:
                    raw = file.read()
            except OSError:  # gone, or not ours to read: not the job's either way
                return None
            if raw:
                break
            time.sleep(_ENVIRON_PAUSE)
        entries = raw.split(b"\0")
        environ = dict(entry.split(b"=", 1) for entry in entries if b"=" in entry)
        if environ.get(b"GBROKER_JOB_ID") != os.fsencode(run.job_id):
            return None
        job_dir = environ.get(b"GBROKER_JOB_DIR", b"")
        # Compared resolved: the same root may be spelt differently by the broker's successor.
        if os.path.realpath(job_dir) != os.path.realpath(os.fsencode(run.job_dir)):
            return None
        return environ

    async def _spawn(
        self, link: LauncherLink, run: _Run, spec: JobSpec, account: LocalAccount
    ) -> int:
        """Have the launcher fork the job; its pid. Raises :class:`LaunchFailed` if it fails."""
        limits = run.limits or self.limits_for(spec, len(run.slots))
        confine = None
        rlimits = limits.rlimits()
        if "cpu_time" in rlimits:  # a moved job's: what is left (none: _arm_limits stops it)
            rlimits["cpu_time"] = max(1, run.cpu_left() or 0)
        if self.cgroups is not None:  # the cgroup holds memory and processes, for all the job
            confine = {
                "memory": rlimits.pop("memory", None),
                "pids": rlimits.pop("processes", None),
                "cpu": self._cpu_quota(len(run.slots)),
            }
        argv = [spec.executable, *spec.arguments]
        if spec.ranks is not None:  # an MPI job: its ranks, through the flavour's mpiexec
            argv = self._ranks_argv(spec.ranks, argv, run.slots)
        reply = await link.request(
            {
                "op": "start",
                "job_id": spec.job_id,
                "argv": argv,
                "env": self._environment(run, spec),
                "job_dir": str(run.job_dir),
                "cwd": spec.working_directory,
                "stdin": spec.stdin,
                "stdout": spec.stdout,
                "stderr": spec.stderr,
                "append": spec.append_output,
                "uid": account.uid,
                "gid": account.gid,
                "cpus": self.cpus_for(run.slots),
                "limits": rlimits,
                "cgroup": confine,
                "helper": EXEC_HELPER,
                "token": run.token,
            }
        )
        if reply["op"] == "started":
            run.started_at = float(reply.get("at") or time.time())
            cgroup = reply.get("cgroup")
            run.cgroup = cgroup if isinstance(cgroup, str) else None
            return int(reply["pid"])
        step, code = reply.get("error", ("launcher", 0))
        reason = os.strerror(code) if code else "unknown error"
        if step == "exec":
            if code == errno.ENOENT:
                reason += " (looked up on PATH and from the working directory)"
            raise LaunchFailed(f"executable {spec.executable!r}: {reason}")
        raise LaunchFailed(f"{step}: {reason}")

    def _ranks_argv(
        self, ranks: spmd.Ranks, command: list[str], slots: tuple[int, ...]
    ) -> list[str]:
        """The mpiexec line of an SPMD job's ranks, bound to its CPUs one per slot (a CPU
        repeats where the site has more cores than the host); the launchers are looked up on
        the jobs' PATH. Raises :class:`LaunchFailed` where the flavour's is missing."""
        path = self._base_environment["PATH"]
        cpus = [self.cpus[slot % len(self.cpus)] for slot in sorted(slots)]
        try:
            return spmd.local_argv(
                ranks,
                command,
                cpus,
                spmd.installed_launchers(lambda name: shutil.which(name, path=path)),
                taskset=shutil.which("taskset", path=path) or "taskset",
            )
        except spmd.LauncherMissing as exc:
            raise LaunchFailed(f"its MPI ranks: {exc}") from None

    async def _prepare_app_library(self) -> None:
        """Make the root's application library, once (:mod:`.app_library`): a thread copies
        its few files while the loop goes on; every start waits for the first attempt."""
        if self._app_library is None:
            self._app_library = asyncio.get_running_loop().run_in_executor(
                None, self._made_app_library
            )
        self._app_path = await asyncio.shield(self._app_library)

    def _made_app_library(self) -> str | None:
        try:
            return str(app_library.prepare(self.root))
        except OSError as exc:  # jobs run without it: a Python one then needs its own copy
            log.warning("jobs start without gbroker.app on their path: %s", exc)
            return None

    def _environment(self, run: _Run, spec: JobSpec) -> dict[str, str]:
        # Absolute: the job runs in its directory, not in the broker's working directory.
        job_dir = str(run.job_dir)
        env = {**self._base_environment, "HOME": job_dir}
        env.update(spec.environment)
        env.setdefault("OMP_NUM_THREADS", str(run.cores))
        env.update(
            GBROKER_JOB_ID=spec.job_id,
            GBROKER_CORES=str(run.cores),
            GBROKER_SITE=self.site,
            GBROKER_JOB_DIR=job_dir,
            GBROKER_CPUS=",".join(map(str, self.cpus_for(run.slots))),
            GBROKER_SLOTS=",".join(map(str, run.slots)),
        )
        app = self._app_path
        if app is not None:  # last on the job's path: a job's own copy of gbroker.app wins
            env[app_library.APP_PATH_ENV] = app
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), app) if p)
        # Every job may listen on its control socket: a malleable job's resizes, any job's own
        # checkpoints (gbroker.app.malleable); a job that does not use it never knows.
        env[CONTROL_ENV] = str(self.control_path(spec.job_id))
        return env

    def _arm_limits(self, run: _Run) -> None:
        """A job's process exists now: its wall-time limit runs from here (what is left of it,
        for a moved job), and a moved job with none of its CPU time left is stopped at once."""
        left = run.time_left()
        if left is not None:
            loop = asyncio.get_running_loop()
            run.timers.append(loop.call_later(left, self._stop, run, StopReason.TIMED_OUT))
        if run.cpu_left() == 0:
            self._stop(run, StopReason.CPU_LIMIT)

    async def _lower_cpu_limit(self, run: _Run, spec: JobSpec) -> None:
        """A job CRIU restored has the rlimits it had (CRIU restores them), but its processes'
        CPU time starts from nothing: RLIMIT_CPU becomes what is left of its CPU-time limit,
        for each of its processes (not its init, which is ours), as at a start (SIGXCPU then,
        SIGKILL a second later). prlimit(2) on another user's process wants CAP_SYS_RESOURCE,
        which a container's root often lacks, or that user's ids: ``prlimit(1)`` runs as the
        job's account."""
        left = run.cpu_left()
        group = self.cgroup_of(run.job_id)
        pids = [] if group is None else [pid for pid in group.members() if pid != run.pgid]
        if not left or not pids:
            return
        account = self._account_of(spec)
        own = os.geteuid() != 0 or account.uid == 0
        prlimit, failed = shutil.which("prlimit"), None
        if prlimit is None:
            log.warning(_NOT_LOWERED, run.job_id, left, "no prlimit(1) here (util-linux)")
            return
        for pid in pids:
            try:
                process = await asyncio.create_subprocess_exec(
                    prlimit,
                    f"--pid={pid}",
                    f"--cpu={left}:{left + 1}",
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    cwd="/",
                    user=None if own else account.uid,
                    group=None if own else account.gid,
                    extra_groups=None if own else [],
                )
                _, stderr = await process.communicate()
            except OSError as exc:
                failed = str(exc)
                break
            if process.returncode != 0 and procfs.proc_stat(pid) is not None:  # not just gone
                failed = stderr.decode(errors="replace").strip()[-300:] or "no word"
        if failed is not None:
            log.warning(_NOT_LOWERED, run.job_id, left, failed)

    def _stop(self, run: _Run, reason: StopReason) -> None:
        """Begin stopping a job for ``reason``: SIGTERM now, SIGKILL after the grace period."""
        if run.stop_reason is not None or run.detached:
            return  # already being stopped (the first reason stands), or not ours any more
        run.stop_reason = reason
        run.stopped_at = time.time()
        if run.pgid is None:
            return  # still being spawned: _run stops it as soon as the process exists
        log.info("stopping job %s (%s)", run.job_id, reason)
        self._signal(run, SIGTERM)
        loop = asyncio.get_running_loop()
        run.timers.append(loop.call_later(self.grace_period, self._kill, run))

    def _kill(self, run: _Run) -> None:
        """The grace period is over and the leader has not exited: SIGKILL to the group."""
        if run.pgid is not None:
            run.killed = True
            self._signal(run, SIGKILL)

    def _signal(self, run: _Run, signal: Signals) -> None:
        """Signal the job's whole process group, if it has one that is the job's.

        Through its launcher when it has one: the launcher has not reaped the leader, so the
        group's id cannot name a stranger, which it could by the time we hear of the end.
        """
        if run.pgid is None:
            return
        if run.link is not None and not run.link.lost:
            run.link.post({"op": "signal", "pid": run.pgid, "signal": int(signal)})
            return
        self._killpg(run.job_id, run.pgid, signal)
        if signal == SIGKILL and self.cgroups is not None:
            self._close_group(run, remove=False)

    def _close_group(self, run: _Run, remove: bool = True) -> None:
        """Kill whatever is left in a job's cgroup (its launcher is gone, or never told us),
        and remove the group."""
        if self.cgroups is None or run.cgroup is None:
            return
        group = self.cgroups.group(run.cgroup)
        try:
            if group.exists():
                group.kill()
                if remove:
                    group.remove()
        except OSError as exc:
            log.warning("job %s: its cgroup: %s", run.job_id, exc)

    def _recorded_cgroup(self, token: str | None) -> str | None:
        """The cgroup a launch record says its job was started in (an adopted job's)."""
        if token is None or self.cgroups is None:
            return None
        try:
            with open(self.root / launcher.LAUNCHES / token, "rb") as record:
                first = json.loads(record.readline(1 << 16))
        except (OSError, ValueError):
            return None
        cgroup = first.get("cgroup") if isinstance(first, dict) else None
        # A name the launcher made: never a path that could lead out of the site's groups.
        if isinstance(cgroup, str) and cgroup and "/" not in cgroup and cgroup not in (".", ".."):
            return cgroup
        return None

    def _cpu_quota(self, cores: int) -> int | None:
        """A job's CPU quota on ``cores`` cores at this site (None: uncapped)."""
        return cgroups.cpu_quota(self.cpu_share, cores) if self._capped else None

    def cgroup_of(self, job_id: str) -> cgroups.Group | None:
        """The cgroup of a running job, if it has one."""
        run = self._runs.get(job_id)
        if run is None or run.cgroup is None or self.cgroups is None:
            return None
        return self.cgroups.group(run.cgroup)

    @staticmethod
    def _killpg(job_id: str, pgid: int, signal: Signals) -> None:
        """Signal a process group; a group already empty is fine."""
        try:
            os.killpg(pgid, signal)
        except ProcessLookupError:
            pass
        except PermissionError:  # cannot be ours any more; never signal a stranger
            log.warning("job %s: not allowed to signal group %d", job_id, pgid)

    def _report(self, run: _Run, result: ExitResult) -> None:
        if run.own_token and run.token is not None:
            self.forget_launch(run.token)
        try:
            run.on_exit(result)
        except Exception as exc:
            # The callback is the driver's; its bug must not take the watcher down silently.
            context: dict[str, Any] = {
                "message": f"on_exit callback of job {run.job_id!r} raised",
                "exception": exc,
            }
            asyncio.get_running_loop().call_exception_handler(context)


def _lstat_mode(path: Path) -> int:
    """A path's mode, never following a link; 0 if there is nothing there."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _slots_of(environ: Mapping[bytes, bytes], count: int) -> tuple[int, ...]:
    """The core slots recorded in a job's environment (``GBROKER_SLOTS``), those still valid."""
    text = environ.get(b"GBROKER_SLOTS", b"").decode(errors="replace")
    return tuple(int(s) for s in text.split(",") if s.isdigit() and int(s) < count)
