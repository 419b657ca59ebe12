"""A broker's view of its neighbourhood's site states. Pure.

Theory of operation. DCSMon agents publish each site's state (n_j, c_j, q_j, s_j) with the time it
was sampled. A broker keeps the latest observation per site: an older or duplicate report (messages
may arrive out of order) never replaces a newer one. Decisions read the view as it is, stale by
up to one publication period, exactly as in reality; ``age`` tells how stale, and ``forget`` drops
sites whose broker went away (e.g. its MQTT last-will said ``offline``).
"""

from __future__ import annotations

from gbroker.core.model import Observation, SiteState

__all__ = ["NeighbourhoodView", "Observation"]


class NeighbourhoodView:
    __slots__ = ("_latest",)

    def __init__(self) -> None:
        self._latest: dict[str, Observation] = {}

    def update(self, site: str, state: SiteState, observed_at: float) -> bool:
        """Record a report; False if it is older than (or as old as) what is known."""
        known = self._latest.get(site)
        if known is not None and known.observed_at >= observed_at:
            return False
        self._latest[site] = Observation(state, observed_at)
        return True

    def get(self, site: str) -> Observation | None:
        return self._latest.get(site)

    def age(self, site: str, now: float) -> float:
        """Seconds since the site's state was sampled; +inf if never heard of."""
        known = self._latest.get(site)
        return float("inf") if known is None else now - known.observed_at

    def forget(self, site: str) -> None:
        self._latest.pop(site, None)

    def sites(self) -> list[str]:
        return sorted(self._latest)
