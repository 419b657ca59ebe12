"""MQTT status dissemination and liveness (gbroker.daemon.mqtt).

Pure tests first (topics, URLs, ViewFeed); then tests over a real MQTT broker, each run against
the embedded amqtt broker and against a mosquitto process (``mqtt_broker`` in conftest.py).
Every network test is bounded by a timeout so that a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import msgpack
import pytest

from dcsmon.view import NeighbourhoodView
from gbroker.core.model import Observation, SiteState
from gbroker.daemon import wire
from gbroker.daemon.mqtt import (
    EmbeddedBroker,
    LinkError,
    Liveness,
    MonitorLink,
    NetmonUpdate,
    SiteLink,
    SiteUpdate,
    StateUpdate,
    Updates,
    ViewFeed,
    alive_topic,
    events_topic,
    keep_publishing,
    netmon_topic,
    parse_site_topic,
    state_topic,
)
from gbroker.errors import GBrokerError, InvalidInput
from netmon.forecast import PiecewiseLinearForecaster
from netmon.table import ForecastTable, LinkPoints, TableFeed

from .conftest import RunningBroker, find_mosquitto

ROOT = Path(__file__).resolve().parents[2]

# Bounds for one network test, and for one awaited event within it.
TEST_TIMEOUT = 30.0
EVENT_TIMEOUT = 5.0
# ARCHITECTURE §5: neighbours learn of a killed broker "within milliseconds"; we allow 2 s.
WILL_DEADLINE = 2.0


def state(free: int, queued: int = 0, total: int = 8, running: int = 0) -> SiteState:
    return SiteState(total_cores=total, free_cores=free, queued=queued, running=running)


# --- pure --------------------------------------------------------------------------------------


def test_topics_follow_the_architecture() -> None:
    assert state_topic("s1") == "gbroker/v1/site/s1/state"
    assert alive_topic("s1") == "gbroker/v1/site/s1/alive"
    assert netmon_topic("s1") == "gbroker/v1/site/s1/netmon"
    assert events_topic("s1") == "gbroker/v1/site/s1/events"


@pytest.mark.parametrize("channel", ["state", "alive", "netmon", "events"])
def test_parse_site_topic_inverts_the_helpers(channel: str) -> None:
    topic = f"gbroker/v1/site/site-7/{channel}"
    assert parse_site_topic(topic) == ("site-7", channel)


@pytest.mark.parametrize(
    "topic",
    ["gbroker/v1/site//state", "gbroker/v1/site/s1/other", "gbroker/v2/site/s1/state", "x", ""],
)
def test_parse_site_topic_rejects_other_topics(topic: str) -> None:
    assert parse_site_topic(topic) is None


@pytest.mark.parametrize("site", ["", "a/b", "a+", "#", "$SYS", "nul\0"])
def test_site_names_must_be_one_topic_level(site: str) -> None:
    with pytest.raises(InvalidInput, match="site"):
        state_topic(site)
    with pytest.raises(InvalidInput):
        SiteLink("mqtt://127.0.0.1", site)


@pytest.mark.parametrize("url", ["http://127.0.0.1:1883", "mqtt://", "mqtt://host:99999", "x"])
def test_bad_urls_are_rejected_with_the_expected_form(url: str) -> None:
    with pytest.raises(InvalidInput, match="mqtt url"):
        SiteLink(url, "s1")


def test_a_site_is_not_its_own_neighbour() -> None:
    with pytest.raises(InvalidInput, match="neighbours"):
        SiteLink("mqtt://127.0.0.1", "s1", ["s2", "s1"])


def test_link_must_be_open_to_use() -> None:
    link = SiteLink("mqtt://127.0.0.1", "s1", ["s2"])
    with pytest.raises(GBrokerError, match="not open"):
        link.updates()


def test_view_feed_keeps_newest_and_forgets_offline_sites() -> None:
    view = NeighbourhoodView()
    feed = ViewFeed(view)
    assert feed.apply(StateUpdate("a", Observation(state(free=4), 2.0)))
    assert not feed.apply(StateUpdate("a", Observation(state(free=1), 1.0)))  # older: ignored
    assert view.get("a") == Observation(state(free=4), 2.0)
    assert feed.apply(Liveness("a", online=False))
    assert view.get("a") is None
    assert feed.offline == {"a"}
    # A dead site's retained state (delivered after its will) must not come back.
    assert not feed.apply(StateUpdate("a", Observation(state(free=4), 3.0)))
    assert view.sites() == []
    assert not feed.apply(Liveness("a", online=True))
    assert feed.apply(StateUpdate("a", Observation(state(free=5), 4.0)))
    assert view.get("a") == Observation(state(free=5), 4.0)
    assert not feed.apply(Liveness("b", online=False))  # nothing to forget


# --- helpers over a real broker ------------------------------------------------------------------


async def next_update(updates: Updates, timeout: float = EVENT_TIMEOUT) -> SiteUpdate:
    async with asyncio.timeout(timeout):
        return await anext(updates)


async def wait_for_update(
    updates: Updates, wanted: SiteUpdate, timeout: float = EVENT_TIMEOUT
) -> list[SiteUpdate]:
    """Every update up to and including ``wanted``."""
    seen: list[SiteUpdate] = []
    async with asyncio.timeout(timeout):
        async for update in updates:
            seen.append(update)
            if update == wanted:
                return seen
    raise AssertionError(f"the updates stopped before {wanted}; saw {seen}")


@asynccontextmanager
async def raw_client(url: str, name: str) -> AsyncIterator[aiomqtt.Client]:
    """A plain MQTT client, e.g. to publish what no SiteLink would."""
    port = int(url.rsplit(":", 1)[1])
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"test-{name}", timeout=5) as client:
        yield client


network = pytest.mark.network


# --- over a real broker ------------------------------------------------------------------------


@network
@pytest.mark.asyncio
async def test_late_subscriber_gets_retained_state_and_liveness(mqtt_broker: RunningBroker) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
            await a.publish_state(state(free=3, queued=2, running=1), observed_at=100.5)
            async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
                updates = b.updates()
                got = {await next_update(updates), await next_update(updates)}
    assert got == {
        Liveness("a", online=True),
        StateUpdate("a", Observation(state(free=3, queued=2, running=1), 100.5)),
    }


@network
@pytest.mark.asyncio
async def test_updates_arrive_in_order_and_the_view_ends_with_the_newest(
    mqtt_broker: RunningBroker,
) -> None:
    reports = [(state(free=i % 9, queued=i), 1000.0 + i) for i in range(30)]
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
                assert await next_update(updates) == Liveness("a", online=True)
                for report, at in reports:
                    await a.publish_state(report, at)
                received = [await next_update(updates) for _ in reports]
    assert received == [StateUpdate("a", Observation(s, at)) for s, at in reports]
    view = NeighbourhoodView()
    feed = ViewFeed(view)
    for update in received:
        feed.apply(update)
    assert view.get("a") == Observation(*reports[-1])


@network
@pytest.mark.asyncio
async def test_feed_keeps_a_view_current_and_forgets_a_site_that_closes(
    mqtt_broker: RunningBroker,
) -> None:
    view = NeighbourhoodView()
    newest = Observation(state(free=7, queued=0), 20.0)

    async def until(check: Callable[[], bool]) -> None:
        async with asyncio.timeout(EVENT_TIMEOUT):
            while not check():
                await asyncio.sleep(0.01)

    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b, asyncio.TaskGroup() as tasks:
            feeding = tasks.create_task(b.feed(view), name="mqtt-feed")
            async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
                await a.publish_state(state(free=2, queued=5), 10.0)
                await a.publish_state(newest.state, newest.observed_at)
                await until(lambda: view.get("a") == newest)
            # a closed cleanly: its offline makes the view forget it.
            await until(lambda: view.get("a") is None)
            feeding.cancel()
    assert view.sites() == []


@network
@pytest.mark.asyncio
async def test_clean_close_publishes_a_retained_offline(mqtt_broker: RunningBroker) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            async with SiteLink(mqtt_broker.url, "a", ["b"]):
                assert await next_update(updates) == Liveness("a", online=True)
            assert await next_update(updates) == Liveness("a", online=False)
        # Retained: a neighbour that comes later learns it too.
        async with SiteLink(mqtt_broker.url, "c", ["a"]) as c:
            assert await next_update(c.updates()) == Liveness("a", online=False)


_VICTIM = textwrap.dedent(
    """
    import asyncio, sys
    from gbroker.core.model import SiteState
    from gbroker.daemon.mqtt import SiteLink

    async def main(url: str) -> None:
        async with SiteLink(url, "victim", ["watcher"]) as link:
            await link.publish_state(SiteState(total_cores=16, free_cores=5, queued=1), 42.0)
            print("ready", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
    """
)


@network
@pytest.mark.asyncio
async def test_last_will_of_a_sigkilled_site_reaches_its_neighbour(
    mqtt_broker: RunningBroker,
) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "watcher", ["victim"]) as watcher:
            updates = watcher.updates()
            victim = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _VICTIM,
                mqtt_broker.url,
                stdout=asyncio.subprocess.PIPE,
                env=env,
                cwd=ROOT,
            )
            killed = False
            try:
                assert victim.stdout is not None
                async with asyncio.timeout(20):
                    assert (await victim.stdout.readline()).strip() == b"ready"
                reported_state = state(free=5, queued=1, total=16)
                reported = StateUpdate("victim", Observation(reported_state, 42.0))
                seen = await wait_for_update(updates, reported)
                assert Liveness("victim", online=True) in seen
                # No DISCONNECT, no offline of its own: only the MQTT broker's will can tell.
                victim.send_signal(signal.SIGKILL)
                killed, killed_at = True, time.monotonic()
                seen = await wait_for_update(updates, Liveness("victim", online=False), timeout=10)
                delay = time.monotonic() - killed_at
            finally:
                # Signal it only once: a second signal would poll() it, reaping the dead child
                # before asyncio's watcher does (which then reports exit code 255).
                if not killed:
                    victim.kill()
                await victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert delay < WILL_DEADLINE, f"the last-will took {delay:.2f} s ({mqtt_broker.kind})"
    assert seen == [Liveness("victim", online=False)]
    # The will is retained: a neighbour that subscribes later learns it at once, along with the
    # dead site's last retained state, in either order; its view must not hold the dead site.
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "late", ["victim"]) as late:
            late_updates = late.updates()
            got = [await next_update(late_updates), await next_update(late_updates)]
    assert set(got) == {Liveness("victim", online=False), reported}
    view = NeighbourhoodView()
    feed = ViewFeed(view)
    for update in got:
        feed.apply(update)
    assert view.sites() == []


@network
@pytest.mark.asyncio
async def test_garbage_on_a_state_topic_is_dropped_and_later_updates_arrive(
    mqtt_broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    good = Observation(state(free=6), 7.0)
    garbage = [
        b"\xc1",  # not MessagePack
        b"",  # empty
        wire.encode_site_state("someone-else", good),  # another site's report on a's topic
        b"\x81\xa1v\x02",  # {"v": 2}: unsupported version
    ]
    caplog.set_level(logging.WARNING, logger="gbroker.daemon.mqtt")
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            async with raw_client(mqtt_broker.url, "garbage") as peer:
                for payload in garbage:
                    await peer.publish(state_topic("a"), payload, qos=1)
                await peer.publish(alive_topic("a"), b"maybe", qos=1)
            async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
                await a.publish_state(good.state, good.observed_at)
                seen = await wait_for_update(updates, StateUpdate("a", good))
    assert seen == [Liveness("a", online=True), StateUpdate("a", good)]
    assert b.rejected_messages == len(garbage) + 1
    dropped = [r for r in caplog.records if "dropped a message" in r.getMessage()]
    assert len(dropped) == len(garbage) + 1
    assert any("site-state.v" in r.getMessage() for r in dropped)


@network
@pytest.mark.asyncio
async def test_only_the_neighbours_topics_come_through_and_strays_are_not_rejections(
    mqtt_broker: RunningBroker,
) -> None:
    # c follows x, so the broker holds a subscription to x's topics; amqtt 0.12 then also sends
    # x's retained messages to every client that connects. b does not follow x: it must not
    # see them, nor count them as bad payloads.
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "x", ["c"]) as x:
            await x.publish_state(state(free=1), 5.0)
            async with SiteLink(mqtt_broker.url, "c", ["x"]) as c:
                assert await next_update(c.updates()) in {
                    Liveness("x", online=True),
                    StateUpdate("x", Observation(state(free=1), 5.0)),
                }
                async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
                    updates = b.updates()
                    async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
                        await a.publish_state(state(free=2), 6.0)
                        seen = await wait_for_update(
                            updates, StateUpdate("a", Observation(state(free=2), 6.0))
                        )
    assert seen == [
        Liveness("a", online=True),
        StateUpdate("a", Observation(state(free=2), 6.0)),
    ]
    assert b.rejected_messages == 0


@network
@pytest.mark.asyncio
async def test_updates_raise_instead_of_hanging_when_the_broker_goes_away(
    mqtt_broker: RunningBroker,
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            waiting = asyncio.create_task(anext(updates))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            await mqtt_broker.stop()
            with pytest.raises(LinkError, match="lost the connection"):
                async with asyncio.timeout(EVENT_TIMEOUT):
                    await waiting
            with pytest.raises(LinkError):
                await b.publish_state(state(free=1), 1.0)
        # Leaving the link after the broker died neither hangs nor raises.


@network
@pytest.mark.asyncio
async def test_updates_stop_when_the_link_is_closed(mqtt_broker: RunningBroker) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        link = SiteLink(mqtt_broker.url, "b", ["a"])
        async with link:
            collected = asyncio.create_task(_collect(link.updates()))
            await asyncio.sleep(0.1)
        assert await collected == []


async def _collect(updates: Updates) -> list[SiteUpdate]:
    return [update async for update in updates]


@network
@pytest.mark.asyncio
async def test_an_unreachable_broker_is_a_link_error() -> None:
    async with EmbeddedBroker() as broker:
        url = broker.url
    async with asyncio.timeout(TEST_TIMEOUT):
        with pytest.raises(LinkError, match="cannot connect"):
            async with SiteLink(url, "a", ["b"], timeout=2):
                pass


@network
@pytest.mark.asyncio
async def test_embedded_broker_picks_a_free_port_and_stops_cleanly() -> None:
    amqtt_logger = logging.getLogger("amqtt")
    level_before = amqtt_logger.level
    async with asyncio.timeout(TEST_TIMEOUT):
        async with EmbeddedBroker() as one, EmbeddedBroker() as two:
            assert amqtt_logger.level == logging.ERROR  # quiet while running
            assert one.url.startswith("mqtt://127.0.0.1:")
            assert one.url != two.url
            async with SiteLink(one.url, "a", ["b"]), SiteLink(two.url, "b", ["a"]):
                pass
        await one.stop()  # idempotent
        with pytest.raises(GBrokerError):
            _ = one.url
    assert amqtt_logger.level == level_before


def test_a_missing_mosquitto_fails_the_tests_and_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(pytest.fail.Exception, match=r"scripts/ensure_mosquitto\.sh"):
        find_mosquitto()


# --- NetMon tables ------------------------------------------------------------------------------


def table(site: str, at: float, **links: tuple[float, ...]) -> ForecastTable:
    """A table of ``site`` measured at ``at``: each link's seconds for 1 MiB and 8 MiB."""
    return ForecastTable(
        site, at, {target: LinkPoints((1 << 20, 8 << 20), secs) for target, secs in links.items()}
    )


def test_view_feed_leaves_tables_alone() -> None:
    view = NeighbourhoodView()
    assert not ViewFeed(view).apply(NetmonUpdate("a", table("a", 1.0, b=(0.1, 0.5))))
    assert view.sites() == []


def test_monitor_roles_are_checked() -> None:
    with pytest.raises(InvalidInput, match="role: expected dcsmon or netmon"):
        MonitorLink("mqtt://127.0.0.1", "s1", "broker")


@network
@pytest.mark.asyncio
async def test_neighbours_and_own_tables_arrive_and_feed_a_forecaster(
    mqtt_broker: RunningBroker,
) -> None:
    from_b = table("b", 10.0, a=(0.2, 1.2), c=(0.1, 0.6))
    own = table("a", 11.0, b=(0.3, 1.4))
    forecaster = PiecewiseLinearForecaster(default_bandwidth=1.0)
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
            updates = a.updates()
            async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
                await b.publish_netmon_table(from_b)
                seen = await wait_for_update(updates, NetmonUpdate("b", from_b))
            # A standalone NetMon of a's own publishes a's table: a hears it too.
            async with MonitorLink(mqtt_broker.url, "a", "netmon") as monitor:
                await monitor.publish_netmon_table(own)
            await wait_for_update(updates, NetmonUpdate("a", own))
        assert Liveness("b", online=True) in seen
        # Retained: a broker that joins later gets both tables, and feed() applies them.
        async with SiteLink(mqtt_broker.url, "a", ["b"], client_id="late-a") as late:
            feeding = asyncio.create_task(late.feed(NeighbourhoodView(), TableFeed(forecaster)))
            async with asyncio.timeout(EVENT_TIMEOUT):
                while forecaster.table("b", "c") is None or forecaster.table("a", "b") is None:
                    await asyncio.sleep(0.01)
            feeding.cancel()
    assert forecaster.forecast("b", "a", 8 << 20) == pytest.approx(1.2)
    assert forecaster.forecast("b", "c", 1 << 20) == pytest.approx(0.1)
    assert forecaster.forecast("a", "b", 1 << 20) == pytest.approx(0.3)
    assert forecaster.forecast("c", "b", 1 << 20) == pytest.approx(1 << 20)  # unknown: 1 B/s


@network
@pytest.mark.asyncio
async def test_bad_tables_are_dropped_with_the_field_named(
    mqtt_broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    good = table("b", 3.0, a=(0.2, 0.9))
    garbage = [
        b"\xc1",
        wire.encode_netmon_table(table("someone-else", 2.0, a=(0.1, 0.2))),  # wrong topic
        msgpack.packb(
            {"v": 1, "kind": "netmon-table", "site": "b", "measured_at": 1.0, "links": {"a": {}}}
        ),
    ]
    caplog.set_level(logging.WARNING, logger="gbroker.daemon.mqtt")
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
            updates = a.updates()
            async with raw_client(mqtt_broker.url, "garbage") as peer:
                for payload in garbage:
                    await peer.publish(netmon_topic("b"), payload, qos=1)
                await peer.publish(netmon_topic("b"), wire.encode_netmon_table(good), qos=1)
            await wait_for_update(updates, NetmonUpdate("b", good))
    assert a.rejected_messages == len(garbage)
    dropped = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
    assert len(dropped) == len(garbage)
    assert any("netmon-table.site: expected 'b' (the topic's site)" in m for m in dropped)
    assert any(
        "netmon-table.links[a].sizes: expected a list of sizes in bytes" in m for m in dropped
    )


@network
@pytest.mark.asyncio
async def test_a_monitor_publishes_retained_state_without_speaking_for_the_broker(
    mqtt_broker: RunningBroker,
) -> None:
    reported = Observation(state(free=3, queued=1), 50.0)

    async def publish(link: MonitorLink) -> None:
        await link.publish_state(reported.state, reported.observed_at)

    async with asyncio.timeout(TEST_TIMEOUT):
        await keep_publishing(mqtt_broker.url, "a", "dcsmon", publish)  # returns when done
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            assert await next_update(updates) == StateUpdate("a", reported)
            # The monitor said nothing on a's alive topic, neither online nor offline.
            with pytest.raises(TimeoutError):
                await next_update(updates, timeout=0.5)
        async with MonitorLink(mqtt_broker.url, "a", "netmon") as monitor:
            with pytest.raises(GBrokerError, match="cannot publish the NetMon table of b"):
                await monitor.publish_netmon_table(table("b", 1.0, a=(0.1, 0.2)))


@pytest.mark.asyncio
async def test_a_cancellation_dropped_while_publishing_is_raised_again() -> None:
    from gbroker.daemon.mqtt import _publish

    class DropsCancellation:
        """Publishes like Python 3.11's wait_for when the PUBACK and a cancel arrive together."""

        async def publish(self, *args: object, **kwargs: object) -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    client: Any = DropsCancellation()
    task = asyncio.create_task(_publish(client, "mqtt://127.0.0.1", "t", b"x", "state"))
    await asyncio.sleep(0.01)
    task.cancel()
    async with asyncio.timeout(EVENT_TIMEOUT):
        with pytest.raises(asyncio.CancelledError):
            await task
