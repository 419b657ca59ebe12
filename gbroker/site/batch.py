"""What the batch-system back-ends share: :class:`BatchBackend`, the follower of a site's jobs
in a batch system, which :mod:`.slurm` and :mod:`.gridengine` each complete in the batch
system's own terms (submit, release, cancel, list the queue, say how a job ended); the account
a job is submitted as, a job as the queue lists it, and a job as the back-end follows it (the
queue's words are Slurm's: a back-end translates its own into them)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Self

from gbroker.core.limits import NOTHING, Used
from gbroker.errors import InvalidInput
from gbroker.site import spmd
from gbroker.site.backend import (
    Capacity,
    ExitCallback,
    ExitResult,
    JobSpec,
    LaunchRecord,
    Limits,
    RunningJob,
    StopReason,
)
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.identity import LocalAccount, local_account
from gbroker.site.launcher import LAUNCHES
from gbroker.site.safe_paths import Account, directory_inside, give_directory

__all__ = ["SEARCH_PATH", "BatchAccount", "BatchBackend", "BatchError", "BatchRun", "QueueRow"]

log = logging.getLogger(__name__)

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
"""Where the batch system's commands are looked for (its daemons' tools are often in sbin)."""
HELD = ("JobHeldUser", "JobHeldAdmin")
"""Why a held job waits, in the queue's words."""
_FINAL = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
_CANNOT = ("PartitionConfig", "PartitionNodeLimit", "BadConstraints", "ReqNodeNotAvail")
"""Why Slurm says a job waits, when the cluster as configured cannot run it."""
_HOLD_PATIENCE = 60.0  # seconds a job Slurm will not release stays held before it is cancelled
_RLIMIT_OPTIONS = {
    "memory": "--as",
    "processes": "--nproc",
    "file_size": "--fsize",
    "cpu_time": "--cpu",
    "open_files": "--nofile",
}


class BatchError(InvalidInput):
    """A batch system's command failed (its words in the message)."""


BatchAccount = LocalAccount
"""The account a job is submitted as: its user name, uid and gid (as every back-end's)."""


@dataclass(slots=True)
class QueueRow:
    """One job as ``squeue`` shows it."""

    slurm_id: int
    state: str
    started_at: float | None
    ended_at: float | None
    status: int
    reason: str
    comment: str


@dataclass(slots=True)
class BatchRun:
    """A job the back-end follows in the batch system, from its launch to its reported end."""

    job_id: str
    cores: int
    time_limit: float | None
    on_exit: ExitCallback
    token: str
    slurm_id: int | None = None
    started_at: float | None = None
    stopping: StopReason | None = None
    running: asyncio.Future[None] | None = None
    """For a start: done once Slurm runs the job (or it ended)."""
    returned: bool = True
    """:meth:`.slurm.SlurmBackend.start` has returned: its end may be reported."""
    result: ExitResult | None = None
    reported: bool = False
    missing: int = 0
    """Polls in a row that did not show the job."""
    stdout: Path | None = None
    timer: asyncio.TimerHandle | None = None
    held_since: float | None = None
    """Its release failed (monotonic time): it is released again at each poll."""
    releasing: bool = False
    release_error: str | None = None
    """The batch system would not release it in the back-end's patience: cancelled, with these
    words."""
    submitted_at: float = field(default_factory=time.time)

    def view(self) -> RunningJob:
        assert self.slurm_id is not None
        started = self.started_at if self.started_at is not None else self.submitted_at
        deadline = None if self.time_limit is None else started + self.time_limit
        return RunningJob(
            self.job_id, self.slurm_id, self.cores, started, deadline, self.stopping, self.token
        )


class BatchBackend:
    """Runs a site's jobs as batch jobs and follows them (:class:`~gbroker.site.backend.Backend`):
    launch records, held submission and release, one poll loop, adoption, exactly-once reports.
    A subclass sets who it is (:attr:`name`, :attr:`_system`) and its constructor's attributes,
    then :meth:`_init_following`, and completes the hooks below in its batch system's terms."""

    name: str
    _system: str
    """The batch system's name, for people."""
    root: Path
    site: str
    interval: float
    allow_root: bool
    run_as: BatchAccount
    accounts: Mapping[str, str]
    default_limits: Limits
    uids: None
    cgroups: None
    confinement: str
    _job_path: str
    _env: dict[str, str]

    # -- what each batch system does in its own terms ---------------------------------------------

    def _where(self) -> dict[str, str]:
        """Where the batch system is, for the health report."""
        raise NotImplementedError

    async def _submit(self, run: BatchRun, spec: JobSpec, account: BatchAccount) -> None:
        """Submit the job held, record its id, and release it."""
        raise NotImplementedError

    async def _release(self, slurm_id: int) -> None:
        """Let a held job run."""
        raise NotImplementedError

    async def _cancel_job(self, slurm_id: int) -> None:
        """Take a job out of the batch system (a job already gone is no error)."""
        raise NotImplementedError

    async def _queue(self) -> list[QueueRow]:
        """Every job the batch system lists (and, for ours it no longer lists, how they ended)."""
        raise NotImplementedError

    async def _cluster_cpus(self) -> tuple[int, int] | None:
        """The cluster's CPUs: (total, idle)."""
        raise NotImplementedError

    def _result(self, run: BatchRun, row: QueueRow, started: float, ended: float) -> ExitResult:
        """How a job in a final state ended, in the batch system's words."""
        raise NotImplementedError

    # -- the following, shared --------------------------------------------------------------------
    resizes = False
    checkpoints: tuple[str, ...] = ()

    def _init_following(self) -> None:
        """The state of the runs and of the poll loop (what every batch back-end keeps)."""
        self.hold_patience = _HOLD_PATIENCE
        """Seconds a job the batch system will not release, or cannot run as configured, waits
        before it is cancelled and its start failed."""
        self._node_names: list[str] | None = None
        self._runs: dict[str, BatchRun] = {}
        self._by_slurm: dict[int, BatchRun] = {}
        self._submitting: set[str] = set()
        self._capacity: Capacity | None = None
        self._closed = False
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._submits: asyncio.Semaphore | None = None
        self._polled = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- identity --------------------------------------------------------------------------------

    def _known(self, field_name: str, name: str) -> BatchAccount:
        account = local_account(field_name, name, "the name of an account the cluster knows")
        if account.uid == 0 and not self.allow_root:
            raise InvalidInput(field_name, "an unprivileged account (allow_root is off)", name)
        return account

    def account_for(self, submitter: str) -> str | None:
        return self.accounts.get(submitter)

    def owner_for(self, submitter: str | None) -> Account:
        """The uid and gid ``submitter``'s jobs run as (:class:`~.backend.Backend`)."""
        if os.geteuid() != 0:  # sbatch runs them as we are
            return Account(os.geteuid(), os.getegid())
        user = None if submitter is None else self.account_for(submitter)
        account = self._account_named(user, "submitter")
        return Account(account.uid, account.gid)

    def _account_of(self, spec: JobSpec) -> BatchAccount:
        return self._account_named(spec.user, f"job[{spec.job_id}].user")

    def _account_named(self, user: str | None, field_name: str) -> BatchAccount:
        if user is None or user == self.run_as.name:
            return self.run_as
        if user not in self.accounts.values():
            raise InvalidInput(field_name, "an account named in the site's accounts", user)
        return self._known(field_name, user)

    # -- the public face -------------------------------------------------------------------------

    async def checkpoint(self, job_id: str, into: Path) -> Checkpoint:
        raise CheckpointError(f"a {self.name} site cannot checkpoint a running job")

    async def resume(self, job_id: str) -> None:
        raise CheckpointError(f"a {self.name} site cannot checkpoint a running job")

    async def release(self, job_id: str) -> None:
        raise CheckpointError(f"a {self.name} site cannot checkpoint a running job")

    async def restore(self, spec: JobSpec, image: Path, cores: int, on_exit: ExitCallback) -> None:
        raise CheckpointError(f"a {self.name} site cannot restore a checkpointed job")

    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id in (".", ".."):
            raise InvalidInput("job_id", "a directory name", job_id)
        return self.root / job_id

    @property
    def closed(self) -> bool:
        return self._closed

    def capacity(self) -> Capacity | None:
        return self._capacity

    def resizable(self) -> None:
        """None: a batch job keeps the cores it was given."""
        return None

    def jobs_run_as(self) -> str:
        mapped = "the account --accounts maps a user to, else " if self.accounts else ""
        return f"{mapped}one account for all: {self.run_as.name} ({self._system}: --run-as)"

    def health(self) -> dict[str, Any]:
        """Where its cluster is, its limits, and what the cluster has free."""
        capacity = self.capacity()
        return {
            **self._where(),
            "uid_per_user": False,
            "limits": self.default_limits.rlimits(),
            "cluster": None if capacity is None else dataclasses.asdict(capacity),
        }

    def running(self) -> Mapping[str, RunningJob]:
        return MappingProxyType(
            {
                job_id: run.view()
                for job_id, run in self._runs.items()
                if run.slurm_id is not None and not run.reported
            }
        )

    def running_job(self, job_id: str) -> RunningJob | None:
        run = self._runs.get(job_id)
        if run is None or run.slurm_id is None or run.reported:
            return None
        return run.view()

    async def start(self, spec: JobSpec, cores: int, on_exit: ExitCallback) -> None:
        if self._closed:
            raise InvalidInput("site", "a site that is not shutting down", self.site)
        if not isinstance(spec, JobSpec):
            raise InvalidInput("spec", "a JobSpec", spec)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"job[{spec.job_id}].cores", "an integer >= 1", cores)
        if spec.job_id in self._runs:
            raise InvalidInput("job_id", "a job not running here already", spec.job_id)
        if spec.launch_token is None:
            raise InvalidInput(f"job[{spec.job_id}].launch_token", "a token (Slurm site)", None)
        account = self._account_of(spec)
        token = spec.launch_token
        loop = asyncio.get_running_loop()
        run = BatchRun(spec.job_id, cores, spec.time_limit, on_exit, token, returned=False)
        run.running = loop.create_future()
        self._runs[spec.job_id] = run
        self._submitting.add(token)
        try:
            await self._submit(run, spec, account)
        except (OSError, InvalidInput) as exc:
            now = time.time()
            run.result = ExitResult(spec.job_id, None, None, now, now, error=str(exc))
            self._finish(run)
        finally:
            self._submitting.discard(token)
        if run.slurm_id is not None and run.result is None:
            self._ensure_loop().set()
            await asyncio.shield(run.running)
        run.returned = True
        if run.result is not None:
            loop.call_soon(self._report, run)

    async def settle_launch(self, token: str, patience: float = 5.0) -> LaunchRecord | None:
        record = self._records() / token
        try:
            lines = record.read_text().splitlines()
        except FileNotFoundError:
            self._write_record(token, {"void": True}, new=True)
            return None
        facts: dict[str, object] = {}
        for line in lines:
            with contextlib.suppress(ValueError):
                facts.update(json.loads(line))
        if facts.get("void"):
            return None
        slurm_id = facts.get("slurm_id")
        rows = {row.slurm_id: row for row in await self._queue()}
        if not isinstance(slurm_id, int):  # killed between sbatch and the record: ask Slurm
            comment = self._comment(token)
            found = [row.slurm_id for row in rows.values() if row.comment == comment]
            if not found:
                self._write_record(token, {"void": True})
                return None
            # Ids only grow: a copy of the comment (it is public in squeue) came later.
            slurm_id = min(found)
            self._write_record(token, {"slurm_id": slurm_id})
        row = rows.get(slurm_id)
        if row is not None and row.state == "PENDING" and row.reason in HELD:
            await self._release(slurm_id)
        started = row.started_at if row is not None and row.started_at else time.time()
        return LaunchRecord(slurm_id, started)

    def forget_launch(self, token: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._records() / token).unlink()
        (self._records() / f"{token}.sh").unlink(missing_ok=True)

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
        used: Used = NOTHING,  # a batch site restores no moved job: it used nothing before
    ) -> None:
        if job_id in self._runs:
            raise InvalidInput("job_id", "a job not running here already", job_id)
        if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid < 1:
            raise InvalidInput(f"job[{job_id}].slurm_id", "a Slurm job id", pgid)
        run = BatchRun(job_id, cores, time_limit, on_exit, launch_token or "", slurm_id=pgid)
        run.started_at = started_at
        run.stdout = None
        self._runs[job_id] = run
        self._by_slurm[pgid] = run
        self._ensure_loop().set()
        log.info("job %s: adopted Slurm job %d", job_id, pgid)

    def cancel(self, job_id: str) -> bool:
        run = self._runs.get(job_id)
        if run is None or run.reported:
            return False
        if run.stopping is None:
            run.stopping = StopReason.CANCELLED
            if run.slurm_id is not None:
                self._spawn(self._cancel_job(run.slurm_id))
        return True

    async def aclose(self, detach: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not detach:
            for run in list(self._runs.values()):
                if run.slurm_id is not None and not run.reported:
                    run.stopping = run.stopping or StopReason.SHUTDOWN
                    await self._cancel_job(run.slurm_id)
            deadline = time.monotonic() + 15.0
            while any(not r.reported for r in self._runs.values()) and (
                time.monotonic() < deadline
            ):
                await self._poll_once()
                await asyncio.sleep(0.2)
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- submitting ------------------------------------------------------------------------------

    def _records(self) -> Path:
        records = self.root / LAUNCHES
        records.mkdir(mode=0o700, parents=True, exist_ok=True)
        return records

    def _write_record(self, token: str, facts: Mapping[str, object], new: bool = False) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        if new:
            flags |= os.O_EXCL
        fd = os.open(self._records() / token, flags, 0o600)
        try:
            os.write(fd, json.dumps(dict(facts)).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def _comment(self, token: str) -> str:
        return f"gbroker:{self.site}:{token}"

    def _script(self, run: BatchRun, spec: JobSpec, job_dir: Path) -> str:
        env = {"PATH": self._job_path, "LANG": "C.UTF-8", "HOME": str(job_dir)}
        env.update(spec.environment)
        env.setdefault("OMP_NUM_THREADS", str(run.cores))
        env.update(
            GBROKER_JOB_ID=spec.job_id,
            GBROKER_CORES=str(run.cores),
            GBROKER_SITE=self.site,
            GBROKER_JOB_DIR=str(job_dir),
        )
        lines = ["#!/bin/sh", "# written by GBroker; the job's environment, then its program"]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
        # The memory a job asked for is the cluster's to hold (its nodes' RealMemory, --mem):
        # as an address-space rlimit on each process it would only break programs that map
        # more than they touch. The site's default memory, an operator's choice, still goes.
        own = dataclasses.replace(spec.limits, memory=None)
        limits = self.default_limits.over(own).rlimits()
        command = [spec.executable, *spec.arguments]
        if spec.ranks is not None:  # an MPI job: mpiexec finds the allocation and uses srun
            command = spmd.batch_argv(spec.ranks, command)
        if limits:
            options = [f"{_RLIMIT_OPTIONS[name]}={value}" for name, value in limits.items()]
            command = ["prlimit", *options, "--", *command]
        lines.append("exec " + " ".join(shlex.quote(word) for word in command))
        return "\n".join(lines) + "\n"

    def _prepare(self, spec: JobSpec, account: BatchAccount) -> tuple[Path, Path]:
        """The job's directory, given to the job's account (as the local back-end's launchers
        give it), and its working directory, made as that account (never through a link).
        Nothing in it is given away: the job's inputs were staged as its account already, and
        whatever else is there may be the job's hard link to another's file."""
        owner = Account(account.uid, account.gid)
        job_dir = self.job_dir(spec.job_id)
        give_directory(job_dir, owner)
        if not spec.working_directory:
            return job_dir, job_dir
        os.close(directory_inside(job_dir, spec.working_directory, owner, create=True, mode=0o700))
        return job_dir, job_dir / spec.working_directory

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.ensure_future(coroutine)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- following -------------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._loop_task is None and not self._closed:
            self._loop_task = asyncio.get_running_loop().create_task(self._follow())
        return self._wake

    def watch(self) -> None:
        """Start following the cluster now (its capacity for DCSMon), not at the first job."""
        self._ensure_loop()

    async def _follow(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self._poll_once()
            except (OSError, BatchError) as exc:
                log.warning("%s: following %s: %s", self.site, self._system, exc)
            waiting = any(
                r.running is not None and not r.running.done() for r in self._runs.values()
            )
            delay = self.interval / 5 if waiting else self.interval
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # not wait_for: it may swallow a cancel
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _poll_once(self) -> None:
        rows = await self._queue()
        self._polled += 1
        prefix = f"gbroker:{self.site}:"
        seen: set[int] = set()
        queued = running = 0
        for row in rows:
            run = self._by_slurm.get(row.slurm_id)
            if run is None:
                if row.comment.startswith(prefix):
                    self._stray(row, row.comment[len(prefix) :])
                elif row.state == "PENDING":
                    queued += 1
                elif row.state in ("RUNNING", "COMPLETING", "SUSPENDED"):
                    running += 1
                continue
            seen.add(row.slurm_id)
            self._update(run, row)
        for slurm_id, run in list(self._by_slurm.items()):
            if slurm_id in seen or run.reported or run.result is not None:
                continue
            run.missing += 1
            if run.missing >= 3:  # purged (MinJobAge) before we saw it end
                now = time.time()
                started = run.started_at or now
                run.result = ExitResult(
                    run.job_id,
                    None,
                    None,
                    started,
                    now,
                    error=f"Slurm no longer knows job {slurm_id} (it ended while its broker "
                    "was away); its exit status is unknown",
                )
                self._finish(run)
        if self._polled % 5 == 1 or self._capacity is None:
            cpus = await self._cluster_cpus()
            if cpus is not None:
                self._capacity = Capacity(cpus[0], cpus[1], queued, running)

    def _stray(self, row: QueueRow, token: str) -> None:
        """A job of this site's that no run knows: a held one whose record is void or absent
        was submitted by a broker that died in ``sbatch``, and must never run."""
        if row.state != "PENDING" or row.reason not in HELD or token in self._submitting:
            return
        try:
            text = (self._records() / token).read_text()
        except FileNotFoundError:
            text = '{"void": true}'
        except OSError:
            return
        if '"void"' in text:
            log.warning("%s: cancelling Slurm job %d, a launch made void", self.site, row.slurm_id)
            self._spawn(self._cancel_job(row.slurm_id))

    def _update(self, run: BatchRun, row: QueueRow) -> None:
        run.missing = 0
        if row.state == "PENDING" and row.reason in HELD and run.stopping is None:
            self._release_later(run)
        elif row.state == "PENDING" and row.reason in _CANNOT and run.stopping is None:
            # The cluster as it is cannot give it what it asks (its nodes, its CPUs): it
            # would wait forever; past the patience it is cancelled, with Slurm's reason.
            if run.held_since is None:
                run.held_since = time.monotonic()
            elif time.monotonic() - run.held_since > self.hold_patience and run.slurm_id:
                run.release_error = f"Slurm cannot run it here ({row.reason})"
                run.stopping = StopReason.CANCELLED
                self._spawn(self._cancel_job(run.slurm_id))
        if row.state in ("RUNNING", "COMPLETING", "SUSPENDED") or row.state in _FINAL:
            if run.running is not None and not run.running.done():
                run.started_at = self._start_time(run, row)
                run.running.set_result(None)
            elif run.started_at is None:
                run.started_at = self._start_time(run, row)
            self._time_limit(run)
        if row.state not in _FINAL or run.result is not None:
            return
        started = run.started_at or row.started_at or time.time()
        ended = max(row.ended_at or time.time(), started)  # Slurm's are whole seconds
        run.result = self._result(run, row, started, ended)
        self._finish(run)

    def _release_later(self, run: BatchRun) -> None:
        """A recorded job still held (its release failed): released at a later poll, or, held
        past :data:`_HOLD_PATIENCE` seconds, cancelled and its start failed with Slurm's words
        (it never ran: the site's scheduler may place it again)."""
        assert run.slurm_id is not None
        if run.held_since is None:
            run.held_since = time.monotonic()
        if run.releasing:
            return
        run.releasing = True
        slurm_id = run.slurm_id

        async def release() -> None:
            try:
                await self._release(slurm_id)
            except BatchError as exc:
                if time.monotonic() - (run.held_since or 0.0) > self.hold_patience:
                    run.release_error = str(exc)
                    run.stopping = StopReason.CANCELLED
                    await self._cancel_job(slurm_id)
            finally:
                run.releasing = False

        self._spawn(release())

    def _time_limit(self, run: BatchRun) -> None:
        """Slurm's ``--time`` counts whole minutes: the limit to the second is ours."""
        if run.time_limit is None or run.timer is not None or run.started_at is None:
            return
        delay = max(0.0, run.started_at + run.time_limit - time.time())
        run.timer = asyncio.get_running_loop().call_later(delay, self._time_out, run)

    def _time_out(self, run: BatchRun) -> None:
        if run.reported or run.result is not None or run.stopping is not None:
            return
        run.stopping = StopReason.TIMED_OUT
        if run.slurm_id is not None:
            self._spawn(self._cancel_job(run.slurm_id))

    def _start_time(self, run: BatchRun, row: QueueRow) -> float:
        """When the job started, as first seen running (or ended): its output file's time
        where it lies between Slurm's ``StartTime`` (whole seconds, at allocation) and now
        (slurmstepd makes the file as it launches the job, which may be seconds after the
        allocation on a busy node; a job that wrote since moved it, but not past now)."""
        now = time.time()
        start = row.started_at or now
        if run.stdout is not None:
            with contextlib.suppress(OSError):
                mtime = run.stdout.stat().st_mtime
                if start <= mtime <= now:
                    return mtime
        return start

    def _finish(self, run: BatchRun) -> None:
        if run.running is not None and not run.running.done():
            run.running.set_result(None)
        if run.returned:
            asyncio.get_running_loop().call_soon(self._report, run)

    def _report(self, run: BatchRun) -> None:
        if run.reported or run.result is None:
            return
        run.reported = True
        if run.timer is not None:
            run.timer.cancel()
        self._runs.pop(run.job_id, None)
        if run.slurm_id is not None:
            self._by_slurm.pop(run.slurm_id, None)
        try:
            run.on_exit(run.result)
        except Exception:
            log.exception("job %s: on_exit failed", run.job_id)
