"""Observability of real broker daemons on loopback: /metrics, the status page, /api/v1/info.

Each test runs real jobs through real daemons (real HTTP, real processes, a real journal), then
scrapes /metrics over HTTP, parses it with prometheus_client's own parser and checks that each
figure moved by exactly what the jobs did.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgpack
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from dcsmon.view import NeighbourhoodView
from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.model import SiteState
from gbroker.core.states import JobState
from gbroker.daemon.driver import JobStatus
from gbroker.daemon.metrics import DECISION_BUCKETS, bucket_quantile, describe, status_page
from gbroker.daemon.server import BrokerDaemon
from gbroker.errors import InvalidInput
from tests.brokers import AUTH, daemon_config, signed
from tests.daemon.test_server import pair, running_pair

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest_asyncio.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[dict[str, BrokerDaemon]]:
    async for daemons in running_pair(tmp_path, DispatchPolicy(Algorithm.DLO)):
        yield daemons


def job(rank: int, name: str = "hello", command: str = "true") -> str:
    return (
        f"name: {name!r}\nexecutable: /bin/sh\narguments: ['-c', {command!r}]\n"
        f"total_cpu_count: {{exact: {rank}}}\nwall_time_limit: 60\n"
    )


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def submit(http: aiohttp.ClientSession, url: str, description: str) -> str:
    async with http.post(f"{url}/api/v1/jobs", data=description) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["id"])


async def wait(http: aiohttp.ClientSession, url: str, job_id: str) -> dict[str, object]:
    async with http.get(f"{url}/api/v1/jobs/{job_id}/wait?timeout=20") as response:
        status: dict[str, object] = await response.json()
    assert status["state"] in ("done", "failed", "cancelled"), status
    return status


@pytest.mark.asyncio
async def test_a_job_run_next_door_moves_the_owners_counters_and_histograms(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a, b = fleet["a"], fleet["b"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        before_a, before_b = await scrape(http, a.url), await scrape(http, b.url)
        job_id = await submit(http, a.url, job(4))  # a has 2 cores: only b can run it
        status = await wait(http, a.url, job_id)
        assert (status["state"], status["site"]) == ("done", "b")
        # Reports are idempotent: b repeating its "started" (as its outbox may) counts nothing.
        repeat = {"id": job_id, "site": "b", "kind": "started", "at": time.time()}
        url, data = f"{a.url}/peer/v1/report", msgpack.packb(repeat)
        async with http.post(
            url, data=data, headers=signed("b", "POST", url, data, to="a")
        ) as response:
            assert response.status == 200
        after_a, after_b = await scrape(http, a.url), await scrape(http, b.url)
        async with http.get(f"{a.url}/api/v1/jobs/{job_id}") as response:
            assert (await response.json())["started_at"] == status["started_at"]

    for name, labels, amount in [
        ("gbroker_jobs_submitted_total", {}, 1),
        ("gbroker_jobs_accepted_total", {}, 1),
        ("gbroker_dispatches_total", {"site": "b"}, 1),
        ("gbroker_dispatches_total", {"site": "a"}, 0),
        ("gbroker_jobs_started_total", {}, 1),
        ("gbroker_jobs_finished_total", {"outcome": "done"}, 1),
        ("gbroker_jobs_finished_total", {"outcome": "failed"}, 0),
        ("gbroker_jobs_cancelled_total", {}, 0),
        ("gbroker_dispatch_decision_seconds_count", {}, 1),
        ("gbroker_durable_submission_seconds_count", {}, 1),
        ("gbroker_submit_to_start_seconds_count", {}, 1),
    ]:
        assert moved(before_a, after_a, name, **labels) == amount, (name, labels)
    # b ran the job but does not own it: the job counters are the owner's alone.
    for name in ("gbroker_jobs_submitted_total", "gbroker_jobs_started_total"):
        assert moved(before_b, after_b, name) == 0, name
    assert moved(before_b, after_b, "gbroker_jobs_finished_total", outcome="done") == 0

    # The histogram holds exactly what the job's status says.
    started, submitted = status["started_at"], status["submitted_at"]
    assert isinstance(started, float)
    assert isinstance(submitted, float)
    waited = moved(before_a, after_a, "gbroker_submit_to_start_seconds_sum")
    assert waited == pytest.approx(started - submitted, abs=1e-6)
    decided = moved(before_a, after_a, "gbroker_dispatch_decision_seconds_sum")
    assert 0 < decided < 1.0
    # Scrape-time gauges: the owned job by state, each site's own cores.
    assert value(after_a, "gbroker_owned_jobs", state="done") == 1
    assert value(after_a, "gbroker_owned_jobs", state="running") == 0
    assert value(after_a, "gbroker_site_total_cores") == 2
    assert value(after_b, "gbroker_site_total_cores") == 8
    assert value(after_b, "gbroker_site_free_cores") == 8
    assert value(after_a, "gbroker_broker_info", site="a") == 1


@pytest.mark.asyncio
async def test_cancelling_counts_once_and_bad_submissions_are_received_not_accepted(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        before = await scrape(http, a.url)
        job_id = await submit(http, a.url, job(1, command="sleep 30"))
        async with http.post(f"{a.url}/api/v1/jobs", data="<JobDefinition") as response:
            assert response.status == 400
        async with http.delete(f"{a.url}/api/v1/jobs/{job_id}") as response:
            assert (await response.json())["state"] == "cancelled"
        async with http.delete(f"{a.url}/api/v1/jobs/{job_id}") as response:
            assert response.status == 200  # cancelling again changes nothing
        after = await scrape(http, a.url)
    assert moved(before, after, "gbroker_jobs_submitted_total") == 2
    assert moved(before, after, "gbroker_jobs_accepted_total") == 1
    assert moved(before, after, "gbroker_durable_submission_seconds_count") == 1
    assert moved(before, after, "gbroker_jobs_cancelled_total") == 1
    assert value(after, "gbroker_owned_jobs", state="cancelled") == 1


@pytest.mark.asyncio
async def test_the_owned_jobs_gauge_is_the_count_of_the_jobs_in_each_state(
    fleet: dict[str, BrokerDaemon],
) -> None:
    """The gauge is kept as jobs change state, not counted at scrape time: it must agree with
    the jobs themselves, whichever way they ended, and forget what retention purges."""
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        done = [await submit(http, a.url, job(1)) for _ in range(3)]
        failed = await submit(http, a.url, job(1, command="exit 3"))
        running = await submit(http, a.url, job(1, command="sleep 30"))
        cancelled = await submit(http, a.url, job(1, command="sleep 30"))
        for job_id in (*done, failed):
            await wait(http, a.url, job_id)
        async with http.delete(f"{a.url}/api/v1/jobs/{cancelled}") as response:
            assert (await response.json())["state"] == "cancelled"
        while a.driver.jobs[running].state is not JobState.RUNNING:
            await asyncio.sleep(0.02)
        samples = await scrape(http, a.url)
        async with http.get(f"{a.url}/api/v1/jobs") as response:
            listed = [job["state"] for job in (await response.json())["jobs"]]
        expected = {"done": 3, "failed": 1, "running": 1, "cancelled": 1}
        for state in JobState:
            assert value(samples, "gbroker_owned_jobs", state=state.value) == listed.count(
                state.value
            ), state
            assert listed.count(state.value) == expected.get(state.value, 0), state
        a.driver.forget([*done, running])  # a running job is not purged
        samples = await scrape(http, a.url)
    assert value(samples, "gbroker_owned_jobs", state="done") == 0
    assert value(samples, "gbroker_owned_jobs", state="running") == 1
    assert value(samples, "gbroker_owned_jobs", state="failed") == 1


@pytest.mark.asyncio
async def test_replica_claims_and_withdrawals_are_counted_by_answer(tmp_path: Path) -> None:
    async for daemons in running_pair(tmp_path, DispatchPolicy(Algorithm.DR, replicas=2)):
        a = daemons["a"]
        async with aiohttp.ClientSession(headers=AUTH) as http:
            job_id = await submit(http, a.url, job(1))  # both sites can start it at once
            assert (await wait(http, a.url, job_id))["state"] == "done"
            # The losing replica's withdrawal is answered after the winner's claim.
            for _ in range(100):
                samples = await scrape(http, a.url)
                withdrawn = value(samples, "gbroker_withdrawals_total", result="withdrawn")
                too_late = value(samples, "gbroker_withdrawals_total", result="too_late")
                if withdrawn + too_late == 1:
                    break
                await asyncio.sleep(0.05)
    assert value(samples, "gbroker_dispatches_total", site="a") == 1
    assert value(samples, "gbroker_dispatches_total", site="b") == 1
    assert value(samples, "gbroker_claims_total", result="granted") == 1
    assert withdrawn + too_late == 1
    # The loser was either still queued (withdrawn, never claims), or already claiming (too late
    # to withdraw, and its claim is then denied), or denied and dropped before the withdrawal
    # came (which a site then answers "withdrawn"): a denial goes with every late withdrawal.
    denied = value(samples, "gbroker_claims_total", result="denied")
    assert too_late <= denied <= 1
    assert value(samples, "gbroker_jobs_started_total") == 1


@pytest.mark.asyncio
async def test_failed_peer_calls_are_counted_by_peer_and_call(tmp_path: Path) -> None:
    topology = pair()  # b's port is free: nothing listens there
    async with (
        BrokerDaemon(daemon_config("a", topology, tmp_path / "a")) as a,
        aiohttp.ClientSession(headers=AUTH) as http,
    ):
        await submit(http, a.url, job(4))  # only b has 4 cores, and b is down
        for _ in range(100):
            samples = await scrape(http, a.url)
            if value(samples, "gbroker_peer_call_failures_total", peer="b", call="accept"):
                break
            await asyncio.sleep(0.05)
    assert value(samples, "gbroker_peer_call_failures_total", peer="b", call="accept") == 1
    assert value(samples, "gbroker_dispatches_total", site="b") == 1


@pytest.mark.asyncio
async def test_the_status_page_shows_the_site_and_its_jobs_with_every_value_escaped(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    hostile = "<script>alert('x')</script>"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        job_id = await submit(http, a.url, job(1, name=hostile))
        await wait(http, a.url, job_id)
        pages = []
        for path in ("/", "/status"):
            async with http.get(a.url + path) as response:
                assert response.status == 200
                assert response.content_type == "text/html"
                pages.append(await response.text())
        async with http.get(f"{a.url}/api/v1/info") as response:
            info = await response.json()
    page = pages[0]
    assert pages[1] == page  # the same page at both paths
    assert page.startswith("<!DOCTYPE html>")
    assert "GBroker site a" in page
    assert job_id in page
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    # The JSON carries the same facts, its old keys kept.
    assert (info["site"], info["url"]) == ("a", a.url)
    # The site's forecast CPU availability (dcsmon.cpu) beside them, once measured.
    cpu = info["state"].pop("cpu")
    assert 0 < cpu <= 1
    assert info["state"] == {"total_cores": 2, "free_cores": 2, "queued": 0, "running": 0}
    assert "<th>cpu</th>" in page
    assert [(n["site"], n["status"]) for n in info["neighbours"]] == [("b", "assumed")]
    assert info["neighbours"][0]["state"]["total_cores"] == 8  # the topology's idle guess
    assert info["jobs"]["owned"] == 1
    assert info["jobs"]["by_state"] == {"done": 1}
    assert [(j["id"], j["name"]) for j in info["jobs"]["latest"]] == [(job_id, hostile)]


@pytest.mark.asyncio
async def test_the_sites_cpu_availability_is_a_gauge_as_its_state_says(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    gauge = ("gbroker_site_cpu_availability", frozenset({"site": "a"}.items()))
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for _ in range(200):  # the sensor's first measurement is taken as the broker starts
            before = a.driver.site_state().cpu
            samples = await scrape(http, a.url)
            if gauge in samples and a.driver.site_state().cpu == before:
                break  # (a scrape between two reports would compare two values)
            await asyncio.sleep(0.05)
    assert before is not None
    assert 0 < before <= 1
    assert samples[gauge] == before == a.cpu.reported()
    # b's state is the topology's guess (no MQTT here): nothing measured, no series for it.
    assert ("gbroker_site_cpu_availability", frozenset({"site": "b"}.items())) not in samples


@pytest.mark.asyncio
async def test_metrics_and_the_status_page_need_the_token(tmp_path: Path) -> None:
    topology = pair()
    config = daemon_config("a", topology, tmp_path / "a")
    async with BrokerDaemon(config) as a, aiohttp.ClientSession() as http:
        for path in ("/metrics", "/", "/status", "/api/v1/info", "/api/v1/health"):
            async with http.get(a.url + path) as response:
                assert response.status == 401, path
            async with http.get(a.url + path, headers={"Authorization": "Bearer no"}) as response:
                assert response.status == 401, path
            # A peer signature opens peer routes, not these.
            async with http.get(
                a.url + path, headers=signed("b", "GET", a.url + path, to="a")
            ) as response:
                assert response.status == 401, path
            async with http.get(a.url + path, headers=AUTH) as response:
                assert response.status == 200, path


def test_bucket_quantiles_are_the_upper_bound_of_the_bucket_holding_them() -> None:
    buckets = [(1e-4, 90.0), (2e-3, 99.0), (1e-2, 100.0), (math.inf, 100.0)]
    assert bucket_quantile(0.5, buckets) == 1e-4
    assert bucket_quantile(0.9, buckets) == 1e-4
    assert bucket_quantile(0.99, buckets) == 2e-3
    assert bucket_quantile(1.0, buckets) == 1e-2
    assert bucket_quantile(0.99, [(1.0, 1.0), (math.inf, 5.0)]) == math.inf
    assert math.isnan(bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))
    with pytest.raises(InvalidInput, match="quantile"):
        bucket_quantile(99, buckets)
    # Fine enough to tell 0.1 ms from 2 ms: separate buckets, with some between.
    assert DECISION_BUCKETS.index(2e-3) - DECISION_BUCKETS.index(1e-4) >= 4


def test_describe_shows_each_neighbour_as_seen_and_the_newest_jobs_first() -> None:
    view = NeighbourhoodView()
    view.update("near", SiteState(8, 3, queued=2, running=1), observed_at=100.0)
    view.update("seeded", SiteState(4, 4), observed_at=0.0)  # the daemon's guess from topology
    jobs = {
        f"a.{n}": JobStatus(f"a.{n}", JobState.DONE if n % 3 else JobState.QUEUED, 50.0 + n)
        for n in range(25)
    }
    info = describe(
        "a", "http://x", SiteState(2, 1), ["near", "seeded", "gone"], view, jobs.values(), 102.5
    )
    assert info["neighbours"] == [
        {
            "site": "near",
            "status": "reported",
            "state": {"total_cores": 8, "free_cores": 3, "queued": 2, "running": 1},
            "age": 2.5,
        },
        {
            "site": "seeded",
            "status": "assumed",
            "state": {"total_cores": 4, "free_cores": 4, "queued": 0, "running": 0},
            "age": None,
        },
        {"site": "gone", "status": "offline", "state": None, "age": None},
    ]
    assert info["jobs"]["owned"] == 25
    assert info["jobs"]["by_state"] == {"done": 16, "queued": 9}
    assert [j["id"] for j in info["jobs"]["latest"]] == [f"a.{n}" for n in range(24, 4, -1)]
    page = status_page(info)
    assert page.count("<tr>") == 2 + 4 + 21  # header + site, header + 3 neighbours, 1 + 20 jobs
    assert "offline" in page
    assert "2.500" in page
    # Times as the host reads them, not Unix seconds.
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(74.0)) in page
    assert "74.000" not in page
