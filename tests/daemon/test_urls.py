"""Staging sources (gbroker.daemon.urls): classification, resolution, pinned and capped fetches."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from gbroker.daemon.urls import (
    Source,
    SourceKind,
    check_source,
    fetch,
    resolve_public,
)
from gbroker.errors import InvalidInput

DIGEST = "ab" * 32
PEERS = {"s0": "http://127.0.0.1:8705", "s1": "https://peer.example.org:9443/"}
PUBLIC_REFUSED = "a URL of a public host"


# --- check_source: pure ---------------------------------------------------------------------------


def test_a_peers_file_store_url_is_a_peer_source() -> None:
    source = check_source(f"http://127.0.0.1:8705/files/{DIGEST}", allow_private=False, peers=PEERS)
    assert (source.kind, source.site, source.sha256) == (SourceKind.PEER, "s0", DIGEST)
    source = check_source(
        f"HTTPS://Peer.Example.org:9443/files/{DIGEST}", allow_private=False, peers=PEERS
    )
    assert (source.kind, source.site, source.host, source.port) == (
        SourceKind.PEER,
        "s1",
        "peer.example.org",
        9443,
    )


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:8705/files/{DIGEST.upper()}",  # not our digest syntax
        f"http://127.0.0.1:8705/files/{DIGEST}?x=1",  # a query is not a file store URL
        f"http://127.0.0.1:8705/files/{DIGEST}/more",
        f"http://127.0.0.1:8705/metrics?{DIGEST}",
        f"http://127.0.0.1:8706/files/{DIGEST}",  # another port
        f"http://localhost:8705/files/{DIGEST}",  # another host name, even if the same machine
    ],
)
def test_anything_else_on_a_peer_is_not_a_peer_source(url: str) -> None:
    # Allowed as a public source at most, which never gets the fleet secret.
    source = check_source(url, allow_private=True, peers=PEERS)
    assert (source.kind, source.site, source.sha256) == (SourceKind.PUBLIC, None, None)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///etc/passwd", "a URL with scheme http or https"),
        ("ftp://example.org/x", "a URL with scheme http or https"),
        ("gopher://example.org/x", "a URL with scheme http or https"),
        ("example.org/x", "a URL with scheme http or https"),
        ("http:///x", "a URL naming a host"),
        ("http://user:pw@example.org/x", "a URL without user info"),
        ("http://example.org:0/x", "a URL with a port from 1 to 65535"),
        ("http://example.org:99999/x", "an http(s) URL"),
        ("http://example.org/x#frag", "a URL without a fragment"),
        ("http://example.org/a b", "a URL without spaces or control characters"),
        ("http://example.org/\x00", "a URL without spaces or control characters"),
        ("", "an http(s) URL"),
        ("http://example.org/" + "x" * 3000, "an http(s) URL of at most 2048"),
        ("http://127.0.0.1:8705/metrics", PUBLIC_REFUSED),
        ("http://[::1]/x", PUBLIC_REFUSED),
        ("http://169.254.169.254/latest/meta-data/", PUBLIC_REFUSED),
        ("http://10.1.2.3/x", PUBLIC_REFUSED),
        ("http://192.168.0.1/x", PUBLIC_REFUSED),
        ("http://100.64.0.1/x", PUBLIC_REFUSED),  # shared address space (CGNAT)
        ("http://0.0.0.0:8705/x", PUBLIC_REFUSED),
        ("http://224.0.0.1/x", PUBLIC_REFUSED),
        ("http://240.0.0.1/x", PUBLIC_REFUSED),
        ("http://[::ffff:127.0.0.1]/x", PUBLIC_REFUSED),
        ("http://[fe80::1]/x", PUBLIC_REFUSED),
        ("http://[fc00::1]/x", PUBLIC_REFUSED),
    ],
)
def test_bad_sources_are_refused_naming_the_field(url: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_source(url, allow_private=False, peers=PEERS, field="staging[2].source")
    assert caught.value.field == "staging[2].source"
    assert caught.value.expected.startswith(expected)
    assert len(str(caught.value)) < 400


def test_public_sources_are_http_or_https_to_public_or_named_hosts() -> None:
    for url in ("https://example.org/data.bin", "http://93.184.216.34:8080/x?y=1"):
        source = check_source(url, allow_private=False, peers=PEERS)
        assert (source.kind, source.site, source.sha256) == (SourceKind.PUBLIC, None, None)


def test_private_addresses_are_allowed_when_the_operator_says_so() -> None:
    source = check_source("http://127.0.0.1:9000/x", allow_private=True, peers={})
    assert (source.kind, source.host, source.port) == (SourceKind.PUBLIC, "127.0.0.1", 9000)


# --- resolve_public ----------------------------------------------------------------------------


def _answers(*addresses: str) -> Any:
    async def getaddrinfo(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    return getaddrinfo


@pytest.mark.asyncio
async def test_every_resolved_address_must_be_public() -> None:
    found = await resolve_public(
        "x.example", 80, allow_private=False, getaddrinfo=_answers("93.184.216.34", "2001:4860::1")
    )
    assert [str(a) for a in found] == ["93.184.216.34", "2001:4860::1"]
    for bad in (("93.184.216.34", "10.0.0.1"), ("fe80::1%eth0",), ("::ffff:169.254.169.254",)):
        with pytest.raises(InvalidInput, match="a URL of a public host"):
            await resolve_public("x.example", 80, allow_private=False, getaddrinfo=_answers(*bad))


@pytest.mark.asyncio
async def test_a_host_that_does_not_resolve_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="a URL whose host resolves"):
        await resolve_public("nowhere.invalid", 80, allow_private=False, getaddrinfo=_answers())


@pytest.mark.asyncio
async def test_localhost_resolves_to_loopback_and_is_refused() -> None:
    with pytest.raises(InvalidInput, match="localhost -> "):
        await resolve_public("localhost", 80, allow_private=False)
    assert await resolve_public("localhost", 80, allow_private=True)


# --- fetch, against a real local HTTP server ------------------------------------------------

BODY = b"input data\n" * 1000
BODY_SHA = hashlib.sha256(BODY).hexdigest()


class Server:
    def __init__(self) -> None:
        self.requests: list[web.Request] = []
        self.port = 0

    async def data(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        return web.Response(body=BODY)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        response = web.StreamResponse()  # chunked: no Content-Length
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"x" * 65536)
        await response.write_eof()
        return response

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    async def file(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        if request.headers.get("X-GBroker-Secret") != "fleet":
            return web.Response(status=401)
        return web.Response(body=BODY)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_get("/data", state.data)
    app.router.add_get("/stream", state.stream)
    app.router.add_get("/redirect", state.redirect)
    app.router.add_get("/files/{sha}", state.file)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        await runner.cleanup()


def _public(url: str) -> Source:
    return check_source(url, allow_private=True, peers={})


@pytest.mark.asyncio
async def test_a_public_source_is_fetched_without_credentials(
    server: Server, tmp_path: Path
) -> None:
    target = tmp_path / "in"
    size, digest = await fetch(
        _public(server.url("/data")),
        target,
        max_bytes=1 << 20,
        allow_private=True,
        peer_headers={"X-GBroker-Secret": "fleet"},
    )
    assert (size, digest, target.read_bytes()) == (len(BODY), BODY_SHA, BODY)
    assert "X-GBroker-Secret" not in server.requests[0].headers


@pytest.mark.asyncio
async def test_a_private_host_name_is_refused_before_connecting(
    server: Server, tmp_path: Path
) -> None:
    source = check_source(server.url("/data", "localhost"), allow_private=False, peers={})
    with pytest.raises(InvalidInput, match="a URL of a public host"):
        await fetch(source, tmp_path / "in", max_bytes=1 << 20, allow_private=False)
    assert server.requests == []
    assert not (tmp_path / "in").exists()


@pytest.mark.asyncio
async def test_the_connection_goes_to_the_checked_address(server: Server, tmp_path: Path) -> None:
    # A name nothing else can resolve: only the pinned, checked address makes this work.
    source = _public(server.url("/data", "pinned.invalid"))
    size, _ = await fetch(
        source,
        tmp_path / "in",
        max_bytes=1 << 20,
        allow_private=True,
        getaddrinfo=_answers("127.0.0.1"),
    )
    assert size == len(BODY)
    assert server.requests[0].host == f"pinned.invalid:{server.port}"


@pytest.mark.asyncio
async def test_redirects_are_not_followed(server: Server, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="HTTP 302"):
        await fetch(
            _public(server.url("/redirect")), tmp_path / "in", max_bytes=1 << 20, allow_private=True
        )
    assert len(server.requests) == 1
    assert not (tmp_path / "in").exists()


@pytest.mark.asyncio
async def test_downloads_are_capped(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "in"
    with pytest.raises(InvalidInput, match="a file of at most 100 bytes, got 11000"):
        await fetch(_public(server.url("/data")), target, max_bytes=100, allow_private=True)
    with pytest.raises(InvalidInput, match="a file of at most 1000000 bytes, got 'more than"):
        await fetch(_public(server.url("/stream")), target, max_bytes=10**6, allow_private=True)
    assert not target.exists()


@pytest.mark.asyncio
async def test_a_peer_source_gets_the_secret_and_is_verified(
    server: Server, tmp_path: Path
) -> None:
    peers = {"s1": server.url("")}
    good = check_source(server.url(f"/files/{BODY_SHA}"), allow_private=False, peers=peers)
    assert good.kind is SourceKind.PEER
    headers = {"X-GBroker-Secret": "fleet"}
    target = tmp_path / "in"
    assert await fetch(
        good, target, max_bytes=1 << 20, allow_private=False, peer_headers=headers
    ) == (len(BODY), BODY_SHA)
    wrong = check_source(server.url(f"/files/{DIGEST}"), allow_private=False, peers=peers)
    with pytest.raises(InvalidInput, match=f"content with sha256 {DIGEST}"):
        await fetch(wrong, target, max_bytes=1 << 20, allow_private=False, peer_headers=headers)
    assert not target.exists()
