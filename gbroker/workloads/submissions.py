"""Jobs the simulator can take from job descriptions: a JSDL (or JSON/YAML) job, or a job array.

Theory of operation. The simulator's workload is a list of
:class:`~gbroker.workloads.streams.Arrival`. A described job becomes one arrival; a job array (a
parameter sweep, :mod:`gbroker.jobs.sweep`) becomes one arrival per element, all entering the same
broker at the same instant, with the element ids the daemon gives them
(:func:`gbroker.core.arrays.element_id`): the simulated owner sees what a real one would, N ordinary
jobs. Each job carries its requirements
(:meth:`gbroker.jobs.description.JobDescription.requirements`), which the simulated brokers match
against the topology's site properties in the core, as the daemons do.

A description says how long a job may run, not how long it runs: its actual run time here is
``run_time`` when given, else its requested time (WallTimeLimit, or the CPU time it asks for).
"""

from __future__ import annotations

from gbroker.core.arrays import element_id
from gbroker.errors import InvalidInput
from gbroker.jobs.description import JobDescription
from gbroker.jobs.sweep import JobArray
from gbroker.workloads.streams import Arrival

__all__ = ["submission_arrivals"]


def submission_arrivals(
    submission: JobDescription | JobArray,
    *,
    entry: str,
    at: float,
    job_id: str,
    run_time: float | None = None,
) -> list[Arrival]:
    """The arrivals of a submission at broker ``entry`` at time ``at``: one job ``job_id``, or
    the elements ``job_id_1`` .. ``job_id_N`` of an array."""
    if isinstance(submission, JobArray):
        named = [(element_id(job_id, i), d) for i, d in enumerate(submission.elements, start=1)]
    else:
        named = [(job_id, submission)]
    arrivals = []
    for name, desc in named:
        job = desc.to_job(name, entry)
        actual = run_time if run_time is not None else job.requested_time
        if actual is None:
            raise InvalidInput(
                f"job[{name}].run_time",
                "a run time: give one, or a WallTimeLimit in the description",
                None,
            )
        if not actual >= 0:
            raise InvalidInput(f"job[{name}].run_time", "seconds >= 0", actual)
        arrivals.append(Arrival(at, entry, job, actual))
    return arrivals
