"""Authentication: client tokens say *who* asks, peer signatures say *which site* speaks.

Theory of operation (ARCHITECTURE §10, docs/SECURITY.md).

**Client tokens.** Every client request carries ``Authorization: Bearer <token>``; a broker never
serves its client API without one, loopback included. :class:`Tokens` maps tokens to
:class:`User` s, read from a token file (one ``name token [admin]`` a line) or ``$GBROKER_TOKEN``;
with neither, a broker makes ``<data dir>/tokens`` with one admin token, as Jupyter does. Tokens
are compared as bytes in constant time (:func:`same_secret`). A job belongs to its submitter:
only that user, or an admin, sees it, cancels it or reads its output.

**Users come and go while brokers run.** A :class:`TokenFile` looks at the file's ``stat`` on
every authentication and reads it again when it changed, so :func:`add_user` and
:func:`remove_user` take effect at the next request, with no restart. They change the file *in
place* under an exclusive ``flock`` (readers take a shared one), because a container fleet
bind-mounts the single file and a rename would not be seen through that mount; each change
moves the mtime forward by at least a nanosecond, so two changes within one tick of the file
system's clock are not mistaken for none. A file that no longer reads leaves the broker on the
users it last read, and says so in its log.

**Peer signatures.** Brokers of a fleet share a secret that never leaves them: each peer request
carries its sender's site, the site it is meant for, a timestamp, a nonce and an HMAC-SHA256
under the secret over them and the request (:class:`PeerSigner`). The receiver
(:class:`PeerVerifier`) accepts it only from a site of its topology, meant for itself, within
:data:`MAX_SKEW` and never twice: so a peer message says which site sent it, and one captured on
its way to one site is refused by every other. A NetMon probe's signature covers
:data:`UNSIGNED_PAYLOAD` instead of its random body, so the receiver never holds a probe in
memory to check it.

Nothing here reads a clock or draws randomness except through the ``clock`` and ``nonce``
arguments' defaults, so tests can pin both.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from gbroker.errors import GBrokerError, InvalidInput

__all__ = [
    "MAX_SKEW",
    "SIGNATURE_HEADERS",
    "SIGNATURE_VERSION",
    "UNSIGNED_PAYLOAD",
    "USER_NAME",
    "PeerSigner",
    "PeerVerifier",
    "TokenFile",
    "Tokens",
    "Unauthorized",
    "User",
    "add_user",
    "bearer",
    "read_users",
    "remove_user",
    "same_secret",
    "write_private",
]

MAX_SKEW = 60.0
"""Seconds a peer request's timestamp may differ from the receiver's clock."""

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
"""What a probe's signature covers instead of its body's sha256."""

SIGNATURE_VERSION = 2
"""The peer signature's scheme: 2 names the receiver (``X-GBroker-To``); 1, before it, did not.
Sent as ``X-GBroker-Signature-Version`` and covered by the HMAC."""

SITE_HEADER = "X-GBroker-Site"
RECEIVER_HEADER = "X-GBroker-To"
VERSION_HEADER = "X-GBroker-Signature-Version"
TIME_HEADER = "X-GBroker-Time"
NONCE_HEADER = "X-GBroker-Nonce"
SIGNATURE_HEADER = "X-GBroker-Signature"
SIGNATURE_HEADERS = (
    SITE_HEADER,
    RECEIVER_HEADER,
    VERSION_HEADER,
    TIME_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
)

_MIN_TOKEN, _MAX_TOKEN = 16, 256

USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
"""A user name :func:`add_user` accepts: what ``useradd`` accepts by default (a lower-case letter
or ``_``, then letters, digits, ``_`` and ``-``; at most 32), so the same name can be an account
in a site's map."""

log = logging.getLogger("gbroker.security")


class Unauthorized(GBrokerError):
    """A request without valid credentials: answered 401 with this (short) reason."""


def same_secret(presented: str | bytes | None, expected: str | bytes) -> bool:
    """Constant-time comparison of two credentials as UTF-8 bytes: any text (non-ASCII, lone
    surrogates) or a missing one (None) is a match or not, never an error."""
    if presented is None:
        return False
    a = presented.encode("utf-8", "surrogateescape") if isinstance(presented, str) else presented
    b = expected.encode("utf-8", "surrogateescape") if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


def write_private(path: Path, data: str | bytes, *, exclusive: bool = False) -> None:
    """Write a credential to ``path``, readable by its owner only (0600 from the first byte;
    a file that existed is made 0600 too). ``exclusive``: never replace one (FileExistsError)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    descriptor = os.open(path, flags, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)


def bearer(token: str) -> dict[str, str]:
    """The header that presents ``token``."""
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True, slots=True)
class User:
    name: str
    admin: bool = False

    def may_see(self, owner: str | None) -> bool:
        """Whether this user may see (cancel, read the output of) a job submitted by ``owner``."""
        return self.admin or owner == self.name


def _check_token(token: str, where: str) -> str:
    if not (_MIN_TOKEN <= len(token) <= _MAX_TOKEN) or not all(33 <= ord(c) < 127 for c in token):
        raise InvalidInput(
            where, f"a token of {_MIN_TOKEN}-{_MAX_TOKEN} printable ASCII characters"
        )
    return token


class Tokens:
    """Who holds which client token."""

    def __init__(self, users: Mapping[str, User]) -> None:
        if not users:
            raise InvalidInput("tokens", "at least one user")
        self._users = {token.encode(): user for token, user in users.items()}

    def __iter__(self) -> Iterator[User]:
        return iter(self._users.values())

    def first_token(self) -> str:
        """An admin's token if there is one, else the first user's (what a local client uses)."""
        admins = [token for token, user in self._users.items() if user.admin]
        return (admins or list(self._users))[0].decode()

    def identify(self, authorization: str | None) -> User | None:
        """The user an ``Authorization`` header presents, or None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        presented = authorization[len("Bearer ") :].strip().encode("utf-8", "surrogateescape")
        found: User | None = None
        for token, user in self._users.items():  # every entry, so the time says nothing
            if hmac.compare_digest(presented, token):
                found = user
        return found

    def _users_by_token(self) -> dict[str, User]:
        return {token.decode(): user for token, user in self._users.items()}

    @classmethod
    def single(cls, token: str, name: str = "admin") -> Tokens:
        """One admin token (``$GBROKER_TOKEN``)."""
        return cls({_check_token(token, "GBROKER_TOKEN"): User(name, admin=True)})

    @classmethod
    def parse(cls, text: str, source: str) -> Tokens:
        users: dict[str, User] = {}
        names: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            where = f"{source}:{number}"
            if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2] != "admin"):
                raise InvalidInput(where, "NAME TOKEN [admin]", f"{len(fields)} fields")
            name, token = fields[0], _check_token(fields[1], where)
            if name in names or token in users:
                raise InvalidInput(where, "each name and token once", name)
            names.add(name)
            users[token] = User(name, admin=len(fields) == 3)
        if not users:
            raise InvalidInput(source, "at least one 'NAME TOKEN [admin]' line")
        return cls(users)

    @classmethod
    def load(cls, path: Path) -> Tokens:
        return cls.parse(path.read_text(), str(path))

    @staticmethod
    def create(path: Path, name: str = "admin") -> str:
        """Write a new token file (0600) holding one generated admin token; return the token."""
        token = secrets.token_hex(24)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f"# GBroker client tokens: NAME TOKEN [admin]\n{name} {token} admin\n"
        write_private(path, text, exclusive=True)
        return token


_Stamp = tuple[int, int, int, int, int]


def _stamp(info: os.stat_result) -> _Stamp:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class TokenFile(Tokens):
    """The tokens of a file, read again whenever the file changes (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: _Stamp | None = None
        text, self._stamp = self._read()
        super().__init__(Tokens.parse(text, str(path))._users_by_token())

    def _read(self) -> tuple[str, _Stamp]:
        with open(self.path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH)  # a writer's change is whole or not begun
            return f.read().decode("utf-8", "surrogateescape"), _stamp(os.fstat(f.fileno()))

    def refresh(self) -> None:
        """Read the file again if it changed since it was last read."""
        try:
            if _stamp(os.stat(self.path)) == self._stamp:
                return
            text, stamp = self._read()
            users = Tokens.parse(text, str(self.path))._users_by_token()
        except (OSError, InvalidInput) as exc:
            log.error("client tokens: %s: %s; still serving the users last read", self.path, exc)
            self._stamp = None  # try again on the next request
            return
        self._users = {token.encode(): user for token, user in users.items()}
        self._stamp = stamp
        log.info("client tokens: read %s again: %d user(s)", self.path, len(users))

    def __iter__(self) -> Iterator[User]:
        self.refresh()
        return super().__iter__()

    def first_token(self) -> str:
        self.refresh()
        return super().first_token()

    def identify(self, authorization: str | None) -> User | None:
        self.refresh()
        return super().identify(authorization)


def _token_lines(text: str) -> list[tuple[str, str]]:
    """Each line of a token file with the name it gives a token ("" for a comment or a blank)."""
    return [(line, (line.split("#", 1)[0].split() or [""])[0]) for line in text.splitlines()]


def _change(path: Path, edit: Callable[[str], str]) -> None:
    """Rewrite a token file in place under an exclusive lock: ``edit`` maps its text to the new
    text (and raises to change nothing). Readers (:class:`TokenFile`) never see half of it."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = os.fstat(fd)
        text = os.pread(fd, before.st_size + 1, 0).decode("utf-8", "surrogateescape")
        data = edit(text).encode("utf-8", "surrogateescape")
        os.fchmod(fd, 0o600)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        # The mtime moves on even within one tick of the file system's coarse clock, so a
        # reader comparing stamps sees every change.
        moved = max(time.time_ns(), before.st_mtime_ns + 1)
        os.utime(fd, ns=(moved, moved))
        os.fsync(fd)
    finally:
        os.close(fd)  # and the lock with it


def read_users(path: Path) -> list[User]:
    """The users of a token file, in its order (never their tokens)."""
    return list(Tokens.load(path)._users.values())


def add_user(path: Path, name: str, *, admin: bool = False) -> str:
    """Give a new user ``name`` a generated token in the token file at ``path``; the token.

    Raises :class:`InvalidInput` for a name that is not a valid user name (:data:`USER_NAME`)
    or is already there; concurrent calls on one file all land (each under the file's lock).
    """
    if not USER_NAME.fullmatch(name):
        raise InvalidInput(
            "NAME",
            "a user name: a lower-case letter or _, then lower-case letters, digits, _ or -, "
            "at most 32",
            name,
        )
    token = secrets.token_hex(24)

    def edit(text: str) -> str:
        Tokens.parse(text, str(path))  # a file that does not read is left as it is
        if any(user == name for _, user in _token_lines(text)):
            raise InvalidInput("NAME", f"a user not yet in {path}", name)
        line = f"{name} {token}" + (" admin" if admin else "")
        return text + ("" if text.endswith("\n") or not text else "\n") + line + "\n"

    _change(path, edit)
    return token


def remove_user(path: Path, name: str) -> User:
    """Take user ``name`` out of the token file at ``path`` (their token stops working at
    once); the user removed. Raises :class:`InvalidInput` for a name not there, or for the
    file's last admin (a fleet needs one: ``fleet down`` asks every broker with it)."""
    removed: list[User] = []

    def edit(text: str) -> str:
        users = list(Tokens.parse(text, str(path))._users.values())
        found = [user for user in users if user.name == name]
        if not found:
            raise InvalidInput("NAME", f"a user of {path}", name)
        if found[0].admin and sum(user.admin for user in users) == 1:
            raise InvalidInput("NAME", "a user other than the last admin (add another first)", name)
        removed.extend(found)
        return "".join(f"{line}\n" for line, user in _token_lines(text) if user != name)

    _change(path, edit)
    return removed[0]


def _payload_hash(body: bytes | None) -> str:
    return UNSIGNED_PAYLOAD if body is None else hashlib.sha256(body).hexdigest()


def _signature(
    secret: bytes,
    site: str,
    receiver: str,
    at: str,
    nonce: str,
    method: str,
    target: str,
    body: str,
) -> str:
    fields = (f"gbroker-peer-{SIGNATURE_VERSION}", site, receiver, at, nonce, method.upper())
    message = "\n".join((*fields, target, body)).encode("utf-8", "surrogateescape")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class PeerSigner:
    """Signs this site's peer requests with the fleet secret."""

    def __init__(
        self,
        site: str,
        secret: str,
        clock: Callable[[], float] = time.time,
        nonce: Callable[[], str] = lambda: secrets.token_hex(12),
    ) -> None:
        self.site = site
        self._secret = secret.encode()
        self._clock = clock
        self._nonce = nonce

    def headers(
        self, method: str, target: str, body: bytes | None = b"", *, to: str
    ) -> dict[str, str]:
        """Headers for a request of ``method`` to site ``to``'s ``target`` (path and query) with
        ``body`` (None: a probe, whose body is not covered)."""
        at = f"{self._clock():.3f}"
        nonce = self._nonce()
        signature = _signature(
            self._secret, self.site, to, at, nonce, method, target, _payload_hash(body)
        )
        return {
            SITE_HEADER: self.site,
            RECEIVER_HEADER: to,
            VERSION_HEADER: str(SIGNATURE_VERSION),
            TIME_HEADER: at,
            NONCE_HEADER: nonce,
            SIGNATURE_HEADER: signature,
        }


class PeerVerifier:
    """Checks the peer requests site ``site`` receives: a known sender, meant for ``site``, a
    fresh timestamp, a signature never seen before."""

    def __init__(
        self,
        secret: str,
        sites: Collection[str],
        site: str,
        clock: Callable[[], float] = time.time,
        max_skew: float = MAX_SKEW,
    ) -> None:
        self._secret = secret.encode()
        self.sites = frozenset(sites)
        self.site = site
        self._clock = clock
        self.max_skew = max_skew
        self._seen: dict[str, float] = {}  # signature -> when it may be forgotten
        self._next_sweep = 0.0

    def verify(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> str:
        """The site that signed the request, or :class:`Unauthorized`."""
        site = headers.get(SITE_HEADER)
        at = headers.get(TIME_HEADER)
        nonce = headers.get(NONCE_HEADER, "")
        signature = headers.get(SIGNATURE_HEADER)
        if site is None or at is None or signature is None:
            raise Unauthorized("peer request without a site signature")
        if site not in self.sites:
            raise Unauthorized("peer request from a site outside the topology")
        version = headers.get(VERSION_HEADER)
        if version != str(SIGNATURE_VERSION):
            raise Unauthorized(
                f"peer request signed by scheme {(version or '1')[:8]!r}, not "
                f"{SIGNATURE_VERSION} (which names the receiver): is {site} an older GBroker?"
            )
        receiver = headers.get(RECEIVER_HEADER, "")
        if receiver != self.site:
            raise Unauthorized(
                f"peer request signed for site {receiver[:100]!r}, not for {self.site}"
            )
        if not 8 <= len(nonce) <= 64:
            raise Unauthorized("peer request without a nonce of 8-64 characters")
        now = self._clock()
        try:
            skew = abs(now - float(at))
        except ValueError:
            raise Unauthorized("peer request with an unreadable timestamp") from None
        if not skew <= self.max_skew:  # also refuses nan
            raise Unauthorized(f"peer request timestamp more than {self.max_skew:g} s off")
        expected = _signature(
            self._secret, site, self.site, at, nonce, method, target, _payload_hash(body)
        )
        if not same_secret(signature, expected):
            raise Unauthorized("peer request with a bad signature")
        if now >= self._next_sweep:
            self._seen = {s: t for s, t in self._seen.items() if t > now}
            self._next_sweep = now + self.max_skew
        if expected in self._seen:
            raise Unauthorized("peer request replayed")
        self._seen[expected] = now + 2 * self.max_skew
        return site
