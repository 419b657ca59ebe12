"""A site's published NetMon forecast table, and how a broker takes it in. Pure.

Theory of operation. A NetMon agent at site i measures the links (i, j) to its neighbours and
publishes them as one :class:`ForecastTable`: for each target j the test sizes and the smoothed
seconds each took (:class:`LinkPoints`, the points of a :class:`~netmon.forecast.LinkTable`).
The table is a value: it validates itself on construction and names the offending field, so
the wire layer can turn a bad table from a peer into a precise rejection.

A broker takes tables in through a :class:`TableFeed`, which writes their points into the
broker's :class:`~netmon.forecast.PiecewiseLinearForecaster`. Per publishing site the newest
table wins (retained MQTT messages may arrive again, or late). Tables carry points that the
publisher has already smoothed, so the receiving forecaster should keep only the latest value of
each point (``alpha`` = 1, the daemon's setting): observing a point then sets it.

Which links a broker knows, then: its own outgoing links (measured by its own agent), and each
neighbour's outgoing links (from the neighbour's table). t(h, j, m) for a file at a site h that
is neither falls back to the forecaster's default bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gbroker.errors import InvalidInput
from netmon.forecast import Forecaster

__all__ = ["ForecastTable", "LinkPoints", "TableFeed", "table_from"]


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True, slots=True)
class LinkPoints:
    """One measured link: test sizes (bytes, strictly increasing) and the seconds each took."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.sizes, tuple) or not self.sizes:
            raise InvalidInput("sizes", "a non-empty list of sizes in bytes", self.sizes)
        if not isinstance(self.seconds, tuple) or len(self.seconds) != len(self.sizes):
            raise InvalidInput(
                "seconds", f"one time per size ({len(self.sizes)} numbers)", self.seconds
            )
        previous = 0
        for k, size in enumerate(self.sizes):
            if not _is_size(size) or size <= previous:
                what = "a size in bytes > 0"
                if k > 0:
                    what = f"a size in bytes > {previous} (sizes strictly increase)"
                raise InvalidInput(f"sizes[{k}]", what, size)
            previous = size
        for k, seconds in enumerate(self.seconds):
            if not _is_seconds(seconds):
                raise InvalidInput(f"seconds[{k}]", "a finite number of seconds >= 0", seconds)


@dataclass(frozen=True, slots=True)
class ForecastTable:
    """Site ``site``'s measured outgoing links, as of ``measured_at`` (seconds since the epoch).

    ``links`` maps each target site to its points; it is copied into a read-only mapping.
    """

    site: str
    measured_at: float
    links: Mapping[str, LinkPoints] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.site, str) or not self.site:
            raise InvalidInput("site", "a non-empty site name", self.site)
        if (
            not isinstance(self.measured_at, int | float)
            or isinstance(self.measured_at, bool)
            or not math.isfinite(self.measured_at)
        ):
            raise InvalidInput("measured_at", "a finite number (seconds)", self.measured_at)
        for target, points in self.links.items():
            if not isinstance(target, str) or not target:
                raise InvalidInput("links", "non-empty site names as targets", target)
            if target == self.site:
                raise InvalidInput(f"links[{target}]", f"a site other than {self.site!r} itself")
            if not isinstance(points, LinkPoints):
                raise InvalidInput(f"links[{target}]", "LinkPoints", type(points).__name__)
        object.__setattr__(self, "links", MappingProxyType(dict(self.links)))


def table_from(
    forecaster: Forecaster,
    site: str,
    targets: Iterable[str],
    measured_at: float,
) -> ForecastTable:
    """The table of ``site``'s links to ``targets`` that ``forecaster`` has measured so far."""
    links: dict[str, LinkPoints] = {}
    for target in sorted(set(targets)):
        table = forecaster.table(site, target)
        if table is not None and table.sizes:
            links[target] = LinkPoints(tuple(table.sizes), tuple(table.seconds))
    return ForecastTable(site, measured_at, links)


class TableFeed:
    """Applies published tables to a forecaster, newest per site first. Pure.

    ``ignore`` names sites whose tables are not taken in: a broker whose own agent feeds its
    forecaster directly ignores the echo of its own table.
    """

    __slots__ = ("_latest", "forecaster", "ignore")

    def __init__(self, forecaster: Forecaster, ignore: Iterable[str] = ()) -> None:
        self.forecaster = forecaster
        self.ignore = frozenset(ignore)
        self._latest: dict[str, float] = {}

    def measured_at(self, site: str) -> float | None:
        """When the newest table taken in from ``site`` was measured; None if none was."""
        return self._latest.get(site)

    def apply(self, table: ForecastTable) -> bool:
        """Write the table's points into the forecaster; False if ignored, older or as old."""
        if table.site in self.ignore:
            return False
        known = self._latest.get(table.site)
        if known is not None and known >= table.measured_at:
            return False
        self._latest[table.site] = table.measured_at
        for target, points in table.links.items():
            for size, seconds in zip(points.sizes, points.seconds, strict=True):
                self.forecaster.adopt(table.site, target, size, seconds)
        return True
