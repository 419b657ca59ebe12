"""The owner's job arrays: one submission, many ordinary jobs, and the bookkeeping that ties them.

Theory of operation. A submission with a parameter sweep (:mod:`gbroker.jobs.sweep`) becomes N
descriptions. Each is submitted through the driver's ordinary path
(:meth:`~gbroker.daemon.driver.Driver.submit`) under the element id ``<array id>_<i>``
(:mod:`gbroker.core.arrays`), so each element is journaled, ranked, dispatched, run, reported
and recovered exactly as any job is; nothing below the client API knows arrays exist. What is
kept here, in a small SQLite file of its own (``DATA_DIR/arrays.sqlite``, WAL, ``synchronous
= FULL``), is which arrays this broker owns: id, size, submitter, name, the submission's
idempotency key and fingerprint, and the submission itself.

Durability. The array's row, with the submission's bytes, is committed *before* its first
element is submitted and marked complete once every element is durable in the journal; only
then is the submission acknowledged (201). A broker killed in between finds the row
incomplete when it starts again (:meth:`Arrays.resume`), reads the submission again and submits
the elements the journal does not hold, so an array is never left half made. A repeat of the
submission with the same ``Idempotency-Key`` answers the same array (and completes it first, if
need be); with another body, 422, as for single jobs.

An array's status is its elements' (:func:`~gbroker.core.arrays.array_state`), read from
memory or, for elements that ended before the broker last started, from the journal; cancel
and wait act on every element.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.core.arrays import array_state, element_id, element_ids, state_counts
from gbroker.core.states import TERMINAL_STATES
from gbroker.daemon.driver import Driver, JobStatus, status_of
from gbroker.errors import GBrokerError, InternalError
from gbroker.jobs.description import JobDescription
from gbroker.jobs.sweep import JobArray, loads_submission
from gbroker.protocol.idempotency import KeyReused, fingerprint

__all__ = ["ArrayRecord", "Arrays"]

log = logging.getLogger("gbroker.daemon")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS arrays (
    id           TEXT PRIMARY KEY,
    size         INTEGER NOT NULL,
    submitter    TEXT NOT NULL,
    name         TEXT,
    submitted_at REAL NOT NULL,
    complete     INTEGER NOT NULL DEFAULT 0,
    key          TEXT,
    fingerprint  TEXT NOT NULL,
    body         BLOB NOT NULL,
    plan         TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS arrays_by_key ON arrays(submitter, key) WHERE key IS NOT NULL;
"""
# Element submissions in flight at once: the journal commits them in groups.
_AT_ONCE = 256


@dataclass(slots=True)
class ArrayRecord:
    """An array this broker owns."""

    id: str
    size: int
    submitter: str
    name: str | None
    submitted_at: float
    complete: bool
    # A co-allocated job's placement: (site, cores, units) per component; None for an array.
    plan: list[tuple[str, int, int | None]] | None = None

    @property
    def element_ids(self) -> list[str]:
        return element_ids(self.id, self.size)


class Arrays:
    """The arrays of one broker (see the module docstring); ``async with`` opens the file."""

    def __init__(self, path: Path, driver: Driver) -> None:
        self.path = path
        self.driver = driver
        self.records: dict[str, ArrayRecord] = {}
        # (submitter, key) -> (array id, fingerprint) of each keyed array, as committed: every
        # keyed single submission asks (:meth:`key_taken`), so it is answered from memory.
        self._keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._lock = asyncio.Lock()  # one writer at a time (each write is one short commit)

    async def __aenter__(self) -> Arrays:
        await asyncio.to_thread(self._open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The broker's alone (it holds submissions, inline data included), before SQLite opens
        # it: its -wal and -shm files take the database file's mode.
        os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.path.chmod(0o600)
        with contextlib.closing(self._connect()) as conn:
            conn.executescript(_SCHEMA)
            columns = {str(c[1]) for c in conn.execute("PRAGMA table_info(arrays)")}
            if "plan" not in columns:  # a file of a broker from before co-allocated jobs
                conn.execute("ALTER TABLE arrays ADD COLUMN plan TEXT")
            rows = conn.execute(
                "SELECT id, size, submitter, name, submitted_at, complete, key, fingerprint, plan"
                " FROM arrays"
            ).fetchall()
        for row in rows:
            plan = None if row[8] is None else [tuple(p) for p in json.loads(str(row[8]))]
            self.records[str(row[0])] = ArrayRecord(
                str(row[0]),
                int(row[1]),
                str(row[2]),
                row[3],
                float(row[4]),
                bool(row[5]),
                plan,
            )
            if row[6] is not None:
                self._keys[str(row[2]), str(row[6])] = (str(row[0]), str(row[7]))

    async def _write(self, sql: str, args: Sequence[object]) -> None:
        def run() -> None:
            with contextlib.closing(self._connect()) as conn:
                conn.execute(sql, args)

        async with self._lock:
            await asyncio.to_thread(run)

    def _keyed(self, submitter: str, key: str) -> tuple[str, str] | None:
        """The id and fingerprint of the array that holds ``submitter``'s ``key``, if any."""
        return self._keys.get((submitter, key))

    async def key_taken(self, submitter: str, key: str, body: bytes) -> None:
        """Raise :class:`KeyReused` if an array holds ``submitter``'s ``key`` (a single job
        is being submitted with it)."""
        held = self._keyed(submitter, key)
        if held is not None:
            raise KeyReused(key, held[0])

    # -- submission ----------------------------------------------------------------------------

    async def submit(
        self,
        array: JobArray | JobDescription,
        submitter: str,
        key: str | None,
        body: bytes,
        plan: list[tuple[str, int, int | None]] | None = None,
    ) -> tuple[ArrayRecord, bool]:
        """Take an array (or a co-allocated job: ``array`` is its description and ``plan`` its
        components' placement): its record, then every element, durable before this returns.
        The record, and whether this was a repeat of the key's submission."""
        digest = fingerprint(body)
        if key is not None:
            held = self._keyed(submitter, key)
            if held is not None:
                if held[1] != digest:
                    raise KeyReused(key, held[0])
                record = self.records[held[0]]
                if not record.complete:
                    await self._complete(record, self._elements(record, array))
                return record, True
            earlier = await self.driver.journal.idempotent(submitter, key, 0.0)
            if earlier is not None:  # the key made a single job
                raise KeyReused(key, earlier[0])
        if isinstance(array, JobArray):
            size, name = array.size, array.elements[0].name
        else:
            assert plan is not None
            size, name = len(plan), array.name
        record = ArrayRecord(self.driver.new_id(), size, submitter, name, time.time(), False, plan)
        try:
            await self._write(
                "INSERT INTO arrays (id, size, submitter, name, submitted_at, key, fingerprint,"
                " body, plan) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.size,
                    submitter,
                    record.name,
                    record.submitted_at,
                    key,
                    digest,
                    body,
                    None if plan is None else json.dumps(plan),
                ),
            )
        except sqlite3.IntegrityError:  # the same key, submitted concurrently
            assert key is not None
            return await self.submit(array, submitter, key, body, plan)
        except sqlite3.Error as exc:
            raise InternalError(f"arrays: {exc}") from exc
        self.records[record.id] = record
        if key is not None:
            self._keys[submitter, key] = (record.id, digest)
        await self._complete(record, self._elements(record, array))
        return record, False

    @staticmethod
    def _elements(record: ArrayRecord, array: JobArray | JobDescription) -> list[JobDescription]:
        """An array's elements, or a co-allocated job's components as its plan placed them."""
        if isinstance(array, JobArray):
            return list(array.elements)
        assert record.plan is not None
        size = len(record.plan)
        return [
            array.component(record.id, i, size, site, cores, units)
            for i, (site, cores, units) in enumerate(record.plan)
        ]

    async def _complete(
        self, record: ArrayRecord, elements: Sequence[JobDescription], skip_known: bool = False
    ) -> None:
        """Submit every element (those the journal holds already, if ``skip_known``), then
        mark the array complete. An element no site takes is journaled failed, as a single
        job is; the others go on."""
        gate = asyncio.Semaphore(_AT_ONCE)

        async def one(index: int, desc: JobDescription) -> None:
            job_id = element_id(record.id, index)
            async with gate:
                if skip_known and (
                    job_id in self.driver.jobs or await self.driver.journal.get(job_id)
                ):
                    return
                with contextlib.suppress(GBrokerError):  # journaled failed by the driver
                    await self.driver.submit(desc, record.submitter, job_id=job_id)

        await asyncio.gather(*(one(i, d) for i, d in enumerate(elements, start=1)))
        await self._write("UPDATE arrays SET complete = 1 WHERE id = ?", (record.id,))
        record.complete = True

    async def _body(self, array_id: str) -> bytes:
        """The submission an array (or co-allocated job) was made from, as it was sent."""

        def read() -> bytes:
            with contextlib.closing(self._connect()) as conn:
                row = conn.execute("SELECT body FROM arrays WHERE id = ?", (array_id,))
                return bytes(row.fetchone()[0])

        return await asyncio.to_thread(read)

    async def description(self, record: ArrayRecord) -> JobDescription:
        """The description a co-allocated job was submitted with (not its components')."""
        loaded = loads_submission(await self._body(record.id), document=record.id)
        if not isinstance(loaded, JobDescription):
            raise InternalError(f"{record.id}: its submission no longer reads as one job")
        return loaded

    async def resume(self) -> int:
        """Complete the arrays a killed broker left half submitted; how many there were."""
        unfinished = [r for r in self.records.values() if not r.complete]
        for record in unfinished:
            try:
                loaded = loads_submission(await self._body(record.id), document=record.id)
                if record.plan is not None and isinstance(loaded, JobDescription):
                    loaded = (await self.driver.stager.learn_sizes([loaded]))[0]
                    elements = self._elements(record, loaded)
                elif not isinstance(loaded, JobArray) or loaded.size != record.size:
                    raise InternalError("its submission no longer reads as the same array")
                else:
                    elements = await self.driver.stager.learn_sizes(loaded.elements)
            except GBrokerError as exc:  # never acknowledged: its journaled elements carry on
                log.error("%s: array %s cannot be completed: %s", self.driver.site, record.id, exc)
                continue
            await self._complete(record, elements, skip_known=True)
        return len(unfinished)

    # -- the client's requests -----------------------------------------------------------------

    async def _statuses(self, record: ArrayRecord) -> list[JobStatus | None]:
        out: list[JobStatus | None] = []
        for job_id in record.element_ids:
            status = self.driver.jobs.get(job_id)
            if status is None:
                row = await self.driver.journal.get(job_id)
                status = None if row is None else status_of(row)
            out.append(status)
        return out

    async def status(self, record: ArrayRecord) -> dict[str, Any]:
        """The array as clients see it: its summed-up state, counts and every element."""
        statuses = await self._statuses(record)
        known = [s for s in statuses if s is not None]
        states = [s.state for s in known]
        elements = [
            {"id": job_id, "state": "purged"}
            if s is None
            else {
                "id": s.id,
                "state": str(s.state),
                "site": s.site,
                "exit_code": s.exit_code,
                "error": s.error,
            }
            for job_id, s in zip(record.element_ids, statuses, strict=True)
        ]
        return {
            "id": record.id,
            "array": True,
            "size": record.size,
            "name": record.name,
            "state": str(array_state(states)) if states else "purged",
            "counts": state_counts(states),
            "submitted_at": record.submitted_at,
            "submitter": record.submitter,
            "complete": record.complete,
            "elements": elements,
        } | (
            {}
            if record.plan is None
            else {
                "components": [
                    {"site": site, "cores": cores} | ({} if units is None else {"units": units})
                    for site, cores, units in record.plan
                ]
            }
        )

    async def listing(self, record: ArrayRecord) -> list[dict[str, Any]]:
        """Its elements as ``GET /api/v1/jobs`` lists jobs."""
        return [s.as_dict() for s in await self._statuses(record) if s is not None]

    async def cancel(self, record: ArrayRecord, by: str) -> int:
        """User ``by`` cancels every element that has not ended; how many were."""
        cancelled = 0
        for job_id in record.element_ids:
            status = self.driver.jobs.get(job_id)
            if status is not None and status.state not in TERMINAL_STATES:
                await self.driver.cancel(status, by)
                cancelled += 1
        return cancelled

    async def wait(self, record: ArrayRecord, timeout: float) -> None:
        """Until every element has ended, or ``timeout`` seconds."""
        waits = [
            status.done.wait()
            for job_id in record.element_ids
            if (status := self.driver.jobs.get(job_id)) is not None
            and status.state not in TERMINAL_STATES
        ]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)
