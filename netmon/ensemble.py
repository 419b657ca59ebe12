"""An adaptive forecaster ensemble, as the Network Weather Service does it (AppLeS, seed 003). Pure.

Theory of operation. NWS forecasts each measured series (here: the seconds a NetMon probe of one
test size took on one directed link) with a family of simple predictors and, "for a given
resource, different estimation techniques will yield the best forecasts at different times.
Consequently, the Network Weather Service tracks the error between all predictors and sampled
data, and uses the predictor with the lowest cumulative error" (Berman, Wolski et al., AppLeS,
1996, §4.3.1). The family here is the one SEEDS.md §003 lists:

- last value;
- the running mean of the whole series;
- sliding means and sliding medians over the last 5, 10 and 20 values;
- exponential smoothing with gains 0.1, 0.3, 0.5 and 0.8.

Each :class:`Series` keeps every member's next prediction. When a measurement x arrives, each
member's absolute error |prediction - x| is added to its record, then each member takes x in.
The record is the mean absolute error over the last ``window`` measurements (a bounded deque
per member; ``window=None`` keeps the cumulative sum, as the 1996 text says). The forecast is
the prediction of the member with the lowest record; ties go to the first member in the order
above, so a series with a single measurement is forecast by its last value. Absolute, not
squared, error: one outlier (a probe that met a competing transfer) should cost a member in
proportion, not dominate its record for a whole window.

Memory per series is bounded: at most 20 values (the widest window), ``window`` errors per
member, and a few numbers.

**Combined with the piecewise-linear table** (:class:`EnsembleForecaster`). The table of the
GBroker paper (:mod:`netmon.forecast`) gives a transfer time's dependence on size: a point per
test size, interpolated between them. The ensemble gives each point its time adaptivity: one
:class:`Series` per (link, test size), and the table's point for that size is the series'
forecast; any other size is interpolated from those points exactly as the paper's table is. So
a forecast for 300 MB on a link probed with 1 MiB and 8 MiB follows the line through the two
ensemble forecasts, and a link that drops 4x moves both points as fast as the best member
adapts. :meth:`EnsembleForecaster.table` returns those points as a :class:`LinkTable`, so
NetMon's published tables (:mod:`netmon.table`) carry the ensemble's view unchanged in format.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable

from gbroker.errors import InvalidInput
from netmon.forecast import Forecaster, LinkTable, PiecewiseLinearForecaster

__all__ = ["FORECASTERS", "MEMBERS", "EnsembleForecaster", "Series", "make_forecaster"]

_WINDOWS = (5, 10, 20)
_GAINS = (0.1, 0.3, 0.5, 0.8)
MEMBERS: tuple[str, ...] = (
    "last",
    "mean",
    *(f"mean{w}" for w in _WINDOWS),
    *(f"median{w}" for w in _WINDOWS),
    *(f"exp{g:g}" for g in _GAINS),
)
"""The members' names, in the order ties are broken."""


class Series:
    """One measured series: every member's prediction and recent error (module docstring)."""

    __slots__ = ("_count", "_errors", "_recent", "_smoothed", "_sum", "_totals", "window")

    def __init__(self, window: int | None = 20) -> None:
        if window is not None and (isinstance(window, bool) or window < 1):
            raise InvalidInput("ensemble.window", "a number of measurements >= 1, or None", window)
        self.window = window
        self._recent: deque[float] = deque(maxlen=max(_WINDOWS))
        self._sum = 0.0
        self._count = 0
        self._smoothed = [0.0] * len(_GAINS)
        self._errors = [deque[float](maxlen=window or 1) for _ in MEMBERS]
        self._totals = [0.0] * len(MEMBERS)  # the sum of each deque, or cumulative

    def __len__(self) -> int:
        return self._count

    def predictions(self) -> list[float]:
        """Each member's prediction of the next value, in :data:`MEMBERS` order (no value yet:
        an empty list)."""
        if not self._count:
            return []
        recent = list(self._recent)
        out = [recent[-1], self._sum / self._count]
        out += [statistics.fmean(recent[-w:]) for w in _WINDOWS]
        out += [statistics.median(recent[-w:]) for w in _WINDOWS]
        out += self._smoothed
        return out

    def observe(self, value: float) -> None:
        """A new measurement: score every member's prediction of it, then let them take it in."""
        if not value >= 0 or value == float("inf"):
            raise InvalidInput("ensemble.value", "a finite number >= 0", value)
        for m, predicted in enumerate(self.predictions()):
            error = abs(predicted - value)
            self._totals[m] += error
            if self.window is not None:  # cumulative: the sum alone
                errors = self._errors[m]
                if len(errors) == self.window:
                    self._totals[m] -= errors[0]
                errors.append(error)
        if self._count:
            self._smoothed = [
                s + g * (value - s) for s, g in zip(self._smoothed, _GAINS, strict=True)
            ]
        else:
            self._smoothed = [value] * len(_GAINS)
        self._recent.append(value)
        self._sum += value
        self._count += 1

    def records(self) -> list[float]:
        """Each member's record: its mean absolute error over the window (or cumulative)."""
        scored = len(self._errors[0])  # every member has scored as many predictions
        if self.window is None:
            scored = max(self._count - 1, 0)
        return [total / scored if scored else 0.0 for total in self._totals]

    def best(self) -> str:
        """The member that forecasts now: the lowest record, ties to the first."""
        records = self.records()
        return MEMBERS[min(range(len(MEMBERS)), key=records.__getitem__)]

    def forecast(self) -> float:
        """The best member's prediction of the next value."""
        predictions = self.predictions()
        if not predictions:
            raise InvalidInput("ensemble", "a series with at least one measurement", "none")
        records = self.records()
        return predictions[min(range(len(MEMBERS)), key=records.__getitem__)]


class EnsembleForecaster:
    """t(i, j, m): NWS ensembles per (link, test size), interpolated by size as the paper's
    table is (module docstring). The same interface as
    :class:`~netmon.forecast.PiecewiseLinearForecaster`; callable as a ``TransferForecast``."""

    __slots__ = ("_adopted", "_series", "default_bandwidth", "window")

    def __init__(self, default_bandwidth: float = 100e6, window: int | None = 20) -> None:
        if not default_bandwidth > 0:
            raise InvalidInput("default_bandwidth", "bytes per second > 0", default_bandwidth)
        Series(window)  # checks it
        self.default_bandwidth = default_bandwidth
        self.window = window
        self._series: dict[tuple[str, str], dict[int, Series]] = {}
        self._adopted: dict[tuple[str, str], LinkTable] = {}  # other sites' published points

    def observe(self, source: str, target: str, size: int, seconds: float) -> None:
        """Record that moving ``size`` bytes from ``source`` to ``target`` took ``seconds``."""
        if size <= 0:
            raise InvalidInput("netmon.size", "bytes > 0", size)
        if not seconds >= 0:
            raise InvalidInput("netmon.seconds", "seconds >= 0", seconds)
        by_size = self._series.setdefault((source, target), {})
        series = by_size.get(size)
        if series is None:
            series = by_size[size] = Series(self.window)
        series.observe(seconds)

    def adopt(self, source: str, target: str, size: int, seconds: float) -> None:
        """Take a point of another site's published table as it is: that site's own ensemble
        forecast it (feeding forecasts to an ensemble again would smooth them twice)."""
        if size <= 0:
            raise InvalidInput("netmon.size", "bytes > 0", size)
        if not seconds >= 0:
            raise InvalidInput("netmon.seconds", "seconds >= 0", seconds)
        table = self._adopted.setdefault((source, target), LinkTable())
        table.observe(size, seconds, 1.0)

    def table(self, source: str, target: str) -> LinkTable | None:
        """The link's points: per test size, the ensemble's forecast, or the points adopted from
        the link's own site (None: nothing known of it)."""
        by_size = self._series.get((source, target))
        if not by_size:
            return self._adopted.get((source, target))
        sizes = sorted(by_size)
        return LinkTable(sizes, [by_size[s].forecast() for s in sizes])

    def series(self, source: str, target: str) -> dict[int, Series]:
        """The link's series by test size (for reports: which member forecasts each)."""
        return dict(self._series.get((source, target), {}))

    def forecast(self, source: str, target: str, size: int) -> float:
        """Forecast seconds to move ``size`` bytes from ``source`` to ``target``."""
        if source == target or size <= 0:
            return 0.0
        table = self.table(source, target)
        if table is None:
            return size / self.default_bandwidth
        return table.interpolate(size)

    __call__ = forecast


def members_in_use(
    forecaster: EnsembleForecaster, links: Iterable[tuple[str, str]]
) -> dict[str, int]:
    """How many (link, size) series each member forecasts now, over ``links``."""
    counts = dict.fromkeys(MEMBERS, 0)
    for source, target in links:
        for series in forecaster.series(source, target).values():
            counts[series.best()] += 1
    return counts


FORECASTERS = ("table", "ensemble")
"""The forecasters ``--forecaster`` selects: the paper's piecewise-linear table, or the
NWS-style ensemble per test size interpolated the same way (:mod:`netmon.ensemble`)."""


def make_forecaster(kind: str, default_bandwidth: float) -> Forecaster:
    """A forecaster of ``kind`` (one of :data:`FORECASTERS`)."""
    if kind == "table":
        return PiecewiseLinearForecaster(default_bandwidth)
    if kind == "ensemble":
        return EnsembleForecaster(default_bandwidth)
    raise InvalidInput("forecaster", f"one of {', '.join(FORECASTERS)}", kind)
