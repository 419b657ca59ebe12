"""Staging URLs: which a broker fetches job input from, delivers output to, and how, safely.

Theory of operation. A job's staging ``source`` is a URL the *user* chose, fetched by the
*broker*, from inside the fleet's network: without care it is a way to read the cloud metadata
service, a neighbour's admin port or our own ``/metrics`` (server-side request forgery). So:

1. :func:`~gbroker.jobs.urls.check_source` (pure, in :mod:`gbroker.jobs.urls`, where
   ``gbroker jsdl check`` uses it too) parses the URL and classifies it: a ``peer`` source (a
   topology peer's ``/files/<sha256>``) or a ``public`` one (``http``/``https``, no user
   info, an IP literal only if public). Anything else is an
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

Other schemes are refused at submission with the scheme named (:mod:`gbroker.jobs.urls` says
why each).

Stage-out targets (:func:`~gbroker.jobs.urls.check_target`) are ``http(s)`` URLs, checked
and pinned as sources are, to which the file is sent with one ``PUT`` (:func:`deliver`; no
redirects, no credentials), or :data:`STORE_TARGET`, the executing site's own file store, from
which ``gbroker output --file NAME JOB`` reads it back. :func:`head_size` learns an input's size
up front (a ``HEAD``, under the same rules), so F(j) counts its transfer.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from ssl import SSLContext
from typing import Any, BinaryIO

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from gbroker.errors import InvalidInput
from gbroker.jobs.urls import (
    MAX_URL_CHARS,
    SCHEMES,
    STORE_TARGET,
    IPAddress,
    Source,
    SourceKind,
    Target,
    TargetKind,
    check_source,
    check_target,
    is_public,
)

__all__ = [
    "MAX_URL_CHARS",
    "SCHEMES",
    "STORE_TARGET",
    "PinnedResolver",
    "Source",
    "SourceKind",
    "Target",
    "TargetKind",
    "check_source",
    "check_target",
    "deliver",
    "exists",
    "fetch",
    "head_size",
    "is_public",
    "resolve_public",
]

GetAddrInfo = Callable[..., Awaitable[list[tuple[Any, ...]]]]


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
