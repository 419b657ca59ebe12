"""Real execution at a site: each job a process group in its own directory (ARCHITECTURE §7).

Theory of operation. The core's local scheduler decides *when* a job starts and on how many cores
(a :class:`~gbroker.core.site.Launch` command); this driver makes it happen with real processes
and reports back *how it ended*, which the daemon turns into an event for the core. Jobs outlive
their broker: one that crashes, or shuts down for a restart (``aclose(detach=True)``), leaves its
jobs running, and its successor takes them over with :meth:`Executor.adopt`.

:meth:`Executor.start` validates, creates the job's directory ``root/<job_id>/`` and spawns there
(never through a shell) a tiny **supervisor**, ``python -I -S -c _SUPERVISOR``, as the leader of
a new session, hence of a new process group whose id is the supervisor's pid. The supervisor
forks; the child gets the default signal dispositions back and executes the job's program, found
as ``os.execvp`` finds it (a name on the job's ``PATH``; a path taken from the working directory).
Everything the job forks stays in that group unless it calls ``setsid`` itself, so signalling the
group reaches the grandchildren too (an ``mpirun`` and its ranks, a shell and its background
jobs). The supervisor waits for its child, records how it ended in ``<job_dir>/.gbroker-exit``
(JSON ``{"exit_code": int|null, "signal": int|null, "pid": <supervisor pid>}``, written to a
temporary file, fsynced and renamed, so a reader sees all of it or nothing), then ends the same
way: the same exit status, or killed by the same signal. Watching the supervisor, the executor
sees what it would see watching the job, and the file keeps that answer for a broker that was not
there to see it. Why a process of our own rather than the job as leader: a process's exit status
goes to its parent only, and the parent of an orphaned job is not the restarted broker. The
supervisor costs a Python start (about 10 ms of CPU): it imports nothing but ``os``, ``sys`` and
the built-in ``_signal`` (and ``resource``, to end by the job's signal without a core dump).

The process sees a clean environment: ``PATH``, ``LANG``, ``HOME`` (the job directory), then the
job's own variables, then its allocation (``GBROKER_JOB_ID``, ``GBROKER_CORES``, ``GBROKER_SITE``,
``GBROKER_JOB_DIR``; the site's facts win over the job's), and ``OMP_NUM_THREADS`` = cores unless
the job set it. Standard output and error go to files in the job directory (``stdout`` and
``stderr`` by default), never to pipes, so a job that writes much cannot stall on us, a
grandchild holding the descriptors open cannot keep a job "running", and a job survives the
broker that started it. Standard input comes from a file in the job directory, else
``/dev/null``.

Once :meth:`Executor.start` has accepted a spec (it raises :class:`~gbroker.errors.InvalidInput`
for bad values *before* anything happens), the job is reported **exactly once** through its
``on_exit`` callback with an :class:`ExitResult`, whatever happens next: a normal exit, a signal,
a cancellation, a time-out, or a launch that failed (executable missing, not executable, input
file missing, directory not creatable: ``exit_code`` None and ``error`` saying what; the
supervisor tells the executor through a pipe whether its child's ``exec`` succeeded, so
:meth:`Executor.start` returns only once the job's program runs or has failed to). A failure
never escapes as an exception into the event loop, and the callback is never called from inside
:meth:`Executor.start` or :meth:`Executor.adopt`, so a driver that feeds results to the core is
never re-entered while it is carrying out a command. ``on_exit`` is a plain callback, not a
coroutine: a sans-I/O driver only has to turn the result into an event; it runs in the event
loop's thread.

Stopping a job (:meth:`Executor.cancel`, or the time limit firing) sends SIGTERM to the whole
group, then SIGKILL to the group after a grace period (5 s by default) if the leader has not
exited by then. The supervisor ignores SIGTERM (and SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
which are the job's business too), so it is the job that decides how long it takes to end within
the grace period; SIGKILL takes the supervisor too, and its exit file is then missing. When the
leader exits, for whatever reason, whatever is left of its group is killed with SIGKILL at once
(while the unreaped leader still holds the group's id, so that id cannot name anyone else yet):
a job ends with its main process, and nothing it forked outlives it to hold cores that the
scheduler believes free. The first reason to stop a job wins: a job cancelled while it is being
timed out stays timed out. The time limit of a started job is measured from the spawn on the
loop's monotonic clock.

Adoption. A broker journals each running job's process group id (:attr:`RunningJob.pid`), cores
and start time. Restarted, it calls :meth:`Executor.adopt` with them. A process id can have been
reused meanwhile, so the group is taken for the job's only if one of its members carries the
job's ``GBROKER_JOB_ID`` and ``GBROKER_JOB_DIR`` in its ``/proc/<pid>/environ`` (the supervisor
has the job's environment); a group that is not the job's is never signalled. An adopted job is
not our child, so the executor polls ``/proc`` (every 0.2 s) for its leader, identified by its
start time as well as its pid; once the leader is gone it kills what is left of the group and
reports the status from the exit file. Without a file (the supervisor was killed, or the group
is gone and is not the job's), the status is unknown: ``exit_code`` None and ``error`` saying
so, or ``signal`` SIGKILL if this executor killed the group. A job that ended while no broker
watched is reported from its file the same way, after :meth:`Executor.adopt` has returned. An
adopted job is then like any other: in :meth:`Executor.running`, stopped by
:meth:`Executor.cancel` and by its time limit (measured from its recorded wall-clock start, so
one already past is stopped at once), and by :meth:`Executor.aclose`.

Nothing here blocks the event loop on a wait: each job is watched by its own named task (a pidfd
for a child of ours, polling for an adopted job), and timers are loop callbacks. Preparing the
job directory, opening its stream files, spawning the supervisor and reading ``/proc`` to adopt a
job are a few local system calls done inline. :meth:`Executor.aclose` (or leaving ``async with``)
stops every job, waits until each has been reported, and refuses new starts; with
``detach=True`` it leaves the running jobs alone, for a successor to adopt, and reports nothing
for them. A job id may run again once its run has been reported (a re-dispatch): its directory
is reused, its files kept, its stream files truncated, its exit file removed before the spawn.
Removing job directories is the caller's business.

Limits: a process that leaves the group (``setsid``, or a daemon double-fork with ``setsid``)
escapes; only cgroups can follow it. The job runs as the broker's user, so the job directory is a
convenience and a tidy place for files, not a security boundary. Linux only (``/proc``, pidfds).

The wall clock (``time.time``) stamps :attr:`ExitResult.started_at` and ``ended_at``; timers use
the loop's monotonic clock. This is a driver: the core never reads either.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from signal import SIGKILL, SIGTERM, Signals
from types import MappingProxyType, TracebackType
from typing import IO, Any, NamedTuple, Self, TypeGuard

from gbroker.errors import InternalError, InvalidInput

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "EXIT_FILE",
    "Executor",
    "ExitCallback",
    "ExitResult",
    "JobSpec",
    "RunningJob",
    "StopReason",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD = 5.0
"""Seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of time."""

_MAX_NAME = 255  # a single path component on every filesystem we care about


class StopReason(StrEnum):
    """Why the executor stopped a job (rather than the job ending on its own)."""

    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(name, "a string", value)
    if "\0" in value:
        raise InvalidInput(name, "text without NUL characters", value)
    return value


def _check_job_id(value: object) -> str:
    job_id = _check_text("job_id", value)
    if (
        not job_id
        or job_id in (".", "..")
        or "/" in job_id
        or "\\" in job_id
        or len(job_id.encode()) > _MAX_NAME
    ):
        raise InvalidInput(
            "job_id",
            f"a directory name: non-empty, at most {_MAX_NAME} bytes, no '/', '\\', '.' or '..'",
            value,
        )
    return job_id


def _check_relative(name: str, value: object) -> str:
    """A path inside the job directory: relative, no '..' component, naming something."""
    text = _check_text(name, value)
    path = PurePosixPath(text)
    if not text or path.is_absolute() or ".." in path.parts or not path.parts:
        raise InvalidInput(name, "a relative path inside the job directory, without '..'", value)
    return str(path)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run for one job, and how; every value checked on construction.

    Attributes:
        job_id: the job's globally unique id; it names the job directory, so it must be a single
            path component.
        executable: a program name looked up on the job's ``PATH``, or a path (relative paths
            are taken from the working directory, so a staged ``./solver`` works).
        arguments: the program's arguments (no shell: nothing is expanded).
        environment: the job's own variables, laid over the clean base environment.
        working_directory: a directory inside the job directory to start in (created if needed);
            None for the job directory itself.
        stdin: a file in the job directory to read standard input from; None for ``/dev/null``.
        stdout: the file in the job directory that receives standard output.
        stderr: the file that receives standard error; it may name the same file as ``stdout``.
        time_limit: wall-clock seconds the job may run before it is stopped; None for no limit.
    """

    job_id: str
    executable: str
    arguments: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict, hash=False)
    working_directory: str | None = None
    stdin: str | None = None
    stdout: str = "stdout"
    stderr: str = "stderr"
    time_limit: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check_job_id(self.job_id)
        if not _check_text("executable", self.executable):
            raise InvalidInput("executable", "a program name or path", self.executable)
        if isinstance(self.arguments, str | bytes):  # a lone string would become its letters
            raise InvalidInput("arguments", "a sequence of strings", self.arguments)
        arguments = tuple(self.arguments)
        for i, argument in enumerate(arguments):
            _check_text(f"arguments[{i}]", argument)
        set_(self, "arguments", arguments)
        if not isinstance(self.environment, Mapping):
            raise InvalidInput("environment", "a mapping of names to strings", self.environment)
        environment = dict(self.environment)
        for key, value in environment.items():
            name = _check_text("environment", key)
            if not name or "=" in name:
                raise InvalidInput("environment", "variable names without '='", key)
            _check_text(f"environment.{name}", value)
        set_(self, "environment", MappingProxyType(environment))
        for key in ("working_directory", "stdin"):
            value = getattr(self, key)
            if value is not None:
                set_(self, key, _check_relative(key, value))
        for key in ("stdout", "stderr"):
            set_(self, key, _check_relative(key, getattr(self, key)))
        limit = self.time_limit
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise InvalidInput("time_limit", "seconds > 0 or None", limit)


@dataclass(frozen=True, slots=True)
class ExitResult:
    """How a job ended, as reported to its ``on_exit`` callback.

    Attributes:
        job_id: the job.
        exit_code: the job's exit status (its supervisor ends with the same); None if a signal
            ended it, it never started, or how it ended is unknown.
        signal: the number of the signal that ended the job, else None.
        started_at: wall-clock time of the spawn (of the attempt, if it failed); for an adopted
            job, the start time given to :meth:`Executor.adopt`.
        ended_at: wall-clock time the leader's exit was seen (or the attempt failed); for an
            adopted job, when its supervisor recorded the end (when the executor saw the group
            gone, if nothing was recorded).
        timed_out: the executor stopped the job because its time limit passed.
        cancelled: the executor stopped the job because :meth:`Executor.cancel` asked it to
            (or :meth:`Executor.aclose` did).
        error: why the job could not be started at all, or why how it ended is unknown (an
            adopted job whose end was not recorded); None otherwise.
    """

    job_id: str
    exit_code: int | None
    signal: int | None
    started_at: float
    ended_at: float
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        """The job ran to its end on its own and exited 0."""
        return (
            self.exit_code == 0 and self.error is None and not self.timed_out and not self.cancelled
        )

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` and the like, for messages."""
        if self.signal is None:
            return None
        try:
            return Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job whose process is alive, as :meth:`Executor.running` shows it."""

    job_id: str
    pid: int
    """Pid of the leader (the job's supervisor), which is also the id of the job's process group;
    what a restarted broker passes to :meth:`Executor.adopt`."""
    cores: int
    started_at: float
    deadline: float | None
    """Wall-clock time at which the time limit stops the job; None without a limit."""
    stopping: StopReason | None
    """Set once the executor has begun to stop the job."""


ExitCallback = Callable[[ExitResult], None]
"""Called once per accepted start or adoption, in the event loop's thread, with how the job
ended."""


EXIT_FILE = ".gbroker-exit"
"""Name, in the job directory, of the file where the supervisor records how the job ended."""

_POLL_INTERVAL = 0.2  # seconds between looks at an adopted job's leader (not our child: no pidfd)

_UNKNOWN_WHILE_DOWN = "the job ended while its broker was down; its exit status is unknown"
_UNKNOWN_UNRECORDED = (
    "the job's supervisor ended without recording how the job ended (was it killed?); "
    "its exit status is unknown"
)

# The supervisor: argv is <exit file> <status fd> <executable> <arguments...>. It tells the
# executor through the status fd whether the job's exec worked ("ok", or "exec <errno>" /
# "fork <errno>"), then waits, records, and ends as its child did. `_signal` is the built-in
# module behind `signal`, which only adds enums (and ~5 ms of imports per start). The child is
# given the environment the supervisor received: Python may have added LC_CTYPE to os.environ
# (PEP 538 locale coercion), which the job must not see. Any signal the job dies of is
# re-raised against the supervisor itself, without a core dump of the supervisor.
_SUPERVISOR = r"""# gbroker job supervisor (what `ps` shows of it)
import os, sys
try:
    import _signal as signal
except ImportError:
    import signal
exit_file, status, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
S = signal
passed_on = (S.SIGTERM, S.SIGINT, S.SIGHUP, S.SIGQUIT, S.SIGUSR1, S.SIGUSR2)
for number in passed_on:
    S.signal(number, S.SIG_IGN)
S.signal(S.SIGCHLD, S.SIG_DFL)  # an ignored SIGCHLD, inherited, would make waitpid fail
try:
    with open("/proc/self/environ", "rb") as f:
        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
except OSError:
    env = os.environ
r, w = os.pipe()
try:
    pid = os.fork()
except OSError as exc:
    os.write(status, b"fork %d" % (exc.errno or 0))
    os._exit(127)
if pid == 0:
    try:
        try:
            os.close(r)
            os.close(status)
            for number in (*passed_on, S.SIGPIPE, S.SIGXFSZ):
                S.signal(number, S.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            os.write(w, b"exec %d" % (getattr(exc, "errno", 0) or 0))
    finally:
        os._exit(127)
os.close(w)
failed = os.read(r, 64)
os.close(r)
try:
    os.write(status, failed or b"ok")
except OSError:
    pass
os.close(status)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if failed:
    os._exit(127)
text = '{"exit_code": %s, "signal": %s, "pid": %d}\n' % (
    code if code >= 0 else "null", -code if code < 0 else "null", os.getpid()
)
try:
    temporary = exit_file + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, exit_file)
    fd = os.open(os.path.dirname(exit_file), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
except OSError as exc:
    try:
        os.write(2, b"gbroker supervisor: cannot record the exit status: %s\n" % str(exc).encode())
    except OSError:
        pass
if code >= 0:
    os._exit(code)
try:
    S.signal(-code, S.SIG_DFL)
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (OSError, ValueError, ImportError):
    pass
os.kill(os.getpid(), -code)
os._exit(128 - code)
"""


class _ProcStat(NamedTuple):
    state: str
    pgrp: int
    starttime: int  # clock ticks after boot: with the pid, names one process for good


_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []
"""Supervisors that ``aclose(detach=True)`` left running. A Popen dropped while its process runs
warns (ResourceWarning); kept here, they are reaped once they end, should this process live on
(a broker restarted within the same process, as in tests), instead of staying zombies."""


def _reap_left_running() -> None:
    _LEFT_RUNNING[:] = [child for child in _LEFT_RUNNING if child.poll() is None]


def _proc_stat(pid: int) -> _ProcStat | None:
    """What ``/proc/<pid>/stat`` says, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:  # gone (or never was)
        return None
    # After the command name in parentheses (which may itself hold ") "): state, ppid, pgrp, ...
    fields = stat.rsplit(b")", 1)[1].split()
    return _ProcStat(fields[0].decode(), int(fields[2]), int(fields[19]))


def _alive(stat: _ProcStat | None) -> TypeGuard[_ProcStat]:
    return stat is not None and stat.state not in ("Z", "X")  # a zombie has ended


def _group_members(pgid: int) -> list[int]:
    """The live processes of a process group, found by reading every ``/proc/<pid>/stat``."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if _alive(stat) and stat.pgrp == pgid:
                members.append(int(entry.name))
    return members


async def _until_exited(child: subprocess.Popen[bytes]) -> None:
    """Wait, without blocking the loop, until our child has ended, *without* reaping it.

    An unreaped child keeps its pid, which is also its group's id, from being reused: the
    caller may still signal what is left of the group, then reaps it (``child.wait()``).
    """
    try:
        pidfd = os.pidfd_open(child.pid)
    except OSError:  # no pidfds (Linux < 5.3): look every now and then
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        try:
            while os.waitid(os.P_PID, child.pid, flags) is None:
                await asyncio.sleep(_POLL_INTERVAL)
        except ChildProcessError:  # reaped behind our back: it has ended all the same
            pass
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:  # a pidfd turns readable once its process has ended
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def _read_to_end(fd: int) -> bytes:
    """Everything written to a pipe until its last writer closes it; closes ``fd``."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    closed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            chunks.append(data)
        elif not closed.done():
            closed.set_result(None)

    try:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
        try:
            await closed
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return b"".join(chunks)


@dataclass(slots=True, eq=False)
class _Run:
    """One accepted start or adoption, from validation to its report."""

    job_id: str
    cores: int
    time_limit: float | None
    on_exit: ExitCallback
    job_dir: Path
    started_at: float = 0.0
    pgid: int | None = None
    """The job's process group, once it exists and is known to be the job's: set, the executor
    may signal it and :meth:`Executor.running` shows the job."""
    stop_reason: StopReason | None = None
    killed: bool = False
    """This executor sent the group SIGKILL (the status an adopted job's missing file implies)."""
    detached: bool = False
    """Left running by ``aclose(detach=True)``: never signalled, never reported."""
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    spawned: asyncio.Future[None] | None = None
    """For a start: done once the spawn has succeeded or failed."""

    def view(self) -> RunningJob:
        assert self.pgid is not None
        limit = self.time_limit
        return RunningJob(
            job_id=self.job_id,
            pid=self.pgid,
            cores=self.cores,
            started_at=self.started_at,
            deadline=None if limit is None else self.started_at + limit,
            stopping=self.stop_reason,
        )

    def result(
        self,
        ended_at: float,
        exit_code: int | None = None,
        signal: int | None = None,
        error: str | None = None,
    ) -> ExitResult:
        return ExitResult(
            self.job_id,
            exit_code=exit_code,
            signal=signal,
            started_at=self.started_at,
            ended_at=ended_at,
            timed_out=self.stop_reason is StopReason.TIMED_OUT,
            cancelled=self.stop_reason is StopReason.CANCELLED,
            error=error,
        )


class _LaunchFailed(Exception):
    """A launch step failed; the message says which and why, for :attr:`ExitResult.error`."""


def _check_number(name: str, value: object, expected: str, *, positive: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise InvalidInput(name, expected, value)
    return float(value)


class Executor:
    """Runs a site's jobs as process groups under ``root``, one directory per job.

    Args:
        root: the directory that holds the job directories; created when needed. A broker that
            takes over its predecessor's jobs must use the same root.
        site: the site's name, given to jobs as ``GBROKER_SITE``.
        grace_period: seconds between SIGTERM and SIGKILL when a job is stopped.
        path: the ``PATH`` jobs start with; the broker's own ``PATH`` by default.
    """

    def __init__(
        self,
        root: Path,
        *,
        site: str = "local",
        grace_period: float = DEFAULT_GRACE_PERIOD,
        path: str | None = None,
    ) -> None:
        if (
            isinstance(grace_period, bool)
            or not isinstance(grace_period, int | float)
            or not math.isfinite(grace_period)
            or grace_period < 0
        ):
            raise InvalidInput("grace_period", "seconds >= 0", grace_period)
        self.root = Path(root)
        self.site = _check_text("site", site)
        self.grace_period = float(grace_period)
        self._base_environment = {
            "PATH": path if path is not None else os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- the public face ----------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        """The directory of a job (where its input files are staged before it starts)."""
        return self.root / _check_job_id(job_id)

    async def start(self, spec: JobSpec, cores: int, on_exit: ExitCallback) -> None:
        """Start ``spec`` on ``cores`` cores; ``on_exit`` hears how it ended, exactly once.

        Returns as soon as the job's program runs or the launch has failed (the failure then
        goes to ``on_exit`` too). Raises :class:`InvalidInput` for bad values, a job id that is
        already running here included, and :class:`InternalError` once the executor is closing;
        in both cases ``on_exit`` is never called. If the caller is cancelled while this waits
        for the spawn, the job still starts and is still reported.
        """
        if not isinstance(spec, JobSpec):
            raise InvalidInput("spec", "a JobSpec", spec)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{spec.job_id}].cores", "an integer >= 1", cores)
        if not callable(on_exit):
            raise InvalidInput("on_exit", "a callable taking an ExitResult", on_exit)
        self._check_new(spec.job_id)
        loop = asyncio.get_running_loop()
        run = _Run(spec.job_id, cores, spec.time_limit, on_exit, self.root / spec.job_id)
        run.spawned = spawned = loop.create_future()
        self._runs[spec.job_id] = run
        self._watch(run, self._run(run, spec, spawned))
        # Shielded: cancelling this await must not cancel the launch, which is already ours to
        # report; the task carries on and on_exit still hears of it.
        await asyncio.shield(spawned)

    def adopt(
        self,
        job_id: str,
        pgid: int,
        cores: int,
        started_at: float,
        time_limit: float | None,
        on_exit: ExitCallback,
    ) -> None:
        """Take over a job that an earlier executor over the same root started.

        A plain (not async) method, to be called from within the event loop, typically by a
        restarted broker for each job its journal shows running. ``pgid`` is the job's process
        group (:attr:`RunningJob.pid` as the earlier executor showed it); ``cores``,
        ``started_at`` (wall clock) and ``time_limit`` are the job's as recorded at its start.

        If the group still holds the job (checked in ``/proc``: see the module's docstring),
        the job is watched, shows in :meth:`running`, can be cancelled, and its time limit
        holds from ``started_at`` (one already past stops it at once); ``on_exit`` hears how it
        ended, exactly once. If the job has ended (or the group is not the job's any more), it
        is reported from its exit file, or with an unknown status (``exit_code`` None and
        ``error`` saying so) if it has none; never from inside this call, and a group that is
        not the job's is never signalled.

        Raises :class:`InvalidInput` for bad values, a job id already running here included,
        and :class:`InternalError` once the executor is closing; ``on_exit`` is then never
        called.
        """
        job_id = _check_job_id(job_id)
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
        self._check_new(job_id)
        loop = asyncio.get_running_loop()
        run = _Run(job_id, cores, limit, on_exit, self.root / job_id, started_at=started)
        leader = _proc_stat(pgid)
        if _alive(leader) and leader.pgrp == pgid:
            if self._belongs(pgid, run):
                run.pgid = pgid
                self._runs[job_id] = run
                if limit is not None:
                    delay = max(0.0, started + limit - time.time())
                    run.timers.append(loop.call_later(delay, self._stop, run, StopReason.TIMED_OUT))
                self._watch(run, self._follow(run, leader.starttime))
                log.info("job %s: adopted process group %d", job_id, pgid)
                return
            log.warning("job %s: process group %d is not the job's any more", job_id, pgid)
        elif any(self._belongs(pid, run) for pid in _group_members(pgid)):
            # The supervisor is gone but some of what the job forked is not: it goes now,
            # as it would have gone with the supervisor had a broker been watching.
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

    def running(self) -> Mapping[str, RunningJob]:
        """A snapshot of the jobs whose processes are alive, by job id."""
        return MappingProxyType(
            {job_id: run.view() for job_id, run in self._runs.items() if run.pgid is not None}
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has begun: no job may start any more."""
        return self._closed

    async def aclose(self, detach: bool = False) -> None:
        """Refuse new jobs, then stop every running job and wait until each has been reported.

        With ``detach=True`` (a broker shutting down to restart), the running jobs are left
        alone instead: they keep running under their supervisors, which still record how they
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
                self._stop(run, StopReason.CANCELLED)
            await asyncio.wait(set(self._tasks))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

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

    async def _run(self, run: _Run, spec: JobSpec, spawned: asyncio.Future[None]) -> None:
        """A started job: spawn it, then follow our child, the supervisor, to its end."""
        loop = asyncio.get_running_loop()
        run.started_at = time.time()
        try:
            try:
                child = await self._spawn(run, spec)
            except Exception as exc:
                if isinstance(exc, _LaunchFailed):
                    error = str(exc)
                else:  # our bug or the platform's; the job is still reported, once
                    log.exception("job %s: unexpected failure while starting it", run.job_id)
                    error = f"cannot start job {run.job_id!r}: internal error: {exc!r}"
                del self._runs[run.job_id]
                self._report(run, run.result(time.time(), error=error))
                return
            run.pgid = child.pid  # the supervisor leads its own session, hence its own group
            run.started_at = time.time()
            if run.time_limit is not None:
                run.timers.append(
                    loop.call_later(run.time_limit, self._stop, run, StopReason.TIMED_OUT)
                )
            if run.stop_reason is not None:  # cancelled while it was being spawned
                reason, run.stop_reason = run.stop_reason, None
                self._stop(run, reason)
        finally:
            if not spawned.done():
                spawned.set_result(None)
        try:
            await _until_exited(child)
        except asyncio.CancelledError:
            if run.detached:
                _LEFT_RUNNING.append(child)
            else:  # the loop is being torn down under us: leave nothing running
                self._signal(run, SIGKILL)
            raise
        ended_at = time.time()
        self._end(run)
        returncode = child.wait()  # it has exited: this only reaps it
        self._report(
            run,
            run.result(
                ended_at,
                exit_code=returncode if returncode >= 0 else None,
                signal=-returncode if returncode < 0 else None,
            ),
        )

    async def _follow(self, run: _Run, leader_starttime: int) -> None:
        """An adopted job: poll until its leader has ended, then report from its exit file."""
        assert run.pgid is not None
        try:
            while True:
                leader = _proc_stat(run.pgid)
                if not _alive(leader) or leader.starttime != leader_starttime:
                    break
                await asyncio.sleep(_POLL_INTERVAL)
        except asyncio.CancelledError:
            if not run.detached:
                self._signal(run, SIGKILL)
            raise
        pgid = run.pgid
        self._end(run)
        self._report(run, self._recorded_end(run, pgid, _UNKNOWN_UNRECORDED))

    async def _deliver(self, run: _Run, result: ExitResult) -> None:
        """Report an adopted job that had already ended: from a task, never inside adopt()."""
        self._report(run, result)

    def _end(self, run: _Run) -> None:
        """The leader has ended: stop the timers, kill what is left of the group, forget it."""
        for timer in run.timers:
            timer.cancel()
        self._signal(run, SIGKILL)
        run.pgid = None
        del self._runs[run.job_id]

    def _detach(self, run: _Run) -> None:
        """Leave a running job alone for good: no signal, no report, no watcher."""
        run.detached = True
        for timer in run.timers:
            timer.cancel()
        del self._runs[run.job_id]
        if run.task is not None:
            run.task.cancel()
        log.info("job %s: left running in process group %s", run.job_id, run.pgid)

    def _recorded_end(self, run: _Run, pgid: int, unknown: str) -> ExitResult:
        """How an adopted job ended, from its exit file; ``unknown`` as the error without one."""
        path = run.job_dir / EXIT_FILE
        try:
            # The supervisor wrote it as the job ended. A file time is a tick or so coarse:
            # a job never ends before it starts.
            ended_at = max(run.started_at, path.stat().st_mtime)
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            record = None
        except (OSError, ValueError) as exc:
            log.warning("job %s: unreadable exit file %s: %s", run.job_id, path, exc)
            record = None
        if (
            isinstance(record, dict)
            and record.get("pid") == pgid  # not a file left by an earlier run of the same id
            and all(
                key in record
                and (record[key] is None or type(record[key]) is int)  # bool is not an int here
                for key in ("exit_code", "signal")
            )
        ):
            return run.result(ended_at, exit_code=record["exit_code"], signal=record["signal"])
        if record is not None:
            log.warning("job %s: exit file %s is not the one of group %d", run.job_id, path, pgid)
        if run.killed:  # we killed the group, supervisor included, before it could write
            return run.result(time.time(), signal=SIGKILL)
        return run.result(time.time(), error=unknown)

    def _belongs(self, pid: int, run: _Run) -> bool:
        """Whether process ``pid`` was started for ``run``'s job by an executor over our root."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                environ = file.read().split(b"\0")
        except OSError:  # gone, or not ours to read: not the job's either way
            return False
        wanted = b"GBROKER_JOB_ID=" + os.fsencode(run.job_id)
        if wanted not in environ:
            return False
        prefix = b"GBROKER_JOB_DIR="
        job_dir = next((entry[len(prefix) :] for entry in environ if entry.startswith(prefix)), b"")
        # Compared resolved: the same root may be spelt differently by the broker's successor.
        return os.path.realpath(job_dir) == os.path.realpath(os.fsencode(run.job_dir.absolute()))

    async def _spawn(self, run: _Run, spec: JobSpec) -> subprocess.Popen[bytes]:
        """Prepare the job directory and start the job under its supervisor.

        Raises :class:`_LaunchFailed` if we cannot, the job's own ``exec`` included.
        """
        _reap_left_running()
        job_dir = run.job_dir
        cwd = job_dir if spec.working_directory is None else job_dir / spec.working_directory
        exit_file = job_dir.absolute() / EXIT_FILE
        step = "job directory"
        try:
            with ExitStack() as files:
                job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                if cwd != job_dir:
                    step = "working directory"
                    cwd.mkdir(parents=True, exist_ok=True)
                stdin: IO[bytes] | int = subprocess.DEVNULL
                if spec.stdin is not None:
                    step = f"stdin file {spec.stdin!r}"
                    stdin = files.enter_context((job_dir / spec.stdin).open("rb"))
                step = f"stdout file {spec.stdout!r}"
                stdout = files.enter_context(self._create(job_dir / spec.stdout))
                stderr = stdout
                if spec.stderr != spec.stdout:
                    step = f"stderr file {spec.stderr!r}"
                    stderr = files.enter_context(self._create(job_dir / spec.stderr))
                step = f"exit file {EXIT_FILE!r}"
                # An earlier run's record must never pass for this run's.
                exit_file.unlink(missing_ok=True)
                step = f"supervisor {sys.executable!r}"
                status, status_writer = os.pipe()
                files.callback(os.close, status_writer)  # the supervisor has its own copy
                try:
                    # The child keeps its own copies of the descriptors; ours close on leaving.
                    child = subprocess.Popen(
                        [
                            sys.executable,
                            "-I",  # nothing from the job's PYTHON* variables or the cwd
                            "-S",  # no site: a faster start
                            "-c",
                            _SUPERVISOR,
                            str(exit_file),
                            str(status_writer),
                            spec.executable,
                            *spec.arguments,
                        ],
                        stdin=stdin,
                        stdout=stdout,
                        stderr=stderr,
                        cwd=cwd,
                        env=self._environment(run, spec),
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=(status_writer,),
                    )
                except BaseException:
                    os.close(status)
                    raise
        except OSError as exc:
            raise _LaunchFailed(
                f"cannot start job {spec.job_id!r}: {step}: {exc.strerror or exc}"
            ) from exc
        except (ValueError, subprocess.SubprocessError) as exc:
            raise _LaunchFailed(f"cannot start job {spec.job_id!r}: {step}: {exc}") from exc
        try:
            told = await _read_to_end(status)
        except BaseException:
            # Torn down while the supervisor was starting: take the group with us.
            self._killpg(spec.job_id, child.pid, SIGKILL)
            raise
        if told == b"ok":
            return child
        # The job's program never ran: the supervisor is ending; reap it before reporting.
        await _until_exited(child)
        returncode = child.wait()
        stage, _, number = told.decode(errors="replace").partition(" ")
        if stage not in ("exec", "fork") or not number.isdigit():
            raise _LaunchFailed(
                f"cannot start job {spec.job_id!r}: supervisor {sys.executable!r}: it ended "
                f"(status {returncode}) before starting the job; see {spec.stderr!r}"
            )
        code = int(number)
        reason = os.strerror(code) if code else "unknown error"
        if stage == "fork":
            raise _LaunchFailed(f"cannot start job {spec.job_id!r}: fork: {reason}")
        if code == errno.ENOENT:
            reason += " (looked up on PATH and from the working directory)"
        raise _LaunchFailed(
            f"cannot start job {spec.job_id!r}: executable {spec.executable!r}: {reason}"
        )

    @staticmethod
    def _create(path: Path) -> IO[bytes]:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("wb")

    def _environment(self, run: _Run, spec: JobSpec) -> dict[str, str]:
        # Absolute: the job runs in its directory, not in the broker's working directory.
        job_dir = str(run.job_dir.absolute())
        env = {**self._base_environment, "HOME": job_dir}
        env.update(spec.environment)
        env.setdefault("OMP_NUM_THREADS", str(run.cores))
        env.update(
            GBROKER_JOB_ID=spec.job_id,
            GBROKER_CORES=str(run.cores),
            GBROKER_SITE=self.site,
            GBROKER_JOB_DIR=job_dir,
        )
        return env

    def _stop(self, run: _Run, reason: StopReason) -> None:
        """Begin stopping a job for ``reason``: SIGTERM now, SIGKILL after the grace period."""
        if run.stop_reason is not None or run.detached:
            return  # already being stopped (the first reason stands), or not ours any more
        run.stop_reason = reason
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
        """Signal the job's whole process group, if it has one that is the job's."""
        if run.pgid is not None:
            self._killpg(run.job_id, run.pgid, signal)

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
        try:
            run.on_exit(result)
        except Exception as exc:
            # The callback is the driver's; its bug must not take the watcher down silently.
            context: dict[str, Any] = {
                "message": f"on_exit callback of job {run.job_id!r} raised",
                "exception": exc,
            }
            asyncio.get_running_loop().call_exception_handler(context)
