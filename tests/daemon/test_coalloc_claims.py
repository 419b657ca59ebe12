"""The owner's side of a co-allocated job's claims, in one daemon: a component is never told it
may start before every component's grant is in the owner's journal, and then it is told its
rank table and the job's key with it (issue 28)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gbroker.core.dispatch import JobSubmitted
from gbroker.core.model import Gang, Job
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology
from tests.daemon.test_monitors import config, daemons


def claim(component: int) -> dict[str, Any]:
    endpoint = {"host": "127.0.0.1", "port": 4000 + component}
    return {"id": f"a.1_{component}", "site": "a", "endpoint": endpoint, "cores": 1}


@pytest.mark.asyncio
async def test_no_component_is_granted_before_every_grant_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology = Topology([SiteSpec("a", 4, http=f"http://127.0.0.1:{free_port()}")], "full")
    async with asyncio.timeout(60), daemons(config("a", topology, tmp_path)) as [daemon]:
        driver = daemon.driver
        for index in (0, 1):  # placed in the owner's core only: no site starts them here
            job = Job(f"a.1_{index + 1}", 1, gang=Gang("a.1", 2, index, "a"))
            driver.broker.handle(JobSubmitted(job), time.time(), driver.decision_view)
        writing, release = asyncio.Event(), asyncio.Event()
        durable = driver.journal.grant_gang

        async def slow_grant(*args: Any) -> bool:
            writing.set()
            await release.wait()
            return await durable(*args)

        monkeypatch.setattr(driver.journal, "grant_gang", slow_grant)
        assert await driver._claim(claim(1), "a") == {"granted": False, "wait": True}
        completing = asyncio.create_task(driver._claim(claim(2), "a"))
        await writing.wait()  # the core has granted both; the journal has not yet
        assert await driver._claim(claim(1), "a") == {"granted": False, "wait": True}
        release.set()
        last = await completing
        assert last["granted"]
        assert [(r["rank"], r["port"]) for r in last["ranks"]] == [(0, 4001), (1, 4002)]
        again = await driver._claim(claim(1), "a")
        assert again["granted"]
        assert (again["ranks"], again["key"]) == (last["ranks"], last["key"])
        assert await driver.journal.gang_start("a.1") == {
            "ranks": last["ranks"],
            "key": last["key"],
        }
