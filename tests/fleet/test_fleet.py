"""A local fleet of real broker processes with its MQTT broker (amqtt or mosquitto), driven by
the CLI. The fleet's MQTT broker runs with access control; the brokers join it with their
sites' passwords (the last-will test below needs them joined)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import aiomqtt
import pytest

from gbroker import fleet as fleet_module
from gbroker.client.gclient import Client, ClientError
from gbroker.mqtt.accounts import read_password_file
from gbroker.mqtt.topics import alive_topic
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

BIG_JOB = "executable: /bin/echo\narguments: [big]\ntotal_cpu_count: {exact: 8}\n"


@pytest.fixture
def fleet(tmp_path: Path, fleet_mqtt: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """Three sites; with the fleet's embedded MQTT broker, then with its mosquitto."""
    topology = tmp_path / "three.yaml"
    sites = [SiteSpec("a", 2), SiteSpec("b", 2), SiteSpec("c", 8)]
    save_topology(Topology(sites, "full", name="three"), topology)
    directory = tmp_path / "fleet"
    mqtt = ("--mqtt-broker", fleet_mqtt)
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory), *mqtt)
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield directory, {name: m["url"] for name, m in record["sites"].items()}
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


async def submit_big(url: str) -> dict[str, object]:
    async with Client(url) as client:
        job_id = await client.submit(BIG_JOB)
        return await client.wait(job_id, timeout=30)


def test_a_killed_broker_is_seen_through_its_last_will_and_gets_no_more_jobs(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    directory, urls = fleet
    assert gbroker("fleet", "status", "--dir", str(directory)).returncode == 0
    status = asyncio.run(submit_big(urls["a"]))  # only c has 8 cores
    assert (status["state"], status["site"]) == ("done", "c")

    killed = gbroker("fleet", "kill", "c", "--dir", str(directory))
    assert killed.returncode == 0, killed.stderr
    assert gbroker("fleet", "status", "--dir", str(directory)).returncode == 1

    async def refused_everywhere() -> list[int]:
        # The last-will reaches the neighbours within milliseconds; allow a loaded machine 10 s.
        for site in ("a", "b"):
            async with Client(urls[site]) as client, asyncio.timeout(10):
                while True:
                    try:
                        await client.submit(BIG_JOB)  # still sent to c: it fails there
                    except ClientError as refused:
                        codes.append(refused.status)
                        break
                    await asyncio.sleep(0.1)
        return codes

    codes: list[int] = []
    assert asyncio.run(refused_everywhere()) == [400, 400]

    restarted = gbroker("fleet", "restart", "c", "--dir", str(directory))
    assert restarted.returncode == 0, restarted.stderr

    async def accepted_again() -> dict[str, object]:
        for _ in range(100):  # until a hears c's online and state again
            try:
                return await submit_big(urls["a"])
            except ClientError:
                await asyncio.sleep(0.1)
        raise AssertionError("a never sent work to the restarted c")

    status = asyncio.run(accepted_again())
    assert (status["state"], status["site"]) == ("done", "c")


def test_fleet_status_says_which_part_of_a_broker_is_not_ok(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    """A broker that answers 503 (here: its MQTT link is down) is not ok, and says why; it is
    not "no answer". fleet up returns once every broker is healthy, MQTT link included."""
    directory, _ = fleet
    fleet_status = ("fleet", "status", "--dir", str(directory))
    assert all(row["answers"] for row in fleet_module.status(directory) if row["name"] != "mqtt")
    fleet_module.kill_mqtt(directory)
    deadline = time.monotonic() + 30
    while not all(
        row["not_ok"] == ["mqtt"] for row in fleet_module.status(directory) if row["name"] != "mqtt"
    ):
        assert time.monotonic() < deadline, fleet_module.status(directory)
        time.sleep(0.1)
    shown = gbroker(*fleet_status)
    assert shown.returncode == 1
    assert shown.stdout.count("not ok: mqtt") == 3, shown.stdout
    assert "no answer" not in shown.stdout
    fleet_module.restart_mqtt(directory)
    deadline = time.monotonic() + 60  # the brokers join again with their backoff
    while (shown := gbroker(*fleet_status)).returncode != 0:
        assert time.monotonic() < deadline, shown.stdout
        time.sleep(0.5)
    assert "not ok" not in shown.stdout


def test_the_fleets_mqtt_refuses_anonymous_clients_and_other_sites_topics(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    directory, _ = fleet
    record = json.loads((directory / "fleet.json").read_text())
    port = int(record["mqtt_url"].rsplit(":", 1)[1])
    auth = directory / "mqtt"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o700
    assert {f.name for f in auth.iterdir()} >= {"a.password", "b.password", "c.password"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in auth.iterdir())
    password = read_password_file(auth / "a.password")
    # No password on any command line (fleet.json records them; /proc shows them to anyone).
    commands = [m["command"] for m in (record["mqtt"], *record["sites"].values())]
    assert not any(password in " ".join(c) for c in commands)
    cmdline = Path(f"/proc/{record['sites']['a']['pid']}/cmdline").read_bytes()
    assert b"--mqtt-password-file" in cmdline
    assert password.encode() not in cmdline

    async def probe() -> tuple[bool, bytes]:
        try:
            async with aiomqtt.Client("127.0.0.1", port, identifier="gbroker-a/x", timeout=5):
                anonymous_admitted = True
        except aiomqtt.MqttError:
            anonymous_admitted = False
        client = aiomqtt.Client(
            "127.0.0.1", port, identifier="gbroker-a/x", username="a", password=password
        )
        async with client:
            # a's forged offline for c is dropped; c's own retained online stays.
            await client.publish(alive_topic("c"), b"offline", qos=1, retain=True)
            await client.subscribe(alive_topic("c"), qos=1)
            async with asyncio.timeout(10):
                message = await anext(client.messages)
        assert isinstance(message.payload, bytes)
        return anonymous_admitted, message.payload

    assert asyncio.run(probe()) == (False, b"online")


def test_a_standalone_monitor_joins_with_its_sites_password_file(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    directory, _ = fleet
    record = json.loads((directory / "fleet.json").read_text())
    wrong = directory / "wrong.password"
    wrong.write_text(read_password_file(directory / "mqtt" / "b.password"))
    wrong.chmod(0o600)
    logs = {}
    for name, password_file, awaited in (
        ("right", directory / "mqtt" / "a.password", "publishing on"),
        ("wrong", wrong, "rejoining"),
    ):
        monitor = subprocess.Popen(
            [
                *(sys.executable, "-m", "gbroker", "dcsmon", "serve", "--site", "a"),
                *("--topology", record["topology"], "--mqtt", record["mqtt_url"]),
                *("--mqtt-password-file", str(password_file), "--period", "0.2"),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        log = _StderrLog(monitor)
        try:
            log.until(awaited, timeout=60)
        finally:
            monitor.terminate()
            monitor.wait(timeout=10)
        logs[name] = log.all()
    assert "publishing on" in logs["right"]
    assert "rejoining" not in logs["right"], logs["right"]
    assert "rejoining" in logs["wrong"], logs["wrong"]


class _StderrLog:
    """A process's standard error, read as it comes (by a thread of its own)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        stream = process.stderr
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(stream,))
        self._reader.start()
        self.text = ""

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)

    def until(self, wanted: str, timeout: float) -> None:
        """Wait until a line holding ``wanted`` was written (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while wanted not in self.text:
            try:
                self.text += self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} in {timeout:g} s: {self.text}") from None

    def all(self) -> str:
        """Everything written, once the process has ended."""
        self._reader.join(timeout=10)
        while not self._lines.empty():
            self.text += self._lines.get()
        return self.text


def test_a_brokers_log_never_shows_its_mqtt_password(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    directory, _ = fleet
    record = json.loads((directory / "fleet.json").read_text())
    password = read_password_file(directory / "mqtt" / "a.password")
    log = Path(record["sites"]["a"]["log"])
    os.killpg(record["mqtt"]["pid"], signal.SIGKILL)  # a's link breaks; it logs and rejoins
    deadline = time.monotonic() + 20
    while "MQTT link" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    assert "MQTT link mqtt://127.0.0.1" in text  # credentials are not part of the URL
    assert password not in text


def test_fleet_commands_report_errors(tmp_path: Path) -> None:
    missing = gbroker("fleet", "status", "--dir", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "no fleet" in missing.stderr
    # An MQTT broker open to anyone is never the default, and passwords stay private.
    open_broker = gbroker("mqtt-serve", "--port", "0")
    assert open_broker.returncode == 2
    assert "--password-file: expected a password file" in open_broker.stderr
    readable = tmp_path / "a.password"
    readable.write_text("pw\n")
    readable.chmod(0o644)
    topology = tmp_path / "one.yaml"
    save_topology(Topology([SiteSpec("a", 1)], "full", name="one"), topology)
    serve = gbroker(
        "serve", "--site", "a", "--topology", str(topology), "--mqtt-password-file", str(readable)
    )
    assert serve.returncode == 2
    assert "only its owner may read (chmod 600)" in serve.stderr


@pytest.mark.slow
def test_the_demo_serves_every_job_and_tears_down() -> None:
    done = gbroker("demo", "--jobs", "8", "--rate", "4", "--seed", "2")
    assert done.returncode == 0, done.stderr
    assert "(8 of 8 done)" in done.stdout
    assert "B = " in done.stdout
    assert "fleet down" in done.stderr
