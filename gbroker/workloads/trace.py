"""A job of a workload: when it arrives, how many processors it asks for, how long it runs.

The unit every workload source yields (SWF traces, Poisson streams) and the replay takes."""

from __future__ import annotations

from dataclasses import dataclass

from gbroker.errors import InvalidInput

__all__ = ["TraceJob"]


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a workload: arrival, processors, actual and requested run time (seconds).

    ``requested_time`` None means unknown: the job can then only backfill into extra cores.
    """

    submit: float
    processors: int
    run_time: float
    requested_time: float | None = None
    id: int | str | None = None

    def __post_init__(self) -> None:
        if not self.submit >= 0:
            raise InvalidInput(f"trace_job[{self.id}].submit", "seconds >= 0", self.submit)
        if self.processors < 1:
            raise InvalidInput(
                f"trace_job[{self.id}].processors", "an integer >= 1", self.processors
            )
        if not self.run_time >= 0:
            raise InvalidInput(f"trace_job[{self.id}].run_time", "seconds >= 0", self.run_time)
        if self.requested_time is not None and not self.requested_time >= 0:
            raise InvalidInput(
                f"trace_job[{self.id}].requested_time", "seconds >= 0 or None", self.requested_time
            )
