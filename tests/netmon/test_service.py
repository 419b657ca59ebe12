"""The NetMon agent and probe endpoint (netmon.service) over real HTTP on loopback.

The peers here are bare aiohttp servers with the probe endpoint; tests/daemon/test_monitors.py
runs the same agent inside and beside real broker daemons, over real MQTT brokers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from gbroker.errors import InvalidInput
from gbroker.fleet.ports import free_port
from netmon.forecast import PiecewiseLinearForecaster
from netmon.service import (
    DEFAULT_SIZES,
    PROBE_PATH,
    NetMonAgent,
    parse_size,
    parse_sizes,
    probe_endpoint,
)
from netmon.table import ForecastTable

KiB = 1 << 10
SIZES = (16 * KiB, 128 * KiB)
TIMEOUT = 20.0


@asynccontextmanager
async def probe_peer(limit: int = 1 << 20, port: int = 0) -> AsyncIterator[str]:
    """A real HTTP server with only the probe endpoint; yields its base URL."""
    app = web.Application()
    app.router.add_post(PROBE_PATH, probe_endpoint(limit))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


class Recorder:
    """A TablePublisher that keeps what it is given."""

    def __init__(self) -> None:
        self.tables: list[ForecastTable] = []
        self.arrived = asyncio.Event()

    async def publish_netmon_table(self, table: ForecastTable) -> None:
        self.tables.append(table)
        self.arrived.set()


# --- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64KiB", 65536), ("1MiB", 1 << 20), ("8MB", 8_000_000), (" 2 k ", 2000)],
)
def test_sizes_read_with_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5", "1XB", "MiB", "0.5KiB1"])
def test_bad_sizes_say_what_was_expected(text: str) -> None:
    with pytest.raises(InvalidInput, match="size"):
        parse_size(text)


def test_size_lists_are_sorted_unique_and_errors_name_the_entry() -> None:
    assert parse_sizes("8MiB,1MiB,1048576") == (1 << 20, 8 << 20)
    with pytest.raises(InvalidInput) as info:
        parse_sizes("1MiB,zero")
    assert info.value.field == "sizes[1]"
    with pytest.raises(InvalidInput, match="one or more sizes"):
        parse_sizes(" , ")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"period": 0}, "netmon.period"),
        ({"period": float("inf")}, "netmon.period"),
        ({"start_delay": -1}, "netmon.start_delay"),
        ({"retry": 0}, "netmon.retry"),
        ({"timeout": float("nan")}, "netmon.timeout"),
        ({"sizes": ()}, "netmon.sizes"),
        ({"sizes": (1024, 0)}, "netmon.sizes"),
    ],
)
def test_agent_options_are_checked(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        NetMonAgent("a", ["b"], {}, PiecewiseLinearForecaster(), **options)  # type: ignore[arg-type]
    assert info.value.field == field


def test_defaults_are_two_sizes_a_mebibyte_apart_or_more() -> None:
    agent = NetMonAgent("a", ["b", "a"], {}, PiecewiseLinearForecaster())
    assert agent.sizes == DEFAULT_SIZES == (1 << 20, 8 << 20)
    assert agent.period == 300.0
    assert agent.neighbours == ("b",)  # never itself
    # The first round comes 2 s after start plus a random phase of up to 5 s, so that a fleet
    # started at once does not probe all at once.
    delays = {
        NetMonAgent("a", ["b"], {}, PiecewiseLinearForecaster()).start_delay for _ in range(20)
    }
    assert all(2.0 <= delay <= 7.0 for delay in delays)
    assert len(delays) > 1
    short = NetMonAgent("a", ["b"], {}, PiecewiseLinearForecaster(), period=0.5)
    assert 2.0 <= short.start_delay <= 2.5


# --- the probe endpoint ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_probe_endpoint_counts_what_arrives_and_refuses_oversized_bodies() -> None:
    async def chunked(size: int) -> AsyncIterator[bytes]:
        for _ in range(size // 1000):
            yield b"z" * 1000

    async with (
        asyncio.timeout(TIMEOUT),
        probe_peer(limit=5000) as url,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(url + PROBE_PATH, data=b"x" * 5000) as response:
            assert response.status == 200
            assert await response.json() == {"received": 5000}
        async with http.post(url + PROBE_PATH, data=b"x" * 5001) as response:
            assert response.status == 413
            body = await response.json()
            assert body["error"] == "probe of 5001 bytes is larger than the limit of 5000 bytes"
            assert (body["field"], body["expected"], body["limit"]) == (
                "body",
                "at most 5000 bytes",
                5000,
            )
        # Without a Content-Length the limit holds as the bytes stream in.
        async with http.post(url + PROBE_PATH, data=chunked(4000)) as response:
            assert await response.json() == {"received": 4000}
        async with http.post(url + PROBE_PATH, data=chunked(9000)) as response:
            assert response.status == 413
            assert "limit of 5000 bytes" in (await response.json())["error"]
    with pytest.raises(InvalidInput, match="max_probe"):
        probe_endpoint(-1)


# --- the agent ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_round_measures_every_size_to_every_neighbour() -> None:
    forecaster = PiecewiseLinearForecaster(default_bandwidth=1.0)  # 1 B/s: unmistakable
    recorder = Recorder()
    async with (
        asyncio.timeout(TIMEOUT),
        probe_peer() as b,
        probe_peer() as c,
        aiohttp.ClientSession() as session,
    ):
        agent = NetMonAgent("a", ["b", "c"], {"b": b, "c": c}, forecaster, sizes=SIZES)
        publishing = asyncio.create_task(agent.publish_tables(recorder))
        assert await agent.round(session) == set()
        await recorder.arrived.wait()
        publishing.cancel()
    for target in ("b", "c"):
        table = forecaster.table("a", target)
        assert table is not None
        assert table.sizes == list(SIZES)
        assert all(0 < seconds < TIMEOUT for seconds in table.seconds)
        # Forecasts now come from the measurements, not from the 1 B/s default.
        assert forecaster.forecast("a", target, 64 * KiB) < 64 * KiB / 1.0
    assert agent.rounds == 1
    assert agent.table is not None
    assert recorder.tables == [agent.table]
    assert recorder.tables[0].site == "a"
    assert sorted(recorder.tables[0].links) == ["b", "c"]
    assert recorder.tables[0].links["b"].sizes == SIZES


@pytest.mark.asyncio
async def test_a_neighbour_that_is_down_is_logged_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="netmon")
    forecaster = PiecewiseLinearForecaster()
    down = f"http://127.0.0.1:{free_port()}"
    async with (
        asyncio.timeout(TIMEOUT),
        probe_peer() as b,
        aiohttp.ClientSession() as session,
    ):
        agent = NetMonAgent(
            "a", ["b", "c", "d"], {"b": b, "c": down}, forecaster, sizes=SIZES, timeout=5
        )
        failed = await agent.round(session)
    assert failed == {"c", "d"}  # c refuses connections; d has no endpoint at all
    assert forecaster.table("a", "b") is not None
    assert forecaster.table("a", "c") is None
    assert agent.table is not None
    assert list(agent.table.links) == ["b"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("to c" in m and "skipping c this round" in m for m in messages)
    assert any("no HTTP endpoint known for d" in m for m in messages)
    # The first size failed, so the second was not tried: one warning per neighbour.
    assert len(messages) == 2


@pytest.mark.asyncio
async def test_a_refused_probe_is_a_failure_that_names_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="netmon")
    forecaster = PiecewiseLinearForecaster()
    async with (
        asyncio.timeout(TIMEOUT),
        probe_peer(limit=20 * KiB) as b,
        aiohttp.ClientSession() as session,
    ):
        agent = NetMonAgent("a", ["b"], {"b": b}, forecaster, sizes=SIZES)
        assert await agent.round(session) == {"b"}
    # The 16 KiB probe fits under b's limit and was kept; the 128 KiB one got a 413.
    table = forecaster.table("a", "b")
    assert table is not None
    assert table.sizes == [16 * KiB]
    assert any("HTTP 413" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_a_late_neighbour_is_retried_long_before_the_next_round() -> None:
    forecaster = PiecewiseLinearForecaster()
    port = free_port()
    agent = NetMonAgent(
        "a",
        ["b"],
        {"b": f"http://127.0.0.1:{port}"},
        forecaster,
        sizes=SIZES,
        period=60.0,
        start_delay=0.0,
        retry=0.1,
    )
    async with asyncio.timeout(TIMEOUT):
        running = asyncio.create_task(agent.run())
        try:
            while agent.rounds == 0:
                await asyncio.sleep(0.01)
            assert forecaster.table("a", "b") is None  # b was not up yet
            async with probe_peer(port=port):
                # The forecaster has b after the retry's first size; the agent's table only once
                # the round is over, after its last.
                while agent.table is None:
                    await asyncio.sleep(0.02)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    table = forecaster.table("a", "b")
    assert table is not None
    assert table.sizes == list(SIZES)
    assert agent.rounds >= 2


@pytest.mark.asyncio
async def test_rounds_repeat_every_period_and_each_new_table_is_published() -> None:
    forecaster = PiecewiseLinearForecaster()
    recorder = Recorder()
    async with asyncio.timeout(TIMEOUT), probe_peer() as b:
        agent = NetMonAgent(
            "a", ["b"], {"b": b}, forecaster, sizes=SIZES, period=0.2, start_delay=0.0
        )
        running = asyncio.create_task(agent.run())
        publishing = asyncio.create_task(agent.publish_tables(recorder))
        try:
            while len(recorder.tables) < 3:
                await asyncio.sleep(0.02)
            # A publisher that joins later (a rejoined MQTT link) gets the latest table at once.
            late = Recorder()
            joined = asyncio.create_task(agent.publish_tables(late))
            await late.arrived.wait()
            joined.cancel()
        finally:
            for task in (running, publishing):
                task.cancel()
            await asyncio.gather(running, publishing, return_exceptions=True)
    stamps = [table.measured_at for table in recorder.tables]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)
    assert stamps[2] - stamps[0] >= 0.35  # two periods of 0.2 s apart, give or take
    assert late.tables[0].measured_at >= stamps[2]
