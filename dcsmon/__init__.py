"""DCSMon: the neighbourhood's compute-resource states (n, c, q, s) with their age, and each
site's forecast CPU availability (its sensor, :mod:`dcsmon.cpu`).

May import: :mod:`gbroker.core`, :mod:`netmon` (its CPU sensor forecasts with NetMon's ensemble)
and libraries.
"""

from dcsmon.view import NeighbourhoodView, Observation

__all__ = ["NeighbourhoodView", "Observation"]
