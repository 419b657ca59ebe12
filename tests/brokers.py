"""Real MQTT brokers for the network tests: the embedded amqtt one and mosquitto (fixtures of
every test directory, through tests/conftest.py), and helpers of the daemon's tests.

``mqtt_broker`` is parametrized over both, so every MQTT test runs against the in-process broker
a local fleet uses by default and against the mosquitto that real deployments use. Each test gets
a fresh broker on a free loopback port; :meth:`RunningBroker.stop` lets a test take it away.
``secured_broker`` is the same pair with access control on, as a fleet runs them: the sites
``a``, ``b`` and ``c`` are the only users, each under the fleet's topic ACL; ``passwords`` gives
each site's password. mosquitto is required: when it is missing the fixture fails (it never
skips), since CI installs it with ``scripts/setup/ensure_mosquitto.sh``.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from yarl import URL

from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.journal import Journal
from gbroker.fleet.ports import free_port
from gbroker.mqtt.accounts import (
    AuthFiles,
    TopicAcl,
    mosquitto_config,
    read_amqtt_password_file,
    read_password_file,
    write_auth_files,
)
from gbroker.mqtt.broker import EmbeddedBroker
from gbroker.security.auth import PeerSigner, bearer
from gbroker.topology import Topology

_STARTUP_TIMEOUT = 10.0


@dataclass
class RunningBroker:
    """An MQTT broker a test can connect to (``url``) and take away (``stop``)."""

    kind: str
    url: str
    stop: Callable[[], Awaitable[None]]
    passwords: dict[str, str] = field(default_factory=dict)
    """Each site's password, when access control is on."""


def find_mosquitto() -> str:
    """The mosquitto binary; Debian installs it in /usr/sbin, often not on a user's PATH."""
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail(
            "mosquitto is not installed and the MQTT tests need it: "
            "run `bash scripts/setup/ensure_mosquitto.sh`",
            pytrace=False,
        )
    return found


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Mosquitto:
    """A mosquitto process listening on a free loopback port, with a config in ``workdir``;
    with ``auth``, anonymous clients are refused and the fleet's passwords and ACL apply."""

    def __init__(self, workdir: Path, auth: AuthFiles | None = None) -> None:
        self.workdir = workdir
        self.auth = auth
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = find_mosquitto()
        failures: list[str] = []
        # The port is free when chosen (gbroker.fleet.ports), but another process may take it before
        # mosquitto binds it; then mosquitto exits at once and we try another port.
        for attempt in range(3):
            self.port = free_port()
            config = self.workdir / f"mosquitto-{attempt}.conf"
            config.write_text(mosquitto_config(self.port, self.auth))
            log_path = self.workdir / f"mosquitto-{attempt}.log"
            with log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    [binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
                )
            deadline = time.monotonic() + _STARTUP_TIMEOUT
            while time.monotonic() < deadline and self.process.poll() is None:
                if _accepts(self.port):
                    return
                time.sleep(0.02)
            self.stop()
            failures.append(f"port {self.port}: {log_path.read_text(errors='replace').strip()}")
        pytest.fail("mosquitto did not start:\n" + "\n".join(failures), pytrace=False)

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest_asyncio.fixture(params=["amqtt", "mosquitto"])
async def mqtt_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RunningBroker]:
    """A fresh MQTT broker on loopback: the embedded amqtt broker, then a mosquitto process."""
    if request.param == "amqtt":
        embedded = EmbeddedBroker()
        async with embedded:
            yield RunningBroker("amqtt", embedded.url, embedded.stop)
        return
    process = Mosquitto(tmp_path)
    await asyncio.to_thread(process.start)

    async def stop() -> None:
        await asyncio.to_thread(process.stop)

    try:
        yield RunningBroker("mosquitto", process.url, stop)
    finally:
        await stop()


@pytest.fixture(params=["amqtt", "mosquitto"])
def fleet_mqtt(request: pytest.FixtureRequest) -> str:
    """The MQTT broker a fleet of real broker processes runs itself, with access control: its
    embedded amqtt broker process, then a mosquitto (``gbroker.fleet.launch.up``'s ``mqtt``)."""
    if request.param == "mosquitto":
        find_mosquitto()  # fail with the install hint rather than as a FleetError
    return str(request.param)


SECURED_SITES = ("a", "b", "c")


@pytest_asyncio.fixture(params=["amqtt", "mosquitto"])
async def secured_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RunningBroker]:
    """A fresh MQTT broker with the fleet's access control for sites a, b and c: the embedded
    amqtt broker (from the fleet's files), then a mosquitto process."""
    auth = await asyncio.to_thread(write_auth_files, tmp_path / "mqtt", SECURED_SITES)
    passwords = {site: read_password_file(auth.password_file(site)) for site in SECURED_SITES}
    if request.param == "amqtt":
        embedded = EmbeddedBroker(
            users=read_amqtt_password_file(auth.amqtt_passwords), acl=TopicAcl.load(auth.acl)
        )
        async with embedded:
            yield RunningBroker("amqtt", embedded.url, embedded.stop, passwords)
        return
    process = Mosquitto(tmp_path, auth)
    await asyncio.to_thread(process.start)

    async def stop() -> None:
        await asyncio.to_thread(process.stop)

    try:
        yield RunningBroker("mosquitto", process.url, stop, passwords)
    finally:
        await stop()


# Credentials of the in-process daemons of these tests (real daemons never run without them).
TOKEN = "test-client-token-0123456789"
SECRET = "test-fleet-secret"
AUTH = bearer(TOKEN)


def daemon_config(
    site: str, topology: Topology, data_dir: Path, *args: Any, **options: Any
) -> DaemonConfig:
    """A daemon's config with the tests' client token and fleet secret unless told otherwise,
    and its neighbours taken as idle from the start (``neighbour_grace=0``): these tests submit
    at once, before a heartbeat could answer (``test_lone_broker.py`` tests the default)."""
    options.setdefault("token", TOKEN)
    options.setdefault("secret", SECRET)
    options.setdefault("neighbour_grace", 0.0)
    return DaemonConfig(site, topology, data_dir, *args, **options)


def signed(
    site: str, method: str, url: str, body: bytes | None = b"", *, to: str
) -> dict[str, str]:
    """A peer signature by ``site`` for site ``to`` under the tests' fleet secret (fresh each
    call)."""
    return PeerSigner(site, SECRET).headers(method, URL(url).path_qs, body, to=to)


@pytest.fixture
def bounded() -> Iterator[None]:
    """Fail the test if it takes over 15 s: a journal whose writer died (a bug, or a mutant of
    mutation testing) leaves its callers waiting forever, which would hang the run."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError("the test took over 15 s: a journal request was never answered")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(15)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class HeldWriter:
    """Holds a journal's writer in its commits until :attr:`release` is set, so that a test can
    queue requests behind a batch the writer has taken. ``await held.holding()`` returns once
    the writer holds its first batch: tests wait for that state, never for a fixed time (under
    load, as in mutation testing, a sleep can be too short). :attr:`sizes`: each batch's size."""

    def __init__(self, journal: Journal, *, every: bool = False) -> None:
        self.release = threading.Event()
        self.sizes: list[int] = []
        self._commit = journal._commit
        self._entered = threading.Event()
        self._every = every
        journal._commit = self._held  # type: ignore[method-assign]

    def _held(self, conn: sqlite3.Connection, work: list[Any]) -> None:
        if self._every or not self._entered.is_set():
            self._entered.set()
            self.release.wait(30)
        self.sizes.append(len(work))
        self._commit(conn, work)

    async def holding(self) -> None:
        assert await asyncio.to_thread(self._entered.wait, 10), "the writer took no batch"


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll for a state the test needs (``what``), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


async def queued(journal: Journal, count: int) -> None:
    """Until ``count`` requests wait in the journal's queue (behind a held batch)."""
    await until(lambda: journal.waiting == count, f"{count} requests queued")
