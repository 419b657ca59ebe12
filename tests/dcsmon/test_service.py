"""DCSMon as a service (dcsmon.service): when it publishes, and sampling a broker over HTTP.

The HTTP peer here is a bare aiohttp server; tests/daemon/test_monitors.py samples real broker
daemons and publishes to real MQTT brokers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dcsmon.service import (
    STATE_PATH,
    DcsMon,
    HttpSampler,
    SampleError,
    local_sampler,
    observation_from_document,
    state_document,
)
from gbroker.core.model import Observation, SiteState
from gbroker.errors import InvalidInput
from gbroker.fleet.ports import free_port

TIMEOUT = 20.0


class Recorder:
    """A StatePublisher that keeps what it is given."""

    def __init__(self) -> None:
        self.published: list[Observation] = []

    async def publish_state(self, state: SiteState, observed_at: float) -> None:
        self.published.append(Observation(state, observed_at))


async def until(check: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def test_state_documents_round_trip() -> None:
    observation = Observation(SiteState(total_cores=8, free_cores=3, queued=2, running=4), 12.5)
    document = state_document("s1", observation)
    assert document == {
        "site": "s1",
        "total_cores": 8,
        "free_cores": 3,
        "queued": 2,
        "running": 4,
        "observed_at": 12.5,
    }
    assert observation_from_document(document, "s1") == observation
    shrinking = Observation(SiteState(8, 3, 2, 4, shrinkable=5), 12.5)
    assert state_document("s1", shrinking)["shrinkable"] == 5
    assert observation_from_document(state_document("s1", shrinking), "s1") == shrinking
    sharing = Observation(SiteState(8, 3, 2, 4, shareable=5), 12.5)
    assert state_document("s1", sharing)["shareable"] == 5
    assert "shareable" not in state_document("s1", shrinking)
    assert observation_from_document(state_document("s1", sharing), "s1") == sharing
    measured = Observation(SiteState(8, 3, 2, 4, cpu=0.42), 12.5)
    assert state_document("s1", measured)["cpu"] == 0.42
    assert observation_from_document(state_document("s1", measured), "s1") == measured
    assert "cpu" not in state_document("s1", observation)  # not measured: not said


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"site": "s2"}, "state.site"),
        ({"free_cores": -1}, "state.free_cores"),
        ({"queued": True}, "state.queued"),
        ({"running": "4"}, "state.running"),
        ({"total_cores": None}, "state.total_cores"),
        ({"observed_at": "now"}, "state.observed_at"),
        ({"free_cores": 9}, "state.free_cores"),  # more free cores than cores
        ({"shrinkable": -1}, "state.shrinkable"),
        ({"shrinkable": 6}, "state.shrinkable"),  # more than the 5 busy cores
        ({"shareable": -1}, "state.shareable"),
        ({"shareable": 1.0}, "state.shareable"),
        ({"shareable": 6}, "state.shareable"),  # more than the 5 busy cores
        ({"shrinkable": 3, "shareable": 3}, "state.shareable"),  # 2 busy left beside 3
        ({"cpu": 0}, "state.cpu"),
        ({"cpu": 1.5}, "state.cpu"),
        ({"cpu": "0.5"}, "state.cpu"),
        ({"cpu": True}, "state.cpu"),
    ],
)
def test_bad_state_documents_name_the_field(changes: dict[str, Any], field: str) -> None:
    document = state_document("s1", Observation(SiteState(8, 3), 1.0)) | changes
    with pytest.raises(InvalidInput) as info:
        observation_from_document(document, "s1")
    assert info.value.field == field
    with pytest.raises(InvalidInput, match="state: expected a JSON object"):
        observation_from_document([1, 2], "s1")


def test_a_negative_period_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"dcsmon.period: expected seconds >= 0"):
        DcsMon(local_sampler(lambda: SiteState(1, 1)), -1.0)


@pytest.mark.asyncio
async def test_in_process_it_publishes_at_once_then_only_changes_at_most_once_per_period() -> None:
    current = SiteState(total_cores=8, free_cores=8)
    changed = asyncio.Event()
    monitor = DcsMon(local_sampler(lambda: current), period=0.3, changed=changed)
    recorder = Recorder()
    async with asyncio.timeout(TIMEOUT):
        task = asyncio.create_task(monitor.publish_states(recorder))
        try:
            await until(lambda: len(recorder.published) == 1)  # at once, unprompted
            assert recorder.published[0].state == current
            # A burst of changes within one period yields one publication, of the last state.
            for free in range(7, 2, -1):
                current = SiteState(total_cores=8, free_cores=free)
                changed.set()
                await asyncio.sleep(0.01)
            await until(lambda: len(recorder.published) == 2)
            await asyncio.sleep(0.4)
            assert len(recorder.published) == 2
            assert recorder.published[1].state == SiteState(total_cores=8, free_cores=3)
            # Woken without a real change: nothing new is published.
            changed.set()
            await asyncio.sleep(0.4)
            assert len(recorder.published) == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    first, second = recorder.published
    assert second.observed_at - first.observed_at >= 0.3


@asynccontextmanager
async def fake_broker(answer: web.Response | dict[str, Any]) -> AsyncIterator[str]:
    async def state(request: web.Request) -> web.Response:
        if isinstance(answer, web.Response):
            return answer
        assert request.headers.get("Authorization") == "Bearer tok"
        return web.json_response(answer)

    app = web.Application()
    app.router.add_get(STATE_PATH, state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_http_sampler_reads_the_brokers_state() -> None:
    observation = Observation(SiteState(total_cores=4, free_cores=1, queued=3, running=2), 99.0)
    async with (
        asyncio.timeout(TIMEOUT),
        fake_broker(state_document("s1", observation)) as url,
        aiohttp.ClientSession() as http,
    ):
        assert await HttpSampler(http, url, "s1", token="tok")() == observation
        with pytest.raises(InvalidInput, match=r"state\.site: expected 's2'"):
            await HttpSampler(http, url, "s2", token="tok")()


@pytest.mark.asyncio
async def test_a_broker_that_is_down_or_refuses_is_a_sample_error() -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with asyncio.timeout(TIMEOUT), aiohttp.ClientSession() as http:
        with pytest.raises(SampleError, match="cannot sample"):
            await HttpSampler(http, down, "s1")()
        async with fake_broker(web.json_response({"error": "unauthorized"}, status=401)) as url:
            with pytest.raises(SampleError, match="HTTP 401"):
                await HttpSampler(http, url, "s1")()


@pytest.mark.asyncio
async def test_sampling_failures_are_logged_and_retried_never_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dcsmon")
    failures = 0

    async def flaky() -> Observation:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise SampleError("dcsmon s1: broker away")
        return Observation(SiteState(2, 2), 5.0)

    recorder = Recorder()
    monitor = DcsMon(flaky, period=0.05)
    async with asyncio.timeout(TIMEOUT):
        task = asyncio.create_task(monitor.publish_states(recorder))
        try:
            await until(lambda: recorder.published)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert recorder.published == [Observation(SiteState(2, 2), 5.0)]
    # Two failures in a row: one warning, not one per period; then a word on recovery.
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "dcsmon s1: broker away; trying again every 0.05 s"),
        (logging.INFO, "dcsmon: sampling works again"),
    ]
