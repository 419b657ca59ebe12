"""The discrete-event driver: a virtual clock feeds the core events and carries out its commands.

The mirror of :mod:`gbroker.daemon` in simulated time: :mod:`.kernel` (a heap of timed events),
:mod:`.grid` (the broker network: every site's broker and local scheduler, DCSMon and NetMon,
transfers over :mod:`.network`'s shared links), :mod:`.replay` (one site's scheduler over a trace),
:mod:`.elastic` (malleable jobs on speed-up models), :mod:`.experiment` (seeds and intervals),
:mod:`.sweep` (an experiment's independent runs, in this process or on Dask distributed),
:mod:`.apples` (Jacobi2D partitioned by AppLeS's planner on a loaded testbed).

May import: :mod:`gbroker.core`, :mod:`gbroker.workloads`, :mod:`gbroker.topology`, the pure
parts of :mod:`netmon`, :mod:`gbroker.errors`; never the daemon. Dask only in :mod:`.sweep`, and
only when a sweep uses it.
"""

from gbroker.sim.kernel import Kernel
from gbroker.sim.replay import ReplayResult, replay
from gbroker.workloads.trace import TraceJob

__all__ = ["Kernel", "ReplayResult", "TraceJob", "replay"]
