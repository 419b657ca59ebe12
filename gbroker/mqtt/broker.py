"""The embedded MQTT broker (amqtt), with the access control it enforces.

:class:`EmbeddedBroker` runs an in-process amqtt broker on loopback, the default for a local
fleet and for tests; real deployments point the links at mosquitto or any MQTT 3.1.1 broker.

**amqtt's gaps, closed in front of it.** amqtt 0.12 checks neither the will topic against the
  publish ACL nor credentials before acting on a CONNECT's client id: an anonymous client that
  connects as ``gbroker-b`` is refused, but only after amqtt has dropped b's session and its
  subscriptions, so b hears nothing more and does not notice. A site could also take another
  site's client id over. :class:`EmbeddedBroker` therefore reads each CONNECT itself and
  hands amqtt only connections whose password, client id and will topic pass; the others get
  a CONNACK refusal (4: bad user name or password; 2: identifier rejected; 5: not
  authorized). mosquitto 2.0 authenticates before it touches a session and drops a will whose
  topic its ACL denies when the will fires (it admits the connection); it cannot tie client ids
  to users, so there a site with valid credentials could still take over another's id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from gbroker.errors import InternalError, InvalidInput
from gbroker.mqtt.accounts import TopicAcl, amqtt_password_ok, client_id_allowed
from gbroker.mqtt.topics import short_name

# --- the embedded broker -----------------------------------------------------------------------

log = logging.getLogger(__name__)


class _QuietAmqttLogs:
    """Quiets amqtt (and its state-machine library) while any embedded broker runs.

    They log every connection at INFO and routine disconnections at WARNING; a daemon's log
    should carry our events, not theirs. Levels are restored when the last broker stops.
    """

    _LOGGERS: Final = ("amqtt", "transitions")

    def __init__(self) -> None:
        self._users = 0
        self._saved: dict[str, int] = {}

    def acquire(self) -> None:
        if self._users == 0:
            for name in self._LOGGERS:
                logger = logging.getLogger(name)
                self._saved[name] = logger.level
                logger.setLevel(logging.ERROR)
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            for name, level in self._saved.items():
                logging.getLogger(name).setLevel(level)
            self._saved.clear()


_quiet_amqtt_logs = _QuietAmqttLogs()


class EmbeddedBroker:
    """An in-process amqtt MQTT broker on loopback; an async context manager.

    ``port=0`` picks a free port; :attr:`url` tells which (``mqtt://127.0.0.1:PORT``). amqtt's
    logging is quieted to errors while it runs. Messages, retained ones included, live in memory
    only and die with the broker.

    With ``users`` (user -> :func:`amqtt_hash` of the password) only those users may connect,
    under ``acl`` (by default :meth:`TopicAcl.for_sites` of the users), through amqtt's
    ``FileAuthPlugin`` (anonymous off) and ``TopicAccessControlListPlugin``, behind our own
    CONNECT check (see the module docs). Without ``users`` anyone may connect and do anything:
    for tests of other things only.

    We own the listening socket (amqtt's "external" listener) so that the real port is known
    without reaching into amqtt's internals, and so that we see each CONNECT first.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        users: Mapping[str, str] | None = None,
        acl: TopicAcl | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if users is not None and not users:
            raise InvalidInput("users", "at least one user (or None for anonymous access)", "{}")
        if acl is not None and users is None:
            raise InvalidInput("acl", "users to go with the ACL", "no users")
        self.host = host
        self.port = port
        self.users = dict(users) if users is not None else None
        self.acl = acl if acl is not None or users is None else TopicAcl.for_sites(users)
        self.refused = 0
        """How many connections our CONNECT check turned away."""
        self._password_file: Path | None = None
        self._ssl = ssl_context  # TLS (mqtts://) with gbroker.security.tls.server_context
        self._broker: Any = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._quieting = False

    @property
    def url(self) -> str:
        if self._server is None:
            raise InternalError("EmbeddedBroker is not running: use 'async with'")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self._ssl else 'mqtt'}://{host}:{self.port}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start listening; see :attr:`url`."""
        if self._server is not None:
            raise InternalError("EmbeddedBroker is already running")
        _quiet_amqtt_logs.acquire()
        self._quieting = True
        from amqtt.broker import Broker

        # Only authentication and topic plugins: no $SYS publisher, no packet or event loggers.
        plugins: dict[str, Any]
        if self.users is None:
            plugins = {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            }
        else:
            assert self.acl is not None
            plugins = {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": False},
                "amqtt.plugins.authentication.FileAuthPlugin": {
                    "password_file": str(self._write_password_file(self.users))
                },
                "amqtt.plugins.topic_checking.TopicAccessControlListPlugin": (
                    self.acl.amqtt_plugin_config()
                ),
            }
        config = {
            "listeners": {"default": {"type": "external", "bind": f"{self.host}:{self.port}"}},
            "plugins": plugins,
        }
        try:
            with warnings.catch_warnings():
                # amqtt 0.12's ACL plugin warns that "acl" is deprecated for "subscribe-acl",
                # but its strict config class has no field of the new name.
                warnings.filterwarnings("ignore", "The 'acl' option", DeprecationWarning)
                self._broker = Broker(config)
                await self._broker.start()
            # amqtt's FileAuthPlugin read it as the broker started, and never again: gone now,
            # so that a broker killed with SIGKILL leaves no file of password hashes behind.
            self._forget_password_file()
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, ssl=self._ssl
            )
        except BaseException:
            await self.stop()
            raise
        self.port = self._server.sockets[0].getsockname()[1]

    def _write_password_file(self, users: Mapping[str, str]) -> Path:
        """amqtt's FileAuthPlugin reads users from a file only: a private temporary one."""
        import tempfile

        fd, name = tempfile.mkstemp(prefix="gbroker-mqtt-", suffix=".passwd")
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{user}:{hashed}\n" for user, hashed in users.items())
        self._password_file = Path(name)
        return self._password_file

    def _forget_password_file(self) -> None:
        if self._password_file is not None:
            self._password_file.unlink(missing_ok=True)
            self._password_file = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from amqtt.adapters import ReaderAdapter, StreamReaderAdapter, StreamWriterAdapter

        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            adapter: ReaderAdapter = StreamReaderAdapter(reader)
            if self.users is not None:
                admitted = await self._admit(reader, writer)
                if admitted is None:
                    return
                adapter = admitted
            await self._broker.external_connected(adapter, StreamWriterAdapter(writer), "default")
        except Exception as exc:  # one client's failure must not take the listener down
            log.debug("embedded MQTT broker: connection ended with %r", exc)
        finally:
            writer.close()
            if task is not None:
                self._connections.discard(task)

    async def _admit(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> _ReplayingReader | None:
        """Read the CONNECT and check it before amqtt sees it; a reader that replays it to amqtt,
        or None after refusing the client (CONNACK with a refusal, then close)."""
        from amqtt.errors import AMQTTError, MQTTError, NoDataError
        from amqtt.mqtt.connack import (
            BAD_USERNAME_PASSWORD,
            IDENTIFIER_REJECTED,
            NOT_AUTHORIZED,
            ConnackPacket,
        )
        from amqtt.mqtt.connect import ConnectPacket
        from amqtt.mqtt.packet import CONNECT

        users, acl = self.users, self.acl
        if users is None or acl is None:
            raise InternalError("EmbeddedBroker checks connections only with users and an ACL")
        replay = _ReplayingReader(reader)
        try:
            async with asyncio.timeout(_CONNECT_TIMEOUT):
                packet = await ConnectPacket.from_stream(replay)
        except (TimeoutError, AMQTTError, MQTTError, NoDataError, asyncio.IncompleteReadError):
            log.debug("embedded MQTT broker: no valid CONNECT; connection closed")
            self.refused += 1
            return None
        if packet.fixed_header is None or packet.fixed_header.packet_type != CONNECT:
            self.refused += 1
            return None
        username, password = packet.username, packet.password
        client_id = packet.client_id or ""
        hashed = users.get(username or "")
        refusal: int | None = None
        if (
            username is None
            or password is None
            or hashed is None
            or not await asyncio.to_thread(amqtt_password_ok, password, hashed)
        ):
            refusal = BAD_USERNAME_PASSWORD
        elif not client_id_allowed(username, client_id):
            refusal = IDENTIFIER_REJECTED
        elif packet.will_flag and not acl.may_publish(username, packet.will_topic or ""):
            refusal = NOT_AUTHORIZED
        if refusal is None:
            replay.rewind()
            return replay
        self.refused += 1
        log.info(
            "embedded MQTT broker: refused user %r, client id %r (CONNACK %d)",
            short_name(username or ""),
            short_name(client_id),
            refusal,
        )
        with contextlib.suppress(OSError):
            writer.write(ConnackPacket.build(0, refusal).to_bytes())
            await writer.drain()
        return None

    async def stop(self) -> None:
        """Stop accepting, close every client connection and stop the broker. Idempotent."""
        server, self._server = self._server, None
        broker, self._broker = self._broker, None
        if server is not None:
            server.close()
        try:
            if broker is not None and broker.transitions.state == "started":
                await broker.shutdown()
            # amqtt closes each client's stream on shutdown; give their tasks a moment to end.
            pending = set(self._connections)
            if pending:
                _, still_running = await asyncio.wait(pending, timeout=2.0)
                for task in still_running:
                    task.cancel()
                await asyncio.gather(*still_running, return_exceptions=True)
            if server is not None:
                await server.wait_closed()
        finally:
            self._forget_password_file()
            if self._quieting:
                self._quieting = False
                _quiet_amqtt_logs.release()


_CONNECT_TIMEOUT: Final = 10.0
"""Seconds a new connection may take to send its CONNECT to an access-controlled broker."""


class _ReplayingReader:
    """amqtt's reader adapter over a stream that first records what is read (the CONNECT, read by
    our check) and, after :meth:`rewind`, gives those bytes again before the rest."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._recorded = bytearray()
        self._recording = True
        self._replay = b""

    def rewind(self) -> None:
        self._replay, self._recording = bytes(self._recorded), False
        self._recorded.clear()

    async def read(self, n: int = -1) -> bytes:
        if self._replay:
            if n < 0:
                data, self._replay = self._replay + await self._reader.read(), b""
                return data
            data, self._replay = self._replay[:n], self._replay[n:]
            if len(data) < n:
                data += await self._reader.readexactly(n - len(data))
            return data
        data = await self._reader.read() if n < 0 else await self._reader.readexactly(n)
        if self._recording:
            self._recorded += data
        return data

    def feed_eof(self) -> None:
        self._reader.feed_eof()
