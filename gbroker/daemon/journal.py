"""The broker's journal: its jobs in SQLite, durable before they are acknowledged (ARCHITECTURE §5).

Theory of operation. Every change to a job the broker owns or hosts is written here before the
broker answers for it: a submission is acknowledged only after its row is committed with
``synchronous=FULL`` in WAL mode, so it survives a SIGKILL of the broker and a power cut. A
restarted broker reads back every job that has not reached a terminal state and resumes.

SQLite is blocking, so one writer thread owns the connection. Writes are queued as requests and
the thread commits *every request waiting at that moment in one transaction* (group commit): one
fsync makes a whole burst of submissions durable, on a disk that does only a few hundred fsyncs
per second. Each caller awaits its own request's commit; an error in one request fails only that
request. A transaction holds at most 512 requests, so a commit stays short under any backlog,
and a launch intent (the write a process start waits for) is committed first, in a transaction
of its own, never behind the submissions queued with it. The requests one round of the event
loop makes go to the writer in one hand-over.

Submissions are idempotent by job id, and by ``Idempotency-Key``
(:mod:`gbroker.protocol.idempotency`): the key and the job row go in one savepoint, so of
concurrent submissions with one key exactly one makes a job, and a SIGKILL keeps both or
neither. A finished job stays, with the start and end its site reported, until the retention
policy purges it (:mod:`gbroker.daemon.history`).

Besides the jobs it owns (``jobs``, ``transitions``), a broker journals what recovery needs:
``placements`` (each owned job's sites and grant, written before the dispatch is sent and
before the claim is answered), ``hosted`` (the jobs this site holds for owners, with the launch
token journaled before the job's process may exist, and an outbox of unacknowledged reports)
and ``moves`` (each move under way, by this broker's role). What each table lets a restarted
broker do: docs/RESILIENCE.md, "The protocol".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from types import TracebackType
from typing import Any, Self

from gbroker.core.limits import NOTHING, Used
from gbroker.core.states import TERMINAL_STATES, JobState
from gbroker.errors import InternalError, InvalidInput
from gbroker.protocol.idempotency import IdempotencyKey

__all__ = ["HostedRow", "JobRow", "Journal", "MoveRow"]

log = logging.getLogger("gbroker.daemon")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id           TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    state        TEXT NOT NULL,
    site         TEXT,
    spec         BLOB NOT NULL,
    submitted_at REAL NOT NULL,
    updated_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS transitions (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    state  TEXT NOT NULL,
    site   TEXT,
    at     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE TABLE IF NOT EXISTS placements (
    job_id  TEXT NOT NULL,
    site    TEXT NOT NULL,
    queued  INTEGER NOT NULL DEFAULT 0,
    granted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, site)
);
CREATE TABLE IF NOT EXISTS hosted (
    job_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    replica    INTEGER NOT NULL,
    spec       BLOB NOT NULL,
    phase      TEXT NOT NULL,
    pgid       INTEGER,
    cores      INTEGER,
    started_at REAL,
    report     BLOB,
    at         REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
    submitter   TEXT NOT NULL,
    key         TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (submitter, key)
);
CREATE INDEX IF NOT EXISTS idempotency_by_age ON idempotency(created_at);
CREATE TABLE IF NOT EXISTS allocations (
    job_id TEXT NOT NULL,
    at     REAL NOT NULL,
    cores  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS allocations_by_job ON allocations(job_id);
CREATE TABLE IF NOT EXISTS moves (
    job_id TEXT NOT NULL,
    role   TEXT NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    phase  TEXT NOT NULL,
    bundle TEXT,
    size   INTEGER,
    at     REAL NOT NULL,
    PRIMARY KEY (job_id, role)
);
CREATE TABLE IF NOT EXISTS gangs (
    gang  TEXT PRIMARY KEY,
    ranks TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    owner: str
    state: JobState
    site: str | None
    spec: bytes
    submitted_at: float
    updated_at: float
    submitter: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    used: Used = NOTHING  # what it used before its latest move (gbroker.core.limits)
    moved_at: float | None = None  # when it started at the target of its latest move


@dataclass(frozen=True, slots=True)
class HostedRow:
    """A job this site holds for its owner, as journaled (see the module docstring)."""

    job_id: str
    owner: str
    replica: bool
    spec: bytes
    phase: str  # staging | queued | launching | running | finished
    pgid: int | None
    cores: int | None
    started_at: float | None
    report: bytes | None
    submitter: str | None = None
    token: str | None = None  # the launch token, from phase launching on
    slots: tuple[int, ...] = ()  # a resized malleable job's core slots (else: as at its start)
    used: Used = NOTHING  # a job moved here: what it used before (gbroker.core.limits)


@dataclass(frozen=True, slots=True)
class MoveRow:
    """A running job's move, as one of its three brokers journaled it (gbroker.daemon.moving).

    ``role``: ``owner``, ``out`` (the source) or ``in`` (the target); ``phase``: the owner's
    ``asked`` or ``ready``, the source's ``freezing`` or ``frozen``, the target's
    ``fetching``; ``bundle`` and ``size``: the checkpoint bundle, once there is one; ``used``:
    what the job used until it was frozen, once it is (:mod:`gbroker.core.limits`)."""

    job_id: str
    role: str
    source: str
    target: str
    phase: str
    bundle: str | None
    size: int | None
    at: float
    used: Used = NOTHING


@dataclass(slots=True)
class _Sql:
    """Statements run in one savepoint; the result is whether the first one changed a row."""

    statements: list[tuple[str, tuple[object, ...]]]
    kind: str = "other"  # what the commit latency is observed as (Journal.observe)


@dataclass(slots=True)
class _Submit:
    job_id: str
    owner: str
    spec: bytes
    at: float
    submitter: str | None
    key: IdempotencyKey | None = None


@dataclass(slots=True)
class _Update:
    job_id: str
    state: JobState
    site: str | None
    at: float
    times: tuple[float | None, float | None, int | None, str | None] | None = None
    placement: tuple[tuple[str, tuple[object, ...]], ...] = ()  # statements run with it


_Request = _Submit | _Update | _Sql
_Queued = tuple[_Request, "asyncio.Future[bool]", float]  # and when it was queued


def _kind(request: _Request) -> str:
    if isinstance(request, _Submit):
        return "submit"
    if isinstance(request, _Update):
        return "update"
    return request.kind


_SYNCHRONOUS = {0: "off", 1: "normal", 2: "full", 3: "extra"}

_ADDED_COLUMNS = (
    ("jobs", "submitter", "TEXT"),
    ("hosted", "submitter", "TEXT"),
    ("hosted", "token", "TEXT"),
    ("jobs", "started_at", "REAL"),
    ("jobs", "ended_at", "REAL"),
    ("jobs", "exit_code", "INTEGER"),
    ("jobs", "error", "TEXT"),
    ("hosted", "slots", "TEXT"),
    ("hosted", "used", "TEXT"),
    ("moves", "used", "TEXT"),
    ("jobs", "used", "TEXT"),
    ("jobs", "moved_at", "REAL"),
)
"""Columns added since the first release, with their types: added to an older journal."""
_JOB_COLUMNS = (
    "id, owner, state, site, spec, submitted_at, updated_at, submitter,"
    " started_at, ended_at, exit_code, error, used, moved_at"
)
_STOP = object()
_MAX_BATCH = 512  # requests per transaction at most: a commit stays short under any backlog
# A finished job, spelt as the partial index jobs_finished is (so SQLite uses it).
_FINISHED = "state IN ({})".format(",".join(f"'{state}'" for state in sorted(TERMINAL_STATES)))


def _used_text(used: Used | None) -> str | None:
    """What a moved job used, as a column holds it (JSON); None for nothing."""
    return None if used is None or used == NOTHING else json.dumps(used.as_mapping())


def _used_of(text: object) -> Used:
    """:func:`_used_text`'s column, read back."""
    if text is None:
        return NOTHING
    try:
        return Used.from_mapping(json.loads(str(text)), "journal.used")
    except (ValueError, InvalidInput) as exc:
        raise InternalError(f"journal: what a moved job used is unreadable: {exc}") from None


def _remember_finished(conn: sqlite3.Connection) -> None:
    """The indexes that keep finished jobs queryable (added to older journals too)."""
    conn.executescript(
        "CREATE INDEX IF NOT EXISTS transitions_by_job ON transitions(job_id);"
        "CREATE INDEX IF NOT EXISTS jobs_by_submitter ON jobs(submitter, submitted_at);"
        "CREATE INDEX IF NOT EXISTS jobs_by_submission ON jobs(submitted_at);"
        f"CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(updated_at) WHERE {_FINISHED};"
    )


def _record_times(
    job_id: str,
    started_at: float | None,
    ended_at: float | None,
    exit_code: int | None,
    error: str | None,
) -> tuple[tuple[str, tuple[object, ...]], ...]:
    """The statements of :meth:`Journal.record_times`. An error text is stored as UTF-8 can hold
    it (a lone surrogate from a hostile name is escaped), so it never fails the state update it
    rides with."""
    if error is not None:
        error = error.encode("utf-8", "backslashreplace").decode("utf-8")
    return (
        (
            "UPDATE jobs SET started_at = COALESCE(started_at, ?),"
            " ended_at = COALESCE(ended_at, ?), exit_code = COALESCE(?, exit_code),"
            " error = COALESCE(?, error) WHERE id = ?",
            (started_at, ended_at, exit_code, error, job_id),
        ),
        (
            "UPDATE jobs SET started_at = ended_at WHERE id = ? AND started_at > ended_at",
            (job_id,),
        ),
    )


_Statements = tuple[tuple[str, tuple[object, ...]], ...]


def _placed(job_id: str, site: str) -> _Statements:
    return (("INSERT OR IGNORE INTO placements (job_id, site) VALUES (?, ?)", (job_id, site)),)


def _queued(job_id: str, site: str) -> _Statements:
    return (("UPDATE placements SET queued = 1 WHERE job_id = ? AND site = ?", (job_id, site)),)


def _granted(job_id: str, site: str) -> _Statements:
    return (
        ("UPDATE placements SET granted = 1 WHERE job_id = ? AND site = ?", (job_id, site)),
        (
            "INSERT OR IGNORE INTO placements (job_id, site, queued, granted) VALUES (?, ?, 1, 1)",
            (job_id, site),
        ),
    )


def _allocation(job_id: str, at: float, cores: int) -> tuple[str, tuple[object, ...]]:
    return "INSERT INTO allocations (job_id, at, cores) VALUES (?, ?, ?)", (job_id, at, cores)


_PLACEMENT: dict[str, Callable[[str, str], _Statements]] = {
    "placed": _placed,
    "queued": _queued,
    "granted": _granted,
}
"""What :meth:`Journal.update` may record of a placement in the same request."""

_Settled = list[tuple[asyncio.Future[bool], bool | BaseException]]


def _settle(settled: _Settled) -> None:
    """In the loop's thread: hand each request of a transaction its result."""
    for done, result in settled:
        if done.done():  # its caller was cancelled meanwhile
            continue
        if isinstance(result, BaseException):
            done.set_exception(result)
        else:
            done.set_result(result)


class Journal:
    """``async with Journal(path) as journal:`` — see the module docstring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # What the writer takes: one request, or a list of those one round of the loop made
        # (handed over together: each put may wake the writer thread, a costly switch).
        self._queue: SimpleQueue[_Queued | list[_Queued] | object] = SimpleQueue()
        self._round: list[_Queued] = []
        # Requests handed over (counted by the loop's thread) and taken (by the writer's): each
        # counter has one writer, so their difference is the queue's length in requests.
        self._handed = 0
        self._taken = 0
        self._thread: threading.Thread | None = None
        self._ready: Future[None] = Future()
        self.commits = 0  # transactions committed (group commit makes this << requests)
        self.failures = 0  # transactions that failed whole
        self.last_error: str | None = None
        self.durability = "unknown"  # the journal mode and synchronous setting, once open
        # Told, from the writer thread, each request's kind (submit, update, launch, other) and
        # its commit latency: seconds from its queueing to its transaction's commit.
        self.observe: Callable[[str, float], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The broker's alone, before SQLite opens it: SQLite gives its -wal and -shm files the
        # database file's mode.
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self.path.chmod(0o600)
        except OSError as exc:
            raise InvalidInput(str(self.path), "a writable SQLite file", exc) from None
        self._thread = threading.Thread(target=self._writer, name=f"journal:{self.path.name}")
        self._thread.daemon = True
        self._thread.start()
        await asyncio.wrap_future(self._ready)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._thread is None:
            return
        self._hand_over()
        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    @property
    def alive(self) -> bool:
        """Whether the writer thread is running (it ends only when the journal is closed)."""
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> dict[str, object]:
        return {
            "ok": self.alive,
            "commits": self.commits,
            "failed_commits": self.failures,
            "pending": self.waiting + len(self._round),
            "last_error": self.last_error,
            "durability": self.durability,
        }

    @property
    def waiting(self) -> int:
        """Requests handed to the writer and not yet taken by it."""
        return self._handed - self._taken

    # -- writes ----------------------------------------------------------------------------------

    async def submit(
        self,
        job_id: str,
        owner: str,
        spec: bytes,
        at: float,
        submitter: str | None = None,
        key: IdempotencyKey | None = None,
    ) -> bool:
        """Make a new job durable, with its submitter's idempotency ``key`` if given. False if
        the id, or the key since ``key.not_before``, was already journaled (nothing changes)."""
        if not job_id:
            raise InvalidInput("job.id", "a non-empty id", job_id)
        return await self._request(_Submit(job_id, owner, spec, at, submitter, key))

    async def forget_keys(self, before: float) -> bool:
        """Delete the idempotency keys journaled before ``before``. False if there were none."""
        return await self._sql(("DELETE FROM idempotency WHERE created_at < ?", (before,)))

    async def update(
        self,
        job_id: str,
        state: JobState,
        at: float,
        site: str | None = None,
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        error: str | None = None,
        placement: str | None = None,
        allocation: tuple[float, int] | None = None,
    ) -> bool:
        """Record a job's new state (and site), and in the same request what
        :meth:`record_times` records, if any is given, what ``placement`` says of its
        placement at ``site``: ``placed`` (:meth:`place`), ``queued``
        (:meth:`placement_queued`) or ``granted`` (:meth:`grant`), and the ``allocation``
        ``(at, cores)`` that :meth:`allocated` records, all in one transaction. False if the
        job is unknown (the placement and allocation are recorded all the same)."""
        return await self.update_soon(
            job_id,
            state,
            at,
            site,
            started_at=started_at,
            ended_at=ended_at,
            exit_code=exit_code,
            error=error,
            placement=placement,
            allocation=allocation,
        )

    def update_soon(
        self,
        job_id: str,
        state: JobState,
        at: float,
        site: str | None = None,
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        error: str | None = None,
        placement: str | None = None,
        allocation: tuple[float, int] | None = None,
    ) -> asyncio.Future[bool]:
        """:meth:`update`, queued now: the future of its commit (see :meth:`_enqueue`)."""
        facts = (started_at, ended_at, exit_code, error)
        times = None if facts == (None, None, None, None) else facts
        statements: tuple[tuple[str, tuple[object, ...]], ...] = ()
        if placement is not None:
            if site is None or placement not in _PLACEMENT:
                raise InvalidInput(
                    "placement", f"one of {', '.join(_PLACEMENT)} at a site", placement
                )
            statements = _PLACEMENT[placement](job_id, site)
        if allocation is not None:
            statements += (_allocation(job_id, *allocation),)
        return self._enqueue(_Update(job_id, JobState(state), site, at, times, statements))

    async def place(self, job_id: str, site: str) -> bool:
        """Before dispatching ``job_id`` to ``site``. False if it was placed there already."""
        return await self._sql(*_placed(job_id, site))

    async def placement_queued(self, job_id: str, site: str) -> bool:
        return await self._sql(*_queued(job_id, site))

    async def unplace(self, job_id: str, site: str) -> bool:
        """The job left ``site`` (withdrawn, or given up with the site)."""
        return await self._sql(
            ("DELETE FROM placements WHERE job_id = ? AND site = ?", (job_id, site))
        )

    async def grant(self, job_id: str, site: str) -> bool:
        """Before answering ``site``'s claim with a grant (or on its report that it started)."""
        return await self._sql(*_granted(job_id, site))

    async def host(
        self,
        job_id: str,
        owner: str,
        replica: bool,
        spec: bytes,
        at: float,
        submitter: str | None = None,
        phase: str = "staging",
    ) -> bool:
        """Before acknowledging an owner's dispatch. False if the job is here already. A job
        with no files to stage is hosted ``queued`` at once."""
        return await self._sql(
            (
                "INSERT OR IGNORE INTO hosted (job_id, owner, replica, spec, phase, at, submitter)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, owner, int(replica), spec, phase, at, submitter),
            )
        )

    async def hosted_phase(
        self,
        job_id: str,
        phase: str,
        at: float,
        *,
        pgid: int | None = None,
        cores: int | None = None,
        started_at: float | None = None,
        report: bytes | None = None,
        token: str | None = None,
    ) -> bool:
        return await self.hosted_phase_soon(
            job_id,
            phase,
            at,
            pgid=pgid,
            cores=cores,
            started_at=started_at,
            report=report,
            token=token,
        )

    def hosted_phase_soon(
        self,
        job_id: str,
        phase: str,
        at: float,
        *,
        pgid: int | None = None,
        cores: int | None = None,
        started_at: float | None = None,
        report: bytes | None = None,
        token: str | None = None,
    ) -> asyncio.Future[bool]:
        """:meth:`hosted_phase`, queued now: the future of its commit (see :meth:`_enqueue`)."""
        statement = (
            "UPDATE hosted SET phase = ?, pgid = COALESCE(?, pgid), cores = COALESCE(?, cores),"
            " started_at = COALESCE(?, started_at), report = COALESCE(?, report),"
            " token = COALESCE(?, token), at = ? WHERE job_id = ?",
            (phase, pgid, cores, started_at, report, token, at, job_id),
        )
        kind = "launch" if phase == "launching" else "other"
        return self._enqueue(_Sql([statement], kind))

    async def resized(self, job_id: str, cores: int, slots: tuple[int, ...], at: float) -> bool:
        """A hosted malleable job now holds ``cores`` cores on core ``slots`` (a restarted site
        adopts it on them). False if the job is not hosted here."""
        return await self._sql(
            (
                "UPDATE hosted SET cores = ?, slots = ?, at = ? WHERE job_id = ?",
                (cores, ",".join(map(str, slots)), at, job_id),
            )
        )

    async def allocated(self, job_id: str, at: float, cores: int) -> bool:
        """An owned job runs on ``cores`` cores from ``at`` on (its start, then each resize the
        executing site reported): its allocation history."""
        return await self._sql(_allocation(job_id, at, cores))

    async def allocations_of(self, job_ids: Sequence[str]) -> dict[str, list[tuple[float, int]]]:
        """:meth:`allocations` of many jobs, by job id (those with none left out)."""
        if not job_ids:
            return {}
        out: dict[str, list[tuple[float, int]]] = {}
        for start in range(0, len(job_ids), 900):  # under SQLite's limit of bound values
            chunk = tuple(job_ids[start : start + 900])
            marks = ",".join("?" * len(chunk))
            rows = await asyncio.to_thread(
                self._read_rows,
                f"SELECT job_id, at, cores FROM allocations WHERE job_id IN ({marks})"
                " ORDER BY rowid",
                chunk,
            )
            for job_id, at, cores in rows:
                out.setdefault(str(job_id), []).append((float(at), int(cores)))
        return out

    async def allocations(self, job_id: str) -> list[tuple[float, int]]:
        """An owned job's allocation history: (at, cores), oldest first."""
        rows = await asyncio.to_thread(
            self._read_rows,
            "SELECT at, cores FROM allocations WHERE job_id = ? ORDER BY rowid",
            (job_id,),
        )
        return [(float(r[0]), int(r[1])) for r in rows]

    async def move(
        self,
        job_id: str,
        role: str,
        source: str,
        target: str,
        phase: str,
        at: float,
        bundle: str | None = None,
        size: int | None = None,
        used: Used | None = None,
    ) -> bool:
        """Record (or update) a step of a running job's move (:class:`MoveRow`)."""
        return await self._sql(
            (
                "INSERT OR REPLACE INTO moves"
                " (job_id, role, source, target, phase, bundle, size, at, used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, role, source, target, phase, bundle, size, at, _used_text(used)),
            )
        )

    async def host_moving(
        self,
        job_id: str,
        owner: str,
        spec: bytes,
        at: float,
        submitter: str | None,
        source: str,
        target: str,
        bundle: str,
        size: int,
        used: Used = NOTHING,
    ) -> bool:
        """A running job moving here: hosted (``staging``) with what it used before, and its
        move's row, in one transaction, so that a restarted target never takes it for a new
        job to start afresh. False if it is here already."""
        return await self._sql(
            (
                "INSERT OR IGNORE INTO hosted"
                " (job_id, owner, replica, spec, phase, at, submitter, used)"
                " VALUES (?, ?, 0, ?, 'staging', ?, ?, ?)",
                (job_id, owner, spec, at, submitter, _used_text(used)),
            ),
            (
                "INSERT OR REPLACE INTO moves"
                " (job_id, role, source, target, phase, bundle, size, at)"
                " VALUES (?, 'in', ?, ?, 'fetching', ?, ?, ?)",
                (job_id, source, target, bundle, size, at),
            ),
        )

    async def moved(self, job_id: str, used: Used, at: float) -> bool:
        """An owned job runs at the target of its move from ``at`` on (the target's time),
        having used ``used`` before. False if the job is unknown."""
        return await self._sql(
            (
                "UPDATE jobs SET used = ?, moved_at = ? WHERE id = ?",
                (_used_text(used), at, job_id),
            )
        )

    async def move_done(self, job_id: str, role: str) -> bool:
        """The move is over for this broker's ``role`` in it."""
        return await self._sql(("DELETE FROM moves WHERE job_id = ? AND role = ?", (job_id, role)))

    async def move_granted(self, job_id: str, source: str, target: str) -> bool:
        """The owner passes a moving job's grant from ``source`` to ``target``, in one
        transaction, before the target hears it: a restarted owner knows who holds it."""
        return await self._sql(
            *_granted(job_id, target),
            ("DELETE FROM placements WHERE job_id = ? AND site = ?", (job_id, source)),
        )

    async def grant_gang(self, gang: str, grants: Sequence[tuple[str, str]], start: str) -> bool:
        """The owner grants every component of co-allocated job ``gang`` its start, with the
        start (JSON: the rank table and the job's key) in one transaction: all or none."""
        statements = [s for job_id, site in grants for s in _granted(job_id, site)]
        statements.append(
            ("INSERT OR REPLACE INTO gangs (gang, ranks) VALUES (?, ?)", (gang, start))
        )
        return await self._sql(*statements)

    async def gang_start(self, gang: str) -> dict[str, Any] | None:
        """What co-allocated job ``gang`` was granted with: its rank table (``ranks``) and its
        key (``key``); None: not granted."""
        rows = await asyncio.to_thread(
            self._read_rows, "SELECT ranks FROM gangs WHERE gang = ?", (gang,)
        )
        return None if not rows else dict(json.loads(str(rows[0][0])))

    async def move_abandoned(self, job_id: str, source: str, target: str) -> bool:
        """The owner gives a moving job's grant back to ``source`` (the target never started
        it) and forgets the move, in one transaction."""
        return await self._sql(
            ("DELETE FROM placements WHERE job_id = ? AND site = ?", (job_id, target)),
            *_granted(job_id, source),
            ("DELETE FROM moves WHERE job_id = ? AND role = 'owner'", (job_id,)),
        )

    async def moves(self, role: str) -> list[MoveRow]:
        """The moves under way in which this broker plays ``role``."""
        rows = await asyncio.to_thread(
            self._read_rows,
            "SELECT job_id, role, source, target, phase, bundle, size, at, used FROM moves"
            " WHERE role = ?",
            (role,),
        )
        return [
            MoveRow(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                str(r[3]),
                str(r[4]),
                None if r[5] is None else str(r[5]),
                None if r[6] is None else int(r[6]),
                float(r[7]),
                _used_of(r[8]),
            )
            for r in rows
        ]

    async def unhost(self, job_id: str) -> bool:
        """The job left this site: withdrawn, denied, or its end acknowledged by the owner."""
        return await self._sql(("DELETE FROM hosted WHERE job_id = ?", (job_id,)))

    async def _sql(self, *statements: tuple[str, tuple[object, ...]]) -> bool:
        return await self._request(_Sql(list(statements)))

    async def _request(self, request: _Request) -> bool:
        return await self._enqueue(request)

    def _enqueue(self, request: _Request) -> asyncio.Future[bool]:
        """Queue ``request`` now, with this round of the loop's; the future of its commit.
        Requests commit in the order they were queued (a launch excepted, which goes before
        the others of its round): one queued after another commits in the same transaction
        or a later one, so once the later one's future is done, so is the earlier one's (each
        request may still have failed alone)."""
        if self._thread is None:
            raise InternalError("the journal is not open")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        if not self._round:
            loop.call_soon(self._hand_over)
        self._round.append((request, done, time.perf_counter()))
        return done

    def _hand_over(self) -> None:
        """Give the writer the requests of this round of the loop, in one put."""
        if self._round:
            work, self._round = self._round, []
            self._handed += len(work)
            self._queue.put(work)

    # -- reads (from the broker's thread: a separate read-only connection) -----------------------

    def _read_only(self) -> sqlite3.Connection:
        """A read-only connection, by a URI that escapes the path: a ``#``, ``?`` or ``%`` in a
        directory's name stays the directory's (unescaped, SQLite read them as a fragment, a
        query or an escape, and opened another file)."""
        return sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True)

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[JobRow]:
        with self._read_only() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [
            JobRow(
                r[0],
                r[1],
                JobState(r[2]),
                r[3],
                bytes(r[4]),
                submitted_at=r[5],
                updated_at=r[6],
                submitter=r[7],
                started_at=r[8],
                ended_at=r[9],
                exit_code=r[10],
                error=r[11],
                used=_used_of(r[12]),
                moved_at=r[13],
            )
            for r in rows
        ]

    async def get(self, job_id: str) -> JobRow | None:
        rows = await asyncio.to_thread(
            self._read, f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
        )
        return rows[0] if rows else None

    async def unfinished(self) -> list[JobRow]:
        """Every job not in a terminal state, oldest first: what a restarted broker resumes."""
        marks = ",".join("?" * len(TERMINAL_STATES))
        return await asyncio.to_thread(
            self._read,
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state NOT IN ({marks})"
            " ORDER BY submitted_at, id",
            sorted(TERMINAL_STATES),
        )

    def _read_rows(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._read_only() as conn:
            return list(conn.execute(sql, args).fetchall())

    async def placements(self) -> dict[str, dict[str, tuple[bool, bool]]]:
        """job id -> {site: (queued, granted)} for every placement on record."""
        rows = await asyncio.to_thread(
            self._read_rows, "SELECT job_id, site, queued, granted FROM placements"
        )
        out: dict[str, dict[str, tuple[bool, bool]]] = {}
        for job_id, site, queued, granted in rows:
            out.setdefault(str(job_id), {})[str(site)] = (bool(queued), bool(granted))
        return out

    async def hosted(self) -> list[HostedRow]:
        """Every job this site holds, in the order it was dispatched here."""
        rows = await asyncio.to_thread(
            self._read_rows,
            "SELECT job_id, owner, replica, spec, phase, pgid, cores, started_at, report,"
            " submitter, token, slots, used FROM hosted ORDER BY rowid",
        )
        return [
            HostedRow(
                str(r[0]),
                str(r[1]),
                bool(r[2]),
                bytes(r[3]),
                str(r[4]),
                None if r[5] is None else int(r[5]),
                None if r[6] is None else int(r[6]),
                None if r[7] is None else float(r[7]),
                None if r[8] is None else bytes(r[8]),
                None if r[9] is None else str(r[9]),
                None if r[10] is None else str(r[10]),
                tuple(int(slot) for slot in str(r[11]).split(",") if slot.isdigit())
                if r[11]
                else (),
                _used_of(r[12]),
            )
            for r in rows
        ]

    async def idempotent(
        self, submitter: str | None, key: str, not_before: float
    ) -> tuple[str, str] | None:
        """The job id and body fingerprint ``submitter``'s ``key`` was journaled with (since
        ``not_before``), if it was."""
        rows = await asyncio.to_thread(
            self._read_rows,
            "SELECT job_id, fingerprint FROM idempotency"
            " WHERE submitter = ? AND key = ? AND created_at >= ?",
            (submitter or "", key, not_before),
        )
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    async def all_jobs(self) -> list[JobRow]:
        return await asyncio.to_thread(
            self._read, f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY submitted_at, id"
        )

    # -- finished jobs: their times, read on demand, purged by retention --------------------------

    async def record_times(
        self,
        job_id: str,
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Record when an owned job started and ended (the first time given for each wins),
        and how it ended; then ``started_at <= ended_at`` is made to hold (a start learned late
        is brought back to the end). False if the job is unknown."""
        return await self._sql(*_record_times(job_id, started_at, ended_at, exit_code, error))

    async def transitions(self, job_id: str) -> list[tuple[str, str | None, float]]:
        """An owned job's states as the owner recorded them: (state, site, at), oldest first."""
        rows = await asyncio.to_thread(
            self._read_rows,
            "SELECT state, site, at FROM transitions WHERE job_id = ? ORDER BY seq",
            (job_id,),
        )
        return [(str(r[0]), None if r[1] is None else str(r[1]), float(r[2])) for r in rows]

    async def listing(self, submitter: str | None, limit: int) -> list[JobRow]:
        """The ``limit`` newest jobs (of ``submitter``; None: everyone's), oldest first."""
        where, args = ("WHERE submitter = ?", [submitter]) if submitter is not None else ("", [])
        rows = await asyncio.to_thread(
            self._read,
            f"SELECT {_JOB_COLUMNS} FROM jobs {where} ORDER BY submitted_at DESC, id DESC LIMIT ?",
            [*args, limit],
        )
        return rows[::-1]

    async def finished_count(self) -> int:
        """How many finished jobs the journal holds (what retention by count looks at)."""
        rows = await asyncio.to_thread(
            self._read_rows,
            f"SELECT count(*) FROM jobs INDEXED BY jobs_finished WHERE {_FINISHED}",
        )
        return int(rows[0][0])

    async def oldest_finished(self, limit: int) -> list[tuple[str, float]]:
        """The ``limit`` finished jobs that ended (at the owner) first: (id, updated_at)."""
        rows = await asyncio.to_thread(
            self._read_rows,
            f"SELECT id, updated_at FROM jobs INDEXED BY jobs_finished WHERE {_FINISHED}"
            " ORDER BY updated_at LIMIT ?",
            (limit,),
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    async def purge(self, job_ids: Sequence[str]) -> bool:
        """Forget finished jobs: their rows, transitions, placements and allocation history,
        in one write (keep it small: it shares a transaction with whatever else is waiting).
        Unfinished ones stay."""
        if not job_ids:
            return False
        marks = ",".join("?" * len(job_ids))
        ids = tuple(job_ids)
        return await self._sql(
            (f"DELETE FROM jobs WHERE id IN ({marks}) AND {_FINISHED}", ids),
            (
                f"DELETE FROM transitions WHERE job_id IN ({marks})"
                f" AND job_id NOT IN (SELECT id FROM jobs WHERE id IN ({marks}))",
                ids + ids,
            ),
            (
                f"DELETE FROM placements WHERE job_id IN ({marks})"
                f" AND job_id NOT IN (SELECT id FROM jobs WHERE id IN ({marks}))",
                ids + ids,
            ),
            (
                f"DELETE FROM allocations WHERE job_id IN ({marks})"
                f" AND job_id NOT IN (SELECT id FROM jobs WHERE id IN ({marks}))",
                ids + ids,
            ),
        )

    # -- the writer thread -----------------------------------------------------------------------

    def _writer(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            # As SQLite has them (not as we asked): what /api/v1/health and the tests show.
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            sync = conn.execute("PRAGMA synchronous").fetchone()[0]
            self.durability = f"{mode}, synchronous={_SYNCHRONOUS.get(sync, sync)}"
            conn.executescript(_SCHEMA)
            for table, column, kind in _ADDED_COLUMNS:  # a journal an older release wrote
                columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                if column not in columns:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            _remember_finished(conn)
        except sqlite3.Error as exc:
            self._ready.set_exception(InvalidInput(str(self.path), "a writable SQLite file", exc))
            return
        self._ready.set_result(None)
        backlog: list[_Queued] = []  # taken from the queue, not yet committed
        stop = False

        def take(item: object) -> None:
            nonlocal stop
            if item is _STOP:
                stop = True
            elif isinstance(item, list):
                backlog.extend(item)
                self._taken += len(item)
            else:
                backlog.append(item)  # type: ignore[arg-type]
                self._taken += 1

        try:
            while True:
                if not backlog and not stop:
                    take(self._queue.get())
                while len(backlog) < _MAX_BATCH and not stop and not self._queue.empty():
                    take(self._queue.get())
                work, backlog = backlog[:_MAX_BATCH], backlog[_MAX_BATCH:]
                # A launch waits for its intent's commit: it goes first, in a transaction of
                # its own, not behind the submissions and updates queued with it.
                urgent = [item for item in work if _kind(item[0]) == "launch"]
                if urgent and len(urgent) < len(work):
                    self._commit(conn, urgent)
                    work = [item for item in work if _kind(item[0]) != "launch"]
                if work:
                    self._commit(conn, work)
                if stop and not backlog:
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, work: list[_Queued]) -> None:
        results: list[bool | BaseException] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for request, _, _ in work:
                # A request of one statement needs no savepoint: SQLite undoes a statement
                # that fails (and one whose values cannot even be bound never ran), so it
                # cannot leave half of itself behind. Two statements per request saved.
                alone = isinstance(request, _Sql) and len(request.statements) == 1
                if not alone:
                    conn.execute("SAVEPOINT one")
                try:
                    results.append(self._apply(conn, request))
                    if not alone:
                        conn.execute("RELEASE one")
                except (OverflowError, TypeError, ValueError) as exc:
                    # The values cannot be stored (an integer beyond 64 bits...): the caller's
                    # input, not the journal, is at fault; this request fails, no other.
                    if not alone:
                        conn.execute("ROLLBACK TO one")
                        conn.execute("RELEASE one")
                    log.warning("journal %s: a write refused: %s", self.path, exc)
                    results.append(InvalidInput("journal", "values SQLite can store", str(exc)))
                except sqlite3.Error as exc:
                    if not alone:
                        conn.execute("ROLLBACK TO one")
                        conn.execute("RELEASE one")
                    log.error("journal %s: a write failed: %s", self.path, exc)
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    results.append(InternalError(f"journal write failed: {exc}"))
            conn.execute("COMMIT")
            self.commits += 1
            if self.observe is not None:
                committed = time.perf_counter()
                for request, _, queued in work:
                    self.observe(_kind(request), committed - queued)
        except Exception as exc:  # whatever it was, this batch fails and the writer goes on
            log.exception("journal %s: a commit failed", self.path)
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            results = [InternalError(f"journal commit failed: {exc}")] * len(work)
        # One wake-up of each waiting loop per transaction, not one per request: at thousands
        # of requests per second, per-request thread-safe futures cost the loop more than the
        # SQL does.
        by_loop: dict[asyncio.AbstractEventLoop, _Settled] = {}
        for (_, done, _), result in zip(work, results, strict=True):
            by_loop.setdefault(done.get_loop(), []).append((done, result))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, settled)

    @staticmethod
    def _apply(conn: sqlite3.Connection, request: _Request) -> bool:
        if isinstance(request, _Sql):
            changed = [conn.execute(sql, args).rowcount for sql, args in request.statements]
            return changed[0] > 0
        if isinstance(request, _Submit):
            key = request.key
            scope = request.submitter or ""
            if key is not None:
                held = conn.execute(
                    "SELECT 1 FROM idempotency WHERE submitter = ? AND key = ? AND created_at >= ?",
                    (scope, key.key, key.not_before),
                ).fetchone()
                if held:
                    return False  # a repeat: the first submission with this key holds it
            cursor = conn.execute(
                "INSERT OR IGNORE INTO jobs"
                " (id, owner, state, site, spec, submitted_at, updated_at, submitter)"
                " VALUES (?, ?, ?, NULL, ?, ?, ?, ?)",
                (
                    request.job_id,
                    request.owner,
                    JobState.SUBMITTED.value,
                    request.spec,
                    request.at,
                    request.at,
                    request.submitter,
                ),
            )
            if cursor.rowcount == 0:
                return False
            conn.execute(
                "INSERT INTO transitions (job_id, state, site, at) VALUES (?, ?, NULL, ?)",
                (request.job_id, JobState.SUBMITTED.value, request.at),
            )
            if key is not None:  # REPLACE: an expired row of the same key may still be there
                conn.execute(
                    "INSERT OR REPLACE INTO idempotency"
                    " (submitter, key, job_id, fingerprint, created_at) VALUES (?, ?, ?, ?, ?)",
                    (scope, key.key, request.job_id, key.fingerprint, request.at),
                )
            return True
        for sql, args in request.placement:
            conn.execute(sql, args)
        cursor = conn.execute(
            "UPDATE jobs SET state = ?, site = COALESCE(?, site), updated_at = ? WHERE id = ?",
            (request.state.value, request.site, request.at, request.job_id),
        )
        if cursor.rowcount == 0:
            return False
        conn.execute(
            "INSERT INTO transitions (job_id, state, site, at) VALUES (?, ?, ?, ?)",
            (request.job_id, request.state.value, request.site, request.at),
        )
        if request.times is not None:
            for sql, args in _record_times(request.job_id, *request.times):
                conn.execute(sql, args)
        return True
