"""The journal's contract, function by function, in process (what mutation testing found untested).

Every read is checked against what the writes put there, field by field: the times a finished job
keeps, its transitions, the listing and the retention queries, purge, the hosted rows and their
launch token, idempotency keys, the migration of an older journal, and how the writer thread
batches, observes and survives failures. ``tests/daemon/test_journal.py`` holds the durability
tests (SIGKILL, restart, group commit under load).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from gbroker.core.states import JobState
from gbroker.daemon.journal import HostedRow, JobRow, Journal
from gbroker.errors import InternalError, InvalidInput
from gbroker.protocol.idempotency import IdempotencyKey
from tests.brokers import HeldWriter, queued

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("bounded")]


def _key(key: str, not_before: float, fingerprint: str = "f") -> IdempotencyKey:
    return IdempotencyKey(key=key, fingerprint=fingerprint, not_before=not_before)


async def test_a_job_row_carries_every_field_it_was_written_with(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"spec", 1.5, submitter="ann")
        row = await journal.get("a.1")
        assert row == JobRow("a.1", "a", JobState.SUBMITTED, None, b"spec", 1.5, 1.5, "ann")
        assert await journal.update("a.1", JobState.QUEUED, 2.0, site="b")
        assert await journal.update("a.1", JobState.RUNNING, 3.0)  # the site is kept
        row = await journal.get("a.1")
        assert row is not None
        assert (row.state, row.site, row.submitted_at, row.updated_at) == (
            JobState.RUNNING,
            "b",
            1.5,
            3.0,
        )
        assert await journal.transitions("a.1") == [
            ("submitted", None, 1.5),
            ("queued", "b", 2.0),
            ("running", None, 3.0),
        ]
        assert await journal.transitions("nobody") == []


async def test_an_update_records_the_true_times_first_one_wins(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        await journal.submit("a.1", "a", b"s", 1.0)
        assert await journal.update("a.1", JobState.RUNNING, 5.0, site="b", started_at=4.0)
        row = await journal.get("a.1")
        assert row is not None
        assert (row.started_at, row.ended_at, row.exit_code, row.error) == (4.0, None, None, None)
        # A second start is a repeat of the first report: the first time stays.
        assert await journal.update(
            "a.1", JobState.FAILED, 9.0, started_at=4.5, ended_at=8.0, exit_code=3, error="boom"
        )
        row = await journal.get("a.1")
        assert row is not None
        assert (row.started_at, row.ended_at, row.exit_code, row.error) == (4.0, 8.0, 3, "boom")
        # record_times alone: the end stays the first one; a later exit code and error replace.
        assert await journal.record_times("a.1", ended_at=9.5, exit_code=4, error="again")
        row = await journal.get("a.1")
        assert row is not None
        assert (row.started_at, row.ended_at, row.exit_code, row.error) == (4.0, 8.0, 4, "again")
        assert not await journal.record_times("nobody", ended_at=1.0)
        assert not await journal.update("nobody", JobState.DONE, 1.0, ended_at=1.0)


async def test_a_start_learned_after_the_end_is_brought_back_to_it(tmp_path: Path) -> None:
    """started_at <= ended_at always; a start equal to the end stays as it is."""
    async with Journal(tmp_path / "j.db") as journal:
        await journal.submit("a.1", "a", b"s", 1.0)
        await journal.submit("a.2", "a", b"s", 1.0)
        await journal.submit("a.3", "a", b"s", 1.0)
        assert await journal.update("a.1", JobState.DONE, 9.0, started_at=7.0, ended_at=6.0)
        assert await journal.record_times("a.2", ended_at=6.0)
        assert await journal.record_times("a.2", started_at=7.0)
        assert await journal.record_times("a.3", started_at=6.0, ended_at=6.0)
        for job_id in ("a.1", "a.2", "a.3"):
            row = await journal.get(job_id)
            assert row is not None
            assert (row.started_at, row.ended_at) == (6.0, 6.0), job_id
        # An update with no times leaves the recorded ones alone.
        assert await journal.update("a.3", JobState.DONE, 10.0)
        row = await journal.get("a.3")
        assert row is not None
        assert (row.started_at, row.ended_at, row.exit_code) == (6.0, 6.0, None)


async def test_all_jobs_and_unfinished_come_in_submission_order(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        for job_id, at in (("a.3", 1.0), ("a.1", 2.0), ("a.2", 1.0), ("a.0", 3.0)):
            await journal.submit(job_id, "a", b"s", at)
        await journal.update("a.1", JobState.DONE, 4.0)
        await journal.update("a.0", JobState.FAILED, 4.0)
        await journal.update("a.3", JobState.RUNNING, 4.0)
        assert [r.id for r in await journal.all_jobs()] == ["a.2", "a.3", "a.1", "a.0"]
        assert [r.id for r in await journal.unfinished()] == ["a.2", "a.3"]


async def test_listing_gives_the_newest_of_one_submitter_oldest_first(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        for n in range(6):
            await journal.submit(f"a.{n}", "a", b"s", float(n), "ann" if n % 2 else "bob")
        await journal.submit("a.6", "a", b"s", 5.0, "ann")  # ties broken by id
        assert [r.id for r in await journal.listing("ann", 2)] == ["a.5", "a.6"]
        assert [r.id for r in await journal.listing("ann", 10)] == ["a.1", "a.3", "a.5", "a.6"]
        assert [r.id for r in await journal.listing("bob", 10)] == ["a.0", "a.2", "a.4"]
        assert [r.id for r in await journal.listing(None, 3)] == ["a.4", "a.5", "a.6"]
        assert await journal.listing("carol", 10) == []


async def test_retention_sees_finished_jobs_by_when_they_ended_and_purges_only_those(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        for n in range(5):
            await journal.submit(f"a.{n}", "a", b"s", float(n))
            await journal.place(f"a.{n}", "b")
        await journal.update("a.0", JobState.DONE, 30.0)
        await journal.update("a.1", JobState.FAILED, 10.0)
        await journal.update("a.2", JobState.CANCELLED, 20.0)
        await journal.update("a.3", JobState.RUNNING, 5.0)  # unfinished, ended at no time
        assert await journal.finished_count() == 3
        assert await journal.oldest_finished(2) == [("a.1", 10.0), ("a.2", 20.0)]
        assert await journal.oldest_finished(10) == [("a.1", 10.0), ("a.2", 20.0), ("a.0", 30.0)]
        assert not await journal.purge([])
        # a.3 is running: it stays, with its transitions and placement.
        assert await journal.purge(["a.1", "a.2", "a.3"])
        assert await journal.finished_count() == 1
        assert [r.id for r in await journal.all_jobs()] == ["a.0", "a.3", "a.4"]
        assert await journal.transitions("a.1") == []
        assert await journal.transitions("a.3") == [
            ("submitted", None, 3.0),
            ("running", None, 5.0),
        ]
        assert set(await journal.placements()) == {"a.0", "a.3", "a.4"}
        assert not await journal.purge(["a.3", "a.4"])  # nothing finished among them
        assert not await journal.purge(["gone"])


async def test_a_grant_without_a_placement_on_record_makes_one_queued_and_granted(
    tmp_path: Path,
) -> None:
    """A start reported by a site the journal had no placement for (written before a crash)."""
    async with Journal(tmp_path / "j.db") as journal:
        # False: no placement was on record to grant (one is made, queued and granted).
        assert not await journal.grant("a.1", "b")
        assert await journal.placements() == {"a.1": {"b": (True, True)}}
        assert await journal.place("a.2", "c")
        assert await journal.grant("a.2", "c")
        assert await journal.placements() == {
            "a.1": {"b": (True, True)},
            "a.2": {"c": (False, True)},
        }
        assert not await journal.placement_queued("a.3", "c")


async def test_a_start_is_one_request_with_its_grant_and_first_allocation(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"spec", 1.0)
        assert await journal.place("a.1", "b")
        commits = journal.commits
        started = journal.update(
            "a.1", JobState.RUNNING, 3.0, "b", started_at=2.5, placement="granted",
            allocation=(2.5, 4),
        )  # fmt: skip
        assert await started
        assert journal.commits == commits + 1  # one transaction
        assert await journal.allocations("a.1") == [(2.5, 4)]
        assert await journal.placements() == {"a.1": {"b": (False, True)}}
        row = await journal.get("a.1")
        assert row is not None
        assert (row.state, row.started_at) == (JobState.RUNNING, 2.5)
        # An unknown job: False, and its allocation is recorded all the same.
        assert not await journal.update("x.9", JobState.RUNNING, 4.0, allocation=(3.0, 2))
        assert await journal.allocations("x.9") == [(3.0, 2)]
        assert await journal.update("a.1", JobState.DONE, 5.0)  # no allocation: none added
        assert await journal.allocations("a.1") == [(2.5, 4)]


async def test_a_hosted_row_keeps_every_field_and_the_launch_token(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.host("o.1", "o", True, b"d", 1.0, submitter="ann", phase="queued")
        assert await journal.host("o.2", "p", False, b"e", 2.0)
        assert await journal.hosted_phase("o.1", "launching", 3.0, cores=2, token="tok")
        assert await journal.hosted_phase("o.1", "running", 4.0, pgid=77, started_at=3.5)
        rows = await journal.hosted()
        assert rows == [
            HostedRow("o.1", "o", True, b"d", "running", 77, 2, 3.5, None, "ann", "tok"),
            HostedRow("o.2", "p", False, b"e", "staging", None, None, None, None, None, None),
        ]
        # A later phase keeps what it does not restate; a new report replaces none.
        assert await journal.hosted_phase("o.1", "finished", 5.0, report=b"r1")
        assert await journal.hosted_phase("o.1", "finished", 6.0)
        (row, _) = await journal.hosted()
        assert (row.phase, row.pgid, row.cores, row.started_at, row.report, row.token) == (
            "finished",
            77,
            2,
            3.5,
            b"r1",
            "tok",
        )
        with sqlite3.connect(journal.path) as conn:
            assert conn.execute("SELECT at FROM hosted WHERE job_id = 'o.1'").fetchone() == (6.0,)
        assert await journal.unhost("o.1")
        assert not await journal.unhost("o.1")
        assert [r.job_id for r in await journal.hosted()] == ["o.2"]


async def test_idempotency_keys_are_per_submitter_and_expire(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 10.0, "ann", _key("k", 0.0, "f1"))
        assert await journal.idempotent("ann", "k", 0.0) == ("a.1", "f1")
        assert await journal.idempotent("ann", "k", 10.0) == ("a.1", "f1")  # created at 10.0
        assert await journal.idempotent("ann", "k", 10.5) is None  # older than asked
        assert await journal.idempotent("bob", "k", 0.0) is None
        assert await journal.idempotent("ann", "other", 0.0) is None
        # A repeat within the window makes no job; another submitter's key is another key.
        assert not await journal.submit("a.2", "a", b"s", 11.0, "ann", _key("k", 0.0))
        assert await journal.get("a.2") is None
        assert await journal.submit("a.3", "a", b"s", 11.0, "bob", _key("k", 0.0, "f3"))
        # No submitter: the key is the anonymous one's.
        assert await journal.submit("a.4", "a", b"s", 12.0, None, _key("k", 0.0, "f4"))
        assert await journal.idempotent(None, "k", 0.0) == ("a.4", "f4")
        # Past the window the key is free again, and the new job takes it over.
        assert await journal.submit("a.5", "a", b"s", 20.0, "ann", _key("k", 10.5, "f5"))
        assert await journal.idempotent("ann", "k", 0.0) == ("a.5", "f5")
        # A duplicate job id with a fresh key journals neither.
        assert not await journal.submit("a.1", "a", b"s", 21.0, "ann", _key("fresh", 0.0))
        assert await journal.idempotent("ann", "fresh", 0.0) is None
        assert await journal.forget_keys(12.0)  # the keys of a.3 and a.4 (11.0, 12.0 stays)
        assert await journal.idempotent("bob", "k", 0.0) is None
        assert await journal.idempotent(None, "k", 0.0) == ("a.4", "f4")
        assert not await journal.forget_keys(12.0)


async def test_health_says_what_the_writer_did(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    assert not journal.alive
    async with journal:
        assert journal.alive
        await journal.submit("a.1", "a", b"s", 1.0)
        health = journal.health()
        assert health == {
            "ok": True,
            "commits": 1,
            "failed_commits": 0,
            "pending": 0,
            "last_error": None,
            "durability": "wal, synchronous=full",
        }
    assert not journal.alive
    assert journal.health()["ok"] is False
    await journal.aclose()  # closing twice is harmless


async def test_the_journal_and_its_files_are_the_brokers_alone(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "j.db"  # the directories are made
    async with Journal(path) as journal:
        await journal.submit("a.1", "a", b"s", 1.0)
        for name in ("j.db", "j.db-wal"):
            assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name


async def test_a_journal_written_by_an_older_release_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,"
            " site TEXT, spec BLOB NOT NULL, submitted_at REAL NOT NULL, updated_at REAL NOT NULL);"
            "CREATE TABLE hosted (job_id TEXT PRIMARY KEY, owner TEXT NOT NULL,"
            " replica INTEGER NOT NULL, spec BLOB NOT NULL, phase TEXT NOT NULL, pgid INTEGER,"
            " cores INTEGER, started_at REAL, report BLOB, at REAL NOT NULL);"
            "INSERT INTO jobs VALUES ('a.1', 'a', 'running', 'b', x'00', 1.0, 2.0);"
            "INSERT INTO hosted VALUES"
            " ('o.1', 'o', 0, x'01', 'queued', NULL, NULL, NULL, NULL, 1.0);"
        )
    async with Journal(path) as journal:
        (row,) = await journal.unfinished()
        assert row == JobRow("a.1", "a", JobState.RUNNING, "b", b"\x00", 1.0, 2.0)
        (hosted,) = await journal.hosted()
        assert (hosted.job_id, hosted.submitter, hosted.token) == ("o.1", None, None)
        assert await journal.update("a.1", JobState.DONE, 3.0, started_at=1.5, ended_at=2.5)
        assert await journal.hosted_phase("o.1", "launching", 3.0, token="t")
        row2 = await journal.get("a.1")
        assert row2 is not None
        assert (row2.started_at, row2.ended_at) == (1.5, 2.5)
    with sqlite3.connect(path) as conn:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"transitions_by_job", "jobs_by_submitter", "jobs_by_submission", "jobs_finished"} <= (
        indexes
    )


async def test_a_request_that_fails_fails_alone_and_is_told_how(tmp_path: Path) -> None:
    """Values SQLite cannot store are the caller's fault (InvalidInput); an SQL error is the
    journal's (InternalError, and remembered); requests committed with either still commit."""
    async with Journal(tmp_path / "j.db") as journal:
        # Held, so that the four behind it land in one transaction.
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()
        long_name = asyncio.ensure_future(journal.submit("a.1", "a", b"s", 1.0, "u" * 4096))
        bad_sql = asyncio.ensure_future(journal._sql(("INSERT INTO nowhere VALUES (1)", ())))
        fine = asyncio.ensure_future(journal.submit("a.2", "a", b"s", 1.0))
        overflow = asyncio.ensure_future(journal.hosted_phase("o.1", "running", 1.0, pgid=2**64))
        await queued(journal, 4)
        held.release.set()
        assert await blocker
        assert await long_name  # a long text is storable
        with pytest.raises(InternalError, match="journal write failed: no such table: nowhere"):
            await bad_sql
        assert await fine
        with pytest.raises(InvalidInput, match="values SQLite can store"):
            await overflow
        assert journal.commits == 2
        assert journal.failures == 0
        assert journal.last_error == "OperationalError: no such table: nowhere"
        assert {r.id for r in await journal.all_jobs()} == {"a.0", "a.1", "a.2"}


async def test_a_commit_that_fails_whole_fails_its_requests_and_the_writer_goes_on(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        commit = journal._commit
        calls = 0

        def failing(conn: sqlite3.Connection, work: list) -> None:  # type: ignore[type-arg]
            nonlocal calls
            calls += 1
            if calls == 1:  # the disk is full, say: COMMIT itself fails
                real = conn

                class Failing:
                    @property
                    def in_transaction(self) -> bool:
                        return real.in_transaction

                    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
                        if sql.upper() == "COMMIT":  # as SQLite reads it, in any case
                            raise sqlite3.OperationalError("disk I/O error")
                        return real.execute(sql, *args)

                # The writer must roll the failed transaction back itself: else the next
                # BEGIN fails, and every later request with it.
                commit(Failing(), work)  # type: ignore[arg-type]
                assert not real.in_transaction
                return
            commit(conn, work)

        journal._commit = failing  # type: ignore[method-assign]
        with pytest.raises(InternalError, match="journal commit failed: disk I/O error"):
            await journal.submit("a.1", "a", b"s", 1.0)
        assert journal.failures == 1
        assert journal.commits == 0
        assert journal.last_error == "OperationalError: disk I/O error"
        assert journal.alive
        assert await journal.submit("a.2", "a", b"s", 2.0)
        assert [r.id for r in await journal.all_jobs()] == ["a.2"]
        assert journal.health()["failed_commits"] == 1


async def test_a_backlog_is_committed_in_transactions_of_at_most_512(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("b.0", "b", b"s", 1.0))
        await held.holding()
        backlog = [
            asyncio.ensure_future(journal.submit(f"a.{n}", "a", b"s", 1.0)) for n in range(1100)
        ]
        await queued(journal, 1100)
        held.release.set()
        assert await blocker
        assert all(await asyncio.gather(*backlog))
        assert held.sizes == [1, 512, 512, 76]


async def test_every_commit_is_observed_by_kind(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        seen: list[tuple[str, float]] = []
        journal.observe = lambda kind, seconds: seen.append((kind, seconds))
        await journal.submit("a.1", "a", b"s", 1.0)
        await journal.update("a.1", JobState.QUEUED, 2.0)
        await journal.host("o.1", "o", False, b"s", 1.0)
        await journal.hosted_phase("o.1", "launching", 2.0, token="t")
        await journal.hosted_phase("o.1", "running", 3.0)
        assert [kind for kind, _ in seen] == ["submit", "update", "other", "launch", "other"]
        assert all(0 <= seconds < 10 for _, seconds in seen)


async def test_a_caller_that_gave_up_does_not_stop_the_others(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()
        impatient = asyncio.ensure_future(journal.submit("a.1", "a", b"s", 1.0))
        patient = asyncio.ensure_future(journal.submit("a.2", "a", b"s", 1.0))
        await queued(journal, 2)
        impatient.cancel()
        held.release.set()
        assert await blocker
        assert await patient
        assert held.sizes == [1, 2]  # a.1 and a.2 were settled together
        assert await journal.submit("a.3", "a", b"s", 1.0)
        # The cancelled caller's job was committed all the same: it may have been acknowledged.
        assert {r.id for r in await journal.all_jobs()} == {"a.0", "a.1", "a.2", "a.3"}


# -- errors, exactly, and the writer surviving them ---------------------------------------------


async def test_bad_requests_are_refused_with_the_exact_error(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    with pytest.raises(InternalError) as closed:
        await journal.submit("a.1", "a", b"s", 1.0)
    assert str(closed.value) == "the journal is not open"
    async with journal:
        with pytest.raises(InvalidInput) as empty:
            await journal.submit("", "a", b"s", 1.0)
        assert str(empty.value) == "job.id: expected a non-empty id, got ''"
        with pytest.raises(InvalidInput) as huge:
            await journal.hosted_phase("o.1", "running", 1.0, pgid=2**64)
        assert str(huge.value) == (
            "journal: expected values SQLite can store,"
            " got 'Python int too large to convert to SQLite INTEGER'"
        )


async def test_a_file_that_is_not_a_database_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite database, not even close" * 100)
    with pytest.raises(InvalidInput) as caught:
        async with Journal(path):
            pass
    assert caught.value.field == str(path)
    assert caught.value.expected == "a writable SQLite file"
    assert "file is not a database" in str(caught.value)


async def test_the_writer_logs_each_failure_with_the_journal_and_the_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    async with Journal(path) as journal:
        with caplog.at_level(logging.WARNING, logger="gbroker.daemon"):
            with pytest.raises(InvalidInput):
                await journal.hosted_phase("o.1", "running", 1.0, pgid=2**64)
            with pytest.raises(InternalError):
                await journal._sql(("INSERT INTO nowhere VALUES (1)", ()))
        messages = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert messages == [
            (
                "WARNING",
                f"journal {path}: a write refused: Python int too large to convert to SQLite"
                " INTEGER",
            ),
            ("ERROR", f"journal {path}: a write failed: no such table: nowhere"),
        ]


async def test_failed_commits_are_counted_and_logged_and_a_failed_rollback_stops_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    async with Journal(path) as journal:
        commit = journal._commit
        failing = 2

        def broken(conn: sqlite3.Connection, work: list) -> None:  # type: ignore[type-arg]
            nonlocal failing
            if failing:
                failing -= 1
                real = conn

                class Broken:
                    in_transaction = True

                    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
                        if sql.upper() in ("COMMIT", "ROLLBACK"):  # the disk is gone: both fail
                            raise sqlite3.OperationalError("disk I/O error")
                        return real.execute(sql, *args)

                commit(Broken(), work)  # type: ignore[arg-type]
                real.execute("ROLLBACK")
                return
            commit(conn, work)

        journal._commit = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="gbroker.daemon"):
            for job_id in ("a.1", "a.2"):
                with pytest.raises(InternalError, match="journal commit failed: disk I/O error"):
                    await journal.submit(job_id, "a", b"s", 1.0)
        assert journal.failures == 2
        assert [r.getMessage() for r in caplog.records] == [f"journal {path}: a commit failed"] * 2
        assert all(r.exc_info is not None for r in caplog.records)
        assert await journal.submit("a.3", "a", b"s", 1.0)
        assert [r.id for r in await journal.all_jobs()] == ["a.3"]


async def test_a_request_from_a_loop_closed_meanwhile_does_not_stop_the_writer(
    tmp_path: Path,
) -> None:
    """A caller whose event loop is gone (a thread that gave up) is skipped; the others are
    answered and the writer goes on."""
    import time

    from gbroker.daemon.journal import _Submit

    async with Journal(tmp_path / "j.db") as journal:
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()

        def from_another_loop() -> None:
            loop = asyncio.new_event_loop()
            gone = loop.create_future()
            journal._queue.put((_Submit("a.2", "a", b"s", 1.0, None), gone, time.perf_counter()))
            journal._handed += 1  # as _hand_over counts (the broker's loop waits meanwhile)
            loop.close()

        await asyncio.to_thread(from_another_loop)  # first in the next batch
        ours = asyncio.ensure_future(journal.submit("a.1", "a", b"s", 1.0))
        await queued(journal, 2)
        held.release.set()
        assert await blocker
        assert await ours
        assert held.sizes == [1, 2]  # answered in the batch with the closed loop's request
        assert await journal.submit("a.3", "a", b"s", 1.0)
        assert {r.id for r in await journal.all_jobs()} == {"a.0", "a.1", "a.2", "a.3"}
        assert journal.waiting == 0  # the request put alone was counted as taken, once


async def test_each_hosted_column_is_read_as_itself(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        await journal.host("o.1", "o", False, b"d", 1.0)  # no submitter
        await journal.hosted_phase("o.1", "launching", 2.0, cores=3, token="t")  # no pgid yet
        await journal.host("o.2", "o", False, b"d", 1.0, submitter="ann")
        await journal.hosted_phase("o.2", "running", 2.0, started_at=2.5)  # no cores on record
        one, two = await journal.hosted()
        assert (one.pgid, one.cores, one.started_at, one.submitter, one.token) == (
            None,
            3,
            None,
            None,
            "t",
        )
        assert (two.pgid, two.cores, two.started_at, two.submitter, two.token) == (
            None,
            None,
            2.5,
            "ann",
            None,
        )


async def test_closing_ends_the_writer_cleanly(tmp_path: Path) -> None:
    crashed: list[BaseException | None] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)
    try:
        journal = Journal(tmp_path / "j.db")
        async with journal:
            await journal.submit("a.1", "a", b"s", 1.0)
        assert not journal.alive
    finally:
        threading.excepthook = previous
    assert crashed == []


async def test_before_it_opens_the_journal_says_so_and_its_writer_is_a_named_daemon(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.db")
    assert journal.health()["durability"] == "unknown"
    async with journal:
        thread = journal._thread
        assert thread is not None
        assert (thread.name, thread.daemon) == ("journal:j.db", True)


async def test_a_path_that_cannot_be_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "a-directory"
    path.mkdir()
    with pytest.raises(InvalidInput) as caught:
        async with Journal(path):
            pass
    assert str(caught.value) == (
        f"{path}: expected a writable SQLite file, got IsADirectoryError(21, 'Is a directory')"
    )


@pytest.mark.parametrize("name", ["site#1", "what?", "100%41", "two words"])
async def test_a_journal_in_a_directory_named_with_uri_characters_reads_itself(
    tmp_path: Path, name: str
) -> None:
    """The reads open the journal by a ``file:`` URI: a ``#``, ``?`` or ``%`` in a directory's
    name is the directory's, never a fragment, a query or an escape (which opened another file,
    with no tables, beside it)."""
    path = tmp_path / name / "j.db"
    async with Journal(path) as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        assert await journal.place("a.1", "b")
        assert [r.id for r in await journal.all_jobs()] == ["a.1"]
        assert await journal.placements() == {"a.1": {"b": (False, False)}}
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no file was made beside it


async def test_a_journal_given_by_a_relative_path_reads_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with Journal(Path("data") / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        row = await journal.get("a.1")
        assert row is not None
        assert row.id == "a.1"


async def test_health_counts_pending_requests_not_the_rounds_that_handed_them_over(
    tmp_path: Path,
) -> None:
    """Requests of one loop round reach the writer in one put; /api/v1/health's ``pending``
    still counts each of them."""
    async with Journal(tmp_path / "j.db") as journal:
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()
        three = [asyncio.ensure_future(journal.submit(f"a.{i}", "a", b"s", 1.0)) for i in (1, 2, 3)]
        await queued(journal, 3)
        assert journal.health()["pending"] == 3
        held.release.set()
        assert await blocker
        assert all([await one for one in three])
        assert journal.health()["pending"] == 0


async def test_health_counts_the_requests_of_this_round_not_yet_handed_over_as_pending(
    tmp_path: Path,
) -> None:
    """``pending`` is what waits for the writer: handed over and not taken, plus what this
    round of the loop has asked and will hand over at its end."""
    async with Journal(tmp_path / "j.db") as journal:
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()
        two = [asyncio.ensure_future(journal.submit(f"a.{i}", "a", b"s", 1.0)) for i in (1, 2)]
        await queued(journal, 2)
        three = [asyncio.ensure_future(journal.submit(f"a.{i}", "a", b"s", 1.0)) for i in (3, 4, 5)]
        await asyncio.sleep(0)  # each asks; the round's hand-over runs after this task resumes
        in_round = (journal.waiting, journal.health()["pending"])
        await queued(journal, 5)  # handed over at the round's end: nothing left in the round
        handed = journal.health()["pending"]
        held.release.set()
        assert in_round == (2, 5)
        assert handed == 5
        assert await blocker
        assert [await one for one in two + three] == [True] * 5
        assert journal.health()["pending"] == 0


async def test_a_request_of_several_statements_that_fails_leaves_none_of_them(
    tmp_path: Path,
) -> None:
    """A request of more than one statement runs in a savepoint: when a later statement fails
    (values SQLite cannot store, or an SQL error), the earlier ones are undone, and the other
    requests of its transaction commit."""
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        assert await journal.place("a.2", "mars")
        with sqlite3.connect(journal.path) as conn:  # a grant's second statement fails at mars
            conn.execute(
                "CREATE TRIGGER no_mars BEFORE INSERT ON placements WHEN NEW.site = 'mars' "
                "BEGIN SELECT RAISE(ABORT, 'no mars'); END"
            )
        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"s", 1.0))
        await held.holding()
        # The state change is written, then its exit code cannot be stored.
        overflow = asyncio.ensure_future(
            journal.update("a.1", JobState.FAILED, 2.0, "b", exit_code=2**70)
        )
        # The placement is granted, then the insert behind it is refused.
        refused = asyncio.ensure_future(journal.grant("a.2", "mars"))
        fine = asyncio.ensure_future(journal.submit("a.3", "a", b"s", 3.0))
        await queued(journal, 3)
        held.release.set()
        assert await blocker
        with pytest.raises(InvalidInput, match="values SQLite can store"):
            await overflow
        with pytest.raises(InternalError, match="journal write failed: no mars"):
            await refused
        assert await fine
        assert held.sizes == [1, 3]  # the three in one transaction
        assert journal.failures == 0
        row = await journal.get("a.1")
        assert row is not None
        assert (row.state, row.site, row.updated_at) == (JobState.SUBMITTED, None, 1.0)
        assert await journal.transitions("a.1") == [("submitted", None, 1.0)]
        assert await journal.placements() == {"a.2": {"mars": (False, False)}}
        assert (await journal.get("a.3")) is not None


async def test_an_idle_writer_waits_on_its_queue_rather_than_polling_it(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        queue = journal._queue
        waits = threading.Event()

        class Watched:
            """The writer's queue, telling when the writer waits on it with nothing there."""

            def get(self) -> object:
                if queue.empty():
                    waits.set()
                return queue.get()

            def __getattr__(self, name: str) -> object:
                return getattr(queue, name)

        journal._queue = Watched()  # type: ignore[assignment]
        assert await journal.submit("a.1", "a", b"s", 1.0)  # wakes it; then it is idle again
        assert await asyncio.to_thread(waits.wait, 10), "the idle writer never waited"
        assert await journal.submit("a.2", "a", b"s", 1.0)  # and a waiting writer still takes
        assert {r.id for r in await journal.all_jobs()} == {"a.1", "a.2"}


async def test_the_writer_takes_no_more_than_one_transaction_from_its_queue(
    tmp_path: Path,
) -> None:
    """Requests beyond a full transaction stay in the queue (pending, as health says) until
    the writer comes back for them."""
    async with Journal(tmp_path / "j.db") as journal:
        commit = journal._commit
        full = threading.Event()
        release = threading.Event()
        waiting_then: list[int] = []

        def held_when_full(conn: sqlite3.Connection, work: list[Any]) -> None:
            if len(work) == 512:
                waiting_then.append(journal.waiting)
                full.set()
                release.wait(10)
            commit(conn, work)

        held = HeldWriter(journal)
        blocker = asyncio.ensure_future(journal.submit("b.0", "b", b"s", 1.0))
        await held.holding()
        journal._commit = held_when_full  # type: ignore[method-assign]
        first = [asyncio.ensure_future(journal.submit(f"a.{n}", "a", b"s", 1)) for n in range(512)]
        await queued(journal, 512)
        then = [asyncio.ensure_future(journal.submit(f"c.{n}", "c", b"s", 1.0)) for n in range(10)]
        await queued(journal, 522)
        held.release.set()
        assert await asyncio.to_thread(full.wait, 10), "no transaction of 512"
        release.set()
        assert waiting_then == [10]
        assert await blocker
        assert all(await asyncio.gather(*first, *then))
        assert len(await journal.all_jobs()) == 523
