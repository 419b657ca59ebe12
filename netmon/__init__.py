"""NetMon: link measurements and transfer-time forecasts t(i, j, m)."""

from netmon.forecast import LinkTable, PiecewiseLinearForecaster

__all__ = ["LinkTable", "PiecewiseLinearForecaster"]
