"""NetMon: link measurements and transfer-time forecasts t(i, j, m).

May import: nothing of GBroker; libraries only.
"""

from netmon.forecast import LinkTable, PiecewiseLinearForecaster

__all__ = ["LinkTable", "PiecewiseLinearForecaster"]
