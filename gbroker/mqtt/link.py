"""MQTT links: site states and liveness between neighbouring brokers (ARCHITECTURE §5).

Theory of operation. :class:`SiteLink` is one site's connection. It subscribes to its neighbours'
``state``, ``alive`` and ``netmon`` topics, and to its own ``netmon`` topic (NetMon may run as a
separate process), and turns what arrives into typed events, :class:`StateUpdate`, :class:`Liveness`
and :class:`NetmonUpdate`, through :meth:`SiteLink.updates`, an async iterator that raises
:class:`LinkError` when the connection is lost (it never hangs on a dead link) and stops when the
link is closed on purpose. A malformed payload from a peer is logged and dropped; it never stops the
stream. :class:`ViewFeed` applies the events to a :class:`~dcsmon.view.NeighbourhoodView`: newest
state wins; ``offline`` forgets the site, and a retained state of a site known to be offline is not
taken back in (retained messages of a dead site arrive in any order on subscribe). A
:class:`~netmon.table.TableFeed` applies the tables to the broker's forecaster.

:class:`MonitorLink` is the connection of a standalone DCSMon or NetMon agent (``gbroker dcsmon
serve``, ``gbroker netmon serve``): it only publishes, under its own client id and without a
last-will, since a monitor's death says nothing about the broker's. :func:`keep_publishing` keeps
one up, rejoining with backoff, for as long as its publishing loop runs.

The client id is stable per site (``gbroker-<site>`` unless given): when a restarted broker
reconnects while its old connection still looks open, the MQTT broker takes the old session over
at once rather than letting its will fire later, after the new ``online``.

TLS: an ``mqtts://`` URL (port 8883 by default) makes a link verify the MQTT broker against the
``tls_context`` it is given (:func:`gbroker.security.tls.client_context` with the fleet CA), else
against the system's CAs; an :class:`EmbeddedBroker` given an ``ssl_context`` listens with TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self
from urllib.parse import unquote, urlsplit

import aiomqtt

from dcsmon.view import NeighbourhoodView
from gbroker.core.model import Observation, SiteState
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from gbroker.mqtt.topics import (
    alive_topic,
    check_site,
    netmon_topic,
    parse_site_topic,
    short_name,
    state_topic,
)
from gbroker.protocol import wire
from netmon.table import ForecastTable, TableFeed

log = logging.getLogger(__name__)


_SUBSCRIBED: Final = ("alive", "state", "netmon")  # a SiteLink's channels of each neighbour
_QOS: Final = 1


class LinkError(GBrokerError, ConnectionError):
    """The MQTT broker cannot be reached, or the connection to it was lost.

    Neither the caller's fault nor a bug of ours: the environment failed. A daemon reconnects
    (and re-subscribes) by opening a new :class:`SiteLink`.
    """


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


def _parse_url(url: str, username: str | None = None, password: str | None = None) -> _Endpoint:
    """``mqtt[s]://[user[:password]@]host[:port]`` (port 1883, or 8883 with TLS, by default);
    ``username`` and ``password``, when given, take the place of the URL's."""
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
    if username is None and parts.username is not None:
        username = unquote(parts.username)
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    if password is not None and username is None:
        raise InvalidInput("mqtt username", "a user name to go with the password", None)
    return _Endpoint(parts.hostname, port, username, password, tls)


def _redacted(url: str) -> str:
    """``url`` without a password, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return parts._replace(netloc=netloc).geturl()


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
        client_id: the MQTT client id; ``gbroker-<site>`` by default (see the module docs; with
            access control, other ids must read ``gbroker-<site>/<suffix>``).
        username: the MQTT user; with access control, the site's name.
        password: the site's MQTT password (from its password file, :func:`read_password_file`).
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
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = _redacted(url)
        self.site = check_site(site)
        self.neighbours = tuple(sorted({check_site(n) for n in neighbours}))
        if site in self.neighbours:
            raise InvalidInput("neighbours", f"sites other than {site!r} itself", site)
        self._endpoint = _parse_url(url, username, password)
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
                        "netmon-table.site", f"{site!r} (the topic's site)", short_name(table.site)
                    )
                return NetmonUpdate(site, table)
            reported_site, observation = wire.decode_site_state(payload)
            if reported_site != site:
                raise wire.WireError(
                    "site-state.site", f"{site!r} (the topic's site)", short_name(reported_site)
                )
            return StateUpdate(site, observation)
        except wire.WireError as exc:
            self.rejected_messages += 1
            log.warning("site %s: dropped a message on %s: %s", self.site, topic, exc)
            return None


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
        role: ``dcsmon`` or ``netmon``; the client id is ``gbroker-<site>/<role>``.
        timeout: seconds to wait for the MQTT broker to acknowledge a connect or publish.
        username: the MQTT user; with access control, the site's name (a monitor speaks for
            its site).
        password: the site's MQTT password.
        tls_context: for an ``mqtts://`` url, how to verify the MQTT broker.
    """

    def __init__(
        self,
        url: str,
        site: str,
        role: str,
        *,
        timeout: float = 5.0,
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        if role not in ("dcsmon", "netmon"):
            raise InvalidInput("role", "dcsmon or netmon", role)
        self.url = _redacted(url)
        self.site = check_site(site)
        self.role = role
        self._endpoint = _parse_url(url, username, password)
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
            identifier=f"gbroker-{self.site}/{self.role}",
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
    username: str | None = None,
    password: str | None = None,
) -> None:
    """Run ``publish(link)`` over a :class:`MonitorLink`, rejoining whenever the link is lost.

    A monitor whose MQTT broker is away keeps trying (backoff 0.5 s, doubling up to
    ``max_backoff``); it never dies of it. Returns when ``publish`` returns; any other error of
    ``publish`` propagates. Cancel it to stop (the link closes cleanly). ``username`` and
    ``password`` go to the :class:`MonitorLink`. A refused connection (bad credentials) is
    retried like any other: the MQTT broker's password file may be replaced meanwhile.
    """
    backoff = 0.5
    while True:
        try:
            link = MonitorLink(
                url, site, role, timeout=timeout, username=username, password=password
            )
            async with link:
                backoff = 0.5
                await publish(link)
                return
        except (LinkError, aiomqtt.MqttError, OSError) as exc:
            log.warning(
                "%s of site %s: MQTT link %s: %s; rejoining in %.1f s",
                role,
                site,
                _redacted(url),
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
