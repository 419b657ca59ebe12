"""A broker alone: neighbours it never heard from are not candidates (until the configured
grace), so it runs its own jobs at once instead of sending them to a site that is not there."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology
from tests.brokers import AUTH, daemon_config


def topology() -> Topology:
    """a (4 cores) and a bigger b whose broker never runs (nothing listens at its port)."""
    sites = [
        SiteSpec("a", 4, http=f"http://127.0.0.1:{free_port()}"),
        SiteSpec("b", 16, http=f"http://127.0.0.1:{free_port()}"),
    ]
    return Topology(sites, "full", name="lonely")


def job(cores: int) -> str:
    return f"executable: /bin/sleep\narguments: ['0.5']\ntotal_cpu_count: {{exact: {cores}}}\n"


async def neighbour_status(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/api/v1/info") as response:
        info = await response.json()
    return str(info["neighbours"][0]["status"])


@pytest.mark.asyncio
async def test_a_broker_alone_runs_its_own_jobs_at_once(tmp_path: Path) -> None:
    config = daemon_config("a", topology(), tmp_path / "a", neighbour_grace=None)
    async with BrokerDaemon(config) as a, aiohttp.ClientSession(headers=AUTH) as http:
        assert await neighbour_status(http, a.url) == "unheard"
        began = time.monotonic()
        ids = []
        for _ in range(4):  # as many as fit at a, and more: they queue at a, never go to b
            async with http.post(f"{a.url}/api/v1/jobs", data=job(2)) as response:
                assert response.status == 201, await response.text()
                ids.append((await response.json())["id"])
        for job_id in ids:
            async with http.get(f"{a.url}/api/v1/jobs/{job_id}/wait?timeout=20") as response:
                status = await response.json()
            assert (status["state"], status["site"]) == ("done", "a")
        assert time.monotonic() - began < 10  # not a lease (30 s) spent waiting on b
        # A job only b could run is refused, naming what was expected.
        async with http.post(f"{a.url}/api/v1/jobs", data=job(16)) as response:
            assert response.status == 400
            assert "rank" in (await response.json())["error"]
        async with http.get(f"{a.url}/metrics") as response:
            assert 'gbroker_dispatches_total{site="b"}' not in await response.text()


@pytest.mark.asyncio
async def test_after_the_grace_an_unheard_neighbour_is_assumed_idle(tmp_path: Path) -> None:
    config = daemon_config("a", topology(), tmp_path / "a", neighbour_grace=0.3, heartbeat=None)
    async with BrokerDaemon(config) as a, aiohttp.ClientSession(headers=AUTH) as http:
        assert await neighbour_status(http, a.url) == "unheard"
        await asyncio.sleep(0.6)
        assert await neighbour_status(http, a.url) == "assumed"


@pytest.mark.asyncio
async def test_a_broker_running_the_random_baseline_starts_and_places_jobs(tmp_path: Path) -> None:
    # `gbroker serve --algorithm random` refused to start: the daemon gave its core no seeded
    # generator ("rng: expected a seeded random source").
    from gbroker.core.dispatch import Algorithm, DispatchPolicy

    sites = [SiteSpec("a", 4, http=f"http://127.0.0.1:{free_port()}")]
    lone = Topology(sites, "full", name="alone")
    config = daemon_config("a", lone, tmp_path / "a", policy=DispatchPolicy(Algorithm.RANDOM))
    async with BrokerDaemon(config) as a, aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{a.url}/api/v1/jobs", data=job(1)) as response:
            assert response.status == 201, await response.text()
            job_id = (await response.json())["id"]
        async with http.get(f"{a.url}/api/v1/jobs/{job_id}/wait?timeout=20") as response:
            status = await response.json()
        assert (status["state"], status["site"]) == ("done", "a")
