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

Access control (ARCHITECTURE §10). Anyone who can publish a retained ``offline`` on a site's
alive topic makes every neighbour give that site up, so a fleet's MQTT broker admits only
known users and confines each to its own topics:

- **Users are sites.** A site's broker and its standalone monitors all connect as the MQTT user
  ``<site>`` (the bare site name, so that mosquitto's ``%u`` ACL patterns name the site's
  topics). Client ids are ``gbroker-<site>`` for the broker and ``gbroker-<site>/<suffix>`` for
  anything else of the site (monitors: ``gbroker-<site>/dcsmon``); no site name holds a ``/``,
  so an id names exactly one site.
- **Passwords are random and per site** (256 bits, :func:`new_password`), each in its own
  file, 0600, read by that site's processes only (:func:`read_password_file`); never on a
  command line. Since a site's password opens only that site's topics, a site that leaks its
  own cannot speak for another (a shared fleet secret would let any site). The MQTT broker
  holds only hashes: Argon2 for amqtt (:func:`amqtt_hash`, amqtt's ``FileAuthPlugin``
  format ``user:hash``) and PBKDF2-SHA512 ``$7$`` for mosquitto 2 (:func:`mosquitto_hash`, what
  ``mosquitto_passwd`` writes). :func:`write_auth_files` makes every file a fleet needs.
- **Topic ACL** (:class:`TopicAcl`): user ``<site>`` may publish only on
  ``gbroker/v1/site/<site>/#`` (its last-will, its own alive topic, included) and subscribe to
  ``gbroker/v1/site/+/#``. Anonymous clients and wrong passwords are refused at CONNECT. A
  denied publication is dropped by both brokers without disconnecting the client (MQTT 3.1.1
  has no negative PUBACK): it reaches no subscriber and is not retained. A denied subscription
  is refused in the SUBACK.
- **amqtt's gaps, closed in front of it.** amqtt 0.12 checks neither the will topic against the
  publish ACL nor credentials before acting on a CONNECT's client id: an anonymous client that
  connects as ``gbroker-b`` is refused, but only after amqtt has dropped b's session and its
  subscriptions, so b hears nothing more and does not notice. A site could also take another
  site's client id over. :class:`EmbeddedBroker` therefore reads each CONNECT itself and
  hands amqtt only connections whose password, client id and will topic pass; the others get
  a CONNACK refusal (4: bad user name or password; 2: identifier rejected; 5: not
  authorized). mosquitto 2.0 authenticates before it touches a session and drops a will whose
  topic its ACL denies when the will fires (it admits the connection); it cannot tie client ids
  to users, so there a site with valid credentials could still take over another's id.

TLS: an ``mqtts://`` URL (port 8883 by default) makes a link verify the MQTT broker against the
``tls_context`` it is given (:func:`gbroker.tls.client_context` with the fleet CA), else against
the system's CAs; an :class:`EmbeddedBroker` given an ``ssl_context`` listens with TLS.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import secrets
import ssl
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import unquote, urlsplit

import aiomqtt
import yaml
from pwdlib import PasswordHash
from pwdlib.exceptions import UnknownHashError
from pwdlib.hashers.argon2 import Argon2Hasher

from dcsmon.view import NeighbourhoodView
from gbroker.auth import write_private
from gbroker.core.model import Observation, SiteState
from gbroker.daemon import wire
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from netmon.table import ForecastTable, TableFeed

__all__ = [
    "TOPIC_ROOT",
    "AuthFiles",
    "EmbeddedBroker",
    "LinkError",
    "Liveness",
    "MonitorLink",
    "NetmonUpdate",
    "SiteLink",
    "SiteUpdate",
    "StateUpdate",
    "TopicAcl",
    "Updates",
    "ViewFeed",
    "alive_topic",
    "amqtt_hash",
    "client_id_allowed",
    "events_topic",
    "keep_publishing",
    "mosquitto_config",
    "mosquitto_hash",
    "netmon_topic",
    "new_password",
    "parse_site_topic",
    "read_amqtt_password_file",
    "read_password_file",
    "state_topic",
    "write_auth_files",
]

log = logging.getLogger(__name__)

_AMQTT_HASHER: Final = PasswordHash((Argon2Hasher(time_cost=1, memory_cost=8192, parallelism=1),))

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


# --- access control ----------------------------------------------------------------------------


def client_id_allowed(username: str, client_id: str) -> bool:
    """Whether user ``username`` (a site) may connect as ``client_id``.

    ``gbroker-<site>`` is the site's broker; ``gbroker-<site>/<anything>`` its other clients.
    """
    own = f"gbroker-{username}"
    return client_id == own or client_id.startswith(own + "/")


def _topic_filters(value: object, field_name: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInput(field_name, "a non-empty list of MQTT topic filters", value)
    for item in value:
        try:
            aiomqtt.Wildcard(item)
        except (TypeError, ValueError):
            raise InvalidInput(field_name, "MQTT topic filters such as a/+/#", item) from None
    return tuple(value)


@dataclass(frozen=True, slots=True)
class TopicAcl:
    """Which topics each MQTT user may publish on and subscribe to (MQTT topic filters).

    A user missing from a table may do nothing of that kind. :meth:`for_sites` gives the
    fleet's rule; the file form (:meth:`load`, :meth:`save`) is YAML::

        publish: {a: ["gbroker/v1/site/a/#"], ...}
        subscribe: {a: ["gbroker/v1/site/+/#"], ...}
    """

    publish: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    subscribe: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def for_sites(cls, sites: Iterable[str]) -> TopicAcl:
        """Each site publishes under its own topics only and reads every site's."""
        names = sorted({_check_site(s) for s in sites})
        return cls(
            publish={s: (f"{TOPIC_ROOT}/{s}/#",) for s in names},
            subscribe={s: (f"{TOPIC_ROOT}/+/#",) for s in names},
        )

    def may_publish(self, username: str, topic: str) -> bool:
        """Whether ``username`` may publish (or leave a last-will) on ``topic``."""
        try:
            parsed = aiomqtt.Topic(topic)
        except (TypeError, ValueError):
            return False
        return any(parsed.matches(f) for f in self.publish.get(username, ()))

    @classmethod
    def load(cls, path: str | Path) -> TopicAcl:
        """Read an ACL file; InvalidInput names the file and the entry that is wrong."""
        try:
            document = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            raise InvalidInput(str(path), "a YAML ACL file", str(exc)[:200]) from exc
        if not isinstance(document, dict) or set(document) - {"publish", "subscribe"}:
            raise InvalidInput(str(path), "a mapping with 'publish' and 'subscribe'", document)
        tables: dict[str, dict[str, tuple[str, ...]]] = {}
        for kind in ("publish", "subscribe"):
            table = document.get(kind) or {}
            if not isinstance(table, dict):
                raise InvalidInput(f"{path}: {kind}", "a mapping of user to topic filters", table)
            tables[kind] = {
                str(user): _topic_filters(filters, f"{path}: {kind}.{user}")
                for user, filters in table.items()
            }
        return cls(tables["publish"], tables["subscribe"])

    def save(self, path: str | Path) -> None:
        document = {
            "publish": {u: list(f) for u, f in self.publish.items()},
            "subscribe": {u: list(f) for u, f in self.subscribe.items()},
        }
        Path(path).write_text(yaml.safe_dump(document, sort_keys=True))

    def amqtt_plugin_config(self) -> dict[str, Any]:
        """The config of amqtt 0.12's ``TopicAccessControlListPlugin`` (``acl``: subscribe)."""
        return {
            "publish_acl": {u: list(f) for u, f in self.publish.items()},
            "acl": {u: list(f) for u, f in self.subscribe.items()},
        }


def new_password() -> str:
    """A fresh random MQTT password (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def amqtt_hash(password: str) -> str:
    """An Argon2 hash, as amqtt's ``FileAuthPlugin`` reads it (``user:<this>`` lines).

    The passwords are random 256-bit tokens, not guessable words, so the hash need not be slow;
    small Argon2 costs keep each connection's two checks (ours and amqtt's) to milliseconds.
    """
    return _AMQTT_HASHER.hash(password)


def _amqtt_password_ok(password: str, hashed: str) -> bool:
    """Whether ``password`` matches an :func:`amqtt_hash`; a malformed hash matches nothing."""
    try:
        return _AMQTT_HASHER.verify(password, hashed)
    except UnknownHashError:
        return False


def mosquitto_hash(password: str, *, iterations: int = 101, salt: bytes | None = None) -> str:
    """mosquitto 2's password hash: ``$7$<iterations>$<base64 salt>$<base64 PBKDF2-SHA512>``.

    The format ``mosquitto_passwd`` writes (12-byte salt, 64-byte key, 101 iterations by
    default), so the fleet needs no mosquitto tools besides the broker itself.
    """
    salt = os.urandom(12) if salt is None else salt
    key = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    encode = base64.b64encode
    return f"$7${iterations}${encode(salt).decode()}${encode(key).decode()}"


def read_password_file(path: str | Path) -> str:
    """The password in ``path`` (its first line). It must not be readable by others."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(str(path), "a readable MQTT password file", exc.strerror) from exc
    if mode & 0o077:
        raise InvalidInput(
            str(path), "a password file only its owner may read (chmod 600)", oct(mode & 0o777)
        )
    password = text.strip().partition("\n")[0].strip()
    if not password:
        raise InvalidInput(str(path), "an MQTT password on its first line", "an empty file")
    return password


def read_amqtt_password_file(path: str | Path) -> dict[str, str]:
    """``user -> hash`` from a ``user:hash`` file (amqtt's ``FileAuthPlugin`` format)."""
    path = Path(path)
    users: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidInput(str(path), "a readable password file", exc.strerror) from exc
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed.startswith("$argon2"):
            raise InvalidInput(f"{path}:{number}", "user:<argon2 hash>", line[:40])
        users[user] = hashed
    if not users:
        raise InvalidInput(str(path), "at least one user:<argon2 hash> line", "no users")
    return users


@dataclass(frozen=True, slots=True)
class AuthFiles:
    """The MQTT credential files of a fleet, made by :func:`write_auth_files`."""

    directory: Path
    sites: tuple[str, ...]

    def password_file(self, site: str) -> Path:
        """``<site>.password``: the site's own password, for its broker and its monitors."""
        return self.directory / f"{_check_site(site)}.password"

    @property
    def amqtt_passwords(self) -> Path:
        """``passwords``: ``site:<argon2 hash>`` lines, for ``gbroker mqtt-serve``."""
        return self.directory / "passwords"

    @property
    def acl(self) -> Path:
        """``acl.yaml``: the :class:`TopicAcl`, for ``gbroker mqtt-serve``."""
        return self.directory / "acl.yaml"

    @property
    def mosquitto_passwords(self) -> Path:
        """``mosquitto.passwd``: ``site:$7$...`` lines, mosquitto's ``password_file``."""
        return self.directory / "mosquitto.passwd"

    @property
    def mosquitto_acl(self) -> Path:
        """``mosquitto.acl``: mosquitto's ``acl_file`` (one pattern for every site)."""
        return self.directory / "mosquitto.acl"


_MOSQUITTO_ACL: Final = f"""\
# Written by gbroker. A user is a site: it publishes under its own topics only
# (its last-will included) and reads every site's.
pattern write {TOPIC_ROOT}/%u/#
pattern read {TOPIC_ROOT}/+/#
"""


def write_auth_files(directory: str | Path, sites: Iterable[str]) -> AuthFiles:
    """Make a fresh password for every site and every file a fleet's MQTT broker needs.

    ``directory`` is created 0700; every file in it is 0600. Returns where each file is.
    """
    names = tuple(sorted({_check_site(s) for s in sites}))
    if not names:
        raise InvalidInput("sites", "at least one site", "none")
    files = AuthFiles(Path(directory), names)
    files.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files.directory.chmod(0o700)
    passwords = {site: new_password() for site in names}
    for site, password in passwords.items():
        write_private(files.password_file(site), password + "\n")
    write_private(
        files.amqtt_passwords, "".join(f"{s}:{amqtt_hash(p)}\n" for s, p in passwords.items())
    )
    write_private(
        files.mosquitto_passwords,
        "".join(f"{s}:{mosquitto_hash(p)}\n" for s, p in passwords.items()),
    )
    write_private(files.acl, "")
    TopicAcl.for_sites(names).save(files.acl)
    write_private(files.mosquitto_acl, _MOSQUITTO_ACL)
    return files


def mosquitto_config(port: int, files: AuthFiles | None, host: str = "127.0.0.1") -> str:
    """A mosquitto 2 config: one listener, run as the current user; with ``files``, no
    anonymous clients, the fleet's passwords and ACL. Without ``files`` anyone may connect
    (tests of other things)."""
    import pwd

    # Started as root, mosquitto switches to the user named here (by default "mosquitto", who
    # cannot read the fleet's 0600 files); as anyone else it stays who it is.
    owner = pwd.getpwuid(os.getuid()).pw_name
    lines = [f"listener {port} {host}", "persistence false", f"user {owner}", "log_dest stderr"]
    lines += ["log_type error", "log_type warning"]
    if files is None:
        lines.append("allow_anonymous true")
    else:
        lines.append("allow_anonymous false")
        # Absolute: mosquitto resolves paths against its working directory, not the config's.
        lines.append(f"password_file {files.mosquitto_passwords.resolve()}")
        lines.append(f"acl_file {files.mosquitto_acl.resolve()}")
    return "\n".join(lines) + "\n"


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
        self.site = _check_site(site)
        self.neighbours = tuple(sorted({_check_site(n) for n in neighbours}))
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
        self.site = _check_site(site)
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
            or not await asyncio.to_thread(_amqtt_password_ok, password, hashed)
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
            _short(username or ""),
            _short(client_id),
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
            if self._password_file is not None:
                self._password_file.unlink(missing_ok=True)
                self._password_file = None
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
