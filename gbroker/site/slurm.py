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
import datetime
import logging
import math
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gbroker.errors import InvalidInput
from gbroker.site import spmd
from gbroker.site.backend import (
    ExitResult,
    JobSpec,
    Limits,
    StopReason,
)
from gbroker.site.batch import (
    SEARCH_PATH,
    BatchAccount,
    BatchBackend,
    BatchError,
    BatchRun,
    QueueRow,
)
from gbroker.site.identity import closed_ancestor

__all__ = ["SlurmBackend", "SlurmError"]

log = logging.getLogger(__name__)

_FIELDS = ("JobID", "State", "StartTime", "EndTime", "exit_code", "Reason", "Comment")
_FORMAT = ",".join(f"{name}:|" for name in _FIELDS)
_PARALLEL_SUBMITS = 8  # sbatch processes at once


class SlurmError(BatchError):
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


class SlurmBackend(BatchBackend):
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

    _system = "Slurm"
    """The batch system's name, for people."""

    def _where(self) -> dict[str, str]:
        """Where the cluster is, for the health report."""
        return {"slurm_conf": str(self.slurm_conf)}

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
            await self._cancel_job(slurm_id)

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

    async def _cancel_job(self, slurm_id: int) -> None:
        try:
            await self._run_command("scancel", str(slurm_id))
        except (SlurmError, OSError) as exc:
            log.warning("scancel %d: %s", slurm_id, exc)

    async def _queue(self) -> list[QueueRow]:
        out = await self._run_command("squeue", "--noheader", "--states=all", f"--Format={_FORMAT}")
        return parse_squeue(out)

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
