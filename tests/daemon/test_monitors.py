"""DCSMon and NetMon as real services of the broker daemon, and on their own.

Real daemons on loopback, real HTTP probes, real MQTT brokers (``mqtt_broker`` runs each test
against amqtt and mosquitto) and, for ``gbroker dcsmon serve`` / ``gbroker netmon serve``, real
processes. Periods are short and blobs small to keep the tests quick; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dcsmon.service import STATE_PATH, state_document
from gbroker.client.gclient import Client
from gbroker.core.model import Observation, SiteState
from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.mqtt.link import Liveness, SiteLink, StateUpdate, Updates
from gbroker.topology import SiteSpec, Topology, save_topology
from netmon.service import PROBE_PATH
from tests.brokers import AUTH, SECRET, TOKEN, RunningBroker, daemon_config, signed

ROOT = Path(__file__).resolve().parents[2]
KiB = 1 << 10
SIZES = (16 * KiB, 64 * KiB)
TEST_TIMEOUT = 60.0
EVENT_TIMEOUT = 20.0  # a subprocess starting on a loaded 2-core machine is slow
network = pytest.mark.network


def pair(neighbourhood: Any = "full") -> Topology:
    sites = [
        SiteSpec("a", 2, http=f"http://127.0.0.1:{free_port()}"),
        SiteSpec("b", 8, http=f"http://127.0.0.1:{free_port()}"),
    ]
    return Topology(sites, neighbourhood, name="pair")


def config(site: str, topology: Topology, tmp_path: Path, **options: Any) -> DaemonConfig:
    options.setdefault("secret", SECRET)
    return daemon_config(site, topology, tmp_path / site, **options)


@asynccontextmanager
async def daemons(*configs: DaemonConfig) -> AsyncIterator[list[BrokerDaemon]]:
    started: list[BrokerDaemon] = []
    try:
        for cfg in configs:
            daemon = BrokerDaemon(cfg)
            await daemon.__aenter__()
            started.append(daemon)
        yield started
    finally:
        for daemon in reversed(started):
            await daemon.__aexit__(None, None, None)


async def until(check: Any, timeout: float = EVENT_TIMEOUT, what: str = "") -> None:
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what or check}") from None


# --- the daemon's routes ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_probe_endpoint_needs_a_peer_signature_and_enforces_its_limit(
    tmp_path: Path,
) -> None:
    topology = pair()
    a_config = config("a", topology, tmp_path, max_probe=4096, netmon=False)
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        daemons(a_config) as (a,),
        aiohttp.ClientSession(headers=AUTH) as http,
    ):
        url = a.url + PROBE_PATH
        async with http.post(url, data=b"p" * 100) as response:
            assert response.status == 401  # a peer route: no signature, no entry
        async with http.post(
            url, data=b"p" * 4096, headers=signed("b", "POST", url, None, to="a")
        ) as response:
            assert response.status == 200
            assert await response.json() == {"received": 4096}
        async with http.post(
            url, data=b"p" * 4097, headers=signed("b", "POST", url, None, to="a")
        ) as response:
            assert response.status == 413
            body = await response.json()
    assert body == {
        "error": "probe of 4097 bytes is larger than the limit of 4096 bytes",
        "field": "body",
        "expected": "at most 4096 bytes",
        "limit": 4096,
    }


@pytest.mark.asyncio
async def test_the_state_route_answers_the_local_scheduler_and_needs_the_token(
    tmp_path: Path,
) -> None:
    topology = pair()
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        daemons(config("b", topology, tmp_path, netmon=False)) as (b,),
        aiohttp.ClientSession() as http,
    ):
        async with http.get(b.url + STATE_PATH) as response:
            assert response.status == 401
        before = time.time()
        async with http.get(b.url + STATE_PATH, headers=AUTH) as response:
            assert response.status == 200
            document = await response.json()
        state = b.agent.state()
    assert before <= document["observed_at"] <= time.time()
    assert document == state_document("b", Observation(state, document["observed_at"]))
    assert (document["total_cores"], document["free_cores"]) == (8, 8)


# --- NetMon in the daemon -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_in_process_agent_feeds_the_forecaster_the_broker_ranks_with(
    tmp_path: Path,
) -> None:
    topology = pair()
    a_config = config("a", topology, tmp_path, netmon_period=0.3, netmon_sizes=SIZES)
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        daemons(config("b", topology, tmp_path, netmon=False), a_config) as (b, a),
    ):
        assert a.netmon is not None
        # The agent reads its delay when its task first runs, which is after this line unless
        # the daemon awaits after spawning it; then the test only waits the default 2 s longer.
        a.netmon.start_delay = 0.0
        # The agent's table is set once a round is over; the forecaster has b after one size.
        netmon = a.netmon
        await until(lambda: netmon.table is not None, what="a measured a->b")
        table = a.forecaster.table("a", "b")
        assert table is not None
        assert table.sizes == list(SIZES)
        assert b.forecaster.table("a", "b") is None  # no MQTT here: b hears nothing of it
    assert a.broker.forecast is a.forecaster
    middle = 40 * KiB
    default = middle / topology.default_link.bandwidth
    forecast = a.broker.forecast("a", "b", middle)
    low, high = table.seconds
    assert forecast == pytest.approx(
        low + (high - low) * (middle - SIZES[0]) / (SIZES[1] - SIZES[0])
    )
    assert forecast != default


@network
@pytest.mark.asyncio
async def test_a_neighbours_published_table_reaches_the_broker_over_mqtt(
    tmp_path: Path, mqtt_broker: RunningBroker
) -> None:
    topology = pair()
    url = mqtt_broker.url
    a_config = config("a", topology, tmp_path, mqtt_url=url, netmon=False)
    b_config = config("b", topology, tmp_path, mqtt_url=url, netmon_period=0.3, netmon_sizes=SIZES)
    async with asyncio.timeout(TEST_TIMEOUT), daemons(a_config, b_config) as (a, b):
        assert b.netmon is not None
        b.netmon.start_delay = 0.0

        def same_table() -> bool:
            learned = a.forecaster.table("b", "a")
            return learned is not None and learned == b.forecaster.table("b", "a")

        # b measures b->a and publishes; a applies it (b probes again every 0.3 s, so catch a
        # moment between two of b's rounds where both hold the same points).
        await until(same_table, what="a holds b's table of b->a")
        learned = a.forecaster.table("b", "a")
        assert learned is not None
        assert learned.sizes == list(SIZES)
        middle = 40 * KiB
        measured = a.broker.forecast("b", "a", middle)
        assert measured == pytest.approx(learned.interpolate(middle))
        assert measured != middle / topology.default_link.bandwidth
        # a runs no agent: its own outgoing link is not measured, and falls back to the default.
        assert a.forecaster.table("a", "b") is None
        assert a.broker.forecast("a", "b", middle) == middle / topology.default_link.bandwidth
        assert a.tables.measured_at("b") is not None


# --- standalone monitors as processes -----------------------------------------------------------


@asynccontextmanager
async def gbroker_process(log_path: Path, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m gbroker ARGS``, output in ``log_path``; SIGTERM and wait on the way out."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gbroker", *args, stdout=log, stderr=log, env=env, cwd=ROOT
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def stop(process: asyncio.subprocess.Process, log_path: Path) -> None:
    """SIGTERM: a monitor stops cleanly, exit status 0."""
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(10):
        code = await process.wait()
    assert code == 0, log_path.read_text(errors="replace")


@network
@pytest.mark.asyncio
async def test_netmon_serve_probes_and_publishes_for_its_site(
    tmp_path: Path, mqtt_broker: RunningBroker
) -> None:
    topology = pair()
    topology_file = tmp_path / "pair.yaml"
    save_topology(topology, topology_file)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    url = mqtt_broker.url
    options: dict[str, Any] = {"mqtt_url": url, "netmon": False}
    log_path = tmp_path / "netmon.log"
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        daemons(
            config("a", topology, tmp_path, **options), config("b", topology, tmp_path, **options)
        ) as (a, b),
        gbroker_process(
            log_path,
            *("netmon", "serve", "--site", "a", "--topology", str(topology_file)),
            *("--mqtt", url, "--period", "0.3", "--sizes", "16KiB,64KiB"),
            *("--secret-file", str(secret_file)),
        ) as process,
    ):
        # a's broker runs no agent of its own: it learns its outgoing link from its netmon topic,
        # and its neighbour b from the same table.
        for daemon in (a, b):
            await until(
                lambda d=daemon: d.forecaster.table("a", "b") is not None,
                what=f"{daemon.site} learned a->b; log: {log_path}",
            )
            table = daemon.forecaster.table("a", "b")
            assert table is not None
            assert table.sizes == list(SIZES)
            assert all(seconds > 0 for seconds in table.seconds)
        assert b.forecaster.table("b", "a") is None  # nobody measures b->a
        await stop(process, log_path)


async def next_state(updates: Updates, timeout: float = EVENT_TIMEOUT) -> Observation:
    """The next StateUpdate's observation (liveness events are skipped)."""
    async with asyncio.timeout(timeout):
        async for update in updates:
            if isinstance(update, StateUpdate):
                return update.observation
    raise AssertionError("the updates stopped")


def counts(state: SiteState) -> SiteState:
    """The state without its CPU availability (measured, so it moves by itself)."""
    return dataclasses.replace(state, cpu=None)


async def next_counts(updates: Updates, last: Observation) -> Observation:
    """The next state whose counts differ from ``last``'s (a new CPU forecast alone is skipped)."""
    while True:
        observation = await next_state(updates)
        if counts(observation.state) != counts(last.state):
            return observation


@network
@pytest.mark.asyncio
async def test_dcsmon_serve_samples_the_broker_and_publishes_its_state(
    tmp_path: Path, mqtt_broker: RunningBroker
) -> None:
    # a sends jobs nowhere else, so a job submitted to a runs at a and changes a's state.
    topology = pair(neighbourhood=[("b", "a")])
    topology_file = tmp_path / "pair.yaml"
    save_topology(topology, topology_file)
    url = mqtt_broker.url
    a_config = config("a", topology, tmp_path, mqtt_url=url, netmon=False, dcsmon=False)
    log_path = tmp_path / "dcsmon.log"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    job = """
name: sleeper
executable: /bin/sleep
arguments: ["30"]
total_cpu_count: {exact: 1}
"""
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        daemons(a_config) as (a,),
        SiteLink(url, "watcher", ["a"]) as watcher,
    ):
        updates = watcher.updates()
        async with asyncio.timeout(EVENT_TIMEOUT):
            async for update in updates:
                if update == Liveness("a", online=True):
                    break
                assert not isinstance(update, StateUpdate), update
        # With --no-dcsmon the broker publishes no state of its own.
        with pytest.raises(TimeoutError):
            await next_state(updates, timeout=0.7)
        async with gbroker_process(
            log_path,
            *("dcsmon", "serve", "--site", "a", "--topology", str(topology_file)),
            *("--broker-url", a.url, "--mqtt", url, "--period", "0.2"),
            *("--token-file", str(token_file)),
        ) as process:
            first = await next_state(updates)
            assert counts(first.state) == SiteState(total_cores=2, free_cores=2)
            assert first.observed_at > 0
            async with Client(a.url, token=TOKEN) as client:
                job_id = await client.submit(job)
                busy = await next_counts(updates, first)
                assert counts(busy.state) == SiteState(total_cores=2, free_cores=1, running=1)
                assert counts(busy.state) == a.agent.state()
                assert busy.observed_at > first.observed_at
                await client.cancel(job_id)
            idle = await next_counts(updates, busy)
            assert counts(idle.state) == SiteState(total_cores=2, free_cores=2)
            # The broker's CPU availability (its own sensor, dcsmon.cpu), relayed as it is.
            assert idle.state.cpu is not None
            await stop(process, log_path)


# --- the command line ---------------------------------------------------------------------------


def test_serve_options_turn_the_agents_off_and_tune_netmon() -> None:
    from gbroker.cli import build_parser

    base = ["serve", "--site", "a", "--topology", "t.yaml"]
    args = build_parser().parse_args(base)
    assert (args.no_netmon, args.no_dcsmon) == (False, False)
    assert (args.netmon_period, args.netmon_sizes) == (300.0, (1 << 20, 8 << 20))
    args = build_parser().parse_args(
        [*base, "--no-netmon", "--no-dcsmon", "--netmon-period", "60", "--netmon-sizes", "4MiB,1MB"]
    )
    assert (args.no_netmon, args.no_dcsmon) == (True, True)
    assert (args.netmon_period, args.netmon_sizes) == (60.0, (1_000_000, 4 << 20))


def test_monitor_commands_say_precisely_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gbroker.cli.parser import main

    topology_file = tmp_path / "pair.yaml"
    save_topology(pair(), topology_file)  # its sites name no MQTT endpoint
    common = ["--topology", str(topology_file)]
    with pytest.raises(SystemExit) as exit_info:
        main(["netmon", "serve", "--site", "a", *common, "--sizes", "1MiB,lots"])
    assert exit_info.value.code == 2
    assert "argument --sizes: sizes[1]: expected a size in bytes" in capsys.readouterr().err
    assert main(["dcsmon", "serve", "--site", "z", *common, "--mqtt", "mqtt://x"]) == 2
    assert "gbroker dcsmon: --site: expected a site of pair, got 'z'" in capsys.readouterr().err
    assert main(["netmon", "serve", "--site", "a", *common]) == 2
    assert "gbroker netmon: --mqtt: expected an MQTT URL" in capsys.readouterr().err
    missing = str(tmp_path / "missing.yaml")
    assert main(["netmon", "serve", "--site", "a", "--topology", missing]) == 2
    assert f"gbroker netmon: cannot read {missing}" in capsys.readouterr().err
