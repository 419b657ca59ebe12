"""The discrete-event driver: a virtual clock feeds the core events and carries out its commands."""

from gbroker.sim.kernel import Kernel
from gbroker.sim.replay import ReplayResult, TraceJob, replay

__all__ = ["Kernel", "ReplayResult", "TraceJob", "replay"]
