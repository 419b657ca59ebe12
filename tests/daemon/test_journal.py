"""The SQLite journal: durable before acknowledged, group-committed, idempotent, recoverable."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gbroker.core.limits import NOTHING, Used
from gbroker.core.states import JobState
from gbroker.daemon.journal import Journal
from gbroker.errors import InternalError, InvalidInput
from tests.brokers import HeldWriter, queued

pytestmark = pytest.mark.usefixtures("bounded")


@pytest.mark.asyncio
async def test_submissions_survive_a_restart_and_unfinished_jobs_come_back(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    async with Journal(path) as journal:
        assert await journal.submit("a.1", "a", b"spec-1", 1.0)
        assert await journal.submit("a.2", "a", b"spec-2", 2.0)
        assert await journal.update("a.1", JobState.QUEUED, 3.0, site="b")
        assert await journal.update("a.1", JobState.RUNNING, 4.0)
        assert await journal.update("a.2", JobState.CANCELLED, 5.0)
    async with Journal(path) as journal:
        unfinished = await journal.unfinished()
        assert [(r.id, r.state, r.site, r.spec) for r in unfinished] == [
            ("a.1", JobState.RUNNING, "b", b"spec-1")
        ]
        row = await journal.get("a.2")
        assert row is not None
        assert row.state is JobState.CANCELLED
        assert await journal.get("nope") is None
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        history = conn.execute("SELECT state FROM transitions WHERE job_id = 'a.1' ORDER BY seq")
        assert [s for (s,) in history] == ["submitted", "queued", "running"]


@pytest.mark.asyncio
async def test_submissions_are_idempotent_by_job_id(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        assert await journal.submit("x.1", "x", b"first", 1.0)
        assert not await journal.submit("x.1", "x", b"second", 2.0)
        row = await journal.get("x.1")
        assert row is not None
        assert row.spec == b"first"
        assert not await journal.update("unknown", JobState.DONE, 3.0)
        with pytest.raises(InvalidInput, match=r"job\.id"):
            await journal.submit("", "x", b"", 1.0)


@pytest.mark.asyncio
async def test_concurrent_submissions_share_commits(tmp_path: Path) -> None:
    async with Journal(tmp_path / "j.db") as journal:
        results = await asyncio.gather(
            *(journal.submit(f"s.{k}", "s", b"x" * 100, float(k)) for k in range(500))
        )
        assert all(results)
        assert len(await journal.all_jobs()) == 500
        assert journal.commits < 100  # group commit: many submissions per fsync


@pytest.mark.asyncio
async def test_an_acknowledged_submission_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from gbroker.daemon.journal import Journal
        async def main():
            async with Journal({str(path)!r}) as j:
                for k in range(50):
                    await j.submit(f"k.{{k}}", "k", b"spec", float(k))
                    print(k, flush=True)  # acknowledged
                await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = [proc.stdout.readline() for _ in range(50)]
    os.kill(proc.pid, signal.SIGKILL)  # no clean shutdown, no checkpoint
    proc.wait(timeout=10)
    assert acknowledged[-1].strip() == "49"
    async with Journal(path) as journal:
        assert {r.id for r in await journal.all_jobs()} == {f"k.{k}" for k in range(50)}


@pytest.mark.asyncio
async def test_a_closed_journal_refuses_writes_and_a_bad_path_is_reported(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    with pytest.raises(InternalError, match="not open"):
        await journal.submit("a", "a", b"", 0.0)
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(InvalidInput, match="writable SQLite"):
        async with Journal(tmp_path / "dir.db"):
            pass


@pytest.mark.asyncio
async def test_placements_and_grants_come_back_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    async with Journal(path) as journal:
        assert await journal.submit("a.1", "a", b"spec", 1.0)
        assert await journal.place("a.1", "b")
        assert not await journal.place("a.1", "b")  # idempotent
        assert await journal.place("a.1", "c")
        assert await journal.placement_queued("a.1", "b")
        assert await journal.grant("a.1", "c")
        assert await journal.place("a.2", "d")
        assert await journal.unplace("a.2", "d")
        assert not await journal.unplace("a.2", "d")
    async with Journal(path) as journal:
        assert await journal.placements() == {"a.1": {"b": (True, False), "c": (False, True)}}


@pytest.mark.asyncio
async def test_hosted_jobs_keep_their_phase_process_and_unacknowledged_report(
    tmp_path: Path,
) -> None:
    path = tmp_path / "site.db"
    async with Journal(path) as journal:
        assert await journal.host("o.1", "o", False, b"d1", 1.0)
        assert not await journal.host("o.1", "o", False, b"other", 1.5)  # a repeated dispatch
        assert await journal.host("o.2", "o", True, b"d2", 2.0)
        assert await journal.host("o.3", "p", False, b"d3", 3.0)
        assert await journal.hosted_phase("o.1", "running", 4.0, pgid=4242, cores=2, started_at=4.0)
        assert await journal.hosted_phase("o.1", "finished", 5.0, report=b"r")
        assert await journal.hosted_phase("o.2", "queued", 5.0)
        assert await journal.unhost("o.3")
        assert not await journal.hosted_phase("o.3", "queued", 6.0)
    async with Journal(path) as journal:
        rows = await journal.hosted()
    assert [(r.job_id, r.phase, r.pgid, r.cores, r.started_at, r.report) for r in rows] == [
        ("o.1", "finished", 4242, 2, 4.0, b"r"),
        ("o.2", "queued", None, None, None, None),
    ]
    assert (rows[0].spec, rows[0].replica, rows[1].replica) == (b"d1", False, True)


@pytest.mark.asyncio
async def test_the_journal_runs_in_wal_mode_with_full_synchronous_commits(tmp_path: Path) -> None:
    """As SQLite reports it on the writer's own connection: a commit is on disk (fsynced)
    before a submission is acknowledged, not only in the OS's cache."""
    async with Journal(tmp_path / "j.sqlite") as journal:
        assert journal.health()["durability"] == "wal, synchronous=full"


@pytest.mark.asyncio
async def test_a_submission_is_answered_only_after_its_commit(tmp_path: Path) -> None:
    """The journal's writer is held: the HTTP answer must wait for it, whatever the order of
    the handler's other work; released, the job is committed and then acknowledged."""
    import threading

    import aiohttp

    from gbroker.daemon.server import BrokerDaemon
    from gbroker.fleet.ports import free_port
    from gbroker.security.auth import bearer
    from gbroker.topology import SiteSpec, Topology
    from tests.brokers import TOKEN, daemon_config

    topology = Topology([SiteSpec("a", 2, http=f"http://127.0.0.1:{free_port()}")], "full")
    async with BrokerDaemon(daemon_config("a", topology, tmp_path / "a")) as daemon:
        journal = daemon.driver.journal
        release = threading.Event()
        commit = journal._commit

        def held(conn: sqlite3.Connection, work: list) -> None:  # type: ignore[type-arg]
            release.wait(30)
            commit(conn, work)

        journal._commit = held  # type: ignore[method-assign]
        job = b'{"executable": "/bin/true"}'
        async with aiohttp.ClientSession(headers=bearer(TOKEN)) as http:
            answer = asyncio.ensure_future(http.post(f"{daemon.url}/api/v1/jobs", data=job))
            try:
                done, _ = await asyncio.wait([answer], timeout=1.0)
                assert not done, "acknowledged before the journal committed the job"
                commits = journal.commits
            finally:
                release.set()
            response = await answer
            assert response.status == 201
            assert journal.commits > commits
            job_id = (await response.json())["id"]
            assert (await journal.get(job_id)) is not None
            response.release()


@pytest.mark.asyncio
async def test_an_error_text_utf8_cannot_hold_never_fails_the_state_it_rides_with(
    tmp_path: Path,
) -> None:
    """A hostile file name (a lone surrogate) quoted in a staging error: the job still fails."""
    async with Journal(tmp_path / "j.sqlite") as journal:
        await journal.submit("a.1", "a", b"x", 1.0, "u")
        assert await journal.update("a.1", JobState.FAILED, 2.0, error="bad \udcff name")
        row = await journal.get("a.1")
        assert row is not None
        assert (row.state, row.error) == (JobState.FAILED, "bad \\udcff name")


@pytest.mark.asyncio
async def test_a_launch_intent_commits_before_the_backlog_queued_with_it(tmp_path: Path) -> None:
    """A launch waits for its intent's commit: with a backlog of submissions and updates queued
    at the same time, the intent is committed first, in a transaction of its own, and every
    commit's latency is observed by kind."""
    async with Journal(tmp_path / "j.sqlite") as journal:
        assert await journal.host("b.1", "b", False, b"spec", 1.0, phase="queued")
        observed: list[str] = []
        journal.observe = lambda kind, seconds: observed.append(kind)
        held = HeldWriter(journal)  # busy while the backlog and the intent queue up
        blocker = asyncio.ensure_future(journal.submit("a.0", "a", b"spec", 1.0))
        await held.holding()
        backlog = [
            asyncio.ensure_future(journal.submit(f"a.{n}", "a", b"spec", 1.0)) for n in range(1, 50)
        ]
        intent = asyncio.ensure_future(
            journal.hosted_phase("b.1", "launching", 2.0, cores=1, token="t")
        )
        await queued(journal, 50)  # all of them behind the held batch
        held.release.set()
        assert await blocker
        assert await intent
        assert all(await asyncio.gather(*backlog))
        assert observed[0] == "submit"  # a.0, held
        assert observed[1] == "launch"  # then the intent, before any of the 49 queued before it
        assert observed[2:] == ["submit"] * 49
        assert journal.commits == 1 + 1 + 1 + 1  # host, a.0, the intent, the backlog


@pytest.mark.asyncio
async def test_a_move_s_steps_are_journaled_and_its_grant_passes_in_one_transaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.db"
    bundle = "ab" * 32
    async with Journal(path) as journal:
        # The target: the moving job and its move, together (a restart never sees one alone).
        assert await journal.host_moving("a.1", "a", b"spec", 1.0, "ann", "b", "c", bundle, 7)
        assert not await journal.host_moving("a.1", "a", b"spec", 2.0, "ann", "b", "c", bundle, 7)
        # The owner: the grant passes from b to c, then (say c could not restore) back to b.
        await journal.grant("a.2", "b")
        await journal.move("a.2", "owner", "b", "c", "ready", 3.0, bundle, 7)
        await journal.move_granted("a.2", "b", "c")
    async with Journal(path) as journal:
        [hosted] = await journal.hosted()
        assert (hosted.job_id, hosted.phase) == ("a.1", "staging")
        [incoming] = await journal.moves("in")
        assert (incoming.source, incoming.target, incoming.bundle, incoming.size) == (
            "b",
            "c",
            bundle,
            7,
        )
        assert (await journal.placements())["a.2"] == {"c": (True, True)}
        await journal.move_abandoned("a.2", "b", "c")
        assert (await journal.placements())["a.2"] == {"b": (True, True)}
        assert await journal.moves("owner") == []
        assert await journal.move_done("a.1", "in")
        assert await journal.moves("in") == []


@pytest.mark.asyncio
async def test_what_a_moving_job_used_is_journaled_in_each_role_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    # Issue 35: a restarted target still gives the job only what is left of its limits.
    path = tmp_path / "broker.db"
    bundle, used = "ab" * 32, Used(12.5, 3.25, 2)
    async with Journal(path) as journal:
        await journal.move("a.1", "out", "b", "c", "frozen", 1.0, bundle, 7, used)  # source
        await journal.move("a.1", "owner", "b", "c", "ready", 2.0, bundle, 7, used)  # owner
        assert await journal.host_moving("a.1", "a", b"spec", 3.0, None, "b", "c", bundle, 7, used)
        assert await journal.host_moving("a.2", "a", b"spec", 3.0, None, "b", "c", bundle, 7)
        assert await journal.submit("a.1", "a", b"spec", 0.5)
        assert await journal.moved("a.1", used, 4.0)  # the owner, once the target started it
    async with Journal(path) as journal:
        assert [row.used for row in await journal.moves("out")] == [used]
        assert [row.used for row in await journal.moves("owner")] == [used]
        assert {h.job_id: h.used for h in await journal.hosted()} == {"a.1": used, "a.2": NOTHING}
        row = await journal.get("a.1")
        assert row is not None
        assert (row.used, row.moved_at) == (used, 4.0)
