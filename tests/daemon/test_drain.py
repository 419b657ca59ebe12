"""Draining and black-hole protection on a real 3-site fleet of broker processes.

Jobs run as ``nobody`` and append ``<job id> <site>`` to a log in a world-writable directory of
their own: what ran where is what the processes did, not what the brokers say. The fleets run
round-robin dispatch, so where each job goes is known in advance.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gbroker import fleet
from gbroker.client.gclient import Client
from gbroker.security.auth import Tokens, bearer
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker


@pytest.fixture
def runs() -> Iterator[Path]:
    """A directory the jobs (as nobody) may write their run log into."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-drain-", dir="/tmp"))
    directory.chmod(0o777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def start_fleet(tmp_path: Path, *serve_args: str) -> tuple[Path, dict[str, str]]:
    topology = tmp_path / "three.yaml"
    save_topology(Topology([SiteSpec(s, 2) for s in "abc"], "full", name="three"), topology)
    directory = tmp_path / "fleet"
    record = fleet.up(topology, directory, serve_args=("--algorithm", "roundrobin", *serve_args))
    return directory, {name: m["url"] for name, m in record["sites"].items()}


@pytest.fixture
def drain_fleet(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    directory, urls = start_fleet(tmp_path)
    try:
        yield directory, urls
    finally:
        fleet.down(directory)


def job(log: Path, seconds: float, fail_at: str | None = None) -> str:
    # A file per run: a user's jobs have a uid of their own at each site, so one log file
    # appended to by all of them would be writable by the first site's uid only.
    script = f'mktemp "{log}/$GBROKER_JOB_ID $GBROKER_SITE XXXXXX" > /dev/null; sleep {seconds}'
    if fail_at is not None:
        script += f'; [ "$GBROKER_SITE" != {fail_at} ]'
    return json.dumps(
        {"executable": "/bin/sh", "arguments": ["-c", script], "total_cpu_count": {"exact": 1}}
    )


async def submit_all(url: str, descriptions: list[str]) -> list[str]:
    async with Client(url) as client:
        return [await client.submit(d) for d in descriptions]


async def wait_all(url: str, ids: list[str], timeout: float = 90) -> list[dict[str, Any]]:
    async with Client(url) as client:
        return [await client.wait(job_id, timeout) for job_id in ids]


async def get_json(url: str, token: str, path: str) -> Any:
    async with (
        aiohttp.ClientSession(headers=bearer(token)) as session,
        session.get(url + path) as response,
    ):
        assert response.status == 200, await response.text()
        if response.content_type == "application/json":
            return await response.json()
        return await response.text()


def until(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def ran(log: Path) -> Counter[tuple[str, str]]:
    """Each run of a job, by its job id and site (:func:`job`'s files)."""
    return Counter(tuple(path.name.split()[:2]) for path in log.iterdir())  # type: ignore[misc]


@pytest.mark.slow
def test_drain_moves_queued_jobs_lets_running_ones_finish_and_survives_a_restart(
    drain_fleet: tuple[Path, dict[str, str]], runs: Path
) -> None:
    directory, urls = drain_fleet
    token = Tokens.load(directory / "tokens").first_token()
    log = runs

    def progress(site: str) -> dict[str, Any]:
        report: dict[str, Any] = asyncio.run(get_json(urls[site], token, "/api/v1/drain"))
        return report

    # Round robin over three 2-core sites: each gets 4 one-core jobs, 2 run and 2 queue.
    first = asyncio.run(submit_all(urls["a"], [job(log, 6)] * 12))
    until(lambda: progress("c")["running"] == 2 and progress("c")["queued"] == 2, what="c full")
    drained = gbroker("fleet", "drain", "c", "--dir", str(directory), "--timeout", "60")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.strip() == "c: drained"
    report = progress("c")
    assert (report["draining"], report["drained"]) == (True, True)

    # While c drains, new work goes elsewhere, from any owner, c's own broker included.
    more = asyncio.run(submit_all(urls["c"], [job(log, 0)] * 3))
    ends = asyncio.run(wait_all(urls["a"], first + more))
    assert [s["state"] for s in ends] == ["done"] * 15
    counts = ran(log)
    assert sorted(job_id for job_id, _ in counts) == sorted(first + more)  # none lost
    assert set(counts.values()) == {1}  # none ran twice
    at_c = [job_id for job_id, site in counts if site == "c"]
    assert len(at_c) == 2  # the two running when the drain began; the queued two moved
    assert {s["site"] for s in ends if s["id"] in at_c} == {"c"}  # and the owner agrees

    # The drain survives a restart; a user who is not an admin may not lift it.
    alice = secrets.token_hex(16)
    with (directory / "tokens").open("a") as tokens:
        tokens.write(f"alice {alice}\n")
    assert gbroker("fleet", "restart", "c", "--force", "--dir", str(directory)).returncode == 0
    assert until(lambda: progress("c")["drained"], what="c drained after its restart")

    async def undrain_as_alice() -> int:
        async with (
            aiohttp.ClientSession(headers=bearer(alice)) as session,
            session.post(urls["c"] + "/api/v1/drain", json={"drain": False}) as response,
        ):
            return response.status

    assert asyncio.run(undrain_as_alice()) == 403
    assert progress("c")["draining"]

    undrained = gbroker("fleet", "undrain", "c", "--dir", str(directory))
    assert undrained.returncode == 0, undrained.stderr
    assert undrained.stdout.strip() == "c: taking new work"

    # c gets work again: round robin at c's broker itself sends its third job to c.
    again = asyncio.run(submit_all(urls["c"], [job(log, 0)] * 3))
    assert {s["site"] for s in asyncio.run(wait_all(urls["c"], again))} == {"a", "b", "c"}
    assert sum(1 for job_id, site in ran(log) if site == "c" and job_id in again) == 1


def test_a_dispatch_that_crosses_the_drain_is_refused_and_placed_elsewhere(
    tmp_path: Path, runs: Path
) -> None:
    # Without DCSMon no broker learns that c drains: a keeps choosing c, and c refuses (503).
    directory, urls = start_fleet(tmp_path, "--no-dcsmon")
    try:
        log = runs
        # Any broker's URL with an admin token will do, without the fleet directory.
        tokens = str(directory / "tokens")
        wrong = gbroker("fleet", "drain", "b", "--broker", urls["c"], "--token-file", tokens)
        assert wrong.returncode == 2
        assert "site: expected the site of" in wrong.stderr
        started = gbroker(
            "fleet", "drain", "--broker", urls["c"], "--token-file", tokens, "--no-wait", "--json"
        )
        assert started.returncode == 0, started.stderr
        assert json.loads(started.stdout) == {
            "site": "c",
            "draining": True,
            "since": pytest.approx(time.time(), abs=60),
            "drained": True,  # nothing was there
            "migrate": False,  # running jobs would end here (not --migrate)
            "staging": 0,
            "queued": 0,
            "claiming": 0,
            "running": 0,
            "reporting": 0,
            "jobs": [],  # which jobs are here (`fleet drain` says what it waits for)
        }
        ids = asyncio.run(submit_all(urls["a"], [job(log, 0)] * 6))
        ends = asyncio.run(wait_all(urls["a"], ids))
        assert [s["state"] for s in ends] == ["done"] * 6
        assert "c" not in {s["site"] for s in ends}
        assert sorted(ran(log)) == sorted((s["id"], s["site"]) for s in ends)
        assert "c refused" in (directory / "a.log").read_text()
    finally:
        fleet.down(directory)


def test_a_site_that_fails_every_job_at_once_is_excluded_with_an_event_and_a_metric(
    tmp_path: Path, runs: Path
) -> None:
    directory, urls = start_fleet(tmp_path, "--black-hole", "min_outcomes=3,cooldown=600")
    try:
        token = Tokens.load(directory / "tokens").first_token()
        log = runs
        # Round robin from a: a, b, c, a, b, c, ...; every job fails at c, at once.
        first = asyncio.run(submit_all(urls["a"], [job(log, 0, fail_at="c")] * 9))
        ends = asyncio.run(wait_all(urls["a"], first))
        assert Counter((s["site"], s["state"]) for s in ends) == {
            ("a", "done"): 3,
            ("b", "done"): 3,
            ("c", "failed"): 3,
        }
        later = asyncio.run(submit_all(urls["a"], [job(log, 0, fail_at="c")] * 6))
        ends = asyncio.run(wait_all(urls["a"], later))
        assert Counter(s["site"] for s in ends) == {"a": 3, "b": 3}  # c is out
        assert {s["state"] for s in ends} == {"done"}

        metrics = asyncio.run(get_json(urls["a"], token, "/metrics"))
        assert 'gbroker_site_excluded{site="c"} 1.0' in metrics
        assert 'gbroker_black_hole_exclusions_total{site="c"} 1.0' in metrics
        events = (directory / "a.log").read_text()
        assert "site c excluded as a black hole" in events
        assert "3 of its last 3 jobs failed fast (100%, other sites 0%)" in events
    finally:
        fleet.down(directory)
