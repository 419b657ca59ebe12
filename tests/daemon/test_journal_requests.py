"""How the journal takes its requests: a state change with its placement in one transaction, and
the requests of one round of the event loop handed to the writer together."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gbroker.core.states import JobState
from gbroker.daemon.journal import Journal
from gbroker.errors import InvalidInput

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("bounded")]


async def test_a_state_change_records_its_placement_in_the_same_request(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        assert await journal.update("a.1", JobState.STAGING, 2.0, "b", placement="placed")
        assert await journal.placements() == {"a.1": {"b": (False, False)}}
        assert await journal.update("a.1", JobState.QUEUED, 3.0, "b", placement="queued")
        assert await journal.placements() == {"a.1": {"b": (True, False)}}
        assert await journal.update("a.1", JobState.RUNNING, 4.0, "b", placement="granted")
        assert await journal.placements() == {"a.1": {"b": (True, True)}}
        # A grant at a site it was never placed at is a placement too (a start on a lease).
        assert await journal.update("a.1", JobState.RUNNING, 5.0, "c", placement="granted")
        assert (await journal.placements())["a.1"]["c"] == (True, True)
        assert [state for state, _, _ in await journal.transitions("a.1")] == [
            "submitted", "staging", "queued", "running", "running",
        ]  # fmt: skip


async def test_a_placement_is_recorded_even_when_the_job_is_not(tmp_path: Path) -> None:
    """An owner places a job before its state can change: the placement must never be lost."""
    async with Journal(tmp_path / "j.db") as journal:
        assert not await journal.update("x.9", JobState.STAGING, 2.0, "b", placement="placed")
        assert await journal.placements() == {"x.9": {"b": (False, False)}}


@pytest.mark.parametrize(("placement", "site"), [("moved", "b"), ("placed", None)])
async def test_a_placement_needs_a_known_kind_and_a_site(
    tmp_path: Path, placement: str, site: str | None
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        with pytest.raises(InvalidInput) as refused:
            await journal.update("a.1", JobState.STAGING, 2.0, site, placement=placement)
        assert str(refused.value) == (
            f"placement: expected one of placed, queued, granted at a site, got {placement!r}"
        )
        assert refused.value.found == placement
        assert await journal.placements() == {}
        assert (await journal.get("a.1")).state is JobState.SUBMITTED  # type: ignore[union-attr]


async def test_a_failed_placement_fails_its_state_change_too(tmp_path: Path) -> None:
    """One request, one savepoint: a placement that cannot be written takes its state change
    with it, and no other request of the batch."""
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("a.1", "a", b"s", 1.0)
        assert await journal.submit("a.2", "a", b"s", 1.0)
        with sqlite3.connect(journal.path) as conn:  # a site name SQLite will refuse
            conn.execute(
                "CREATE TRIGGER no_mars BEFORE INSERT ON placements WHEN NEW.site = 'mars' "
                "BEGIN SELECT RAISE(ABORT, 'no mars'); END"
            )
        bad = journal.update("a.1", JobState.STAGING, 2.0, "mars", placement="placed")
        good = journal.update("a.2", JobState.STAGING, 2.0, "b", placement="placed")
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], Exception)
        assert results[1] is True
        assert (await journal.get("a.1")).state is JobState.SUBMITTED  # type: ignore[union-attr]
        assert (await journal.get("a.2")).state is JobState.STAGING  # type: ignore[union-attr]
        assert await journal.placements() == {"a.2": {"b": (False, False)}}


async def test_the_requests_of_one_round_reach_the_writer_in_one_hand_over(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        puts: list[object] = []
        queue = journal._queue

        class Counted:
            """The writer's queue, counting what is put on it."""

            def put(self, item: object) -> None:
                puts.append(item)
                queue.put(item)

            def __getattr__(self, name: str) -> object:
                return getattr(queue, name)

        journal._queue = Counted()  # type: ignore[assignment]
        results = await asyncio.gather(
            *(journal.submit(f"a.{i}", "a", b"s", 1.0) for i in range(20))
        )
        assert results == [True] * 20
        assert len(puts) == 1
        assert isinstance(puts[0], list)
        assert len(puts[0]) == 20
        assert len(await journal.all_jobs()) == 20


async def test_closing_commits_what_was_not_yet_handed_over(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    await journal.__aenter__()
    pending = [asyncio.ensure_future(journal.submit(f"a.{i}", "a", b"s", 1.0)) for i in range(5)]
    await asyncio.sleep(0)  # each has queued its request for this round's hand-over ...
    await journal.aclose()  # ... and the journal closes before that round ended
    assert [await p for p in pending] == [True] * 5
    with sqlite3.connect(journal.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 5


async def test_a_resized_hosted_job_keeps_its_cores_and_slots(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.host("o.1", "o", False, b"d", 1.0, phase="queued")
        assert await journal.hosted_phase("o.1", "launching", 2.0, cores=4, token="t")
        (row,) = await journal.hosted()
        assert (row.cores, row.slots) == (4, ())  # as at its start: its environment says
        assert await journal.resized("o.1", 2, (3, 1), 3.0)
        (row,) = await journal.hosted()
        assert (row.cores, row.slots, row.phase, row.token) == (2, (3, 1), "launching", "t")
        with sqlite3.connect(journal.path) as conn:
            assert conn.execute("SELECT at FROM hosted").fetchone() == (3.0,)
        assert not await journal.resized("o.9", 2, (0, 1), 3.0)  # not hosted here


async def test_an_owned_jobs_allocations_are_kept_in_order_and_purged_with_it(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        for job_id in ("a.1", "a.2"):
            assert await journal.submit(job_id, "a", b"s", 1.0)
        assert await journal.allocated("a.1", 5.0, 4)
        assert await journal.allocated("a.2", 5.5, 1)
        assert await journal.allocated("a.1", 7.0, 2)
        assert await journal.allocated("a.1", 6.0, 3)  # kept as they came, not by time
        assert await journal.allocations("a.1") == [(5.0, 4), (7.0, 2), (6.0, 3)]
        assert await journal.allocations("a.9") == []
        assert await journal.update("a.1", JobState.DONE, 8.0)
        assert await journal.purge(["a.1", "a.2"])  # a.2 has not finished: it stays
        assert await journal.allocations("a.1") == []
        assert await journal.allocations("a.2") == [(5.5, 1)]


async def test_an_older_journal_gains_the_slots_column_and_the_allocations_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    async with Journal(path) as journal:
        assert await journal.host("o.1", "o", False, b"d", 1.0)
    with sqlite3.connect(path) as conn:  # as a release before malleable jobs wrote it
        conn.execute("ALTER TABLE hosted DROP COLUMN slots")
        conn.execute("DROP TABLE allocations")
    async with Journal(path) as journal:
        (row,) = await journal.hosted()
        assert row.slots == ()
        assert await journal.resized("o.1", 2, (0, 1), 2.0)
        assert (await journal.hosted())[0].slots == (0, 1)
        assert await journal.allocated("o.1", 2.0, 2)


async def test_the_allocations_of_many_jobs_come_in_one_read(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        for i in range(1000):  # more than one chunk of bound values
            assert await journal.allocated(f"a.{i}", float(i), 1 + i % 3)
        assert await journal.allocated("a.7", 100.0, 4)
        wanted = [f"a.{i}" for i in range(0, 1000, 7)] + ["a.9999"]
        found = await journal.allocations_of(wanted)
        assert set(found) == {f"a.{i}" for i in range(0, 1000, 7)}  # none for a.9999
        assert found["a.7"] == [(7.0, 2), (100.0, 4)]
        assert await journal.allocations_of([]) == {}
        # Every job of a read over two chunks (900 bound values each), each history once: the
        # first job of the second chunk (a.900) neither skipped nor read twice.
        every = await journal.allocations_of([f"a.{i}" for i in range(1000)])
        expected = {f"a.{i}": [(float(i), 1 + i % 3)] for i in range(1000)}
        expected["a.7"].append((100.0, 4))
        assert every == expected
