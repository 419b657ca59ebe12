"""DCSMon: the neighbourhood's compute-resource states (n, c, q, s) with their age, and each
site's forecast CPU availability (its sensor, :mod:`dcsmon.cpu`)."""

from dcsmon.view import NeighbourhoodView, Observation

__all__ = ["NeighbourhoodView", "Observation"]
