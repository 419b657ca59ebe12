"""MQTT accounts: per-site passwords, the topic ACL, and the files a fleet gives its MQTT broker.

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
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiomqtt
import yaml
from pwdlib import PasswordHash
from pwdlib.exceptions import UnknownHashError
from pwdlib.hashers.argon2 import Argon2Hasher

from gbroker.errors import InvalidInput
from gbroker.mqtt.topics import TOPIC_ROOT, check_site
from gbroker.security.auth import write_private

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
        names = sorted({check_site(s) for s in sites})
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


def amqtt_password_ok(password: str, hashed: str) -> bool:
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
        return self.directory / f"{check_site(site)}.password"

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
    names = tuple(sorted({check_site(s) for s in sites}))
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


_AMQTT_HASHER: Final = PasswordHash((Argon2Hasher(time_cost=1, memory_cost=8192, parallelism=1),))
