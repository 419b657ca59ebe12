"""A job run at its owner's own site: which of its journal writes commit together.

Two pairs of steps of such a job are queued in one round of the loop, not one after the other's
commit (:meth:`Journal.update_soon`, :meth:`Journal.hosted_phase_soon`): the owner's placement
with the site's record of the job, and the site's outbox of the job's end with the owner's
record of it. Each pair must land in one transaction, in that order, and the start's state with
its grant and allocation in one request (other steps may share a transaction when the writer
is busy); a pair split, or a step out of order, shows here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gbroker.daemon import journal as journal_module
from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology
from tests.brokers import AUTH, daemon_config


def _step(request: Any) -> str:
    if isinstance(request, journal_module._Submit):
        return "submit"
    if isinstance(request, journal_module._Update):
        return f"state {request.state.value}"
    sql = request.statements[0][0]
    if sql.startswith("INSERT OR IGNORE INTO hosted"):
        return "host"
    if sql.startswith("UPDATE hosted"):
        return f"hosted {request.statements[0][1][0]!s}"
    if sql.startswith("DELETE FROM hosted"):
        return "unhost"
    if sql.startswith("UPDATE placements SET granted"):
        return "grant"
    return str(sql).split(" (", 1)[0]


@pytest.mark.asyncio
async def test_an_own_site_jobs_steps_commit_in_order_and_in_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions: list[list[str]] = []
    commit = journal_module.Journal._commit

    def recorded(self: journal_module.Journal, conn: Any, work: list[Any]) -> None:
        transactions.append([_step(request) for request, _, _ in work])
        commit(self, conn, work)

    monkeypatch.setattr(journal_module.Journal, "_commit", recorded)
    url = f"http://127.0.0.1:{free_port()}"
    topology = Topology([SiteSpec("solo", 4, http=url)], (), name="one")
    daemon = BrokerDaemon(daemon_config("solo", topology, tmp_path / "data"))
    await daemon.__aenter__()
    try:
        async with aiohttp.ClientSession(headers=AUTH) as http:
            transactions.clear()
            async with http.post(f"{url}/api/v1/jobs", data=b"executable: /bin/true\n") as r:
                job_id = (await r.json())["id"]
            await asyncio.wait_for(daemon.driver.jobs[job_id].done.wait(), 10)
            for _ in range(100):  # the unhost follows the owner's record of the end
                if any("unhost" in t for t in transactions):
                    break
                await asyncio.sleep(0.02)
    finally:
        await daemon.__aexit__(None, None, None)
    steps = [step for transaction in transactions for step in transaction]
    assert steps == [  # each step once, in this order
        "submit", "state staging", "host", "state queued", "grant", "hosted launching",
        "state running", "hosted finished", "state done", "unhost",
    ]  # fmt: skip
    together = {step: n for n, transaction in enumerate(transactions) for step in transaction}
    assert together["state staging"] == together["host"]  # the placement with the site's record
    assert together["hosted finished"] == together["state done"]  # the outbox with the end
    assert len(transactions) <= 8  # 11 before these pairs and the start were joined
