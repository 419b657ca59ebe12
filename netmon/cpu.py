"""CPU availability as the Network Weather Service measures and forecasts it (AppLeS, seed 003).
Pure.

Theory of operation. NWS's CPU sensor answers one question: what fraction of a CPU would a
process started now get? (1.0: a whole core; 0.25: a quarter of one, because three others
compete for it or because the site caps its jobs.) It has two ways to measure it:

- **passive**, from the load: with a load average of L runnable processes on n cores, a new
  process is one of L + 1 sharing n cores and gets ``min(1, n / (L + 1))``
  (:func:`from_load`). It costs nothing (a counter read), but it is blind to what the kernel
  does beyond counting: priorities, quotas, the cores a site may not use;
- **active**, a probe: a short CPU-bound run that measures the CPU time it got over the wall
  time it ran (:func:`from_probe`). It sees exactly what a new process sees, and costs the CPU
  time it measures.

NWS combines them (its *hybrid* sensor): the passive value at every measurement, corrected by
the bias the last probe found (``probe - passive`` at that moment); a measurement that comes
with a probe is the probe itself. So probes may be rare (they cost), and between them the load
moves the value. :class:`CpuAvailability` does this, then caps the result at the site's
**share** (a topology ``cpu_share``: every job's CPU time is capped at share x its cores, so no
new process there gets more than ``share`` of a core, however idle the machine is).

The measurements form a series forecast by NWS's adaptive ensemble
(:class:`netmon.ensemble.Series`, the one NetMon uses per link): last value, running mean,
sliding means and medians, exponential smoothing; the member with the least recent error
forecasts. :attr:`CpuAvailability.reported` is that forecast as a site publishes it: rounded
to hundredths, and moved only when the forecast left it by at least ``resolution`` (a
measurement's jitter does not make a site republish its state every period).

This module sits in ``netmon`` beside the ensemble so that the daemon (through DCSMon's sensor,
:mod:`dcsmon.cpu`) and the simulator may both use it (docs/DESIGN.md).
"""

from __future__ import annotations

import math

from gbroker.errors import InvalidInput
from netmon.ensemble import Series

__all__ = ["FLOOR", "CpuAvailability", "from_load", "from_probe"]

FLOOR = 0.01
"""The least availability reported: a site is never said to give a new process nothing (the
published value must be > 0), only a hundredth of a core."""


def _clamped(value: float) -> float:
    return min(1.0, max(FLOOR, value))


def from_load(load: float, cores: int) -> float:
    """The passive measurement: ``min(1, cores / (load + 1))``, a new process being one more of
    ``load`` runnable ones sharing ``cores`` cores."""
    if not (math.isfinite(load) and load >= 0):
        raise InvalidInput("cpu.load", "a load average >= 0", load)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise InvalidInput("cpu.cores", "an integer >= 1", cores)
    return _clamped(cores / (load + 1.0))


def from_probe(cpu_seconds: float, wall_seconds: float) -> float:
    """The active measurement: the CPU time a probe got over the wall time it ran (clamped to
    [:data:`FLOOR`, 1]: a clock's granularity may make it a hair above 1)."""
    if not (math.isfinite(wall_seconds) and wall_seconds > 0):
        raise InvalidInput("cpu.probe.wall_seconds", "seconds > 0", wall_seconds)
    if not (math.isfinite(cpu_seconds) and cpu_seconds >= 0):
        raise InvalidInput("cpu.probe.cpu_seconds", "seconds >= 0", cpu_seconds)
    return _clamped(cpu_seconds / wall_seconds)


def _fraction(field: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, "a fraction of a core, 0 < value <= 1", value)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise InvalidInput(field, "a fraction of a core, 0 < value <= 1", value)
    return float(value)


class CpuAvailability:
    """One site's CPU availability: the hybrid measurement, its series, the forecast.

    Args:
        share: the site's ``cpu_share`` (1.0: its jobs are not capped); every measurement is
            capped at it.
        window: the ensemble's error window (:class:`netmon.ensemble.Series`).
        resolution: how far the forecast must move before :attr:`reported` follows it.
    """

    __slots__ = ("_bias", "_reported", "resolution", "series", "share")

    def __init__(self, share: float = 1.0, window: int | None = 20, resolution: float = 0.05):
        self.share = _fraction("site.cpu_share", share)
        if not (math.isfinite(resolution) and 0 <= resolution < 1):
            raise InvalidInput("cpu.resolution", "a fraction 0 <= resolution < 1", resolution)
        self.resolution = resolution
        self.series = Series(window)
        self._bias = 0.0  # probe - passive at the last probe
        self._reported: float | None = None

    def measure(self, passive: float, probe: float | None = None) -> float:
        """Take one measurement (``passive`` from :func:`from_load`, ``probe`` from
        :func:`from_probe` when one ran now) into the series; return it."""
        passive = _fraction("cpu.passive", passive)
        if probe is not None:
            probe = _fraction("cpu.probe", probe)
            self._bias = probe - passive
            value = probe
        else:
            value = _clamped(passive + self._bias)
        value = min(value, self.share)
        self.series.observe(value)
        forecast = self.forecast()
        if forecast is not None and (
            self._reported is None or abs(forecast - self._reported) >= self.resolution
        ):
            self._reported = round(forecast, 2)
        return value

    def forecast(self) -> float | None:
        """The ensemble's forecast of the next measurement (None before the first), in
        [:data:`FLOOR`, share]."""
        if not len(self.series):
            return None
        return min(self.share, _clamped(self.series.forecast()))

    @property
    def reported(self) -> float | None:
        """The forecast as published: hundredths, moved only by ``resolution`` or more."""
        if self._reported is None:
            return None
        return min(self.share, max(FLOOR, self._reported))

    def best(self) -> str | None:
        """The ensemble member forecasting now (None before the first measurement)."""
        return self.series.best() if len(self.series) else None
