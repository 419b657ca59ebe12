"""Heartbeats over HTTP for the neighbours MQTT does not speak for (:mod:`gbroker.core.liveness`).

:class:`HeartbeatLoop` makes the pings :class:`~gbroker.core.liveness.Heartbeats` asks for, as
signed ``/peer/v1/ping`` calls with a timeout of one period, and hands the verdicts to the
driver's ``liveness(site, online)``, the same entry MQTT's ``online`` and last-will ``offline``
use. It also answers other brokers' pings (:meth:`HeartbeatLoop.answer`) with this site's state,
a ``site-state`` message as DCSMon publishes it, so that while MQTT is down each broker's view of
its neighbours stays fresh instead of freezing at the outage.

Any HTTP answer proves a neighbour alive, whatever its status (a 404 from a broker too old to
know pings, a 503 from a draining one): only no answer in time, a refused connection or a
broken one is a missed beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from dcsmon.view import NeighbourhoodView
from gbroker.core.liveness import HeartbeatPolicy, Heartbeats
from gbroker.core.model import Observation, SiteState
from gbroker.daemon.peers import PeerClient
from gbroker.daemon.tasks import Tasks
from gbroker.protocol import wire

__all__ = ["PING_PATH", "HeartbeatLoop"]

log = logging.getLogger("gbroker.daemon")

PING_PATH = "/peer/v1/ping"


class HeartbeatLoop:
    """Pings the neighbours of ``site`` that MQTT does not speak for (module docstring).

    ``on_liveness(site, online)`` hears every verdict; ``is_lost(site)`` says whether the driver
    holds a neighbour lost for any reason (a failed call too), so that one that answers a ping
    is taken back whoever declared it lost.
    """

    def __init__(
        self,
        site: str,
        neighbours: Iterable[str],
        peers: PeerClient,
        policy: HeartbeatPolicy,
        *,
        view: NeighbourhoodView,
        own_state: Callable[[], SiteState],
        on_liveness: Callable[[str, bool], None],
        is_lost: Callable[[str], bool],
        tasks: Tasks,
    ) -> None:
        self.site = site
        self.peers = peers
        self.policy = policy
        self.beats = Heartbeats(neighbours, policy)
        self.view = view
        self.own_state = own_state
        self.on_liveness = on_liveness
        self.is_lost = is_lost
        self.tasks = tasks
        self.pings = 0
        self.missed = 0
        self._wake = asyncio.Event()

    # -- MQTT's word -----------------------------------------------------------------------------

    def mqtt_said(self, site: str, online: bool) -> None:
        """MQTT said ``site`` is online or offline on the current link: it speaks for it now."""
        self.beats.mqtt_said(site, online)

    def link_lost(self) -> None:
        """This broker's MQTT link is down: ping every neighbour from now on."""
        self.beats.link_lost(time.monotonic())
        self._wake.set()

    # -- the pings -------------------------------------------------------------------------------

    async def answer(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        """A neighbour's ping: we are alive, and this is our state."""
        state = wire.encode_site_state(self.site, Observation(self.own_state(), time.time()))
        return {"ok": True, "state": state}

    async def run(self) -> None:
        """Ping whoever is due, for ever (a named task in the daemon's task group)."""
        while True:
            now = time.monotonic()
            for site in self.beats.due(now):
                self.tasks.spawn(self._ping(site), f"ping:{site}")
            due = self.beats.next_due()
            delay = self.policy.period if due is None else max(due - now, 0.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _ping(self, site: str) -> None:
        self.pings += 1
        reply: dict[str, Any] | None = None
        try:
            reply = await self.peers.call(site, PING_PATH, {}, timeout=self.policy.period)
        except (aiohttp.ClientResponseError, wire.WireError) as exc:
            # It answered: alive, if not one we can talk to (too old to know pings, draining).
            log.debug("%s: %s answered a ping with %s", self.site, site, exc)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.missed += 1
            lost = self.beats.missed(site)
            if lost is not None:
                log.warning(
                    "%s: site %s missed %d heartbeats in a row (%s): taken as lost",
                    self.site,
                    site,
                    lost.misses,
                    str(exc) or type(exc).__name__,
                )
                self.on_liveness(site, False)
            return
        finally:
            self._wake.set()  # its next beat may be due
        if site not in self.beats.pinged:
            return  # MQTT spoke for it while the ping was out: its word counts
        back = self.beats.answered(site)
        if back is not None or self.is_lost(site):
            log.info("%s: site %s answers heartbeats again", self.site, site)
            self.on_liveness(site, True)
        if reply is not None and "state" in reply:
            self._take_state(site, reply["state"])

    def _take_state(self, site: str, data: bytes) -> None:
        try:
            reported, observation = wire.decode_site_state(data)
        except wire.WireError as exc:
            log.warning("%s: bad state in %s's ping answer: %s", self.site, site, exc)
            return
        if reported != site:
            log.warning("%s: %s's ping answer carries the state of %s", self.site, site, reported)
            return
        self.view.update(site, observation.state, observation.observed_at)
