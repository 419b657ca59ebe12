"""The peer protocol's two ends: the calls a broker makes to its peers, and the routes it serves.

Theory of operation. Brokers talk to each other in MessagePack over HTTP (``/peer/v1/...``,
ARCHITECTURE §5): a site accepts a dispatched job, withdraws it, a replica claims the right to
start, a site reports queued, started and finished back to the job's owner, an owner kills a job.
Each message is one map, answered with one map, and idempotent by job id.

:class:`PeerClient` makes the calls. A call addressed to this broker's own site skips HTTP and
goes straight to the handler, so a job placed at its owner's site takes the same path as any
other. A failed call is told to ``failed`` (the daemon counts it by peer and call).
:meth:`PeerClient.call_until_answered` retries with backoff while the peer is down or restarting
(a report or a claim must get through) and gives up only when the peer rejects the message (4xx),
since a peer that refuses it will not change its mind. A retry waits out its backoff
(:meth:`PeerClient.pause`) or less: once the peer is heard online again (MQTT's ``online``,
:meth:`PeerClient.heard_online`) every call waiting for it goes at once, so a restarted broker
hears what was kept for it within a moment, not after the last backoff of up to 5 s.

:func:`peer_routes` serves the same handlers to other brokers: MessagePack in, MessagePack out,
400 for a message that cannot be read, 503 for one this site will not act on now (a dispatch to a
draining site). The fleet secret that guards these routes is checked by the
daemon's middleware (:mod:`gbroker.daemon.guard`) before a route runs, and the signing site is
handed to the handler as ``sender``; :meth:`PeerClient.headers` signs what this broker sends. The
signature goes only to the peers' own URLs from the topology.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import aiohttp
from aiohttp import ClientSession, ClientTimeout, web
from yarl import URL

from gbroker.daemon.guard import PEER
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.protocol import wire
from gbroker.security.auth import PeerSigner

__all__ = ["PACK", "Forbidden", "PeerClient", "PeerHandler", "Unavailable", "peer_routes"]

log = logging.getLogger("gbroker.daemon")
PACK = "application/msgpack"

PeerHandler = Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]
"""A peer message's handler: the decoded map and the site that signed it in, the answer out."""


class Forbidden(GBrokerError):
    """A peer that is who it says asked for what it may not: answered 403."""


class Unavailable(GBrokerError):
    """This site will not do it now (it drains and takes no new work): answered 503."""


class PeerClient:
    """Calls to the peers of ``site`` at the URLs of ``peers`` (site name -> base URL)."""

    def __init__(
        self,
        site: str,
        peers: dict[str, str],
        signer: PeerSigner,
        failed: Callable[[str, str], None],
    ) -> None:
        self.site = site
        self.peers = peers
        self.signer = signer
        self.failed = failed  # told (site, path) of each call that failed
        self.session: ClientSession | None = None
        # The handlers of this broker's own peer routes: a call to ourselves is a direct call.
        self.local: Mapping[str, PeerHandler] = {}
        self._back: dict[str, asyncio.Event] = {}  # set when the site is heard online again

    def heard_online(self, site: str) -> None:
        """``site`` is up again: the calls waiting to retry it go now."""
        back = self._back.pop(site, None)
        if back is not None:
            back.set()

    async def pause(self, site: str, seconds: float) -> None:
        """Wait ``seconds`` before a retry to ``site``, or less if it is heard online again."""
        back = self._back.setdefault(site, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await back.wait()

    def peer_of(self, url: str) -> str | None:
        """The site whose own URL ``url`` is under (None: not a peer's). Both are compared as
        URLs, not as text: a host name's case does not matter (``http://Xeon80:8700`` from a
        topology is the ``http://xeon80:8700`` a parsed URL spells)."""
        try:
            wanted = str(URL(url))
        except ValueError:
            return None
        for name, base in self.peers.items():
            if wanted.startswith(str(URL(base.rstrip("/"))) + "/"):
                return name
        return None

    def headers(self, method: str, url: str, body: bytes | None = b"") -> dict[str, str]:
        """A signature for a request to ``url``, which must be under a peer's own URL: the
        fleet's credentials go nowhere else."""
        receiver = self.peer_of(url)
        if receiver is None:
            raise Forbidden(f"{url[:200]} is not a peer's URL: no credentials for it")
        return self.signer.headers(method, URL(url).path_qs, body, to=receiver)

    async def call(
        self, site: str, path: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """A peer call; to ourselves it is a direct call. ``timeout``: seconds the whole call
        may take (default: the session's)."""
        kind = path.rsplit("/", 1)[1]
        if site == self.site:
            return await self.local[path](body, self.site)
        assert self.session is not None
        url = self.peers[site] + path
        data = wire.encode_peer(kind, body)
        headers = {**self.headers("POST", url, data), "Content-Type": PACK}
        try:
            # aiohttp reads timeout=None as "none at all": no timeout given is the session's.
            limit = self.session.timeout if timeout is None else ClientTimeout(total=timeout)
            async with self.session.post(
                url, data=data, headers=headers, timeout=limit
            ) as response:
                response.raise_for_status()
                return wire.decode_peer_reply(kind, await response.read())
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.failed(site, path)
            raise

    async def call_until_answered(
        self, site: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A peer call that must get through: retried with backoff while the peer is down or
        restarting. A peer that rejects the message (4xx) will not change its mind: None."""
        backoff = 0.2
        while True:
            try:
                return await self.call(site, path, body)
            except aiohttp.ClientResponseError as exc:
                if 400 <= exc.status < 500:
                    log.error(
                        "%s: %s rejected %s for %s: %s", self.site, site, path, body["id"], exc
                    )
                    return None
                error: Exception = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                error = exc
            log.info(
                "%s: %s%s unreachable (%s); retrying in %.1f s",
                self.site,
                site,
                path,
                error,
                backoff,
            )
            await self.pause(site, backoff)
            backoff = min(backoff * 2, 5.0)


def peer_routes(
    handlers: Mapping[str, PeerHandler], known_sites: Collection[str]
) -> list[web.RouteDef]:
    """An HTTP route per peer message: MessagePack in (checked against its schema, naming only
    ``known_sites``, before the handler sees it), MessagePack out; 400 if bad, 403 if the
    signing site may not say it."""

    def route(kind: str, handler: PeerHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def serve(request: web.Request) -> web.Response:
            try:
                body = wire.decode_peer(kind, await request.read(), known_sites)
                reply = await handler(body, request[PEER])
            except Forbidden as exc:
                return web.Response(status=403, text=f"forbidden: {exc}")
            except Unavailable as exc:
                return web.Response(status=503, text=f"unavailable: {exc}")
            except InvalidInput as exc:
                return web.Response(status=400, text=f"bad peer message: {exc}")
            return web.Response(body=wire.encode_peer_reply(kind, reply), content_type=PACK)

        return serve

    return [
        web.post(path, route(path.rsplit("/", 1)[1], handler)) for path, handler in handlers.items()
    ]
