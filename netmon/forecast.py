"""Transfer-time forecasts by piecewise-linear interpolation (GBroker paper §3.3). Pure.

Theory of operation. NetMon periodically moves test blobs of a few configured sizes from its site
to each neighbour and records how long each took. For every directed link (i, j) that yields a
table of (size, seconds) points, one per test size, each point a smoothed value of the
measurements of that size (``alpha`` = 1 keeps only the latest). The forecast for m bytes is the
piecewise-linear interpolation of the table:
- between two test sizes, the straight line through their points;
- below the smallest size, the line from the origin (0 bytes take 0 s) to the first point;
- above the largest size, the last segment extended (or, with a single point, the line through
  the origin), never below the largest measured time.
A link never measured is forecast from ``default_bandwidth`` (bytes/s), and staying on one site
costs nothing. The same forecaster serves the simulator and the real NetMon agent.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Protocol

from gbroker.errors import InvalidInput

__all__ = ["Forecaster", "LinkTable", "PiecewiseLinearForecaster"]


@dataclass(slots=True)
class LinkTable:
    """Smoothed measurements of one directed link: parallel lists sorted by size."""

    sizes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def observe(self, size: int, seconds: float, alpha: float) -> None:
        i = bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            self.seconds[i] += alpha * (seconds - self.seconds[i])
        else:
            self.sizes.insert(i, size)
            self.seconds.insert(i, seconds)

    def interpolate(self, size: int) -> float:
        xs, ys = self.sizes, self.seconds
        if size <= 0:
            return 0.0
        i = bisect_left(xs, size)
        if i < len(xs) and xs[i] == size:
            return ys[i]
        if i == 0:  # below the smallest test size: from the origin
            return ys[0] * size / xs[0]
        if i == len(xs):  # beyond the largest: extend the last segment
            if len(xs) == 1:
                return ys[0] * size / xs[0]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return max(ys[-1], ys[-1] + slope * (size - xs[-1]))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (size - x0) / (x1 - x0)


class Forecaster(Protocol):
    """What F(j), NetMon and the published tables need of a forecaster."""

    def observe(self, source: str, target: str, size: int, seconds: float) -> None:
        """A measurement of this site's NetMon: ``size`` bytes took ``seconds``."""

    def adopt(self, source: str, target: str, size: int, seconds: float) -> None:
        """A point of another site's published table, taken as it is."""

    def table(self, source: str, target: str) -> LinkTable | None:
        """The link's points by size (None: nothing known of it)."""

    def forecast(self, source: str, target: str, size: int) -> float:
        """Seconds to move ``size`` bytes from ``source`` to ``target``."""

    def __call__(self, source: str, target: str, size: int) -> float: ...


class PiecewiseLinearForecaster:
    """t(i, j, m) for every link measured so far. Callable as a ``TransferForecast``."""

    __slots__ = ("_links", "alpha", "default_bandwidth")

    def __init__(self, default_bandwidth: float = 100e6, alpha: float = 1.0) -> None:
        if not default_bandwidth > 0:
            raise InvalidInput("default_bandwidth", "bytes per second > 0", default_bandwidth)
        if not 0 < alpha <= 1:
            raise InvalidInput("alpha", "a smoothing gain in (0, 1]", alpha)
        self.default_bandwidth = default_bandwidth
        self.alpha = alpha
        self._links: dict[tuple[str, str], LinkTable] = {}

    def observe(self, source: str, target: str, size: int, seconds: float) -> None:
        """Record that moving ``size`` bytes from ``source`` to ``target`` took ``seconds``."""
        if size <= 0:
            raise InvalidInput("netmon.size", "bytes > 0", size)
        if not seconds >= 0:
            raise InvalidInput("netmon.seconds", "seconds >= 0", seconds)
        table = self._links.get((source, target))
        if table is None:
            table = self._links[(source, target)] = LinkTable()
        table.observe(size, seconds, self.alpha)

    def adopt(self, source: str, target: str, size: int, seconds: float) -> None:
        """Take a point of another site's published table as it is (that site smoothed it)."""
        if size <= 0:
            raise InvalidInput("netmon.size", "bytes > 0", size)
        if not seconds >= 0:
            raise InvalidInput("netmon.seconds", "seconds >= 0", seconds)
        table = self._links.get((source, target))
        if table is None:
            table = self._links[(source, target)] = LinkTable()
        table.observe(size, seconds, 1.0)

    def table(self, source: str, target: str) -> LinkTable | None:
        return self._links.get((source, target))

    def forecast(self, source: str, target: str, size: int) -> float:
        """Forecast seconds to move ``size`` bytes from ``source`` to ``target``."""
        if source == target or size <= 0:
            return 0.0
        if not self._links:  # nothing measured yet (or NetMon off): no key to build and look up
            return size / self.default_bandwidth
        table = self._links.get((source, target))
        if table is None:
            return size / self.default_bandwidth
        return table.interpolate(size)

    __call__ = forecast
