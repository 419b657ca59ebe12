"""Authentication: client tokens say *who* asks, peer signatures say *which site* speaks.

Theory of operation (ARCHITECTURE §10, docs/SECURITY.md).

**Client tokens.** Every client request carries ``Authorization: Bearer <token>``; a broker never
serves its client API without one, loopback included. :class:`Tokens` maps tokens to
:class:`User` s. It is read from a token file, one user a line::

    # name   token                                   [admin]
    alice    4f6c...e1
    ops      9b2a...07                               admin

(``#`` starts a comment; a token is 16 to 256 printable ASCII characters without spaces). With no
token file configured, a broker uses ``<data dir>/tokens``, and creates it (mode 0600) with one
generated admin token the first time, as Jupyter does, and logs where it is; ``$GBROKER_TOKEN``
instead names a single admin token. Tokens are compared as bytes in constant time
(:func:`same_secret`), so a token with non-ASCII characters is simply wrong, never an error.
A job belongs to its submitter: only that user, or an admin, sees it, cancels it or reads its
output.

**Peer signatures.** Brokers of a fleet share a secret that never leaves them: instead of the
secret, each peer request carries its sender's site name, the site it is meant for, a timestamp,
a random nonce and an HMAC-SHA256 under the secret over all of them plus the method, the path
with its query and the sha256 of the body (:class:`PeerSigner`). The receiver
(:class:`PeerVerifier`) recomputes it with its *own* name as the receiver, and accepts a request
only from a site of its topology, meant for itself, at most :data:`MAX_SKEW` seconds old or
early, and never twice (it remembers the signatures it saw within the window). So a peer message
says which site sent it, and the driver lets a site speak only for jobs placed at it and an owner
only for its own jobs; a message captured on its way to one site is refused by every other (the
replay cache only stops it at the site it was meant for). The scheme is versioned
(:data:`SIGNATURE_VERSION`, signed too): a request of an older scheme, which named no receiver, is
refused with a 401 that says so. A NetMon probe's body is random bytes thrown away, so its signature
covers :data:`UNSIGNED_PAYLOAD` instead of the body's hash: the receiver never has to hold a
probe in memory to check it.

Nothing here reads a clock or draws randomness except through the ``clock`` and ``nonce``
arguments' defaults, so tests can pin both.
"""

from __future__ import annotations

import hashlib
import hmac
import os
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
    "PeerSigner",
    "PeerVerifier",
    "Tokens",
    "Unauthorized",
    "User",
    "bearer",
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
