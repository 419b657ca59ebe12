"""Heartbeats over the peer protocol: who is alive when MQTT cannot say. Pure.

Theory of operation. A broker learns that a neighbour died from MQTT: the dead broker's
connection carries a retained last-will ``offline`` that the MQTT broker publishes for it
(:mod:`gbroker.mqtt.link`). *MQTT speaks for* a neighbour once it has said, on this broker's
current MQTT link, that the neighbour is online or offline: any later change comes the same way
(a last-will, a new ``online``). For every other neighbour nobody would tell, so this broker
asks: every ``period`` seconds it sends it a signed ``ping`` over HTTP, with a timeout of
``period``. That is every neighbour while this broker's MQTT link is down or when it runs without
MQTT, and, after a rejoin, each neighbour MQTT has said nothing about yet: one that died while
the MQTT broker was down left no last-will with the restarted MQTT broker, and only a ping finds
that out. :class:`Heartbeats` decides when to ping whom and what answers mean; the daemon makes
the calls and acts on the verdicts:

- a neighbour that misses ``misses`` beats in a row (no answer in time, a refused connection,
  an error) is :class:`PeerLost`: the daemon treats it as a last-will ``offline`` (its jobs
  move once their leases run out);
- a lost neighbour that answers again is :class:`PeerBack`, as an ``online`` would be.

One beat is in flight per neighbour at a time: a neighbour is not pinged again before its last
ping was answered or missed, so a slow neighbour is not flooded. A broker killed on loopback
refuses at once, so it is declared lost about ``(misses - 1) × period`` after its first missed
beat; a silent one (a partition) after ``misses × period``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gbroker.errors import InvalidInput

__all__ = ["HeartbeatPolicy", "Heartbeats", "PeerBack", "PeerLost"]


@dataclass(frozen=True, slots=True)
class HeartbeatPolicy:
    """How often to ping and how many missed beats make a neighbour lost.

    Attributes:
        period: seconds between two pings of one neighbour, and how long a ping may take.
        misses: missed beats in a row that declare a neighbour lost.
    """

    period: float = 2.0
    misses: int = 3

    def __post_init__(self) -> None:
        if not self.period > 0:  # also rejects NaN
            raise InvalidInput("heartbeat.period", "seconds > 0", self.period)
        if isinstance(self.misses, bool) or not (isinstance(self.misses, int) and self.misses >= 1):
            raise InvalidInput("heartbeat.misses", "an integer >= 1", self.misses)


@dataclass(frozen=True, slots=True)
class PeerLost:
    """``site`` missed ``misses`` beats in a row: take it as dead."""

    site: str
    misses: int


@dataclass(frozen=True, slots=True)
class PeerBack:
    """``site``, lost before, answered a ping: take it back."""

    site: str


_AT_ONCE = float("-inf")


class Heartbeats:
    """When to ping which neighbour, and what answers and misses mean (module docstring)."""

    __slots__ = ("_due", "_heard", "_in_flight", "_lost", "_missed", "policy")

    def __init__(
        self,
        neighbours: Iterable[str],
        policy: HeartbeatPolicy | None = None,
        *,
        lost: Iterable[str] = (),
    ) -> None:
        self.policy = policy or HeartbeatPolicy()
        sites = sorted(set(neighbours))
        self._due: dict[str, float] = dict.fromkeys(sites, _AT_ONCE)
        self._missed: dict[str, int] = dict.fromkeys(sites, 0)
        self._in_flight: set[str] = set()
        self._heard: set[str] = set()  # MQTT speaks for these on the current link
        self._lost: set[str] = set(lost) & set(sites)

    @property
    def lost(self) -> frozenset[str]:
        """The neighbours that are lost as far as these heartbeats and MQTT know."""
        return frozenset(self._lost)

    @property
    def pinged(self) -> frozenset[str]:
        """The neighbours MQTT does not speak for now: the ones heartbeats watch."""
        return frozenset(self._due.keys() - self._heard)

    # -- what MQTT says ------------------------------------------------------------------------

    def mqtt_said(self, site: str, online: bool) -> None:
        """MQTT, on the current link, said ``site`` is online (it joined) or offline (its
        last-will, or its clean close). Either way MQTT will tell its next change: no more
        pings to it until the link is lost."""
        if site not in self._due:
            return
        self._heard.add(site)
        self._in_flight.discard(site)
        self._missed[site] = 0
        if online:
            self._lost.discard(site)
        else:
            self._lost.add(site)

    def link_lost(self, now: float) -> None:
        """This broker's MQTT link is down: MQTT speaks for no one; ping every neighbour,
        the lost ones too (to find them back), starting now."""
        for site in self._heard:
            self._due[site] = now
        self._heard.clear()

    # -- the pings -----------------------------------------------------------------------------

    def due(self, now: float) -> list[str]:
        """The neighbours to ping now; each is then in flight until :meth:`answered` or
        :meth:`missed` is told about it."""
        pinged = [
            site
            for site, at in self._due.items()
            if at <= now and site not in self._in_flight and site not in self._heard
        ]
        self._in_flight.update(pinged)
        for site in pinged:
            self._due[site] = now + self.policy.period
        return pinged

    def next_due(self) -> float | None:
        """When the next ping is due (None: none is, every pinged neighbour has one in flight
        or MQTT speaks for all)."""
        waiting = [
            at
            for site, at in self._due.items()
            if site not in self._in_flight and site not in self._heard
        ]
        return min(waiting) if waiting else None

    def answered(self, site: str) -> PeerBack | None:
        """``site`` answered its ping: :class:`PeerBack` if it was lost."""
        if site not in self._in_flight:
            return None  # MQTT spoke for it since: its word counts
        self._in_flight.discard(site)
        self._missed[site] = 0
        if site in self._lost:
            self._lost.discard(site)
            return PeerBack(site)
        return None

    def missed(self, site: str) -> PeerLost | None:
        """``site``'s ping failed or timed out: :class:`PeerLost` once it has missed
        ``policy.misses`` in a row (and only then: a lost site is not lost again)."""
        if site not in self._in_flight:
            return None
        self._in_flight.discard(site)
        self._missed[site] += 1
        if self._missed[site] >= self.policy.misses and site not in self._lost:
            self._lost.add(site)
            return PeerLost(site, self._missed[site])
        return None
