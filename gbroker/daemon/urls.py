"""Staging URLs: which a broker fetches job input from, delivers output to, and how, safely.

Theory of operation. A job's staging ``source`` is a URL the *user* chose, fetched by the
*broker*, from inside the fleet's network: without care it is a way to read the cloud metadata
service, a neighbour's admin port or our own ``/metrics`` (server-side request forgery). So:

1. :func:`check_source` (pure) parses the URL and classifies it. A URL that is exactly a
   topology peer's HTTP base + ``/files/<64 hex>`` is a ``peer`` source: our own file store,
   where the fleet secret may be attached and the content is verified against the digest. Any
   other source is ``public``: it must be ``http`` or ``https``, carry no user info, and if its
   host is an IP literal that address must be public. Anything else is an
   :class:`~gbroker.errors.InvalidInput` naming the field, at submission.
2. A public source's host name is resolved by :func:`resolve_public` (``loop.getaddrinfo``);
   *every* address must be public (not loopback, link-local, private, multicast, unspecified,
   reserved, or otherwise not globally routable; IPv4-mapped IPv6 is judged as the IPv4 it
   maps), unless the operator allows private sources. It returns the checked addresses, and
   the connection is made to exactly those (:class:`PinnedResolver`), so a second DNS answer
   cannot point the download elsewhere (DNS rebinding).
3. :func:`fetch` streams the body to a file under a size cap (``max_bytes``, checked against
   Content-Length first and then as bytes arrive), does not follow redirects (a redirect could
   lead anywhere), and for a peer source checks the sha256.

``allow_private`` is for fleets on one host or one LAN (tests, a lab), where public sources
on private addresses are expected; peer sources are always allowed (the topology is trusted).

Other schemes are refused at submission with the scheme named: ``ftp`` (an FTP server names
the address of its data connection itself, so pinning the control connection would not keep a
download on public addresses, and no asyncio FTP client we would trust does that check),
``file`` (the broker's own disk), ``gsiftp``, ``rns`` and the like.

Stage-out targets (:func:`check_target`) are ``http(s)`` URLs, checked and pinned as sources
are, to which the file is sent with one ``PUT`` (:func:`deliver`; no redirects, no
credentials), or :data:`STORE_TARGET`, the executing site's own file store, from which
``gbroker output --file NAME JOB`` reads it back. :func:`head_size` learns an input's size up
front (a ``HEAD``, under the same rules), so F(j) counts its transfer.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from ssl import SSLContext
from typing import Any, BinaryIO, Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from gbroker.errors import InvalidInput

__all__ = [
    "MAX_URL_CHARS",
    "SCHEMES",
    "STORE_TARGET",
    "PinnedResolver",
    "Source",
    "SourceKind",
    "Target",
    "check_source",
    "check_target",
    "deliver",
    "exists",
    "fetch",
    "head_size",
    "is_public",
    "resolve_public",
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
GetAddrInfo = Callable[..., Awaitable[list[tuple[Any, ...]]]]

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


async def _public_session(
    source: Source,
    *,
    allow_private: bool,
    field: str,
    timeout: float,
    getaddrinfo: GetAddrInfo | None,
    ssl: SSLContext | None = None,
) -> aiohttp.ClientSession:
    """A session that reaches ``source``'s host at checked addresses only (or a peer, with
    ``ssl``: the fleet CA)."""
    if source.kind is SourceKind.PEER:
        connector = aiohttp.TCPConnector(ssl=ssl or True)
    else:
        addresses = await resolve_public(
            source.host,
            source.port,
            allow_private=allow_private,
            field=field,
            getaddrinfo=getaddrinfo,
        )
        connector = aiohttp.TCPConnector(
            resolver=PinnedResolver(source.host, addresses), use_dns_cache=False
        )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


async def head_size(
    source: Source,
    *,
    allow_private: bool,
    peer_headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    field: str = "source",
    getaddrinfo: GetAddrInfo | None = None,
    ssl: SSLContext | None = None,
) -> int | None:
    """The size of ``source`` as a ``HEAD`` request's Content-Length says (None: it does not
    say, or the server takes no HEAD).

    Raises:
        InvalidInput: naming ``field``: a host that does not resolve or is not public, or an
            answer that the file is not there (4xx other than 405, or a redirect).
        aiohttp.ClientError, OSError, TimeoutError: no answer.
    """
    headers = peer_headers if source.kind is SourceKind.PEER and peer_headers else {}
    async with asyncio.timeout(timeout):  # the name's resolution included
        async with (
            await _public_session(
                source,
                allow_private=allow_private,
                field=field,
                timeout=timeout,
                getaddrinfo=getaddrinfo,
                ssl=ssl,
            ) as session,
            session.head(source.url, headers=headers, allow_redirects=False) as response,
        ):
            if response.status in (405, 501):  # no HEAD here: the size stays unknown
                return None
            if response.status != 200:
                raise InvalidInput(
                    field,
                    "a URL that answers 200 (redirects are not followed)",
                    f"{source.url.host}: HTTP {response.status}",
                )
            return response.content_length


async def exists(
    target: Target,
    *,
    allow_private: bool,
    timeout: float = 30.0,
    field: str = "target",
    getaddrinfo: GetAddrInfo | None = None,
) -> bool:
    """Whether an http(s) target already holds a file (a ``HEAD`` answered 200)."""
    async with (
        await _public_session(
            target.as_source(),
            allow_private=allow_private,
            field=field,
            timeout=timeout,
            getaddrinfo=getaddrinfo,
        ) as session,
        session.head(target.as_source().url, allow_redirects=False) as response,
    ):
        return response.status == 200


async def deliver(
    target: Target,
    body: BinaryIO,
    size: int,
    *,
    allow_private: bool,
    timeout: float = 300.0,
    field: str = "target",
    getaddrinfo: GetAddrInfo | None = None,
) -> None:
    """Send ``size`` bytes of the open file ``body`` to an http(s) target with one ``PUT``.

    Raises:
        InvalidInput: naming ``field``: refused host, or an answer other than 2xx (a redirect
            is not followed).
        aiohttp.ClientError, OSError, TimeoutError: the transfer itself failed.
    """
    source = target.as_source()
    async with await _public_session(
        source,
        allow_private=allow_private,
        field=field,
        timeout=timeout,
        getaddrinfo=getaddrinfo,
    ) as session:
        headers = {"Content-Length": str(size)}
        async with session.put(
            source.url, data=body, headers=headers, allow_redirects=False
        ) as response:
            if not 200 <= response.status < 300:
                raise InvalidInput(
                    field,
                    "a URL that takes a PUT (2xx; redirects are not followed)",
                    f"{target.host}: HTTP {response.status}",
                )


async def resolve_public(
    host: str,
    port: int,
    *,
    allow_private: bool,
    field: str = "source",
    getaddrinfo: GetAddrInfo | None = None,
) -> list[IPAddress]:
    """The addresses of ``host``, each checked; connect to these and no others.

    Every address must be public (:func:`is_public`) unless ``allow_private``: one private
    answer among public ones refuses the host (a resolver that answers both is hostile).
    ``getaddrinfo`` defaults to the running loop's.

    Raises:
        InvalidInput: the host does not resolve, or resolves to a non-public address.
    """
    lookup = getaddrinfo or asyncio.get_running_loop().getaddrinfo
    try:
        infos = await lookup(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise InvalidInput(field, "a URL whose host resolves", host) from exc
    addresses: list[IPAddress] = []
    for info in infos:
        # sockaddr[0] may carry an IPv6 scope ("fe80::1%eth0"): link-local, never public.
        text = str(info[4][0]).split("%", 1)[0]
        address = ipaddress.ip_address(text)
        if not allow_private and not is_public(address):
            raise InvalidInput(
                field, "a URL of a public host (not loopback, private, ...)", f"{host} -> {text}"
            )
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise InvalidInput(field, "a URL whose host resolves", host)
    return addresses


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that answers for one host with addresses checked beforehand."""

    def __init__(self, host: str, addresses: Sequence[IPAddress]) -> None:
        self._host = host
        self._addresses = tuple(addresses)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self._host:
            raise OSError(f"{host}: not the host this download was checked for")
        return [
            {
                "hostname": host,
                "host": str(address),
                "port": port,
                "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in self._addresses
        ]

    async def close(self) -> None:
        return None


async def fetch(
    source: Source,
    target: Path,
    *,
    max_bytes: int,
    allow_private: bool,
    peer_headers: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    field: str = "source",
    getaddrinfo: GetAddrInfo | None = None,
    ssl: SSLContext | None = None,
) -> tuple[int, str]:
    """Download ``source`` into ``target``; (size, sha256 hex) of what was written.

    ``peer_headers`` (the sender's peer signature) are sent to peer sources only, over ``ssl``
    (the fleet CA) when the peer serves HTTPS. At most ``max_bytes``
    are accepted; redirects are refused; a peer source's content must match its digest. On any
    failure ``target`` is removed.

    Raises:
        InvalidInput: naming ``field``: refused host, HTTP status other than 200, too large,
            wrong digest.
        aiohttp.ClientError, OSError, TimeoutError: the transfer itself failed.
    """
    headers: Mapping[str, str] = {}
    if source.kind is SourceKind.PEER:
        headers = peer_headers or {}
    digest = hashlib.sha256()
    size = 0
    try:
        async with (
            await _public_session(
                source,
                allow_private=allow_private,
                field=field,
                timeout=timeout,
                getaddrinfo=getaddrinfo,
                ssl=ssl,
            ) as session,
            session.get(source.url, headers=headers, allow_redirects=False) as response,
        ):
            if response.status != 200:
                raise InvalidInput(
                    field,
                    "a URL that answers 200 (redirects are not followed)",
                    f"{source.url.host}: HTTP {response.status}",
                )
            length = response.content_length
            if length is not None and length > max_bytes:
                raise InvalidInput(field, f"a file of at most {max_bytes} bytes", length)
            with target.open("wb") as out:
                async for chunk in response.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > max_bytes:
                        raise InvalidInput(
                            field, f"a file of at most {max_bytes} bytes", f"more than {max_bytes}"
                        )
                    digest.update(chunk)
                    out.write(chunk)
        if source.sha256 is not None and digest.hexdigest() != source.sha256:
            raise InvalidInput(field, f"content with sha256 {source.sha256}", digest.hexdigest())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()
