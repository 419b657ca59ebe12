"""Liveness without MQTT, on a real fleet (``gbroker fleet up``) whose MQTT broker is killed.

While their MQTT links are down, brokers ping each other over HTTP (gbroker.daemon.heartbeat):
a broker SIGKILLed then is declared lost by its neighbours (no last-will can say so), taken back
when it answers again, and the neighbours' views stay fresh from the pings' answers. A broker
that died while the MQTT broker was down left no last-will with the restarted MQTT broker: it
stays lost after the others rejoin.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker import fleet
from gbroker.security.auth import bearer
from gbroker.topology import SiteSpec, Topology, save_topology


@pytest.fixture
def beating_fleet(tmp_path: Path, fleet_mqtt: str) -> Iterator[Path]:
    topology = tmp_path / "topology.yaml"
    save_topology(Topology([SiteSpec(n, 4) for n in "abc"], "full", name="hb"), topology)
    directory = tmp_path / "fleet"
    serve = ("--dcsmon-period", "0.2", "--heartbeat", "0.5")
    fleet.up(topology, directory, fleet_mqtt, serve)
    try:
        yield directory
    finally:
        fleet.down(directory)


def _get(directory: Path, site: str, path: str) -> dict[str, Any]:
    url = fleet.load(directory)["sites"][site]["url"]
    request = urllib.request.Request(
        url + path, headers=bearer(fleet.client_token(directory) or "")
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:  # an unhealthy broker's /health is a 503 with a body
        answer = json.load(exc)
    return answer


def _neighbour(directory: Path, site: str, neighbour: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = _get(directory, site, "/api/v1/info")["neighbours"]
    [row] = [r for r in rows if r["site"] == neighbour]
    return row


def _mqtt_ok(directory: Path, site: str) -> bool:
    return bool(_get(directory, site, "/api/v1/health")["mqtt"]["ok"])


def _until(check: Callable[[], bool], what: str, within: float = 20.0) -> float:
    """Poll ``check`` until it holds; the seconds it took."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > within:
            raise AssertionError(f"not within {within:g} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - began


def test_while_mqtt_is_down_a_killed_broker_is_found_lost_and_found_back(
    beating_fleet: Path,
) -> None:
    d = beating_fleet
    _until(lambda: all(_mqtt_ok(d, s) for s in "abc"), "every broker joined MQTT")
    _until(lambda: _neighbour(d, "a", "c")["status"] == "reported", "a hears c's state")

    fleet.kill_mqtt(d)
    _until(lambda: not any(_mqtt_ok(d, s) for s in "abc"), "every broker saw MQTT go")
    fleet.kill(d, "c")
    _until(lambda: _neighbour(d, "a", "c")["status"] == "offline", "a takes c as lost")
    _until(lambda: _neighbour(d, "b", "c")["status"] == "offline", "b takes c as lost")
    # b is alive: a's view of it stays fresh from the pings' answers, MQTT or not.
    time.sleep(1.0)
    b = _neighbour(d, "a", "b")
    assert b["status"] == "reported"
    assert b["age"] < 1.5, b

    fleet.restart(d, "c")
    _until(lambda: _neighbour(d, "a", "c")["status"] == "reported", "a takes c back")
    assert not _mqtt_ok(d, "a")  # all of it without MQTT

    fleet.restart_mqtt(d)
    _until(lambda: all(_mqtt_ok(d, s) for s in "abc"), "every broker rejoined MQTT")


def test_a_broker_that_died_while_mqtt_was_down_stays_lost_after_the_rejoin(
    beating_fleet: Path,
) -> None:
    d = beating_fleet
    _until(lambda: all(_mqtt_ok(d, s) for s in "abc"), "every broker joined MQTT")
    _until(lambda: _neighbour(d, "a", "c")["status"] == "reported", "a hears c's state")
    fleet.kill_mqtt(d)
    _until(lambda: not _mqtt_ok(d, "a"), "a saw MQTT go")
    fleet.kill(d, "c")  # no last-will: the MQTT broker that would publish it is dead
    fleet.restart_mqtt(d)  # back before any ping could miss three times
    _until(lambda: _mqtt_ok(d, "a") and _mqtt_ok(d, "b"), "a and b rejoined MQTT")
    # The restarted MQTT broker never heard of c: a and b keep pinging it, and give it up.
    _until(lambda: _neighbour(d, "a", "c")["status"] == "offline", "a takes c as lost")
    _until(lambda: _neighbour(d, "b", "c")["status"] == "offline", "b takes c as lost")
    fleet.restart(d, "c")  # back: it says online over MQTT, and answers pings
    _until(lambda: _neighbour(d, "a", "c")["status"] == "reported", "a takes c back")
