"""Real execution at a site: each job a process group in its own directory (ARCHITECTURE §7).

Theory of operation. The core's local scheduler decides *when* a job starts and on how many cores
(a :class:`~gbroker.core.site.Launch` command); this driver makes it happen with real processes
and reports back *how it ended*, which the daemon turns into an event for the core.

:meth:`Executor.start` validates, creates the job's directory ``root/<job_id>/`` and spawns the
job's executable there with ``asyncio.create_subprocess_exec`` (never a shell) as the leader of a
new session, hence of a new process group whose id is the leader's pid. Everything the job forks
stays in that group unless it calls ``setsid`` itself, so signalling the group reaches the
grandchildren too (an ``mpirun`` and its ranks, a shell and its background jobs). The process
sees a clean environment: ``PATH``, ``LANG``, ``HOME`` (the job directory), then the job's own
variables, then its allocation (``GBROKER_JOB_ID``, ``GBROKER_CORES``, ``GBROKER_SITE``,
``GBROKER_JOB_DIR``; the site's facts win over the job's), and ``OMP_NUM_THREADS`` = cores unless
the job set it. Standard output and error go to files in the job directory (``stdout`` and
``stderr`` by default), never to pipes, so a job that writes much cannot stall on us and a
grandchild holding the descriptors open cannot keep a job "running". Standard input comes from a
file in the job directory, else ``/dev/null``.

Once :meth:`Executor.start` has accepted a spec (it raises :class:`~gbroker.errors.InvalidInput`
for bad values *before* anything happens), the job is reported **exactly once** through its
``on_exit`` callback with an :class:`ExitResult`, whatever happens next: a normal exit, a signal,
a cancellation, a time-out, or a launch that failed (executable missing, not executable, input
file missing, directory not creatable: ``exit_code`` None and ``error`` saying what). A failure
never escapes as an exception into the event loop, and the callback is never called from inside
:meth:`Executor.start`, so a driver that feeds results to the core is never re-entered while it
is carrying out a command. ``on_exit`` is a plain callback, not a coroutine: a sans-I/O driver
only has to turn the result into an event; it runs in the event loop's thread.

Stopping a job (:meth:`Executor.cancel`, or the time limit firing, measured from the spawn on the
loop's monotonic clock) sends SIGTERM to the whole group, then SIGKILL to the group after a grace
period (5 s by default) if the leader has not exited by then. When the leader exits, for whatever
reason, whatever is left of its group is killed with SIGKILL at once: a job ends with its main
process, and nothing it forked outlives it to hold cores that the scheduler believes free.
The first reason to stop a job wins: a job cancelled while it is being timed out stays timed out.

Nothing here blocks the event loop on a wait: each job is watched by its own named task that
awaits the leader's exit, and timers are loop callbacks. Preparing the job directory and opening
its stream files are a few local filesystem calls done inline. :meth:`Executor.aclose` (or leaving
``async with``) stops every job, waits until each has been reported, and refuses new starts.
A job id may run again once its run has been reported (a re-dispatch): its directory is reused,
its files kept, its stream files truncated. Removing job directories is the caller's business.

Limits: a process that leaves the group (``setsid``, or a daemon double-fork with ``setsid``)
escapes; only cgroups can follow it. The job runs as the broker's user, so the job directory is a
convenience and a tidy place for files, not a security boundary.

The wall clock (``time.time``) stamps :attr:`ExitResult.started_at` and ``ended_at``; timers use
the loop's monotonic clock. This is a driver: the core never reads either.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from signal import SIGKILL, SIGTERM, Signals
from types import MappingProxyType, TracebackType
from typing import IO, Any, Self

from gbroker.errors import InternalError, InvalidInput

__all__ = [
    "DEFAULT_GRACE_PERIOD",
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
        exit_code: the leader's exit status; None if a signal ended it or it never started.
        signal: the number of the signal that ended the leader, else None.
        started_at: wall-clock time of the spawn (of the attempt, if it failed).
        ended_at: wall-clock time the leader's exit was seen (or the attempt failed).
        timed_out: the executor stopped the job because its time limit passed.
        cancelled: the executor stopped the job because :meth:`Executor.cancel` asked it to
            (or :meth:`Executor.aclose` did).
        error: why the job could not be started at all; None once it started.
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
    """Pid of the leader, which is also the id of the job's process group."""
    cores: int
    started_at: float
    deadline: float | None
    """Wall-clock time at which the time limit stops the job; None without a limit."""
    stopping: StopReason | None
    """Set once the executor has begun to stop the job."""


ExitCallback = Callable[[ExitResult], None]
"""Called once per accepted start, in the event loop's thread, with how the job ended."""


@dataclass(slots=True, eq=False)
class _Run:
    """One accepted start, from validation to its report."""

    spec: JobSpec
    cores: int
    on_exit: ExitCallback
    job_dir: Path
    started_at: float = 0.0
    process: asyncio.subprocess.Process | None = None
    stop_reason: StopReason | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def view(self) -> RunningJob:
        assert self.process is not None
        limit = self.spec.time_limit
        return RunningJob(
            job_id=self.spec.job_id,
            pid=self.process.pid,
            cores=self.cores,
            started_at=self.started_at,
            deadline=None if limit is None else self.started_at + limit,
            stopping=self.stop_reason,
        )


class _LaunchFailed(Exception):
    """A launch step failed; the message says which and why, for :attr:`ExitResult.error`."""


class Executor:
    """Runs a site's jobs as process groups under ``root``, one directory per job.

    Args:
        root: the directory that holds the job directories; created when needed.
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

        Returns as soon as the process exists or the launch has failed (the failure then goes to
        ``on_exit`` too). Raises :class:`InvalidInput` for bad values, a job id that is already
        running here included, and :class:`InternalError` once the executor is closing; in both
        cases ``on_exit`` is never called. If the caller is cancelled while this waits for the
        spawn, the job still starts and is still reported.
        """
        if not isinstance(spec, JobSpec):
            raise InvalidInput("spec", "a JobSpec", spec)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{spec.job_id}].cores", "an integer >= 1", cores)
        if not callable(on_exit):
            raise InvalidInput("on_exit", "a callable taking an ExitResult", on_exit)
        if self._closed:
            raise InternalError("the executor is closed: no job may start")
        if spec.job_id in self._runs:
            raise InvalidInput("job_id", "a job that is not already running here", spec.job_id)
        loop = asyncio.get_running_loop()
        run = _Run(spec, cores, on_exit, self.root / spec.job_id)
        self._runs[spec.job_id] = run
        spawned: asyncio.Future[None] = loop.create_future()
        task = loop.create_task(self._run(run, spawned), name=f"gbroker.executor:{spec.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Shielded: cancelling this await must not cancel the launch, which is already ours to
        # report; the task carries on and on_exit still hears of it.
        await asyncio.shield(spawned)

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
            {job_id: run.view() for job_id, run in self._runs.items() if run.process is not None}
        )

    async def aclose(self) -> None:
        """Refuse new jobs, stop every running one and wait until each has been reported."""
        self._closed = True
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

    async def _run(self, run: _Run, spawned: asyncio.Future[None]) -> None:
        job_id = run.spec.job_id
        loop = asyncio.get_running_loop()
        run.started_at = time.time()
        try:
            try:
                process = await self._spawn(run)
            except Exception as exc:
                if isinstance(exc, _LaunchFailed):
                    error = str(exc)
                else:  # our bug or the platform's; the job is still reported, once
                    log.exception("job %s: unexpected failure while starting it", job_id)
                    error = f"cannot start job {job_id!r}: internal error: {exc!r}"
                del self._runs[job_id]
                self._report(
                    run,
                    ExitResult(
                        job_id,
                        exit_code=None,
                        signal=None,
                        started_at=run.started_at,
                        ended_at=time.time(),
                        timed_out=run.stop_reason is StopReason.TIMED_OUT,
                        cancelled=run.stop_reason is StopReason.CANCELLED,
                        error=error,
                    ),
                )
                return
            run.process = process
            run.started_at = time.time()
            if run.spec.time_limit is not None:
                run.timers.append(
                    loop.call_later(run.spec.time_limit, self._stop, run, StopReason.TIMED_OUT)
                )
            if run.stop_reason is not None:  # cancelled while it was being spawned
                reason, run.stop_reason = run.stop_reason, None
                self._stop(run, reason)
        finally:
            if not spawned.done():
                spawned.set_result(None)
        try:
            returncode = await process.wait()
        except asyncio.CancelledError:
            # The loop is being torn down under us: never leave the group running.
            self._signal(run, SIGKILL)
            raise
        ended_at = time.time()
        for timer in run.timers:
            timer.cancel()
        # The leader is gone; whatever it left in its group goes with it.
        self._signal(run, SIGKILL)
        del self._runs[job_id]
        self._report(
            run,
            ExitResult(
                job_id,
                exit_code=returncode if returncode >= 0 else None,
                signal=-returncode if returncode < 0 else None,
                started_at=run.started_at,
                ended_at=ended_at,
                timed_out=run.stop_reason is StopReason.TIMED_OUT,
                cancelled=run.stop_reason is StopReason.CANCELLED,
            ),
        )

    async def _spawn(self, run: _Run) -> asyncio.subprocess.Process:
        """Prepare the job directory and start the leader; :class:`_LaunchFailed` if we cannot."""
        spec = run.spec
        job_dir = run.job_dir
        cwd = job_dir if spec.working_directory is None else job_dir / spec.working_directory
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
                step = f"executable {spec.executable!r}"
                # The child keeps its own copies of the descriptors; ours close on leaving.
                return await asyncio.create_subprocess_exec(
                    spec.executable,
                    *spec.arguments,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=cwd,
                    env=self._environment(run),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if isinstance(exc, FileNotFoundError) and step.startswith("executable"):
                reason += " (looked up on PATH and from the working directory)"
            raise _LaunchFailed(f"cannot start job {spec.job_id!r}: {step}: {reason}") from exc
        except (ValueError, subprocess.SubprocessError) as exc:
            raise _LaunchFailed(f"cannot start job {spec.job_id!r}: {step}: {exc}") from exc

    @staticmethod
    def _create(path: Path) -> IO[bytes]:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("wb")

    def _environment(self, run: _Run) -> dict[str, str]:
        spec = run.spec
        env = {**self._base_environment, "HOME": str(run.job_dir)}
        env.update(spec.environment)
        env.setdefault("OMP_NUM_THREADS", str(run.cores))
        env.update(
            GBROKER_JOB_ID=spec.job_id,
            GBROKER_CORES=str(run.cores),
            GBROKER_SITE=self.site,
            GBROKER_JOB_DIR=str(run.job_dir),
        )
        return env

    def _stop(self, run: _Run, reason: StopReason) -> None:
        """Begin stopping a job for ``reason``: SIGTERM now, SIGKILL after the grace period."""
        if run.stop_reason is not None:
            return  # already being stopped; the first reason stands
        run.stop_reason = reason
        if run.process is None:
            return  # still being spawned: _run stops it as soon as the process exists
        log.info("stopping job %s (%s)", run.spec.job_id, reason)
        self._signal(run, SIGTERM)
        loop = asyncio.get_running_loop()
        run.timers.append(loop.call_later(self.grace_period, self._signal, run, SIGKILL))

    @staticmethod
    def _signal(run: _Run, signal: Signals) -> None:
        """Signal the job's whole process group; a group already empty is fine."""
        if run.process is None:
            return
        try:
            os.killpg(run.process.pid, signal)
        except ProcessLookupError:
            pass
        except PermissionError:  # cannot be ours any more; never signal a stranger
            log.warning("job %s: not allowed to signal group %d", run.spec.job_id, run.process.pid)

    def _report(self, run: _Run, result: ExitResult) -> None:
        try:
            run.on_exit(result)
        except Exception as exc:
            # The callback is the driver's; its bug must not take the watcher down silently.
            context: dict[str, Any] = {
                "message": f"on_exit callback of job {run.spec.job_id!r} raised",
                "exception": exc,
            }
            asyncio.get_running_loop().call_exception_handler(context)
