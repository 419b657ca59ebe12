"""Workload sources: what jobs arrive, and how their work scales.

:mod:`.trace` (a job of a workload), :mod:`.swf` (Standard Workload Format traces),
:mod:`.streams` (the paper's Poisson streams), :mod:`.submissions` (job files as arrivals),
:mod:`.speedup` (speed-up models: linear, Amdahl, Downey, ElastiSim's application model).

May import: :mod:`gbroker.core`, :mod:`gbroker.jobs`, :mod:`gbroker.errors`.
"""
