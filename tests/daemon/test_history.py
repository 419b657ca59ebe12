"""Finished jobs in the journal: true times, read on demand, purged by retention."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gbroker.core.states import JobState
from gbroker.daemon.config import Retention
from gbroker.daemon.history import purge_expired, reported_time, settled_start
from gbroker.daemon.journal import Journal
from gbroker.daemon.server import BrokerDaemon
from gbroker.errors import InvalidInput
from gbroker.fleet.ports import free_port
from gbroker.jobs.documents import loads_job_description
from gbroker.topology import SiteSpec, Topology
from tests.brokers import daemon_config

times = st.floats(min_value=0, max_value=2**33, allow_nan=False)


@given(times, times, times)
@example(at=5.0, submitted_at=10.0, now=20.0)  # before its submission: the submission
@example(at=25.0, submitted_at=10.0, now=20.0)  # after we heard of it: when we heard
@example(at=15.0, submitted_at=10.0, now=20.0)  # inside: as reported
@example(at=15.0, submitted_at=10.0, now=5.0)  # our clock behind the submission's
def test_a_reported_time_is_kept_when_plausible_and_bounded_otherwise(
    at: float, submitted_at: float, now: float
) -> None:
    bounded = reported_time(at, submitted_at, now)
    assert bounded >= submitted_at
    assert bounded <= max(now, submitted_at)
    if submitted_at <= at <= now:
        assert bounded == at


def test_a_start_never_postdates_the_end() -> None:
    assert settled_start(12.0, 10.0) == 10.0
    assert settled_start(8.0, 10.0) == 8.0
    assert settled_start(None, 10.0) is None
    assert settled_start(12.0, None) == 12.0


@pytest.mark.parametrize(
    ("days", "jobs", "batch"), [(0, 1, 1), (-1, 1, 1), (float("nan"), 1, 1), (1, -1, 1), (1, 1, 0)]
)
def test_a_retention_policy_that_makes_no_sense_is_refused(
    days: float, jobs: int, batch: int
) -> None:
    with pytest.raises(InvalidInput):
        Retention(days=days, jobs=jobs, batch=batch)


async def _finished(journal: Journal, job_id: str, at: float, state: JobState) -> None:
    await journal.submit(job_id, "a", b"\x80", at - 1.0, "alice")
    await journal.place(job_id, "b")
    await journal.update(job_id, JobState.RUNNING, at - 0.5, "b")
    await journal.update(job_id, state, at, "b")


@pytest.mark.asyncio
async def test_times_are_journaled_first_given_wins_and_start_is_brought_to_the_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite"
    async with Journal(path) as journal:
        await journal.submit("a.1", "a", b"\x80", 100.0, "alice")
        # The end overtook the start: the start learned afterwards is after the end.
        await journal.record_times("a.1", ended_at=110.0, exit_code=3, error="boom")
        await journal.record_times("a.1", started_at=111.0)
        await journal.record_times("a.1", started_at=105.0, ended_at=120.0)  # repeats: ignored
        assert not await journal.record_times("a.9", started_at=1.0)  # unknown job
    async with Journal(path) as journal:  # a restart
        row = await journal.get("a.1")
    assert row is not None
    assert (row.started_at, row.ended_at, row.exit_code, row.error) == (110.0, 110.0, 3, "boom")


@pytest.mark.asyncio
async def test_retention_purges_by_age_and_count_oldest_first_and_never_an_unfinished_job(
    tmp_path: Path,
) -> None:
    async with Journal(tmp_path / "journal.sqlite") as journal:
        for n in range(10):  # a.0 ended at 1000, ... a.9 at 1009
            await _finished(journal, f"a.{n}", 1000.0 + n, (JobState.DONE, JobState.FAILED)[n % 2])
        await journal.submit("a.100", "a", b"\x80", 10.0, "alice")  # the oldest, unfinished
        await journal.place("a.100", "b")
        forgotten: list[str] = []
        day = 86_400.0

        # By count: 6 of 10 kept, in batches of 3 (3 + 1 purged).
        policy = Retention(days=1, jobs=6, batch=3)
        assert await purge_expired(journal, policy, 1010.0, forgotten.extend) == 4
        assert forgotten == ["a.0", "a.1", "a.2", "a.3"]
        assert await purge_expired(journal, policy, 1010.0, forgotten.extend) == 0

        # By age: those that ended more than a day before now.
        policy = Retention(days=1, jobs=100, batch=3)
        assert await purge_expired(journal, policy, 1006.5 + day, forgotten.extend) == 3
        assert forgotten[4:] == ["a.4", "a.5", "a.6"]

        assert [r.id for r in await journal.all_jobs()] == ["a.100", "a.7", "a.8", "a.9"]
        assert await journal.finished_count() == 3
        assert await journal.transitions("a.3") == []
        assert [t[0] for t in await journal.transitions("a.8")] == ["submitted", "running", "done"]
        assert set(await journal.placements()) == {"a.100", "a.7", "a.8", "a.9"}
        # Even a policy that keeps none leaves an unfinished job alone.
        await purge_expired(journal, Retention(days=1, jobs=0), 1e9)
        assert [r.id for r in await journal.all_jobs()] == ["a.100"]
        assert len(await journal.transitions("a.100")) == 1


@pytest.mark.asyncio
async def test_a_listing_is_the_newest_jobs_of_a_submitter_oldest_first(tmp_path: Path) -> None:
    async with Journal(tmp_path / "journal.sqlite") as journal:
        for n in range(5):
            await journal.submit(f"a.{n}", "a", b"\x80", float(n), ("alice", "bob")[n % 2])
        assert [r.id for r in await journal.listing("alice", 2)] == ["a.2", "a.4"]
        assert [r.id for r in await journal.listing(None, 10)] == [f"a.{n}" for n in range(5)]


@pytest.mark.asyncio
async def test_a_purge_shares_the_writer_with_submissions_that_keep_committing(
    tmp_path: Path,
) -> None:
    """Submissions made while a large purge runs are committed in between its batches."""
    async with Journal(tmp_path / "journal.sqlite") as journal:
        await asyncio.gather(
            *(_finished(journal, f"a.{n}", 1000.0 + n, JobState.DONE) for n in range(4000))
        )
        purge = asyncio.ensure_future(
            purge_expired(journal, Retention(days=1, jobs=0, batch=100), 1e9)
        )
        await asyncio.sleep(0)
        for n in range(5):  # against 40 batches
            assert await journal.submit(f"a.new{n}", "a", b"\x80", 2e9, "alice")
        assert not purge.done()  # the submissions did not wait for the whole purge
        assert await purge == 4000
        assert len(await journal.all_jobs()) == 5


@pytest.mark.asyncio
async def test_an_end_reported_before_the_start_it_overtook_keeps_start_before_end(
    tmp_path: Path,
) -> None:
    """The owner records the times it is given; a start that postdates the end is brought back
    to it, in memory and in the journal, whichever report arrives first."""
    topology = Topology([SiteSpec("a", 2, http=f"http://127.0.0.1:{free_port()}")], "full")
    sleeper = '{"executable": "/bin/sleep", "arguments": ["30"], "total_cpu_count": {"exact": 1}}'
    async with BrokerDaemon(daemon_config("a", topology, tmp_path / "a")) as daemon:
        driver = daemon.driver
        report = driver.peer_handlers["/peer/v1/report"]
        job_id = await driver.submit(loads_job_description(sleeper), "alice")
        assert job_id is not None
        status = driver.jobs[job_id]
        while status.started_at is None:  # its real start, reported by the site
            await asyncio.sleep(0.01)
        # An end between submission and start: the reported start is the one in doubt.
        end = (status.submitted_at + status.started_at) / 2
        body = {"id": job_id, "site": "a", "kind": "finished", "at": end, "ok": True}
        await report({**body, "exit_code": 0}, "a")
        assert (status.state, status.started_at, status.ended_at) == (JobState.DONE, end, end)
        # A second job: its end arrives before its start, whose report comes afterwards.
        other = await driver.submit(loads_job_description(sleeper), "alice")
        assert other is not None
        while driver.jobs[other].state is not JobState.RUNNING:
            await asyncio.sleep(0.01)
        theirs = driver.jobs[other]
        theirs.started_at = None  # as if the start had not reached us yet
        await driver.journal.record_times(other, started_at=None)
        await report({**body, "id": other, "at": theirs.submitted_at + 0.001}, "a")
        await report({"id": other, "site": "a", "kind": "started", "at": 2e9}, "a")
        assert theirs.started_at == theirs.ended_at == theirs.submitted_at + 0.001
        rows = {r.id: r for r in await driver.journal.all_jobs()}
    assert (rows[job_id].started_at, rows[job_id].ended_at) == (end, end)
    assert rows[other].started_at is not None
    assert rows[other].ended_at is not None
    assert rows[other].started_at <= rows[other].ended_at
