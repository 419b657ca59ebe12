"""DCSMon: the neighbourhood's compute-resource states (n, c, q, s) with their age."""

from dcsmon.view import NeighbourhoodView, Observation

__all__ = ["NeighbourhoodView", "Observation"]
