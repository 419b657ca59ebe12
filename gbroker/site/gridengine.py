"""The ``gridengine`` back-end: a site in front of a Grid Engine cell (ARCHITECTURE §11).

Theory of operation. The same life as the ``slurm`` back-end's (:class:`.batch.BatchBackend`,
the follower both complete: launch records, exactly once across a broker's death, the poll loop,
the wall-time limit to the second), through Grid Engine's commands, run with the cell's
``SGE_ROOT``, ``SGE_CELL`` and ports:

- **Start**: the launch record first, then ``qsub -terse -h`` (held) *as the job's account*
  (Grid Engine's job owner is whoever runs ``qsub``; a root broker runs it under the account's
  uid and gid), the batch script on its standard input, named ``gbroker_SITE_TOKEN`` (the token
  in the name: ``qstat`` shows names, so a restarted broker finds its jobs), with the token also
  in the job's context (``-ac gbroker_token=TOKEN``), its cores as slots of the cell's parallel
  environment (``-pe gbroker N``: all on one host), its wall time (``-l h_rt``, whole seconds,
  one more than the limit: the limit to the second is ours), its working directory, its streams
  in the job directory, ``-r n`` (never rerun by Grid Engine); the id goes into the record, then
  ``qrls``.
- **Following**: ``qstat -xml -u '*'`` (every user's jobs: the cluster's own load counts in
  :meth:`~GridEngineBackend.capacity`); a job of ours no longer listed has ended, and
  ``qacct -j ID`` says how (its ``exit_status``, and ``failed``: 37 is Grid Engine's wall-time
  kill, 100 with status 137 a ``qdel``); until the accounting file has it (the cell flushes it
  every ``flush_time``) the job is taken as still ending. A job Grid Engine put in an error
  state (``Eqw``: its directory could not be entered, say) is deleted and reported failed with
  Grid Engine's reason (``qstat -j``).
- **Cancel**: ``qdel``. **Capacity**: ``qstat -g c`` (the queues' free and total slots) and the
  jobs of others in ``qstat``.

Identity: as for Slurm, the account the operator's ``accounts`` names, else ``run_as``; Grid
Engine needs the owner in ``/etc/passwd`` (``qsub`` as a uid without an entry fails: "can't
resolve user"), and a cell refuses uids below its ``min_uid`` (1000 by default: root too).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import os
import re
import signal
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gbroker.errors import InvalidInput
from gbroker.site.backend import ExitResult, JobSpec, Limits, StopReason
from gbroker.site.batch import (
    SEARCH_PATH,
    BatchAccount,
    BatchBackend,
    BatchError,
    BatchRun,
    QueueRow,
)

__all__ = [
    "ENVIRONMENT",
    "PE",
    "GridEngineBackend",
    "GridEngineError",
    "parse_qacct",
    "parse_qstat",
    "parse_queue_summary",
]

log = logging.getLogger(__name__)

ENVIRONMENT = ("SGE_ROOT", "SGE_CELL", "SGE_QMASTER_PORT", "SGE_EXECD_PORT")
"""What a client needs to reach a cell (:attr:`gbroker.fleet.gridengine.Cell.environment`)."""

PE = "gbroker"
"""The parallel environment a job's slots are asked of (``$pe_slots``: on one host)."""

_ACCOUNTING_PATIENCE = 60.0  # seconds to wait for a job's end in the accounting file
_TIMED_OUT = 37  # qacct's failed: "qmaster enforced h_rt, h_cpu, or h_vmem limit"
# Final states of the follower (Slurm's words) standing for Grid Engine's: a job in an error
# state (Eqw), and one whose end the accounting never told.
_ERROR = "BOOT_FAIL"
_UNKNOWN = "SPECIAL_EXIT"


class GridEngineError(BatchError):
    """A Grid Engine command failed; the message has its words."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__("gridengine", what, detail)


@dataclass(frozen=True, slots=True)
class Listed:
    """A job as ``qstat -xml`` lists it."""

    job_id: int
    name: str
    owner: str
    state: str
    slots: int
    started_at: float | None


@dataclass(frozen=True, slots=True)
class Accounted:
    """A job's end as ``qacct -j`` tells it."""

    job_id: int
    failed: int
    failed_reason: str
    exit_status: int
    started_at: float | None
    ended_at: float | None


def _iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_qstat(text: str) -> list[Listed]:
    """``qstat -xml``'s jobs, running and waiting."""
    listed = []
    for job in ElementTree.fromstring(text).iter("job_list"):
        number = (job.findtext("JB_job_number") or "").strip()
        if not number.isdigit():
            continue
        slots = (job.findtext("slots") or "1").strip()
        listed.append(
            Listed(
                int(number),
                (job.findtext("JB_name") or "").strip(),
                (job.findtext("JB_owner") or "").strip(),
                (job.findtext("state") or "").strip(),
                int(slots) if slots.isdigit() else 1,
                _iso(job.findtext("JAT_start_time")),
            )
        )
    return listed


def parse_queue_summary(text: str) -> tuple[int, int] | None:
    """``qstat -g c -xml``: every queue's (total, available) slots, summed."""
    total = available = 0
    seen = False
    for queue in ElementTree.fromstring(text).iter("cluster_queue_summary"):
        with contextlib.suppress(ValueError):
            total += int(queue.findtext("total") or 0)
            available += int(queue.findtext("available") or 0)
            seen = True
    return (total, available) if seen else None


def _qacct_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None


def parse_qacct(text: str) -> list[Accounted]:
    """``qacct -j``'s records (one per run of the job, separated by lines of ``=``)."""
    records = []
    for block in re.split(r"^=+\s*$", text, flags=re.MULTILINE):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(" ")
            if name:
                fields[name] = value.strip()
        if not fields.get("jobnumber", "").isdigit():
            continue
        failed, _, reason = fields.get("failed", "0").partition(":")
        status = fields.get("exit_status", "0").split()[0] if fields.get("exit_status") else "0"
        records.append(
            Accounted(
                int(fields["jobnumber"]),
                int(failed.strip() or 0) if failed.strip().isdigit() else 0,
                reason.strip(),
                int(status) if status.isdigit() else 0,
                _qacct_time(fields.get("start_time", "")),
                _qacct_time(fields.get("end_time", "")),
            )
        )
    return records


class GridEngineBackend(BatchBackend):
    """Runs a site's jobs as batch jobs of a Grid Engine cell (see the module's docstring).

    Args:
        root: the job directories (on a file system the cell's hosts share) and launch records.
        site: the site's name (in each job's name, so sites may share a cell).
        environment: the cell's ``SGE_ROOT``, ``SGE_CELL`` and, if not the defaults, its
            ``SGE_QMASTER_PORT`` and ``SGE_EXECD_PORT``.
        run_as, allow_root, accounts, default_limits, interval, path: as
            :class:`~gbroker.site.slurm.SlurmBackend`'s.
    """

    name = "gridengine"

    _system = "Grid Engine"

    def _where(self) -> dict[str, str]:
        return {
            "sge_root": str(self.sge_root),
            "sge_cell": self.cell_environment.get("SGE_CELL", "default"),
        }

    def __init__(
        self,
        root: Path,
        *,
        site: str,
        environment: Mapping[str, str],
        run_as: str | None = None,
        allow_root: bool = False,
        accounts: Mapping[str, str] | None = None,
        default_limits: Limits | None = None,
        interval: float = 1.0,
        path: str | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.site = site
        unknown = sorted(set(environment) - set(ENVIRONMENT))
        if unknown or "SGE_ROOT" not in environment:
            raise InvalidInput(
                "environment", f"SGE_ROOT and any of {', '.join(ENVIRONMENT[1:])}", unknown
            )
        self.cell_environment = dict(environment)
        self.sge_root = Path(environment["SGE_ROOT"])
        if not (self.sge_root / environment.get("SGE_CELL", "default")).is_dir():
            raise InvalidInput("SGE_ROOT", "the cell's SGE_ROOT (holding SGE_CELL)", self.sge_root)
        if not (isinstance(interval, int | float) and 0 < interval <= 60):
            raise InvalidInput("interval", "seconds in (0, 60]", interval)
        self.interval = float(interval)
        self.allow_root = bool(allow_root)
        self.run_as = self._known("run_as", run_as or "nobody")
        self.accounts = MappingProxyType(dict(accounts or {}))
        self.default_limits = default_limits or Limits()
        self.uids = None
        self.cgroups = None
        self.confinement = f"Grid Engine ({self.sge_root}): the cell's own"
        self._job_path = path if path is not None else os.environ.get("PATH", os.defpath)
        self._env = {"PATH": SEARCH_PATH, "LANG": "C.UTF-8", **self.cell_environment}
        self._accounted: dict[int, float] = {}  # ended jobs awaiting accounting: since when
        self._init_following()

    # -- names -----------------------------------------------------------------------------------

    def _job_name(self, token: str) -> str:
        site = re.sub(r"[^A-Za-z0-9_.-]", "-", self.site)
        return f"gbroker_{site}_{token}"

    def _comment_of(self, name: str) -> str:
        """The Slurm-style comment the follower matches (``gbroker:SITE:TOKEN``) for a job
        name of this site's, else the name itself."""
        prefix = self._job_name("")
        if name.startswith(prefix):
            return self._comment(name[len(prefix) :])
        return name

    # -- submitting ------------------------------------------------------------------------------

    async def _submit(self, run: BatchRun, spec: JobSpec, account: BatchAccount) -> None:
        if self._submits is None:
            self._submits = asyncio.Semaphore(8)
        slots = run.cores
        if spec.ranks is not None:  # mpiexec finds the PE's slots (PE_HOSTFILE) itself
            if spec.ranks.hosts > 1:
                raise InvalidInput(
                    f"job[{spec.job_id}].processes_per_host",
                    "ranks on one host (a Grid Engine site's slots are on one host)",
                    spec.ranks.per_host,
                )
            slots = spec.ranks.processes * spec.ranks.threads
        job_dir, work = await asyncio.to_thread(self._prepare, spec, account)
        run.stdout = job_dir / spec.stdout
        args = [
            "qsub",
            "-terse",
            "-h",
            "-r",
            "n",
            "-N",
            self._job_name(run.token),
            "-ac",
            f"gbroker_token={run.token}",
            "-pe",
            PE,
            str(slots),
            "-wd",
            str(work),
            "-o",
            str(job_dir / spec.stdout),
            "-e",
            str(job_dir / spec.stderr),
            "-S",
            "/bin/sh",
        ]
        if spec.stdin:
            args += ["-i", str(job_dir / spec.stdin)]
        if spec.hosts:  # its candidate hosts here: any of them
            args += ["-l", "hostname=" + "|".join(spec.hosts)]
        if spec.time_limit is not None:
            args += ["-l", f"h_rt={math.ceil(spec.time_limit) + 1}"]
        self._write_record(run.token, {"job_id": spec.job_id, "submitting": True}, new=True)
        async with self._submits:
            out = await self._command(
                *args, account=account, script=self._script(run, spec, job_dir)
            )
        ge_id = int(out.strip().split(".")[0])
        self._write_record(run.token, {"slurm_id": ge_id})
        run.slurm_id = ge_id
        self._by_slurm[ge_id] = run
        await self._release(ge_id)
        if run.stopping is not None:
            await self._cancel_job(ge_id)

    async def _command(
        self, *args: str, account: BatchAccount | None = None, script: str | None = None
    ) -> str:
        as_account: dict[str, object] = {}
        if account is not None and os.geteuid() == 0:
            as_account = {"user": account.uid, "group": account.gid, "extra_groups": []}
        process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if script is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            **as_account,  # type: ignore[arg-type]
        )
        try:
            out, err = await process.communicate(None if script is None else script.encode())
        except asyncio.CancelledError:  # closing: the command goes too (as at a Slurm site)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            words = [w for w in (err or out).decode(errors="replace").splitlines() if w.strip()]
            raise GridEngineError(
                f"{args[0]} to succeed", words[0] if words else f"exit {process.returncode}"
            )
        return out.decode(errors="replace")

    async def _release(self, slurm_id: int) -> None:
        await self._command("qrls", str(slurm_id))

    async def _cancel_job(self, slurm_id: int) -> None:
        try:
            await self._command("qdel", str(slurm_id))
        except (GridEngineError, OSError) as exc:
            if "does not exist" not in str(exc):
                self._log_warning(f"qdel {slurm_id}: {exc}")

    def _log_warning(self, message: str) -> None:
        log.warning("%s: %s", self.site, message)

    async def _cluster_cpus(self) -> tuple[int, int] | None:
        return parse_queue_summary(await self._command("qstat", "-g", "c", "-xml"))

    # -- following: Grid Engine's view in the follower's words ------------------------------------

    async def _queue(self) -> list[QueueRow]:
        listed = parse_qstat(await self._command("qstat", "-xml", "-u", "*"))
        rows = []
        present = set()
        for job in listed:
            present.add(job.job_id)
            rows.append(await self._row_of(job))
        for ge_id, run in list(self._by_slurm.items()):
            if ge_id in present or run.result is not None:
                continue
            rows.append(await self._ended(ge_id))
        return rows

    async def _row_of(self, job: Listed) -> QueueRow:
        comment = self._comment_of(job.name)
        state = job.state
        if "E" in state and job.job_id in self._by_slurm:
            reason = await self._error_reason(job.job_id)
            await self._cancel_job(job.job_id)
            return QueueRow(job.job_id, _ERROR, None, time.time(), 0, reason, comment)
        if "h" in state:
            return QueueRow(job.job_id, "PENDING", None, None, 0, "JobHeldUser", comment)
        if any(letter in state for letter in "rtRsST"):
            return QueueRow(job.job_id, "RUNNING", job.started_at, None, 0, "", comment)
        return QueueRow(job.job_id, "PENDING", None, None, 0, state, comment)

    async def _error_reason(self, ge_id: int) -> str:
        try:
            out = await self._command("qstat", "-j", str(ge_id))
        except GridEngineError as exc:
            return str(exc)
        for line in out.splitlines():
            if line.startswith("error reason"):
                return line.split(":", 1)[1].strip() if ":" in line else line
        return "Grid Engine put the job in an error state"

    async def _ended(self, ge_id: int) -> QueueRow:
        """A job of ours that ``qstat`` no longer lists: how ``qacct`` says it ended, or (not
        yet accounted) still ending; unknown once the accounting has kept us waiting too long."""
        try:
            records = parse_qacct(await self._command("qacct", "-j", str(ge_id)))
        except GridEngineError:
            records = []
        if not records:
            since = self._accounted.setdefault(ge_id, time.monotonic())
            if time.monotonic() - since < _ACCOUNTING_PATIENCE:
                return QueueRow(ge_id, "COMPLETING", None, None, 0, "", "")
            self._accounted.pop(ge_id, None)
            return QueueRow(ge_id, _UNKNOWN, None, time.time(), 0, "", "")
        self._accounted.pop(ge_id, None)
        done = records[-1]
        if done.failed == _TIMED_OUT:
            state = "TIMEOUT"
        elif done.exit_status > 128 and done.failed:
            state = "CANCELLED"
        else:
            state = "COMPLETED" if done.exit_status == 0 and not done.failed else "FAILED"
        # A wait status: above 128, Grid Engine's "killed by signal (status - 128)".
        status = done.exit_status - 128 if done.exit_status > 128 else done.exit_status << 8
        reason = f"failed {done.failed}: {done.failed_reason}" if done.failed else ""
        return QueueRow(ge_id, state, done.started_at, done.ended_at, status, reason, "")

    def _result(self, run: BatchRun, row: QueueRow, started: float, ended: float) -> ExitResult:
        job = run.job_id
        sig = os.WTERMSIG(row.status) if os.WIFSIGNALED(row.status) else None
        if row.state == "TIMEOUT":
            return ExitResult(
                job, None, sig or signal.SIGKILL, started, ended, timed_out=True,
                ended_by=f"killed by Grid Engine at its wall-time limit (h_rt; {row.reason})",
            )  # fmt: skip
        if row.state == "CANCELLED" and run.stopping is StopReason.TIMED_OUT:
            assert run.time_limit is not None
            return ExitResult(
                job, None, sig, started, ended, timed_out=True,
                ended_by=f"killed at its wall-time limit of {run.time_limit:g} s "
                f"(qdel of Grid Engine job {row.slurm_id})",
            )  # fmt: skip
        if row.state == "CANCELLED":
            if run.stopping is not None:
                return ExitResult(
                    job, None, sig, started, ended, cancelled=True,
                    ended_by=f"cancelled: qdel of Grid Engine job {row.slurm_id}",
                )  # fmt: skip
            return ExitResult(
                job, None, sig, started, ended,
                error=f"ended by Grid Engine or someone else (job {row.slurm_id}: {row.reason})",
            )  # fmt: skip
        if row.state == _ERROR:
            return ExitResult(
                job, None, None, started, ended,
                error=f"Grid Engine could not run job {row.slurm_id}: {row.reason}",
            )  # fmt: skip
        if row.state == _UNKNOWN:
            return ExitResult(
                job, None, None, started, ended,
                error=f"Grid Engine's accounting never told how job {row.slurm_id} ended",
            )  # fmt: skip
        code = os.WEXITSTATUS(row.status) if os.WIFEXITED(row.status) else None
        error = f"Grid Engine: {row.reason}" if row.reason else None
        return ExitResult(job, code, sig, started, ended, error=error)
