"""The ``slurm`` back-end: a site in front of a Slurm cluster (ARCHITECTURE §11).

Theory of operation. The site's scheduler (the core's) still decides *when* a job is handed on
and on how many cores; this back-end hands it to the cluster's own ``slurmctld`` and follows it
there with the client commands, run with the cluster's ``SLURM_CONF``:

- **Start** (:meth:`SlurmBackend.start`). The launch record (``root/.gbroker-launches/TOKEN``,
  where no job reaches) is written *before* ``sbatch``; the job is submitted **held**
  (``sbatch --parsable --hold``), with ``--comment=gbroker:SITE:TOKEN``, its cores
  (``--ntasks=1 --cpus-per-task=N``), its wall-time limit (``--time``, rounded up to the
  second), working directory, standard streams (in the job directory), ``--no-requeue`` (a
  node failure must not run it a second time: the broker decides what happens next) and
  ``--uid``/``--gid`` of its account; Slurm's id is appended to the record, and only then is
  the job released (``scontrol release``). :meth:`~SlurmBackend.start` returns once Slurm runs
  the job (or it ended, or failed to start): a job the cluster's own users keep waiting waits
  here, in its launch's task.
- **Exactly once across a broker's death.** :meth:`~SlurmBackend.settle_launch` reads the
  record: an id there is the job (adopted, released if it was still held); a record without
  one (killed between ``sbatch`` and the append) is looked up in Slurm by its comment; found,
  it is adopted, else the record is made void and the job queued again. An ``sbatch`` that was
  still on its way then lands a job that is *held*: it can never run, and the poll loop
  cancels every held job of this site whose record is void or absent.
- **Following** (one poll loop per back-end): ``squeue --states=all`` every
  :attr:`~SlurmBackend.interval` seconds (a fifth of it while a start waits), one call for all
  jobs; a job in a final state is reported: ``COMPLETED``/``FAILED`` with its exit status
  (Slurm's wait status: a code or a signal), ``TIMEOUT`` as timed out, ``CANCELLED`` as
  cancelled (by us: :meth:`~SlurmBackend.cancel` is ``scancel``), ``OUT_OF_MEMORY``, node and
  boot failures with Slurm's words. A job Slurm no longer knows (``MinJobAge`` passed while its
  broker was down, and no accounting) ends with its status unknown, said so.
- **Capacity** (:meth:`~SlurmBackend.capacity`): ``sinfo``'s idle CPUs and the jobs in
  ``squeue`` that are not this site's (the cluster's own users), so DCSMon and F(j) see them.

A job's start time is Slurm's ``StartTime``, in whole seconds; where the job's standard output
file was created within that second (``slurmstepd`` opens it just before it runs the batch
script), its modification time, which is finer. Identity: jobs run as the account the
operator's ``accounts`` map gives the submitter, else ``run_as`` (``nobody``); a Slurm cluster
knows its users by name, so the uids of :mod:`.identity` (no passwd entry) cannot be used here
(``sbatch --uid`` refuses them). Limits: the site's and the job's rlimits apply through
``prlimit(1)`` in the batch script; Slurm's cgroups, where the cluster has them, do the rest.
Malleable jobs run at their start size (:attr:`SlurmBackend.resizes` is False).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import shlex
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

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
from gbroker.site.batch import BatchAccount, BatchRun, QueueRow
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.identity import closed_ancestor, local_account
from gbroker.site.launcher import LAUNCHES
from gbroker.site.safe_paths import Account, directory_inside, give_directory

__all__ = ["SlurmBackend", "SlurmError"]

log = logging.getLogger(__name__)

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"])
_HELD = ("JobHeldUser", "JobHeldAdmin")
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
_FIELDS = ("JobID", "State", "StartTime", "EndTime", "exit_code", "Reason", "Comment")
_FORMAT = ",".join(f"{name}:|" for name in _FIELDS)
_PARALLEL_SUBMITS = 8  # sbatch processes at once
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


class SlurmError(InvalidInput):
    """A Slurm command failed; the message has its words."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__("slurm", what, detail)


def _time(text: str) -> float | None:
    """Slurm's ``2026-11-26T23:14:12`` (the cluster's local time) as a Unix time."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:  # N/A, Unknown, None
        return None


def parse_squeue(text: str) -> list[QueueRow]:
    """``squeue --noheader -O`` in :data:`_FORMAT` as rows; lines that do not parse are skipped
    (another user's comment may hold anything: it is last, and split off whole)."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|", len(_FIELDS) - 1)
        if len(parts) < len(_FIELDS):
            continue
        job, state, start, end, status, reason, comment = parts
        if not job.strip().isdigit():  # an array's or a het job's element: not ours
            continue
        try:
            code = int(status.strip() or 0)
        except ValueError:
            code = 0
        rows.append(
            QueueRow(
                int(job),
                state.strip().split()[0] if state.strip() else "",
                _time(start.strip()),
                _time(end.strip()),
                code,
                reason.strip(),
                comment.rstrip("|").strip(),
            )
        )
    return rows


def parse_sinfo_cpus(text: str) -> tuple[int, int] | None:
    """``sinfo --noheader --format=%C`` (allocated/idle/other/total): (total, idle)."""
    for line in text.splitlines():
        parts = line.strip().split("/")
        if len(parts) == 4 and all(p.isdigit() for p in parts):
            return int(parts[3]), int(parts[1])
    return None


class SlurmBackend:
    """Runs a site's jobs as batch jobs of a Slurm cluster (see the module's docstring).

    Args:
        root: the job directories (on a file system the cluster's nodes share, at the same
            path) and the launch records.
        site: the site's name (in each job's comment, so sites may share a cluster).
        slurm_conf: the cluster's ``slurm.conf`` (``SLURM_CONF`` for every command).
        run_as, allow_root, accounts: as :class:`~gbroker.site.executor.Executor`'s.
        default_limits: the site's rlimits, for each one a job does not set itself.
        partition: the partition to submit to (None: the cluster's default).
        interval: seconds between two looks at the cluster's queue.
        path: the ``PATH`` jobs start with (the broker's by default).
    """

    name = "slurm"
    resizes = False
    checkpoints: tuple[str, ...] = ()

    def __init__(
        self,
        root: Path,
        *,
        site: str,
        slurm_conf: Path,
        run_as: str | None = None,
        allow_root: bool = False,
        accounts: Mapping[str, str] | None = None,
        default_limits: Limits | None = None,
        partition: str | None = None,
        interval: float = 1.0,
        path: str | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.site = site
        self.slurm_conf = Path(slurm_conf).absolute()
        if not self.slurm_conf.is_file():
            raise InvalidInput("slurm_conf", "the path of the cluster's slurm.conf", slurm_conf)
        self.partition = partition
        if not (isinstance(interval, int | float) and 0 < interval <= 60):
            raise InvalidInput("interval", "seconds in (0, 60]", interval)
        self.interval = float(interval)
        self.allow_root = bool(allow_root)
        self.run_as = self._known("run_as", run_as or "nobody")
        self.accounts = MappingProxyType(dict(accounts or {}))
        self.default_limits = default_limits or Limits()
        self.uids = None  # a Slurm cluster knows its users by name (see the module's docstring)
        self.cgroups = None
        self.confinement = f"Slurm ({self.slurm_conf}): the cluster's own"
        closed = closed_ancestor(self.root, self.run_as)
        if closed is not None:
            log.warning(
                "jobs run as %s, who may not search %s: Slurm cannot open their output files "
                "there (make it searchable, chmod o+x, or keep the data directory elsewhere)",
                self.run_as.name,
                closed,
            )
        self._job_path = path if path is not None else os.environ.get("PATH", os.defpath)
        self._env = {
            "PATH": SEARCH_PATH,
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.slurm_conf),
        }
        self._init_following()

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

    _system = "Slurm"
    """The batch system's name, for people."""

    def _where(self) -> dict[str, str]:
        """Where the cluster is, for the health report."""
        return {"slurm_conf": str(self.slurm_conf)}

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
        rows = {row.slurm_id: row for row in await self._squeue()}
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
        if row is not None and row.state == "PENDING" and row.reason in _HELD:
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
                self._spawn(self._scancel(run.slurm_id))
        return True

    async def aclose(self, detach: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not detach:
            for run in list(self._runs.values()):
                if run.slurm_id is not None and not run.reported:
                    run.stopping = run.stopping or StopReason.SHUTDOWN
                    await self._scancel(run.slurm_id)
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

    async def __aenter__(self) -> SlurmBackend:
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

    async def _submit(self, run: BatchRun, spec: JobSpec, account: BatchAccount) -> None:
        if self._submits is None:
            self._submits = asyncio.Semaphore(_PARALLEL_SUBMITS)
        job_dir, work = await asyncio.to_thread(self._prepare, spec, account)
        script = self._records() / f"{run.token}.sh"
        script.write_text(self._script(run, spec, job_dir))
        run.stdout = job_dir / spec.stdout
        args = [
            "sbatch",
            "--parsable",
            "--hold",
            "--no-requeue",
            f"--job-name=gbroker-{spec.job_id}"[:128],
            f"--comment={self._comment(run.token)}",
            *(
                spmd.sbatch_options(spec.ranks)
                if spec.ranks is not None
                else ["--ntasks=1", f"--cpus-per-task={run.cores}"]
            ),
            f"--chdir={work}",
            f"--output={job_dir / spec.stdout}",
            f"--error={job_dir / spec.stderr}",
            f"--input={job_dir / spec.stdin}" if spec.stdin else "--input=/dev/null",
            "--export=ALL",
        ]
        if os.geteuid() == 0:
            args += [f"--uid={account.uid}", f"--gid={account.gid}"]
        if spec.time_limit is not None:
            # Slurm counts minutes; our own timer stops it on the second (_time_limit).
            args.append(f"--time={math.ceil(spec.time_limit / 60) + 1}")
        if self.partition:
            args.append(f"--partition={self.partition}")
        if spec.hosts:  # its candidate hosts here: any of them (--nodelist would be all)
            nodes = await self._nodes()
            unknown = sorted(set(spec.hosts) - set(nodes))
            if unknown:
                raise InvalidInput(
                    f"job[{spec.job_id}].hosts", f"nodes of the cluster: {', '.join(nodes)}",
                    ", ".join(unknown),
                )  # fmt: skip
            others = [node for node in nodes if node not in spec.hosts]
            if others:
                args.append(f"--exclude={','.join(others)}")
        args.append(str(script))
        # Before sbatch: a broker killed during it leaves a record that says so.
        self._write_record(run.token, {"job_id": spec.job_id, "submitting": True}, new=True)
        async with self._submits:
            out = await self._run_command(*args)
        slurm_id = int(out.strip().split(";")[0])
        self._write_record(run.token, {"slurm_id": slurm_id})
        run.slurm_id = slurm_id
        self._by_slurm[slurm_id] = run
        try:
            await self._release(slurm_id)
        except SlurmError as exc:  # e.g. "partition configuration not available now"
            log.warning("job %s: Slurm job %d stays held for now: %s", spec.job_id, slurm_id, exc)
            run.held_since = time.monotonic()
        if run.stopping is not None:  # cancelled while it was being submitted
            await self._scancel(slurm_id)

    async def _run_command(self, *args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
        )
        try:
            out, err = await process.communicate()
        except asyncio.CancelledError:  # closing: the command goes too, reaped while the loop
            with contextlib.suppress(ProcessLookupError):  # runs (no transport left behind)
                process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            words = (err or out).decode(errors="replace").strip().splitlines()
            raise SlurmError(
                f"{args[0]} to succeed", words[-1] if words else f"exit {process.returncode}"
            )
        return out.decode(errors="replace")

    async def _nodes(self) -> list[str]:
        """The cluster's nodes (``sinfo``), asked once."""
        if self._node_names is None:
            out = await self._run_command("sinfo", "--noheader", "--Node", "--format=%N")
            self._node_names = list(dict.fromkeys(out.split()))
        return self._node_names

    async def _release(self, slurm_id: int) -> None:
        """Let a held job run."""
        await self._run_command("scontrol", "release", str(slurm_id))

    async def _cluster_cpus(self) -> tuple[int, int] | None:
        """The cluster's CPUs: (total, idle)."""
        return parse_sinfo_cpus(await self._run_command("sinfo", "--noheader", "--format=%C"))

    async def _scancel(self, slurm_id: int) -> None:
        try:
            await self._run_command("scancel", str(slurm_id))
        except (SlurmError, OSError) as exc:
            log.warning("scancel %d: %s", slurm_id, exc)

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
            except (OSError, SlurmError) as exc:
                log.warning("%s: following Slurm: %s", self.site, exc)
            waiting = any(
                r.running is not None and not r.running.done() for r in self._runs.values()
            )
            delay = self.interval / 5 if waiting else self.interval
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # not wait_for: it may swallow a cancel
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _squeue(self) -> list[QueueRow]:
        out = await self._run_command("squeue", "--noheader", "--states=all", f"--Format={_FORMAT}")
        return parse_squeue(out)

    async def _poll_once(self) -> None:
        rows = await self._squeue()
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
        if row.state != "PENDING" or row.reason not in _HELD or token in self._submitting:
            return
        try:
            text = (self._records() / token).read_text()
        except FileNotFoundError:
            text = '{"void": true}'
        except OSError:
            return
        if '"void"' in text:
            log.warning("%s: cancelling Slurm job %d, a launch made void", self.site, row.slurm_id)
            self._spawn(self._scancel(row.slurm_id))

    def _update(self, run: BatchRun, row: QueueRow) -> None:
        run.missing = 0
        if row.state == "PENDING" and row.reason in _HELD and run.stopping is None:
            self._release_later(run)
        elif row.state == "PENDING" and row.reason in _CANNOT and run.stopping is None:
            # The cluster as it is cannot give it what it asks (its nodes, its CPUs): it
            # would wait forever; past the patience it is cancelled, with Slurm's reason.
            if run.held_since is None:
                run.held_since = time.monotonic()
            elif time.monotonic() - run.held_since > self.hold_patience and run.slurm_id:
                run.release_error = f"Slurm cannot run it here ({row.reason})"
                run.stopping = StopReason.CANCELLED
                self._spawn(self._scancel(run.slurm_id))
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
            except SlurmError as exc:
                if time.monotonic() - (run.held_since or 0.0) > self.hold_patience:
                    run.release_error = str(exc)
                    run.stopping = StopReason.CANCELLED
                    await self._scancel(slurm_id)
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
            self._spawn(self._scancel(run.slurm_id))

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

    def _result(self, run: BatchRun, row: QueueRow, started: float, ended: float) -> ExitResult:
        status = row.status
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        job = run.job_id
        if row.state == "TIMEOUT":
            limit = f" of {run.time_limit:g} s" if run.time_limit else ""
            return ExitResult(
                job, None, sig, started, ended, timed_out=True,
                ended_by=f"killed by Slurm at its wall-time limit{limit}",
            )  # fmt: skip
        if row.state == "CANCELLED" and run.stopping is StopReason.TIMED_OUT:
            assert run.time_limit is not None
            return ExitResult(
                job, None, sig, started, ended, timed_out=True,
                ended_by=f"killed at its wall-time limit of {run.time_limit:g} s "
                f"(scancel of Slurm job {row.slurm_id})",
            )  # fmt: skip
        if row.state == "CANCELLED" and run.release_error is not None:
            return ExitResult(
                job, None, None, started, ended,
                error=f"Slurm would not let it run (for {self.hold_patience:g} s): "
                f"{run.release_error}",
            )  # fmt: skip
        if row.state == "CANCELLED":
            if run.stopping is not None:
                return ExitResult(
                    job, None, sig, started, ended, cancelled=True,
                    ended_by=f"cancelled: scancel of Slurm job {row.slurm_id}",
                )  # fmt: skip
            return ExitResult(
                job, None, sig, started, ended,
                error=f"cancelled in Slurm by someone else (job {row.slurm_id})",
            )  # fmt: skip
        if row.state == "OUT_OF_MEMORY":
            return ExitResult(
                job, None, sig or signal.SIGKILL, started, ended,
                ended_by="killed by Slurm at its memory limit",
            )  # fmt: skip
        if row.reason == "JobLaunchFailure" or (sig is not None and sig >= signal.NSIG):
            return ExitResult(
                job, None, None, started, ended,
                error=f"Slurm could not launch it ({row.reason}, status {status}); its node's "
                "slurmd log says why (an output file or directory its account cannot reach?)",
            )  # fmt: skip
        if row.state in ("COMPLETED", "FAILED"):
            if code is None and sig is None:
                code = 0 if row.state == "COMPLETED" else None
            error = None
            if code is None and sig is None:
                error = f"Slurm says {row.state} ({row.reason}), with no exit status"
            return ExitResult(job, code, sig, started, ended, error=error)
        return ExitResult(
            job, None, sig, started, ended,
            error=f"Slurm ended it: {row.state} ({row.reason})",
        )  # fmt: skip

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
