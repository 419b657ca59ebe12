"""Nothing forgotten, end to end: real fleets (one ``gbroker serve`` process per site), SIGKILLed
and restarted.

A finished job's status (with its true start and end), history and output are still answered
after its owner, and the site that ran it, restarted; retention purges what it should; a job
whose owner is down is answered 503 by any other broker, quickly. Each job records when it began
and ended, in its own directory, so the times the brokers report are checked against what the
process itself saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from gbroker import fleet
from gbroker.client.gclient import Client, ClientError
from gbroker.topology import SiteSpec, Topology, save_topology

JOB = json.dumps(
    {
        "name": "timed",
        "executable": "/bin/sh",
        "arguments": [
            "-c",
            "date +%s.%N > t0; sleep 0.4; echo out-$GBROKER_JOB_ID; echo err >&2; date +%s.%N > t1",
        ],
        "total_cpu_count": {"exact": 1},
        "wall_time_limit": 60,
    }
)

Start = Callable[..., dict[str, str]]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """``start(cores, *serve_args)``: a full-graph fleet (site -> URL), taken down after."""
    directory = tmp_path / "fleet"

    def up(cores: dict[str, int], *serve_args: str) -> dict[str, str]:
        topology = tmp_path / "topology.yaml"
        save_topology(Topology([SiteSpec(n, c) for n, c in cores.items()], "full"), topology)
        record = fleet.up(topology, directory, None, ("--dcsmon-period", "0.1", *serve_args))
        return {name: member["url"] for name, member in record["sites"].items()}

    try:
        yield up
    finally:
        if (directory / "fleet.json").exists():
            fleet.down(directory)


async def _ask(url: str, call: str, *args: Any) -> Any:
    async with Client(url, timeout=20) as client:
        return await getattr(client, call)(*args)


async def _until_done(url: str, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = await _ask(url, "status", job_id)
        if status["state"] in ("done", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.1)


def _kill(directory: Path, site: str, url: str) -> None:
    """SIGKILL a site's broker and wait until its port refuses connections (a restart before
    that could find the dying broker still listening)."""
    fleet.kill(directory, site)
    address = (URL(url).host or "", URL(url).port or 0)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=0.2).close()
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"{site} still listens at {url}")


def _seen_by_job(directory: Path, status: dict[str, Any]) -> tuple[float, float]:
    job_dir = directory / status["site"] / "jobs" / status["id"]
    return float((job_dir / "t0").read_text()), float((job_dir / "t1").read_text())


def test_finished_jobs_keep_status_history_and_output_across_sigkills(
    start: Start, tmp_path: Path
) -> None:
    urls = start({"a": 1, "b": 1})
    directory = tmp_path / "fleet"

    async def scenario() -> None:
        await asyncio.sleep(1.0)  # a hears b's state
        ids = [await _ask(urls["a"], "submit", JOB) for _ in range(4)]
        before = {job_id: await _until_done(urls["a"], job_id) for job_id in ids}
        assert {s["site"] for s in before.values()} == {"a", "b"}, before  # both ran some
        _kill(directory, "a", urls["a"])
        fleet.restart(directory, "a")
        _kill(directory, "b", urls["b"])  # the site that ran some: its memory of them is gone too
        fleet.restart(directory, "b")
        listed = {s["id"]: s for s in await _ask(urls["a"], "jobs")}
        for job_id, old in before.items():
            for via in ("a", "b"):  # the owner itself, and forwarded to it
                status = await _ask(urls[via], "status", job_id)
                assert status == old, (via, status, old)
            assert listed[job_id] == old
            began, ended = _seen_by_job(directory, status)
            # The site's times, not when the owner heard of them (nor the restart's).
            assert abs(status["started_at"] - began) < 0.5, (status, began)
            assert 0 <= status["ended_at"] - ended < 1.0, (status, ended)
            assert status["ended_at"] >= status["started_at"]
            assert status["exit_code"] == 0
            history = await _ask(urls["b"], "history", job_id)
            states = [t["state"] for t in history]
            assert (states[0], states[-1]) == ("submitted", "done"), history
            assert history[-1]["site"] == status["site"]
            assert await _ask(urls["b"], "output", job_id) == f"out-{job_id}\n".encode()
            assert await _ask(urls["a"], "output", job_id, "stderr") == b"err\n"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("serve_args", "kept"),
    [(("--retain-jobs", "2"), 2), (("--retain-days", "0.00001"), 0)],  # 0.864 s
    ids=["by-count", "by-age"],
)
def test_retention_purges_the_oldest_finished_jobs(
    start: Start, tmp_path: Path, serve_args: tuple[str, ...], kept: int
) -> None:
    urls = start({"a": 2}, *serve_args)

    async def scenario() -> None:
        ids = []
        for _ in range(4):  # one after the other: they end in this order
            ids.append(await _ask(urls["a"], "submit", JOB))
            await _until_done(urls["a"], ids[-1])
        await asyncio.sleep(1.0)  # older than 0.864 s, all of them
        _kill(tmp_path / "fleet", "a", urls["a"])
        fleet.restart(tmp_path / "fleet", "a")  # the restarted broker purges at once
        deadline = time.monotonic() + 10.0  # "at once": its purge task may not have run yet
        while [s["id"] for s in await _ask(urls["a"], "jobs")] != ids[4 - kept :]:
            assert time.monotonic() < deadline, "the restarted broker did not purge"
            await asyncio.sleep(0.1)
        for job_id in ids[: 4 - kept]:
            with pytest.raises(ClientError) as refused:
                await _ask(urls["a"], "status", job_id)
            assert refused.value.status == 404
            assert "purged" in str(refused.value), refused.value
            with pytest.raises(ClientError):
                await _ask(urls["a"], "history", job_id)
        for job_id in ids[4 - kept :]:
            assert (await _ask(urls["a"], "status", job_id))["state"] == "done"
        assert [s["id"] for s in await _ask(urls["a"], "jobs")] == ids[4 - kept :]

    asyncio.run(scenario())


def test_a_job_whose_owner_is_down_is_answered_503_naming_the_owner_quickly(
    start: Start, tmp_path: Path
) -> None:
    urls = start({"a": 1, "b": 1})
    directory = tmp_path / "fleet"

    async def refused(job_id: str, call: str = "status") -> tuple[ClientError, float]:
        began = time.monotonic()
        with pytest.raises(ClientError) as caught:
            await _ask(urls["a"], call, job_id)
        return caught.value, time.monotonic() - began

    async def scenario() -> None:
        job_id = await _ask(urls["b"], "submit", JOB)
        await _until_done(urls["b"], job_id)
        _kill(directory, "b", urls["b"])  # down: connections refused
        for call in ("status", "history", "output"):
            error, took = await refused(job_id, call)
            assert error.status == 503, error
            assert "owner site b unreachable" in str(error), error
            assert took < 3.0
        pid = fleet.restart(directory, "b")
        os.kill(pid, signal.SIGSTOP)  # hung: connections accepted, nothing answered
        try:
            error, took = await refused(job_id)
            assert error.status == 503, error
            assert "owner site b unreachable" in str(error), error
            assert took < 10.0
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (await _ask(urls["a"], "status", job_id))["state"] == "done"

    asyncio.run(scenario())
