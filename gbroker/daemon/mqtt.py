"""MQTT: site states and liveness between neighbouring brokers (ARCHITECTURE §5).

Theory of operation. Every site owns four topics under ``gbroker/v1/site/<site>/``:

- ``state``: its latest DCSMon report (a ``site-state`` message, :mod:`gbroker.daemon.wire`),
  retained, so a broker that (re)subscribes learns each neighbour's state at once instead of
  waiting for the next publication;
- ``alive``: the plain string ``online``, retained, published on connecting; the connection's
  MQTT **last-will** is a retained ``offline`` on the same topic, so when a broker dies (SIGKILL,
  crash, or a silent link that misses its keep-alive) the MQTT broker itself tells the neighbours.
  A clean close does not fire the will, so :class:`SiteLink` publishes ``offline`` itself;
- ``netmon``: its NetMon forecast table (a ``netmon-table`` message), retained;
- ``events``: its job events.

:class:`SiteLink` is one site's connection. It subscribes to its neighbours' ``state``, ``alive``
and ``netmon`` topics, and to its own ``netmon`` topic (NetMon may run as a separate process), and
turns what arrives into typed events, :class:`StateUpdate`, :class:`Liveness` and
:class:`NetmonUpdate`, through :meth:`SiteLink.updates`, an async iterator that raises
:class:`LinkError` when the connection is lost (it never hangs on a dead link) and stops when the
link is closed on purpose. A malformed payload from a peer is logged and dropped; it never stops
the stream. :class:`ViewFeed` applies the events to a :class:`~dcsmon.view.NeighbourhoodView`:
newest state wins; ``offline`` forgets the site, and a retained state of a site known to be
offline is not taken back in (retained messages of a dead site arrive in any order on subscribe).
A :class:`~netmon.table.TableFeed` applies the tables to the broker's forecaster.

:class:`MonitorLink` is the connection of a standalone DCSMon or NetMon agent (``gbroker dcsmon
serve``, ``gbroker netmon serve``): it only publishes, under its own client id and without a
last-will, since a monitor's death says nothing about the broker's. :func:`keep_publishing` keeps
one up, rejoining with backoff, for as long as its publishing loop runs.

The client id is stable per site (``gbroker-<site>`` unless given): when a restarted broker
reconnects while its old connection still looks open, the MQTT broker takes the old session over
at once rather than letting its will fire later, after the new ``online``.

:class:`EmbeddedBroker` runs an in-process amqtt broker on loopback, the default for a local
fleet and for tests; real deployments point the links at mosquitto or any MQTT 3.1.1 broker.

TLS: an ``mqtts://`` URL (port 8883 by default) makes a link verify the MQTT broker against the
``tls_context`` it is given (:func:`gbroker.tls.client_context` with the fleet CA), else against
the system's CAs; an :class:`EmbeddedBroker` given an ``ssl_context`` listens with TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import unquote, urlsplit

import aiomqtt

from dcsmon.view import NeighbourhoodView
from gbroker.core.model import Observation, SiteState
from gbroker.daemon import wire
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from netmon.table import ForecastTable, TableFeed

__all__ = [
    "TOPIC_ROOT",
    "EmbeddedBroker",
    "LinkError",
    "Liveness",
    "MonitorLink",
    "NetmonUpdate",
    "SiteLink",
    "SiteUpdate",
    "StateUpdate",
    "Updates",
    "ViewFeed",
    "alive_topic",
    "events_topic",
    "keep_publishing",
    "netmon_topic",
    "parse_site_topic",
    "state_topic",
]

log = logging.getLogger(__name__)

TOPIC_ROOT: Final = "gbroker/v1/site"
"""Every site's topics live under ``TOPIC_ROOT/<site>/``."""

_CHANNELS: Final = frozenset({"state", "alive", "netmon", "events"})
_SUBSCRIBED: Final = ("alive", "state", "netmon")  # a SiteLink's channels of each neighbour
_QOS: Final = 1


class LinkError(GBrokerError, ConnectionError):
    """The MQTT broker cannot be reached, or the connection to it was lost.

    Neither the caller's fault nor a bug of ours: the environment failed. A daemon reconnects
    (and re-subscribes) by opening a new :class:`SiteLink`.
    """


# --- topics ------------------------------------------------------------------------------------


def _check_site(site: str) -> str:
    """``site`` if it can be one level of a topic: no ``/``, wildcards or NUL; not ``$``-led."""
    if (
        not isinstance(site, str)
        or not site
        or any(c in site for c in "/+#\0")
        or site.startswith("$")
    ):
        raise InvalidInput(
            "site", "a non-empty name without '/', '+', '#', NUL or a leading '$'", site
        )
    return site


def state_topic(site: str) -> str:
    """Where ``site``'s DCSMon state is published (retained)."""
    return f"{TOPIC_ROOT}/{_check_site(site)}/state"


def alive_topic(site: str) -> str:
    """Where ``site``'s liveness is published: retained ``online``; last-will ``offline``."""
    return f"{TOPIC_ROOT}/{_check_site(site)}/alive"


def netmon_topic(site: str) -> str:
    """Where ``site``'s NetMon forecast table is published."""
    return f"{TOPIC_ROOT}/{_check_site(site)}/netmon"


def events_topic(site: str) -> str:
    """Where ``site``'s job events are published."""
    return f"{TOPIC_ROOT}/{_check_site(site)}/events"


def parse_site_topic(topic: str) -> tuple[str, str] | None:
    """``(site, channel)`` of a site topic, e.g. ``("s1", "state")``; None for any other topic."""
    prefix = TOPIC_ROOT + "/"
    if not topic.startswith(prefix):
        return None
    site, _, channel = topic[len(prefix) :].partition("/")
    if not site or channel not in _CHANNELS:
        return None
    return site, channel


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """A neighbour reported its state (as DCSMon sampled it at ``observation.observed_at``)."""

    site: str
    observation: Observation


@dataclass(frozen=True, slots=True)
class Liveness:
    """A neighbour's broker came online, or went offline (cleanly or by its last-will)."""

    site: str
    online: bool


@dataclass(frozen=True, slots=True)
class NetmonUpdate:
    """A site (a neighbour, or this site's own NetMon) published its forecast table."""

    site: str
    table: ForecastTable


SiteUpdate = StateUpdate | Liveness | NetmonUpdate


class ViewFeed:
    """Keeps a :class:`NeighbourhoodView` current from :class:`SiteLink` events. Pure.

    A state updates the view (older reports never replace newer ones); ``offline`` forgets the
    site, and states of a site last known offline are ignored until it says ``online`` again,
    so a dead site's retained state cannot creep back in.
    """

    __slots__ = ("_offline", "view")

    def __init__(self, view: NeighbourhoodView) -> None:
        self.view = view
        self._offline: set[str] = set()

    @property
    def offline(self) -> frozenset[str]:
        """The sites whose last word was ``offline``."""
        return frozenset(self._offline)

    def apply(self, update: SiteUpdate) -> bool:
        """Apply one event; True if the view changed. Forecast tables are not its business."""
        if isinstance(update, NetmonUpdate):
            return False
        if isinstance(update, Liveness):
            if update.online:
                self._offline.discard(update.site)
                return False
            self._offline.add(update.site)
            known = self.view.get(update.site) is not None
            self.view.forget(update.site)
            return known
        if update.site in self._offline:
            return False
        observation = update.observation
        return self.view.update(update.site, observation.state, observation.observed_at)


# --- the link ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Endpoint:
    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool = False

    def tls_context(self, given: ssl.SSLContext | None) -> ssl.SSLContext | None:
        """What to connect with: ``given`` (or the system's CAs) for mqtts://, else plain."""
        if not self.tls:
            return None
        return given or ssl.create_default_context()


def _parse_url(url: str) -> _Endpoint:
    """``mqtt[s]://[user[:password]@]host[:port]`` (port 1883, or 8883 with TLS, by default)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "tcp", "mqtts", "ssl"):
        raise InvalidInput("mqtt url", "mqtt://host[:port] or mqtts://host[:port]", url)
    tls = parts.scheme in ("mqtts", "ssl")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise InvalidInput("mqtt url", "a port between 0 and 65535", url) from exc
    if not parts.hostname:
        raise InvalidInput("mqtt url", "a host name, as in mqtt://host[:port]", url)
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return _Endpoint(parts.hostname, port, username, password, tls)


class _Publishing:
    """What both link kinds publish for their site; ``_client`` is set while open."""

    site: str
    url: str
    _client: aiomqtt.Client | None

    def _open_client(self) -> aiomqtt.Client:
        if self._client is None:
            name = type(self).__name__
            raise InternalError(f"{name}({self.site!r}) is not open: use 'async with'")
        return self._client

    async def publish_state(self, state: SiteState, observed_at: float) -> None:
        """Publish this site's state (retained, QoS 1), as sampled at ``observed_at``."""
        payload = wire.encode_site_state(self.site, Observation(state, observed_at))
        await _publish(self._open_client(), self.url, state_topic(self.site), payload, "state")

    async def publish_netmon_table(self, table: ForecastTable) -> None:
        """Publish this site's NetMon forecast table (retained, QoS 1)."""
        await _publish_table(self._open_client(), self.url, self.site, table)


class SiteLink(_Publishing):
    """One site's MQTT connection: publishes its state and liveness, hears its neighbours'.

    An async context manager. On entry it connects with a retained last-will ``offline`` on the
    site's alive topic, publishes a retained ``online`` there and subscribes to the neighbours'
    state, alive and netmon topics and to its own netmon topic; on exit it publishes a retained
    ``offline`` and disconnects cleanly.

    Args:
        url: the MQTT broker, ``mqtt://host[:port]``.
        site: this site's name.
        neighbours: L(i), the sites whose state, liveness and NetMon tables this site follows.
        client_id: the MQTT client id; ``gbroker-<site>`` by default (see the module docs).
        keepalive: seconds between keep-alive pings. A link that goes silent (no FIN, e.g. a
            partition) is declared dead by the MQTT broker after 1.5 × keepalive, which then
            publishes the will.
        timeout: seconds to wait for the MQTT broker to acknowledge a connect, subscribe or
            publish before the link is taken as lost.
        tls_context: for an ``mqtts://`` url, how to verify the MQTT broker (see the module
            docs).
    """

    def __init__(
        self,
        url: str,
        site: str,
        neighbours: Iterable[str] = (),
        *,
        client_id: str | None = None,
        keepalive: int = 10,
        timeout: float = 5.0,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self.site = _check_site(site)
        self.neighbours = tuple(sorted({_check_site(n) for n in neighbours}))
        if site in self.neighbours:
            raise InvalidInput("neighbours", f"sites other than {site!r} itself", site)
        self._endpoint = _parse_url(url)
        self._client_id = client_id or f"gbroker-{site}"
        self._keepalive = keepalive
        self._timeout = timeout
        self._tls_context = tls_context
        self._client: aiomqtt.Client | None = None
        self._closing = False
        self._subscribed = {(n, channel) for n in self.neighbours for channel in _SUBSCRIBED}
        self._subscribed.add((self.site, "netmon"))
        self.rejected_messages = 0
        """How many malformed payloads from peers were logged and dropped."""

    async def __aenter__(self) -> Self:
        if self._client is not None:
            raise InternalError(f"SiteLink({self.site!r}) is already open")
        endpoint = self._endpoint
        client = aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            username=endpoint.username,
            password=endpoint.password,
            identifier=self._client_id,
            will=aiomqtt.Will(
                alive_topic(self.site), wire.encode_alive(False), qos=_QOS, retain=True
            ),
            clean_session=True,
            keepalive=self._keepalive,
            timeout=self._timeout,
            tls_context=endpoint.tls_context(self._tls_context),
        )
        try:
            await client.__aenter__()
        except aiomqtt.MqttError as exc:
            raise LinkError(f"site {self.site}: cannot connect to {self.url}: {exc}") from exc
        self._client = client
        self._closing = False
        try:
            await client.publish(
                alive_topic(self.site), wire.encode_alive(True), qos=_QOS, retain=True
            )
            # Alive topics first: a dead neighbour's retained offline then usually precedes
            # its stale retained state (ViewFeed copes with either order).
            topics = [(alive_topic(n), _QOS) for n in self.neighbours]
            topics += [(state_topic(n), _QOS) for n in self.neighbours]
            topics += [(netmon_topic(n), _QOS) for n in (*self.neighbours, self.site)]
            await client.subscribe(topics)
        except BaseException as exc:
            self._client = None
            with contextlib.suppress(aiomqtt.MqttError):
                await client.__aexit__(None, None, None)
            if isinstance(exc, aiomqtt.MqttError):
                raise LinkError(f"site {self.site}: lost {self.url} while joining: {exc}") from exc
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client = self._client
        if client is None:
            return
        self._closing = True
        self._client = None
        try:
            # A clean DISCONNECT discards the will: say offline ourselves. If the link is
            # already gone this fails fast, and the MQTT broker has published the will instead.
            await client.publish(
                alive_topic(self.site), wire.encode_alive(False), qos=_QOS, retain=True
            )
        except aiomqtt.MqttError as publish_error:
            log.debug("site %s: could not publish offline on close: %s", self.site, publish_error)
        try:
            await client.__aexit__(exc_type, exc, tb)
        except aiomqtt.MqttError as disconnect_error:
            log.debug("site %s: unclean disconnect on close: %s", self.site, disconnect_error)

    def updates(self) -> Updates:
        """The neighbours' state and liveness events, in arrival order.

        Iterate it from one task only. It raises :class:`LinkError` when the connection is
        lost and stops when this link is closed.
        """
        return Updates(self, self._open_client())

    async def feed(
        self,
        view: NeighbourhoodView,
        tables: TableFeed | None = None,
        on_liveness: Callable[[str, bool], None] | None = None,
    ) -> None:
        """Keep ``view`` (and, if given, the forecaster behind ``tables``) current until the
        link closes; raises :class:`LinkError` if it is lost. ``on_liveness(site, online)``
        hears every neighbour's ``online`` and ``offline`` (a daemon's leases act on them).

        Meant to run as a named task in the daemon's task group.
        """
        view_feed = ViewFeed(view)
        async for update in self.updates():
            if isinstance(update, NetmonUpdate):
                if tables is not None:
                    tables.apply(update.table)
                continue
            view_feed.apply(update)
            if on_liveness is not None and isinstance(update, Liveness):
                on_liveness(update.site, update.online)

    def _parse(self, message: aiomqtt.Message) -> SiteUpdate | None:
        """The event a message carries, or None for a message to drop.

        A malformed payload from a neighbour is the neighbour's fault: logged as a warning and
        counted in :attr:`rejected_messages`. A message on a topic this link did not subscribe to
        is the MQTT broker's doing (amqtt 0.12 sends a connecting client the retained messages
        of every topic *anyone* subscribed to): dropped quietly.
        """
        topic = message.topic.value
        parsed = parse_site_topic(topic)
        if parsed is None or parsed not in self._subscribed:
            log.debug("site %s: ignored a message on %s, not subscribed to", self.site, topic)
            return None
        site, channel = parsed
        try:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                raise wire.WireError("payload", "bytes", type(payload).__name__)
            if channel == "alive":
                return Liveness(site, wire.decode_alive(payload))
            if channel == "netmon":
                table = wire.decode_netmon_table(payload)
                if table.site != site:
                    raise wire.WireError(
                        "netmon-table.site", f"{site!r} (the topic's site)", _short(table.site)
                    )
                return NetmonUpdate(site, table)
            reported_site, observation = wire.decode_site_state(payload)
            if reported_site != site:
                raise wire.WireError(
                    "site-state.site", f"{site!r} (the topic's site)", _short(reported_site)
                )
            return StateUpdate(site, observation)
        except wire.WireError as exc:
            self.rejected_messages += 1
            log.warning("site %s: dropped a message on %s: %s", self.site, topic, exc)
            return None


def _short(name: str) -> str:
    return name if len(name) <= 40 else name[:40] + "..."


def _resume_cancellation() -> None:
    """Raise again a cancellation that aiomqtt dropped.

    aiomqtt awaits acknowledgements with :func:`asyncio.wait_for`, which on Python 3.11 returns
    the result, and drops the cancellation, when both arrive together (fixed in 3.12). A
    publisher cancelled at that moment (e.g. SIGTERM right after a publication) would then run
    on, and its shutdown would hang. The task still counts the request (``cancelling()``);
    any other code that swallowed a cancellation without ``uncancel()`` is caught here too.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _publish(client: aiomqtt.Client, url: str, topic: str, payload: bytes, what: str) -> None:
    """Publish retained at QoS 1; a lost connection is a :class:`LinkError`."""
    try:
        await client.publish(topic, payload, qos=_QOS, retain=True)
    except aiomqtt.MqttError as exc:
        raise LinkError(f"cannot publish {what} on {topic} to {url}: {exc}") from exc
    _resume_cancellation()


async def _publish_table(client: aiomqtt.Client, url: str, site: str, table: ForecastTable) -> None:
    if table.site != site:
        raise InternalError(f"site {site} cannot publish the NetMon table of {table.site}")
    await _publish(client, url, netmon_topic(site), wire.encode_netmon_table(table), "netmon")


class MonitorLink(_Publishing):
    """A standalone monitor's MQTT connection: publishes one site's state or NetMon table.

    An async context manager, like :class:`SiteLink` but publish-only, and without a last-will
    or ``online``/``offline``: those speak for the broker, and a monitor is not the broker.

    Args:
        url: the MQTT broker, ``mqtt://host[:port]``.
        site: the site whose topics this monitor publishes on.
        role: ``dcsmon`` or ``netmon``; the client id is ``gbroker-<site>-<role>``.
        timeout: seconds to wait for the MQTT broker to acknowledge a connect or publish.
        tls_context: for an ``mqtts://`` url, how to verify the MQTT broker.
    """

    def __init__(
        self,
        url: str,
        site: str,
        role: str,
        *,
        timeout: float = 5.0,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        if role not in ("dcsmon", "netmon"):
            raise InvalidInput("role", "dcsmon or netmon", role)
        self.url = url
        self.site = _check_site(site)
        self.role = role
        self._endpoint = _parse_url(url)
        self._timeout = timeout
        self._tls_context = tls_context
        self._client: aiomqtt.Client | None = None

    async def __aenter__(self) -> Self:
        if self._client is not None:
            raise InternalError(f"MonitorLink({self.site!r}) is already open")
        endpoint = self._endpoint
        client = aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            username=endpoint.username,
            password=endpoint.password,
            identifier=f"gbroker-{self.site}-{self.role}",
            clean_session=True,
            timeout=self._timeout,
            tls_context=endpoint.tls_context(self._tls_context),
        )
        try:
            await client.__aenter__()
        except aiomqtt.MqttError as exc:
            raise LinkError(
                f"{self.role} of site {self.site}: cannot connect to {self.url}: {exc}"
            ) from exc
        self._client = client
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            await client.__aexit__(exc_type, exc, tb)
        except aiomqtt.MqttError as disconnect_error:
            log.debug("%s of %s: unclean disconnect: %s", self.role, self.site, disconnect_error)


async def keep_publishing(
    url: str,
    site: str,
    role: str,
    publish: Callable[[MonitorLink], Awaitable[None]],
    *,
    timeout: float = 15.0,
    max_backoff: float = 10.0,
) -> None:
    """Run ``publish(link)`` over a :class:`MonitorLink`, rejoining whenever the link is lost.

    A monitor whose MQTT broker is away keeps trying (backoff 0.5 s, doubling up to
    ``max_backoff``); it never dies of it. Returns when ``publish`` returns; any other error of
    ``publish`` propagates. Cancel it to stop (the link closes cleanly).
    """
    backoff = 0.5
    while True:
        try:
            async with MonitorLink(url, site, role, timeout=timeout) as link:
                backoff = 0.5
                await publish(link)
                return
        except (LinkError, aiomqtt.MqttError, OSError) as exc:
            log.warning(
                "%s of site %s: MQTT link %s: %s; rejoining in %.1f s",
                role,
                site,
                url,
                exc,
                backoff,
            )
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, max_backoff)


class Updates:
    """The async iterator behind :meth:`SiteLink.updates` (aiomqtt's MessagesIterator style)."""

    __slots__ = ("_link", "_messages")

    def __init__(self, link: SiteLink, client: aiomqtt.Client) -> None:
        self._link = link
        self._messages = client.messages

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SiteUpdate:
        while True:
            try:
                message = await self._messages.__anext__()
            except aiomqtt.MqttError as exc:
                if self._link._closing:
                    raise StopAsyncIteration from None
                raise LinkError(
                    f"site {self._link.site}: lost the connection to {self._link.url}"
                ) from exc
            update = self._link._parse(message)
            if update is not None:
                return update


# --- the embedded broker -----------------------------------------------------------------------


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

    ``port=0`` picks a free port; :attr:`url` tells which (``mqtt://127.0.0.1:PORT``). Anonymous
    clients are allowed; amqtt's logging is quieted to errors while it runs. Messages, retained
    ones included, live in memory only and die with the broker.

    We own the listening socket (amqtt's "external" listener) so that the real port is known
    without reaching into amqtt's internals.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context  # TLS (mqtts://) with gbroker.tls.server_context
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

        config = {
            "listeners": {"default": {"type": "external", "bind": f"{self.host}:{self.port}"}},
            # Only anonymous authentication: no $SYS publisher, no packet or event loggers.
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        try:
            self._broker = Broker(config)
            await self._broker.start()
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, ssl=self._ssl
            )
        except BaseException:
            await self.stop()
            raise
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from amqtt.adapters import StreamReaderAdapter, StreamWriterAdapter

        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._broker.external_connected(
                StreamReaderAdapter(reader), StreamWriterAdapter(writer), "default"
            )
        except Exception as exc:  # one client's failure must not take the listener down
            log.debug("embedded MQTT broker: connection ended with %r", exc)
        finally:
            writer.close()
            if task is not None:
                self._connections.discard(task)

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
            if self._quieting:
                self._quieting = False
                _quiet_amqtt_logs.release()
