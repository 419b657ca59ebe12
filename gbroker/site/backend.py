"""The site's seam: what a broker asks of whatever runs its jobs (ARCHITECTURE §11).

Theory of operation. Everything above a site decides *where* a job runs; a **back-end** runs it
there. The driver (:mod:`gbroker.daemon.driver`) and recovery (:mod:`gbroker.daemon.recovery`)
talk to a back-end only through :class:`Backend`:

- :meth:`~Backend.start` a job (a :class:`JobSpec`, always with a launch
  token the caller journaled first), hear how it ended through ``on_exit``, exactly once;
- after a restart, :meth:`~Backend.settle_launch` a journaled token: the back-end finds what it
  started under it (a launch record, a batch job's comment) and the caller
  :meth:`~Backend.adopt`\\ s it by its **handle** (a process group id for ``local``, the batch
  system's job id for ``slurm``), or learns that it never began and never will (the caller then
  queues the job again: exactly once);
- :meth:`~Backend.cancel` a job; :meth:`~Backend.running` and :meth:`~Backend.running_job` show
  what runs;
- :meth:`~Backend.capacity`: what the machine behind the site has free and queued, *all* its
  users included (None: the site's own scheduler is the whole truth, as for ``local``, whose
  cores only GBroker uses). DCSMon publishes the site's state with it laid over
  (:func:`seen_with`), so F(j) ranks a Slurm site by what Slurm can really give.

Back-ends: ``local`` (:class:`~gbroker.site.executor.Executor`: launchers, a cgroup and a uid per
job, resizes of malleable jobs), ``slurm`` (:class:`~gbroker.site.slurm.SlurmBackend`: sbatch,
squeue, scancel against a cluster's slurmctld) and ``gridengine``
(:class:`~gbroker.site.gridengine.GridEngineBackend`: qsub, qstat, qacct, qdel against a cell's
qmaster). A back-end that cannot resize a running job says
so (:attr:`Backend.resizes`); the driver then runs malleable jobs there at their start size.

Moving a running job (as in Dynamite): a back-end that can (:attr:`Backend.checkpoints` not
empty) :meth:`~Backend.checkpoint`\\ s a running job into a directory and leaves it **frozen**
(not running, not ended, its cores still held); the caller then either :meth:`~Backend.resume`\\ s
it (the move was abandoned) or :meth:`~Backend.release`\\ s it (it runs elsewhere now: killed, its
``on_exit`` never called). Another site :meth:`~Backend.restore`\\ s the checkpoint like a
start: with a launch token journaled first, so that a restarted broker settles it exactly once
(:meth:`~Backend.settle_launch`). Two kinds: ``criu`` (a CRIU image of the job's process tree,
any program) and ``application`` (the job saves its own state through
:mod:`gbroker.app.malleable`'s hooks and is started again to restore it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path, PurePosixPath
from signal import Signals
from types import MappingProxyType
from typing import Any, Protocol

from gbroker.core.limits import NOTHING, Used
from gbroker.core.model import SiteState
from gbroker.errors import InvalidInput
from gbroker.site import spmd
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.safe_paths import Account

__all__ = [
    "MANAGERS",
    "Backend",
    "Capacity",
    "Checkpoint",
    "CheckpointError",
    "ExitCallback",
    "ExitResult",
    "JobSpec",
    "LaunchRecord",
    "Limits",
    "Resizable",
    "RunningJob",
    "StopReason",
    "check_job_id",
    "check_text",
    "check_token",
    "seen_with",
]

MANAGERS = ("local", "slurm", "gridengine")
"""The back-ends a site may name (its topology's ``manager``, ``gbroker serve --manager``)."""


_MAX_NAME = 255  # a single path component on every filesystem we care about


class StopReason(StrEnum):
    """Why the executor stopped a job (rather than the job ending on its own)."""

    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    SHUTDOWN = "shutdown"
    """:meth:`Executor.aclose` stopped it (its broker shut down, its jobs with it)."""
    CPU_LIMIT = "cpu_limit"
    """A moved job had used up its CPU-time limit at the sites it ran at before
    (:attr:`JobSpec.used`): it is stopped as it is restored."""


def check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(name, "a string", value)
    if "\0" in value:
        raise InvalidInput(name, "text without NUL characters", value)
    return value


def check_token(value: object) -> str:
    token = check_text("launch_token", value)
    if not (0 < len(token) <= 64 and token.isascii() and token.isalnum()):
        raise InvalidInput("launch_token", "1-64 ASCII letters and digits", token)
    return token


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """What the launcher recorded of a launch (:meth:`Executor.settle_launch`).

    Attributes:
        pid: the job's pid (its process group id), or None if the start failed (or the
            launcher died between beginning the launch and recording how it went).
        started_at: the job's true start (wall clock, the launcher's), if it started.
        error: why it did not start, if it did not.
    """

    pid: int | None
    started_at: float | None = None
    error: str | None = None


def check_job_id(value: object) -> str:
    job_id = check_text("job_id", value)
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


def check_relative(name: str, value: object) -> str:
    """A path inside the job directory: relative, no '..' component, naming something."""
    text = check_text(name, value)
    path = PurePosixPath(text)
    if not text or path.is_absolute() or ".." in path.parts or not path.parts:
        raise InvalidInput(name, "a relative path inside the job directory, without '..'", value)
    return str(path)


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a job, each applied as its soft and hard rlimit before ``exec``.

    None leaves a limit to the site's default (:class:`Executor` ``default_limits``), and a
    default of None leaves it as the launcher has it.

    Attributes:
        memory: bytes of address space (``RLIMIT_AS``): an allocation beyond it fails.
        processes: processes of the job's *user* (``RLIMIT_NPROC``; every job of that user
            counts, and root is exempt).
        file_size: bytes any one file may grow to (``RLIMIT_FSIZE``; beyond: SIGXFSZ).
        cpu_time: CPU seconds (``RLIMIT_CPU``; beyond: SIGXCPU, then SIGKILL).
        open_files: open file descriptors (``RLIMIT_NOFILE``).
    """

    memory: int | None = None
    processes: int | None = None
    file_size: int | None = None
    cpu_time: int | None = None
    open_files: int | None = None

    def __post_init__(self) -> None:
        for name in _LIMIT_NAMES:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidInput(f"limits.{name}", "an integer >= 1 or None", value)

    def over(self, job: Limits) -> Limits:
        """These limits (a site's defaults) with the ones ``job`` sets laid over them."""
        if job == _NO_LIMITS:  # most jobs set none: the site's own (every job pays for this)
            return self
        return Limits(
            **{
                name: getattr(self, name) if getattr(job, name) is None else getattr(job, name)
                for name in _LIMIT_NAMES
            }
        )

    def rlimits(self) -> dict[str, int]:
        """The limits that are set, by field name (:data:`.launcher.RLIMITS` maps them)."""
        return {
            name: getattr(self, name) for name in _LIMIT_NAMES if getattr(self, name) is not None
        }


_LIMIT_NAMES = tuple(item.name for item in fields(Limits))
_NO_LIMITS = Limits()


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
        user: the local account to run as (one of the executor's ``accounts``, or ``#UID``, a
            uid its ``uids`` handed out: :meth:`Executor.account_for`); None for the
            executor's ``run_as``.
        limits: the job's resource limits, over the site's defaults.
        launch_token: this launch's token (letters and digits, at most 64), which the caller
            journaled before starting; the launcher records the launch under it (see
            :meth:`Executor.settle_launch`). None: no record.
        control: a malleable job (the driver follows its control socket, which every job's
            environment names: ``GBROKER_CONTROL``, :meth:`Executor.control_path`; see
            :mod:`gbroker.app.malleable`).
        ranks: an SPMD job's MPI ranks: the executable and its arguments are started as these
            ranks by the flavour's ``mpiexec``, bound to the job's CPUs (:mod:`.spmd`); a site
            without that launcher fails the job, saying so. None: the executable runs once.
        hosts: the site's hosts the job may run on (its candidate hosts there, in the site's
            order); empty: any. The ``local`` back-end's hosts are groups of its core slots
            (``Executor(hosts=...)``), a batch system's its nodes.
        append_output: open stdout and stderr to append, not anew (a job started again from
            its own saved state after a move goes on writing where it stopped).
        used: what a job moved here used at the sites it ran at before
            (:mod:`gbroker.core.limits`): ``time_limit`` and ``limits.cpu_time`` are the job's
            in all, and it gets what is left of them (none left: it is stopped at once).
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
    user: str | None = None
    limits: Limits = field(default_factory=Limits)
    launch_token: str | None = None
    control: bool = False
    ranks: spmd.Ranks | None = None
    hosts: tuple[str, ...] = ()
    append_output: bool = False
    used: Used = NOTHING

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        check_job_id(self.job_id)
        if not isinstance(self.used, Used):
            raise InvalidInput("used", "a Used", self.used)
        if isinstance(self.hosts, str) or not all(isinstance(h, str) and h for h in self.hosts):
            raise InvalidInput("hosts", "a sequence of host names", self.hosts)
        set_(self, "hosts", tuple(self.hosts))
        if self.ranks is not None and not isinstance(self.ranks, spmd.Ranks):
            raise InvalidInput("ranks", "a Ranks or None", self.ranks)
        if self.launch_token is not None:
            check_token(self.launch_token)
        if self.user is not None and not check_text("user", self.user):
            raise InvalidInput("user", "a local account name or None", self.user)
        if not isinstance(self.limits, Limits):
            raise InvalidInput("limits", "a Limits", self.limits)
        if not check_text("executable", self.executable):
            raise InvalidInput("executable", "a program name or path", self.executable)
        if isinstance(self.arguments, str | bytes):  # a lone string would become its letters
            raise InvalidInput("arguments", "a sequence of strings", self.arguments)
        arguments = tuple(self.arguments)
        for i, argument in enumerate(arguments):
            check_text(f"arguments[{i}]", argument)
        set_(self, "arguments", arguments)
        if not isinstance(self.environment, Mapping):
            raise InvalidInput("environment", "a mapping of names to strings", self.environment)
        environment = dict(self.environment)
        for key, value in environment.items():
            name = check_text("environment", key)
            if not name or "=" in name:
                raise InvalidInput("environment", "variable names without '='", key)
            check_text(f"environment.{name}", value)
        set_(self, "environment", MappingProxyType(environment))
        for key in ("working_directory", "stdin"):
            value = getattr(self, key)
            if value is not None:
                set_(self, key, check_relative(key, value))
        for key in ("stdout", "stderr"):
            set_(self, key, check_relative(key, getattr(self, key)))
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
        ended_by: what the site did to end the job, for people, when it was the site: its
            wall-time limit, a cancel or the broker's shutdown, with the signals sent (``killed
            at its wall-time limit of 60 s: SIGTERM, then SIGKILL after the 5 s grace
            period``), or a resource limit whose signal ended it (SIGXCPU, SIGXFSZ); None
            when the job ended on its own.
    """

    job_id: str
    exit_code: int | None
    signal: int | None
    started_at: float
    ended_at: float
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None
    ended_by: str | None = None

    @property
    def exit_status(self) -> int | None:
        """The exit code, or minus the number of the signal that ended the job (as Python's
        ``subprocess`` has it, and a peer report's ``exit_code``); None if neither is known."""
        if self.exit_code is not None:
            return self.exit_code
        return None if self.signal is None else -self.signal

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
    """Pid of the job's leader (its program), which is also the id of its process group;
    what a restarted broker passes to :meth:`Executor.adopt`."""
    cores: int
    started_at: float
    deadline: float | None
    """Wall-clock time at which the time limit stops the job; None without a limit."""
    stopping: StopReason | None
    """Set once the executor has begun to stop the job."""
    launch_token: str | None = None
    """The token of its launch record, where its launcher records how it ends: what a
    successor passes to :meth:`Executor.adopt` (the caller's token, or one the executor made)."""


ExitCallback = Callable[[ExitResult], None]
"""Called once per accepted start or adoption, in the event loop's thread, with how the job
ended."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the machine behind a site reports, every user's work included.

    Attributes:
        total_cores: the cores it has (a batch system's CPUs in its partitions).
        free_cores: the cores idle now.
        queued: jobs waiting in its own queue that GBroker did not put there (the cluster's own
            users' load, which F(j)'s q_j should see).
        running: jobs running there that GBroker did not start.
    """

    total_cores: int
    free_cores: int
    queued: int = 0
    running: int = 0

    def __post_init__(self) -> None:
        for name in ("total_cores", "free_cores", "queued", "running"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"capacity.{name}", "an integer >= 0", value)


def seen_with(state: SiteState, capacity: Capacity | None) -> SiteState:
    """The site's own state (its scheduler's) as DCSMon reports it, the back-end's figures laid
    over: no more free cores than the machine has idle, and the others' queue and running jobs
    counted. None leaves the state as it is."""
    if capacity is None:
        return state
    free = min(state.free_cores, capacity.free_cores)
    shrinkable = min(state.shrinkable, state.total_cores - free)
    return SiteState(
        state.total_cores,
        free,
        state.queued + capacity.queued,
        state.running + capacity.running,
        draining=state.draining,
        shrinkable=shrinkable,
        shareable=min(state.shareable, state.total_cores - free - shrinkable),
        cpu=state.cpu,
    )


class Resizable(Protocol):
    """What resizing a running job asks of a back-end that can (:mod:`.resize`): its core slots
    and the CPUs they are, changed and pinned."""

    def slots_of(self, job_id: str) -> tuple[int, ...]:
        """The core slots the job holds."""
        ...

    def cpus_of(self, job_id: str) -> tuple[int, ...]:
        """The CPUs of the job's slots."""
        ...

    def resize_slots(self, job_id: str, cores: int) -> tuple[int, ...]:
        """Give the job ``cores`` slots (as many as it can have); the slots it holds then."""
        ...

    def pin(self, job_id: str) -> tuple[int, ...]:
        """Move the job's threads to exactly the CPUs of its slots; those CPUs."""
        ...

    def control_path(self, job_id: str) -> Path:
        """The job's control socket."""
        ...

    def running_job(self, job_id: str) -> RunningJob | None: ...


class Backend(Protocol):
    """What runs a site's jobs; see the module's docstring."""

    name: str
    """The back-end's manager name (:data:`MANAGERS`)."""
    root: Path
    """Where job directories live (:meth:`job_dir`)."""
    resizes: bool
    """Whether a running job's cores can change (malleable jobs): :meth:`resizable`."""
    confinement: str
    """How jobs are confined, for people (the health report, ``fleet status``)."""

    def resizable(self) -> Resizable | None:
        """Its cores, for resizing running jobs (:class:`~gbroker.site.resize.Resizer`); None
        where :attr:`resizes` is False."""
        ...

    def jobs_run_as(self) -> str:
        """Who the site's jobs run as, in words (the log, ``/api/v1/info``, ``fleet status``)."""
        ...

    def health(self) -> dict[str, Any]:
        """What the back-end adds to the broker's health report on it (its ``executor`` part),
        beside what every back-end says (:attr:`name`, :attr:`confinement`, what runs)."""
        ...

    def job_dir(self, job_id: str) -> Path:
        """The job's directory: where its inputs are staged and its outputs written."""
        ...

    def account_for(self, submitter: str) -> str | None:
        """The local account ``submitter``'s jobs run as (:attr:`JobSpec.user`); None: the
        site's default account."""
        ...

    def owner_for(self, submitter: str | None) -> Account:
        """The uid and gid ``submitter``'s jobs run as here (None: the site's default account):
        their directories' owner, whose rights the broker takes to touch what is in them
        (:mod:`gbroker.site.safe_paths`). Raises :class:`InvalidInput` as a start would."""
        ...

    async def start(self, spec: JobSpec, cores: int, on_exit: ExitCallback) -> None:
        """Start a job on ``cores`` cores; return once it runs or failed to start (the failure
        then goes to ``on_exit``). ``on_exit`` hears how it ended, exactly once."""
        ...

    checkpoints: tuple[str, ...]
    """The kinds of :class:`Checkpoint` it can take and restore (``()``: none, as at a batch
    system's site)."""

    async def checkpoint(self, job_id: str, into: Path) -> Checkpoint:
        """Freeze a running job and write its state into ``into`` (a new, empty directory);
        the job stays frozen, holding its cores, until :meth:`resume` or :meth:`release`.
        :class:`CheckpointError` if it cannot (the job then runs on)."""
        ...

    async def resume(self, job_id: str) -> None:
        """Let a frozen job run on where it is (its move was abandoned)."""
        ...

    async def release(self, job_id: str) -> None:
        """A frozen job runs elsewhere now: kill it here, quietly (its ``on_exit`` is not
        called), and free its cores."""
        ...

    async def restore(self, spec: JobSpec, image: Path, cores: int, on_exit: ExitCallback) -> None:
        """Start a job from a checkpoint's ``image``, its directory already in place at
        :meth:`job_dir`; as :meth:`start` otherwise (``spec`` carries the launch token)."""
        ...

    async def settle_launch(self, token: str, patience: float = 5.0) -> LaunchRecord | None:
        """After a restart: what began under ``token`` (its handle in ``pid``), or None if
        nothing did and nothing ever will."""
        ...

    def forget_launch(self, token: str) -> None:
        """The job's end was acknowledged: its launch's record may go."""
        ...

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
        """Take over a job an earlier broker started (``pgid``: its handle); ``used``: what a
        job moved here used before (:attr:`JobSpec.used`)."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Stop a running job; False if none runs under that id."""
        ...

    def running_job(self, job_id: str) -> RunningJob | None: ...

    def running(self) -> Mapping[str, RunningJob]: ...

    def capacity(self) -> Capacity | None:
        """The machine's own figures (None: the site's scheduler knows everything)."""
        ...

    @property
    def closed(self) -> bool: ...

    async def aclose(self, detach: bool = False) -> None:
        """Stop: the jobs with it, or (``detach``) leave them running for a successor."""
        ...
