"""Who may call what: the daemon's one authentication middleware, and its credentials.

Theory of operation. Every request passes :func:`guard` before any route sees it
(:mod:`gbroker.security.auth` has the mechanisms):

- ``/peer/...`` routes are for brokers of the fleet only: the request must carry a valid peer
  signature (:class:`~gbroker.security.auth.PeerVerifier`); the signing site is left in
  ``request[PEER]`` for the route, which lets a site speak only for itself. A NetMon probe's
  signature does not cover its body (:data:`~gbroker.security.auth.UNSIGNED_PAYLOAD`).
- ``GET /files/<sha256>`` is staging between sites, so a peer signature opens it; so does a
  client token (a user may read back what they uploaded). So does ``HEAD``: an owner learns
  the size of an input in another site's store before it ranks the sites.
- Everything else is the client API, and needs a client token (``Authorization: Bearer``); the
  token's :class:`~gbroker.security.auth.User` is left in ``request[USER]``. A browser on the fleet
  dashboard (:mod:`gbroker.daemon.dashboard`) presents a session cookie instead, for ``GET``
  only; the sign-in form (:data:`SIGN_IN_PATHS`) and the page's static assets
  (:data:`PUBLIC_PREFIX`, no data) need neither.

Before any of that, a request whose ``Host`` is not a name of this broker (DNS rebinding: a web
page whose name now points at us) or whose ``Origin`` is not exactly this broker's own (a
cross-origin request from a page the operator has open) gets a 403: browsers cannot reach the
broker on a user's behalf. Address literals and ``localhost`` are always this broker's names.
"Exactly" is the browser's same-origin rule: scheme, host and port (:func:`_same_origin`). A
page served by another program on another port of the same host is another origin, though its
host is ours and browsers send it ``SameSite=Strict`` cookies (cookies ignore ports): it could
otherwise post a token to the dashboard's sign-in, or ride a signed-in session.

A request that fails gets a 401 with a short reason and nothing else is done for it; a client
address that keeps presenting wrong tokens gets its 401s later and later
(:mod:`gbroker.daemon.throttle`); peers are never slowed. Peer bodies are read here (the routes
read the same cached bytes); the application's body limit bounds them. What each caller may do:
docs/SECURITY.md.

:func:`client_tokens` and :func:`fleet_secret` resolve the credentials a broker starts with:
nothing configured means generated ones, written 0600 into its data directory, never none.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.throttle import FailedTokens
from gbroker.security.auth import (
    PeerVerifier,
    TokenFile,
    Tokens,
    Unauthorized,
    User,
    write_private,
)
from netmon.service import PROBE_PATH

__all__ = [
    "PEER",
    "PUBLIC_PREFIX",
    "SIGN_IN_PATHS",
    "USER",
    "client_tokens",
    "fleet_secret",
    "guard",
]

log = logging.getLogger("gbroker.daemon")

USER = web.RequestKey("user", User)
"""The client API caller (set on client routes)."""
PEER = web.RequestKey("peer", str)
"""The site that signed a peer request (set on peer routes)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SIGN_IN_PATHS = frozenset({"/fleet", "/fleet/login", "/fleet/logout"})
"""Pages that answer without credentials: a sign-in form (no data), or ending a session."""
PUBLIC_PREFIX = "/fleet/static/"
"""The dashboard's static assets (its styles and script, the vendored uPlot): the same for
everyone and nothing of the fleet in them, served without credentials (``GET``, ``HEAD``), so
the sign-in form is styled."""
SESSION_COOKIE = "gbroker_session"  # gbroker.daemon.dashboard.SESSION_COOKIE
LOGIN_PATH = "/fleet/login"


def client_tokens(config: DaemonConfig) -> tuple[Tokens, Path | None]:
    """The broker's client tokens, and the file they came from (None: ``config.token``). A
    file's tokens follow it: users added to it or removed from it while the broker runs
    (``gbroker fleet user``) are let in or refused from the next request on."""
    if config.token_file is not None:
        return TokenFile(config.token_file), config.token_file
    if config.token is not None:
        return Tokens.single(config.token), None
    path = config.data_dir / "tokens"
    if not path.exists():
        Tokens.create(path)
        log.warning("%s: no client token configured; generated one in %s", config.site, path)
    return TokenFile(path), path


def fleet_secret(config: DaemonConfig) -> str:
    """The fleet secret: configured, or this broker's own (generated once, 0600)."""
    if config.secret is not None:
        return config.secret
    path = config.data_dir / "secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, secrets.token_hex(32), exclusive=True)
        if len(config.topology.sites) > 1:
            log.warning(
                "%s: no fleet secret configured; generated %s. Peers must share it "
                "(--secret-file), or they refuse each other",
                config.site,
                path,
            )
    return path.read_text().strip()


def _unauthorized(reason: str) -> web.Response:
    return web.json_response({"error": f"unauthorized: {reason}"}, status=401)


def _too_many(address: str, count: int, retry: float) -> web.Response:
    return web.json_response(
        {
            "error": f"too many requests: {count} wrong client tokens from {address}, "
            "answers to it still held; try again later"
        },
        status=429,
        headers={"Retry-After": str(max(1, round(retry)))},
    )


def _forbidden(reason: str) -> web.Response:
    return web.json_response({"error": f"forbidden: {reason}"}, status=403)


def _host_of(authority: str) -> str:
    """The host of ``host[:port]`` or ``[v6]:port``, lower-cased."""
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0].lower()
    return authority.rsplit(":", 1)[0].lower() if authority.count(":") == 1 else authority.lower()


def _served(host: str, names: frozenset[str]) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host in names
    return True  # an address literal cannot be rebound by DNS


def _same_origin(origin: str, request: web.Request) -> bool:
    """Whether a request's ``Origin`` is the broker's own, as the request reached it: the same
    scheme, host and port (a default port written or not)."""
    try:
        theirs = URL(origin)
        ours = URL(f"{request.scheme}://{request.host}")
    except ValueError:
        return False
    return (
        theirs.is_absolute()
        and theirs.path in ("", "/")
        and (theirs.scheme, theirs.host, theirs.port) == (ours.scheme, ours.host, ours.port)
    )


def guard(
    tokens: Tokens,
    peers: PeerVerifier,
    names: Iterable[str] = (),
    sessions: Callable[[str | None], User | None] | None = None,
    failures: FailedTokens | None = None,
) -> Middleware:
    """The aiohttp middleware; see the module docstring. ``names`` are the host names this
    broker is reached by besides address literals, ``localhost`` and this machine's names;
    ``sessions`` finds the user of a dashboard session cookie; ``failures`` slows the addresses
    that present wrong tokens (default: a :class:`FailedTokens` of its own)."""
    failed = FailedTokens() if failures is None else failures
    served = frozenset(
        n.lower() for n in (*names, "localhost", socket.gethostname(), socket.getfqdn())
    )

    async def peer(request: web.Request) -> str:
        probe = request.path == PROBE_PATH
        body = None if probe else await request.read()
        return peers.verify(request.method, request.path_qs, request.headers, body)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await guarded(request, handler)
        except ConnectionError:
            # The client went away while its request's body was being read (a peer stopping
            # mid-probe, a cut upload): nothing of ours failed and nobody is left to answer, so
            # no traceback in the log. Lost while the client is still there, it is ours: raised.
            transport = request.transport
            if transport is not None and not transport.is_closing():
                raise
            log.info(
                "%s %s: the client went away before it was answered",
                request.method,
                request.path,
            )
            return web.Response(status=400, text="the connection was lost")  # never delivered

    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        # A web page the operator opens must not reach the broker: DNS rebinding shows as a
        # foreign Host, a cross-site request as a foreign Origin.
        host = _host_of(request.headers.get("Host", ""))
        if not _served(host, served):
            return _forbidden(f"Host {host[:100]!r} is not a name of this broker")
        origin = request.headers.get("Origin")
        if origin is not None and not _same_origin(origin, request):
            return _forbidden(
                f"Origin {origin[:100]!r} is not this broker's "
                f"({request.scheme}://{request.host[:100]}): cross-origin requests are refused"
            )
        try:
            if path.startswith("/peer/") or (
                path.startswith("/files/")
                and request.method in ("GET", "HEAD")  # HEAD: an owner learning a size
                and ("Authorization" not in request.headers)
            ):
                request[PEER] = await peer(request)
            else:
                address = request.remote or "unknown"
                if failed.crowded(address):
                    return _too_many(address, failed.failures(address), failed.max_delay)
                user = tokens.identify(request.headers.get("Authorization"))
                if (
                    user is None
                    and sessions is not None
                    and request.method in ("GET", "HEAD")
                    and "Authorization" not in request.headers
                ):
                    user = sessions(request.cookies.get(SESSION_COOKIE))
                if user is None:
                    if path in SIGN_IN_PATHS or (
                        path.startswith(PUBLIC_PREFIX) and request.method in ("GET", "HEAD")
                    ):
                        response = await handler(request)
                        if path == LOGIN_PATH and response.status == 401:  # a wrong token
                            await failed.failed(address)
                        return response
                    reason = "a valid client token (Authorization: Bearer TOKEN)"
                    if "Authorization" in request.headers:  # a wrong one: a guess?
                        waited = await failed.failed(address)
                        if waited:
                            count = failed.failures(address)
                            reason += f"; {count} wrong from {address}, answered after {waited:g} s"
                    raise Unauthorized(reason)
                request[USER] = user
        except Unauthorized as exc:
            return _unauthorized(str(exc))
        return await handler(request)

    return middleware
