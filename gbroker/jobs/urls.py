"""Staging URLs as a broker judges them at submission: which sources it fetches, which targets
it delivers to (pure: no DNS, no connection; :mod:`gbroker.daemon.urls` does the I/O).

:func:`check_source` parses a job's staging ``source`` and classifies it. A URL that is exactly a
topology peer's HTTP base + ``/files/<64 hex>`` is a ``peer`` source: the fleet's own file store,
where the fleet secret may be attached and the content is verified against the digest. Any
other source is ``public``: it must be ``http`` or ``https``, carry no user info, and if its
host is an IP literal that address must be public (:func:`is_public`) unless the broker allows
private sources. Anything else is an :class:`~gbroker.errors.InvalidInput` naming the field.

Other schemes are refused with the scheme named: ``ftp`` (an FTP server names the address of
its data connection itself, so pinning the control connection would not keep a download on
public addresses), ``file`` (the broker's own disk), ``gsiftp``, ``rns``, ``urn`` and the like.

Stage-out targets (:func:`check_target`) are ``http(s)`` URLs, checked as sources are, or
:data:`STORE_TARGET`, the executing site's own file store.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from yarl import URL

from gbroker.errors import InvalidInput

__all__ = [
    "MAX_URL_CHARS",
    "SCHEMES",
    "STORE_TARGET",
    "IPAddress",
    "Source",
    "SourceKind",
    "Target",
    "TargetKind",
    "check_source",
    "check_target",
    "is_public",
]

SCHEMES: Final = ("http", "https")
"""The schemes a broker fetches."""
STORE_TARGET: Final = "gbroker:store"
"""The stage-out target that keeps a file in the executing site's file store."""
# Why each refused scheme is refused, and what to write instead.
_SCHEME_HINTS: Final = {
    "ftp": "GBroker fetches no ftp: serve the file over https, or stage it from your machine "
    "with gbroker submit --upload FILE",
    "ftps": "GBroker fetches no ftps: serve the file over https",
    "file": "a file: URL names the broker's own disk: upload the file with gbroker submit "
    "--upload FILE",
    "gsiftp": "GBroker speaks no GridFTP: serve the file over https",
    "gbroker": f"the only gbroker: URL is the stage-out target {STORE_TARGET}",
}
MAX_URL_CHARS: Final = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_FILES = "/files/"
_HEX = frozenset("0123456789abcdef")


class SourceKind(StrEnum):
    """Where a staging source points."""

    PEER = "peer"  # a topology peer's file store: the fleet secret may go with the request
    PUBLIC = "public"  # anywhere else: public addresses only, never any credential


@dataclass(frozen=True, slots=True)
class Source:
    """A checked staging source.

    Attributes:
        url: the URL, normalised (lower-case scheme and host).
        kind: peer or public.
        host: the host to connect to (a name or an IP literal, without brackets).
        port: the port (the scheme's default when the URL names none).
        site: the peer whose file store it is (peer sources), else None.
        sha256: the content's digest (peer sources), else None.
    """

    url: URL
    kind: SourceKind
    host: str
    port: int
    site: str | None = None
    sha256: str | None = None


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is one a user's download may reach: globally routable unicast."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    )


def _parse(url: object, field: str) -> URL:
    expected = f"an http(s) URL of at most {MAX_URL_CHARS} characters"
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInput(field, expected, url)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise InvalidInput(field, "a URL without spaces or control characters", url)
    try:
        parsed = URL(url)
        port = parsed.port
    except (ValueError, TypeError) as exc:
        raise InvalidInput(field, expected, url) from exc
    if parsed.scheme not in SCHEMES:
        scheme = parsed.scheme or "none"
        why = _SCHEME_HINTS.get(parsed.scheme, "a scheme GBroker does not stage")
        raise InvalidInput(
            field, f"a URL with scheme {' or '.join(SCHEMES)} (not {scheme}: {why})", url
        )
    if not parsed.host:
        raise InvalidInput(field, "a URL naming a host", url)
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise InvalidInput(field, "a URL without user info (no credentials in URLs)", url)
    if port is None or not 0 < port < 65536:
        raise InvalidInput(field, "a URL with a port from 1 to 65535", url)
    if parsed.raw_fragment:
        raise InvalidInput(field, "a URL without a fragment", url)
    return parsed


def _peer_file(url: URL, peers: Mapping[str, str]) -> tuple[str, str] | None:
    """(site, sha256) when ``url`` is exactly a peer's base + /files/<64 lowercase hex>."""
    for site, base in peers.items():
        try:
            root = URL(base.rstrip("/"))
        except (ValueError, TypeError):
            continue
        prefix = root.raw_path.rstrip("/") + _FILES
        if (
            (url.scheme, url.host, url.port) == (root.scheme, root.host, root.port)
            and not url.raw_query_string
            and url.raw_path.startswith(prefix)
        ):
            digest = url.raw_path[len(prefix) :]
            if len(digest) == 64 and set(digest) <= _HEX:
                return site, digest
    return None


def check_source(
    url: object, *, allow_private: bool, peers: Mapping[str, str], field: str = "source"
) -> Source:
    """Parse and classify a staging source (see the module docstring); pure, no DNS.

    ``peers`` maps each topology site to its HTTP base URL. A public source whose host is an
    IP literal is refused here when that address is not public (unless ``allow_private``); a
    host name is checked when it is resolved (:func:`resolve_public`).

    Raises:
        InvalidInput: naming ``field`` and what was expected.
    """
    parsed = _parse(url, field)
    host = parsed.host
    port = parsed.port
    assert host is not None  # checked by _parse
    assert port is not None
    peer = _peer_file(parsed, peers)
    if peer is not None:
        return Source(parsed, SourceKind.PEER, host, port, site=peer[0], sha256=peer[1])
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and not allow_private and not is_public(literal):
        raise InvalidInput(field, "a URL of a public host (not loopback, private, ...)", url)
    return Source(parsed, SourceKind.PUBLIC, host, port)


class TargetKind(StrEnum):
    """Where a stage-out target points."""

    STORE = "store"  # the executing site's own file store
    PUBLIC = "public"  # an http(s) URL: one PUT, public addresses only, never any credential


@dataclass(frozen=True, slots=True)
class Target:
    """A checked stage-out target: :data:`STORE_TARGET`, or an http(s) URL (``url``,
    ``host``, ``port`` as for a :class:`Source`)."""

    kind: TargetKind
    url: URL | None = None
    host: str = ""
    port: int = 0

    def as_source(self) -> Source:
        assert self.url is not None
        return Source(self.url, SourceKind.PUBLIC, self.host, self.port)


def check_target(url: object, *, allow_private: bool, field: str = "target") -> Target:
    """Parse and classify a stage-out target; pure, no DNS (as :func:`check_source`).

    Raises:
        InvalidInput: naming ``field``: the scheme when it is neither http(s) nor the store.
    """
    if url == STORE_TARGET:
        return Target(TargetKind.STORE)
    if isinstance(url, str) and url.startswith("gbroker:"):
        raise InvalidInput(field, f"the store target {STORE_TARGET} or an http(s) URL", url)
    try:
        source = check_source(url, allow_private=allow_private, peers={}, field=field)
    except InvalidInput as exc:
        expected = exc.expected.replace("http or https", f"http or https, or {STORE_TARGET}", 1)
        raise InvalidInput(field, expected, exc.found) from exc
    return Target(TargetKind.PUBLIC, source.url, source.host, source.port)
