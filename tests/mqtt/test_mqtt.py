"""MQTT status dissemination, liveness and access control (gbroker.mqtt.link).

Pure tests first (topics, URLs, ViewFeed); then tests over a real MQTT broker, each run against
the embedded amqtt broker and against a mosquitto process (``mqtt_broker`` in conftest.py); the
access-control tests at the end run both with the fleet's passwords and ACL
(``secured_broker``).
Every network test is bounded by a timeout so that a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
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
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.mqtt.accounts import (
    TopicAcl,
    client_id_allowed,
    mosquitto_hash,
    read_amqtt_password_file,
    read_password_file,
    write_auth_files,
)
from gbroker.mqtt.broker import EmbeddedBroker
from gbroker.mqtt.link import (
    LinkError,
    Liveness,
    MonitorLink,
    NetmonUpdate,
    SiteLink,
    SiteUpdate,
    StateUpdate,
    Updates,
    ViewFeed,
    keep_publishing,
)
from gbroker.mqtt.topics import (
    alive_topic,
    events_topic,
    netmon_topic,
    parse_site_topic,
    state_topic,
)
from gbroker.protocol import wire
from netmon.forecast import PiecewiseLinearForecaster
from netmon.table import ForecastTable, LinkPoints, TableFeed
from tests.brokers import SECURED_SITES, RunningBroker, find_mosquitto

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
    from gbroker.mqtt.link import SiteLink

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
    caplog.set_level(logging.WARNING, logger="gbroker.mqtt.link")
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
async def test_cpu_availability_crosses_mqtt_and_an_older_peers_state_arrives_without_it(
    mqtt_broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    measured = Observation(SiteState(8, 6, cpu=0.33), 7.0)
    # What a broker from before the field publishes: the same map without "cpu".
    older = {"v": 1, "kind": "site-state", "site": "a", "total_cores": 8, "free_cores": 5}
    older |= {"queued": 0, "running": 0, "observed_at": 8.0}
    bad = older | {"observed_at": 9.0, "cpu": 2.0}
    caplog.set_level(logging.WARNING, logger="gbroker.mqtt.link")
    async with asyncio.timeout(TEST_TIMEOUT):
        async with SiteLink(mqtt_broker.url, "b", ["a"]) as b:
            updates = b.updates()
            async with SiteLink(mqtt_broker.url, "a", ["b"]) as a:
                await a.publish_state(measured.state, measured.observed_at)
                seen = await wait_for_update(updates, StateUpdate("a", measured))
                async with raw_client(mqtt_broker.url, "older") as peer:
                    await peer.publish(state_topic("a"), msgpack.packb(bad), qos=1)
                    await peer.publish(state_topic("a"), msgpack.packb(older), qos=1)
                unmeasured = Observation(SiteState(8, 5), 8.0)
                seen += await wait_for_update(updates, StateUpdate("a", unmeasured))
    assert seen[-2:] == [StateUpdate("a", measured), StateUpdate("a", unmeasured)]
    assert b.rejected_messages == 1  # the out-of-range cpu, named where it entered
    dropped = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
    assert any("site-state.cpu: expected a fraction of a core" in m for m in dropped), dropped


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
    with pytest.raises(pytest.fail.Exception, match=r"scripts/setup/ensure_mosquitto\.sh"):
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
    caplog.set_level(logging.WARNING, logger="gbroker.mqtt.link")
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
    from gbroker.mqtt.link import _publish

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


# --- access control -----------------------------------------------------------------------------


def test_the_fleet_acl_confines_each_site_to_its_own_topics() -> None:
    acl = TopicAcl.for_sites(["a", "b"])
    assert acl.may_publish("a", alive_topic("a"))
    assert acl.may_publish("a", "gbroker/v1/site/a/anything/deeper")
    assert not acl.may_publish("a", alive_topic("b"))
    assert not acl.may_publish("a", "gbroker/v1/site/ab/state")  # a prefix is not the site
    assert not acl.may_publish("a", "other")
    assert not acl.may_publish("nobody", alive_topic("nobody"))
    assert acl.subscribe["a"] == ("gbroker/v1/site/+/#",)


def test_client_ids_name_exactly_one_site() -> None:
    assert client_id_allowed("a", "gbroker-a")
    assert client_id_allowed("a", "gbroker-a/dcsmon")
    assert not client_id_allowed("a", "gbroker-b")
    assert not client_id_allowed("a", "gbroker-ab")
    assert not client_id_allowed("a", "gbroker-a-x")
    assert not client_id_allowed("a", "")


def test_acl_files_round_trip_and_bad_ones_name_the_entry(tmp_path: Path) -> None:
    acl = TopicAcl.for_sites(["s1", "s2"])
    path = tmp_path / "acl.yaml"
    acl.save(path)
    assert TopicAcl.load(path) == acl
    path.write_text("publish: {s1: ['a/#/b']}\n")
    with pytest.raises(InvalidInput, match=r"publish\.s1: expected MQTT topic filters"):
        TopicAcl.load(path)
    path.write_text("publish: {s1: []}\n")
    with pytest.raises(InvalidInput, match=r"publish\.s1: expected a non-empty list"):
        TopicAcl.load(path)
    path.write_text("users: {}\n")
    with pytest.raises(InvalidInput, match="expected a mapping with 'publish' and 'subscribe'"):
        TopicAcl.load(path)


def test_auth_files_are_private_and_hold_hashes_only(tmp_path: Path) -> None:
    files = write_auth_files(tmp_path / "mqtt", ["b", "a"])
    assert files.sites == ("a", "b")
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    made = sorted(f.name for f in files.directory.iterdir())
    assert made == sorted(
        ["a.password", "b.password", "passwords", "acl.yaml", "mosquitto.passwd", "mosquitto.acl"]
    )
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files.directory.iterdir())
    password = read_password_file(files.password_file("a"))
    assert len(password) >= 40
    assert password != read_password_file(files.password_file("b"))
    for broker_file in (files.amqtt_passwords, files.mosquitto_passwords):
        assert password not in broker_file.read_text()
    users = read_amqtt_password_file(files.amqtt_passwords)
    assert set(users) == {"a", "b"}
    assert users["a"].startswith("$argon2id$")
    assert files.mosquitto_passwords.read_text().startswith("a:$7$101$")
    assert TopicAcl.load(files.acl) == TopicAcl.for_sites(["a", "b"])
    assert "pattern write gbroker/v1/site/%u/#" in files.mosquitto_acl.read_text()


def test_mosquitto_hashes_are_pbkdf2_sha512_in_its_own_format() -> None:
    import base64
    import hashlib

    hashed = mosquitto_hash("secret", salt=b"0123456789ab")
    _, seven, iterations, salt, key = hashed.split("$")
    assert (seven, iterations, base64.b64decode(salt)) == ("7", "101", b"0123456789ab")
    expected = hashlib.pbkdf2_hmac("sha512", b"secret", b"0123456789ab", 101)
    assert base64.b64decode(key) == expected


def test_a_password_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.password"
    path.write_text("pw\n")
    path.chmod(0o644)
    with pytest.raises(InvalidInput, match="only its owner may read"):
        read_password_file(path)
    path.chmod(0o600)
    assert read_password_file(path) == "pw"
    path.write_text("\n")
    with pytest.raises(InvalidInput, match="an MQTT password on its first line"):
        read_password_file(path)


def test_a_password_never_shows_in_a_links_url() -> None:
    link = SiteLink("mqtt://a:hunter2@127.0.0.1:1", "a")
    assert "hunter2" not in link.url
    assert MonitorLink("mqtt://127.0.0.1:1", "a", "dcsmon", username="a", password="x").url == (
        "mqtt://127.0.0.1:1"
    )


async def collect_for(updates: Updates, seconds: float) -> list[SiteUpdate]:
    """Every update that arrives within ``seconds``."""
    seen: list[SiteUpdate] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for update in updates:
                seen.append(update)  # noqa: PERF401 (kept when the timeout cuts it short)
    return seen


async def connect_raw(
    url: str,
    client_id: str,
    username: str | None = None,
    password: str | None = None,
    will: aiomqtt.Will | None = None,
) -> aiomqtt.Client:
    """Connect a plain client (the caller closes it); raises aiomqtt's error if refused."""
    port = int(url.rsplit(":", 1)[1])
    client = aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=client_id,
        username=username,
        password=password,
        will=will,
        timeout=5,
    )
    await client.__aenter__()
    return client


def secured_link(broker: RunningBroker, site: str, neighbours: list[str], **kw: Any) -> SiteLink:
    return SiteLink(
        broker.url, site, neighbours, username=site, password=broker.passwords[site], **kw
    )


@network
@pytest.mark.asyncio
@pytest.mark.parametrize("credentials", ["anonymous", "wrong password", "unknown user"])
async def test_anonymous_and_wrong_credentials_are_refused(
    secured_broker: RunningBroker, credentials: str
) -> None:
    choices: dict[str, tuple[str | None, str | None]] = {
        "anonymous": (None, None),
        "wrong password": ("a", secured_broker.passwords["b"]),
        "unknown user": ("z", secured_broker.passwords["a"]),
    }
    username, password = choices[credentials]
    async with asyncio.timeout(TEST_TIMEOUT):
        with pytest.raises(aiomqtt.MqttCodeError) as refused:
            await connect_raw(secured_broker.url, "gbroker-a", username, password)
        # CONNACK 4 (bad user name or password) or 5 (not authorized): either way, out.
        assert str(refused.value.rc) in ("Bad user name or password", "Not authorized")
        with pytest.raises(LinkError, match="cannot connect"):
            async with SiteLink(
                secured_broker.url, "a", ["b"], username=username, password=password
            ):
                pass
        # The right password gets in.
        async with secured_link(secured_broker, "a", ["b"]):
            pass


@network
@pytest.mark.asyncio
async def test_the_embedded_broker_keeps_no_file_of_password_hashes_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """amqtt reads its users from a file only. The file was removed at stop, so each embedded
    broker killed with SIGKILL (a fleet's, by the chaos tests or an operator) left one in /tmp:
    it is gone as soon as amqtt has read it, and the users it held still get in."""
    auth = write_auth_files(tmp_path / "mqtt", SECURED_SITES)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    users = read_amqtt_password_file(auth.amqtt_passwords)
    async with asyncio.timeout(TEST_TIMEOUT):
        async with EmbeddedBroker(users=users, acl=TopicAcl.load(auth.acl)) as broker:
            assert list(tmp_path.glob("gbroker-mqtt-*")) == []
            running = RunningBroker(
                "amqtt", broker.url, broker.stop,
                {site: read_password_file(auth.password_file(site)) for site in SECURED_SITES},
            )  # fmt: skip
            async with secured_link(running, "a", ["b"]):
                pass
            with pytest.raises(aiomqtt.MqttCodeError):
                await connect_raw(broker.url, "gbroker-a", "a", "not its password")


@network
@pytest.mark.asyncio
async def test_a_site_cannot_speak_on_another_sites_topics(secured_broker: RunningBroker) -> None:
    good = Observation(state(free=4), 10.0)
    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "c", ["b"]) as c:
            updates = c.updates()
            async with secured_link(secured_broker, "b", ["c"]) as b:
                assert await next_update(updates) == Liveness("b", online=True)
                forger = await connect_raw(
                    secured_broker.url, "gbroker-a/forger", "a", secured_broker.passwords["a"]
                )
                try:
                    forged = wire.encode_site_state("b", Observation(state(free=0), 99.0))
                    await forger.publish(alive_topic("b"), b"offline", qos=1, retain=True)
                    await forger.publish(state_topic("b"), forged, qos=1, retain=True)
                    # Denied quietly: a's connection is still up and may use its own topics.
                    await forger.publish(alive_topic("a"), b"online", qos=1, retain=True)
                finally:
                    await forger.__aexit__(None, None, None)
                await b.publish_state(good.state, good.observed_at)
                # c hears b's own state next: nothing of the forgery came through.
                assert await next_update(updates) == StateUpdate("b", good)
                assert await collect_for(updates, 0.5) == []
                # Nor was it retained: a later subscriber gets b's own word only.
                async with secured_link(
                    secured_broker, "a", ["b"], client_id="gbroker-a/late"
                ) as late:
                    got = await collect_for(late.updates(), 1.0)
    # (amqtt may send a retained message twice: once on connecting, once on subscribing.)
    assert set(got) == {Liveness("b", online=True), StateUpdate("b", good)}


@network
@pytest.mark.asyncio
async def test_a_site_reads_every_site_but_nothing_else(secured_broker: RunningBroker) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "b", ["a"]) as b:
            await b.publish_state(state(free=2), 3.0)
            client = await connect_raw(
                secured_broker.url, "gbroker-a/reader", "a", secured_broker.passwords["a"]
            )
            try:
                granted = await client.subscribe("gbroker/v1/site/+/state", qos=1)
                # amqtt refuses these in the SUBACK; mosquitto grants them but delivers only
                # what the ACL lets a read (the sites' topics): either way nothing else
                # arrives (mosquitto's retained $SYS/broker/version included).
                await client.subscribe("#", qos=1)
                await client.subscribe("$SYS/#", qos=1)
                topics = []
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        async for message in client.messages:
                            topics.append(message.topic.value)  # noqa: PERF401
            finally:
                await client.__aexit__(None, None, None)
    assert [int(code.value) for code in granted] == [1]  # type: ignore[union-attr]
    assert state_topic("b") in topics
    assert all(aiomqtt.Topic(t).matches("gbroker/v1/site/+/#") for t in topics), topics


_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import aiomqtt
    from gbroker.mqtt.accounts import read_password_file

    async def main(port, user, password_file, client_id, will_topic):
        will = aiomqtt.Will(will_topic, b"offline", qos=1, retain=True)
        client = aiomqtt.Client("127.0.0.1", int(port), identifier=client_id, username=user,
                                password=read_password_file(password_file), will=will, timeout=5)
        try:
            async with client:
                print("ready", flush=True)
                await asyncio.sleep(3600)
        except aiomqtt.MqttError as exc:
            print("refused:", getattr(exc, "rc", "?"), flush=True)

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def hold_a_connection(
    broker: RunningBroker, tmp_path: Path, user: str, client_id: str, will_topic: str
) -> tuple[asyncio.subprocess.Process, str]:
    """A process connected as ``user`` with a retained ``offline`` will on ``will_topic``; its
    first line says ``ready`` or ``refused <code>``. The password goes by file, not argv."""
    password_file = tmp_path / f"{user}-{client_id.replace('/', '_')}.password"
    password_file.write_text(broker.passwords[user])
    password_file.chmod(0o600)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    port = broker.url.rsplit(":", 1)[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        port,
        user,
        str(password_file),
        client_id,
        will_topic,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    async with asyncio.timeout(20):
        first = (await process.stdout.readline()).decode().strip()
    return process, first


@network
@pytest.mark.asyncio
async def test_the_last_will_of_a_sigkilled_site_works_with_access_control(
    secured_broker: RunningBroker, tmp_path: Path
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "b", ["a"]) as watcher:
            updates = watcher.updates()
            victim, first = await hold_a_connection(
                secured_broker, tmp_path, "a", "gbroker-a", alive_topic("a")
            )
            try:
                assert first == "ready"
                victim.send_signal(signal.SIGKILL)
                await victim.wait()
                killed_at = time.monotonic()
                seen = await wait_for_update(updates, Liveness("a", online=False), timeout=10)
                delay = time.monotonic() - killed_at
            finally:
                if victim.returncode is None:
                    victim.kill()
                    await victim.wait()
    assert seen == [Liveness("a", online=False)]
    assert delay < WILL_DEADLINE, f"the last-will took {delay:.2f} s ({secured_broker.kind})"


@network
@pytest.mark.asyncio
async def test_a_will_on_another_sites_topic_never_fires(
    secured_broker: RunningBroker, tmp_path: Path
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "c", ["b"]) as c:
            updates = c.updates()
            async with secured_link(secured_broker, "b", ["c"]):
                assert await next_update(updates) == Liveness("b", online=True)
                forger, first = await hold_a_connection(
                    secured_broker, tmp_path, "a", "gbroker-a/forger", alive_topic("b")
                )
                try:
                    # amqtt (behind our check) refuses the CONNECT; mosquitto 2.0 admits it
                    # and drops the will when it fires. Either way c hears nothing.
                    assert first in ("ready", "refused: Not authorized")
                    if forger.returncode is None:
                        forger.send_signal(signal.SIGKILL)
                    await forger.wait()
                    with pytest.raises(TimeoutError):
                        await next_update(updates, timeout=1.0)
                finally:
                    if forger.returncode is None:
                        forger.kill()
                        await forger.wait()
                # Nor was it retained: b's own word stands.
                late = secured_link(secured_broker, "c", ["b"], client_id="gbroker-c/late")
                async with late:
                    late_updates = await collect_for(late.updates(), 1.0)
        assert set(late_updates) == {Liveness("b", online=True)}
    if secured_broker.kind == "amqtt":
        assert first == "refused: Not authorized"


@network
@pytest.mark.asyncio
@pytest.mark.parametrize("intruder", ["anonymous", "wrong password", "another site"])
async def test_nobody_else_can_take_a_sites_client_id_over(
    secured_broker: RunningBroker, intruder: str
) -> None:
    credentials: dict[str, tuple[str | None, str | None]] = {
        "anonymous": (None, None),
        "wrong password": ("b", "guess"),
        "another site": ("a", secured_broker.passwords["a"]),
    }
    username, password = credentials[intruder]
    # mosquitto cannot tie client ids to users: a site with valid credentials can take another's
    # id over (documented in gbroker.mqtt.link). Only our amqtt front refuses that.
    expect_refusal = not (intruder == "another site" and secured_broker.kind == "mosquitto")
    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "c", ["b"]) as c:
            c_hears = c.updates()
            async with secured_link(secured_broker, "b", ["c"]) as b:
                b_hears = b.updates()
                assert await next_update(c_hears) == Liveness("b", online=True)
                assert await next_update(b_hears) == Liveness("c", online=True)
                try:
                    intruding = await connect_raw(
                        secured_broker.url, "gbroker-b", username, password
                    )
                except aiomqtt.MqttCodeError:
                    refused = True
                else:
                    refused = False
                    await intruding.__aexit__(None, None, None)
                if expect_refusal:
                    assert refused
                    # b's session survived: no will fired, and b still speaks and hears (amqtt
                    # alone would have dropped b's subscriptions, silently).
                    await b.publish_state(state(free=3), 1.0)
                    assert await next_update(c_hears) == StateUpdate(
                        "b", Observation(state(free=3), 1.0)
                    )
                    await c.publish_state(state(free=5), 2.0)
                    assert await next_update(b_hears) == StateUpdate(
                        "c", Observation(state(free=5), 2.0)
                    )
                else:
                    assert not refused  # the documented limit of mosquitto (see above)


@network
@pytest.mark.asyncio
async def test_a_monitor_speaks_for_its_site_with_the_sites_password(
    secured_broker: RunningBroker,
) -> None:
    reported = Observation(state(free=6), 70.0)

    async def publish(link: MonitorLink) -> None:
        await link.publish_state(reported.state, reported.observed_at)

    async with asyncio.timeout(TEST_TIMEOUT):
        async with secured_link(secured_broker, "b", ["a"]) as b:
            updates = b.updates()
            await keep_publishing(
                secured_broker.url,
                "a",
                "dcsmon",
                publish,
                username="a",
                password=secured_broker.passwords["a"],
            )
            assert await next_update(updates) == StateUpdate("a", reported)
        with pytest.raises(LinkError, match="dcsmon of site a: cannot connect"):
            async with MonitorLink(secured_broker.url, "a", "dcsmon", username="a"):
                pass
