"""End to end on real fleets: replication, migration, broker kills, leases and restarts.

Every test runs a real fleet (one ``gbroker serve`` process per site) twice: with the embedded
amqtt broker process a local fleet starts by default, and with a real mosquitto. Jobs append
their id and site to a file ``ran`` in their own directory (they run as an unprivileged user,
who may write nowhere else), so that "each job ran exactly once" is read off what the processes
actually did, not off what the brokers believe.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker import fleet
from gbroker.client.gclient import Client
from gbroker.topology import SiteSpec, Topology, save_topology


class Fleet:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        record = json.loads((directory / "fleet.json").read_text())
        self.urls: dict[str, str] = {name: m["url"] for name, m in record["sites"].items()}

    def job(self, seconds: float, cores: int = 2, name: str = "job") -> str:
        script = 'echo "$GBROKER_JOB_ID $GBROKER_SITE" >> ran'
        if seconds:
            script = f"sleep {seconds}; {script}"
        return json.dumps(
            {
                "name": name,
                "executable": "/bin/sh",
                "arguments": ["-c", script],
                "total_cpu_count": {"exact": cores},
                "wall_time_limit": 120,
            }
        )

    def runs(self) -> dict[str, list[str]]:
        """Job id -> the sites where its process ran to the end."""
        out: dict[str, list[str]] = collections.defaultdict(list)
        for ran in sorted(self.directory.glob("*/jobs/*/ran")):
            for line in ran.read_text().splitlines():
                job_id, site = line.split()
                out[job_id].append(site)
        return out

    async def submit(self, site: str, description: str) -> str:
        async with Client(self.urls[site]) as client:
            return await client.submit(description)

    async def status(self, job_id: str, via: str | None = None) -> dict[str, Any]:
        async with Client(self.urls[via or job_id.split(".")[0]]) as client:
            return await client.status(job_id)

    async def until(self, job_id: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = await self.status(job_id)
                if status["state"] in states:
                    return status
            except OSError:
                pass  # its owner is down or restarting: ask again
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id} never reached {states}")
            await asyncio.sleep(0.1)

    async def neighbours(self, via: str) -> dict[str, dict[str, Any]]:
        """What broker ``via`` knows of its neighbours (``/api/v1/info``), by site."""
        async with Client(self.urls[via]) as client:
            info = await client.info()
        return {row["site"]: row for row in info["neighbours"]}

    async def sees(
        self,
        via: str,
        site: str,
        test: Callable[[dict[str, Any]], bool],
        timeout: float = 30.0,
    ) -> None:
        """Wait until broker ``via``'s view of ``site`` (a neighbours row) passes ``test``."""
        deadline = time.monotonic() + timeout
        while True:
            row = (await self.neighbours(via)).get(site)
            if row is not None and test(row):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{via} never saw {site} as expected: {row}")
            await asyncio.sleep(0.05)

    async def forgets(self, site: str, job_id: str, timeout: float = 30.0) -> None:
        """Wait until broker ``site`` holds no copy of ``job_id`` (its hosted record is gone)."""
        deadline = time.monotonic() + timeout
        journal = self.directory / site / "journal.sqlite"
        while True:
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as conn:
                held = conn.execute("SELECT 1 FROM hosted WHERE job_id = ?", (job_id,)).fetchone()
            if held is None:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{site} still holds {job_id}")
            await asyncio.sleep(0.05)


StartFleet = Callable[..., Fleet]


@pytest.fixture
def start_fleet(tmp_path: Path, fleet_mqtt: str | None) -> Iterator[StartFleet]:
    """``start_fleet(cores, *serve_args)``: a full-graph fleet, taken down after the test."""
    directory = tmp_path / "fleet"

    def start(cores: dict[str, int], *serve_args: str) -> Fleet:
        topology = tmp_path / "topology.yaml"
        sites = [SiteSpec(name, n) for name, n in cores.items()]
        save_topology(Topology(sites, "full", name="e2e"), topology)
        fleet.up(topology, directory, fleet_mqtt, ("--dcsmon-period", "0.1", *serve_args))
        return Fleet(directory)

    try:
        yield start
    finally:
        if (directory / "fleet.json").exists():
            fleet.down(directory)


async def wait_for_view(f: Fleet) -> None:
    """Wait until every broker has heard every other's DCSMon state at least once."""
    for via in f.urls:
        for site in f.urls:
            if site != via:
                await f.sees(via, site, lambda row: row["status"] == "reported")


def test_replication_runs_each_job_exactly_once(start_fleet: StartFleet) -> None:
    f = start_fleet({"a": 2, "b": 2, "c": 2}, "--algorithm", "dr", "--replicas", "3")

    async def scenario(f: Fleet) -> None:
        await wait_for_view(f)
        ids = [await f.submit("abc"[k % 3], f.job(0.3, cores=1)) for k in range(12)]
        finals = [await f.until(job_id, {"done", "failed"}) for job_id in ids]
        assert [s["state"] for s in finals] == ["done"] * 12
        runs = f.runs()
        assert {job_id: len(runs[job_id]) for job_id in ids} == dict.fromkeys(ids, 1)
        assert all(runs[s["id"]] == [s["site"]] for s in finals)

    asyncio.run(scenario(f))


def test_migration_moves_a_queued_job_when_a_better_site_frees_up(start_fleet: StartFleet) -> None:
    f = start_fleet({"a": 2, "b": 2}, "--algorithm", "dm", "--interval", "0.5")

    async def scenario(f: Fleet) -> None:
        await wait_for_view(f)
        long = await f.submit("a", f.job(8))
        assert (await f.until(long, {"running"}))["site"] == "a"
        short = await f.submit("a", f.job(1.5))
        assert (await f.until(short, {"running"}))["site"] == "b"
        await f.sees("a", "b", lambda row: row["state"]["free_cores"] == 0)  # a hears b is full
        waiting = await f.submit("a", f.job(0))
        queued = await f.until(waiting, {"queued", "running", "done"})
        assert queued["site"] == "a"  # both full: it waits at the site with the freshest view
        done = await f.until(waiting, {"done"}, timeout=30)
        assert done["site"] == "b"  # b freed up first and the job moved there
        assert done["ended_at"] < (await f.status(long))["started_at"] + 8
        assert f.runs()[waiting] == ["b"]

    asyncio.run(scenario(f))


def test_a_sigkilled_owner_restarts_from_its_journal_and_every_job_runs_once(
    start_fleet: StartFleet,
) -> None:
    f = start_fleet({"a": 2, "b": 2}, "--lease", "2")

    async def scenario(f: Fleet) -> None:
        await wait_for_view(f)
        ids = [await f.submit("a", f.job(1.5)) for _ in range(4)]
        await f.until(ids[0], {"running"})
        fleet.kill(f.directory, "a")  # two jobs running (one at a), two queued
        await asyncio.sleep(1.0)
        fleet.restart(f.directory, "a")
        finals = [await f.until(job_id, {"done", "failed"}) for job_id in ids]
        assert [s["state"] for s in finals] == ["done"] * 4, finals
        runs = f.runs()
        assert {job_id: len(runs[job_id]) for job_id in ids} == dict.fromkeys(ids, 1)

    asyncio.run(scenario(f))


def test_a_lost_site_s_waiting_jobs_move_after_their_lease_and_none_runs_twice(
    start_fleet: StartFleet,
) -> None:
    f = start_fleet({"a": 2, "b": 3, "c": 2}, "--lease", "1")

    async def scenario(f: Fleet) -> None:
        await wait_for_view(f)
        for site in ("a", "c"):  # fill a and c for a while
            busy = await f.submit(site, f.job(6))
            assert (await f.until(busy, {"running"}))["site"] == site
        held = await f.submit("a", f.job(4))
        assert (await f.until(held, {"running"}))["site"] == "b"
        await f.sees("a", "b", lambda row: row["state"]["free_cores"] == 1)  # 1 core left
        # 2 cores wait everywhere; b's one free core makes it the best place to wait.
        moved = await f.submit("a", f.job(0))
        assert (await f.until(moved, {"queued"}))["site"] == "b"
        fleet.kill(f.directory, "b")
        # Its last-will reaches a; once the lease (1 s + 1 s grace) is over, a moves the job.
        deadline = time.monotonic() + 30
        while (status := await f.status(moved))["site"] == "b":
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.1)
        assert status["site"] in ("a", "c"), status
        assert (await f.status(held))["state"] == "running"  # it stays b's to report
        fleet.restart(f.directory, "b")  # b adopts held; its copy of moved is denied
        finals = [await f.until(job_id, {"done", "failed"}) for job_id in (held, moved)]
        assert [(s["state"], s["site"]) for s in finals] == [
            ("done", "b"),
            ("done", status["site"]),
        ]
        await f.forgets("b", moved)  # b's recovered copy of moved was denied and dropped
        runs = f.runs()
        assert (runs[held], runs[moved]) == (["b"], [status["site"]])

    asyncio.run(scenario(f))


@pytest.mark.slow
def test_a_sigkill_under_a_burst_of_64_clients_runs_no_job_twice(
    start_fleet: StartFleet,
) -> None:
    """The double runs issue 10 found: a job's process started before the journal said so, and
    a restarted broker requeued and ran it again. Each start is now journaled ahead (a launch
    token) and settled on restart from the launcher's record."""
    f = start_fleet({"a": 64, "b": 8})

    async def scenario(f: Fleet) -> None:
        await wait_for_view(f)
        acknowledged: list[str] = []
        killed = asyncio.Event()

        async def client() -> None:
            async with Client(f.urls["a"]) as c:
                while not killed.is_set():
                    try:
                        acknowledged.append(await c.submit(f.job(0.3, cores=1)))
                    except Exception:  # the broker died under us: this client stops
                        return
                    if len(acknowledged) >= 300:
                        fleet.kill(f.directory, "a")  # jobs are starting as fast as they come
                        killed.set()

        await asyncio.gather(*(client() for _ in range(64)))
        assert killed.is_set()
        await asyncio.sleep(1.0)
        fleet.restart(f.directory, "a")
        finals = [await f.until(job_id, {"done", "failed"}, 120) for job_id in acknowledged]
        assert {s["state"] for s in finals} == {"done"}, collections.Counter(
            s["state"] for s in finals
        )
        runs = f.runs()
        twice = {job_id: sites for job_id, sites in runs.items() if len(sites) > 1}
        assert not twice, twice
        assert all(len(runs[job_id]) == 1 for job_id in acknowledged)

    asyncio.run(scenario(f))
