"""Single-site trace replay: a workload of jobs through one local scheduler in virtual time.

The driver turns each trace job into a core :class:`~gbroker.core.model.Job` (planned with its
requested time), submits it at its arrival time, and ends it after its *actual* run time. At every
instant the kernel runs completions first (priority 0), then arrivals (1), and then, deferred to
the end of the instant, one scheduling pass, so the scheduler sees all changes of an instant
together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gbroker.core.localsched import LocalScheduler, QueuePolicy, StartJob
from gbroker.core.metrics import BSLD_THRESHOLD, Summary, summarize
from gbroker.core.model import Job
from gbroker.errors import InternalError, InvalidInput
from gbroker.sim.kernel import Kernel

__all__ = ["JobOutcome", "ReplayResult", "TraceJob", "replay"]

_COMPLETION, _ARRIVAL = 0, 1


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


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job: TraceJob
    start: float
    end: float


@dataclass(slots=True)
class ReplayResult:
    """Per-job start and end times (index-aligned with ``jobs``) and the summary."""

    jobs: list[TraceJob]
    start: list[float]
    end: list[float]
    cores: int
    policy: QueuePolicy
    summary: Summary

    def outcomes(self) -> Iterator[JobOutcome]:
        for job, b, e in zip(self.jobs, self.start, self.end, strict=True):
            yield JobOutcome(job, b, e)


def replay(
    jobs: Iterable[TraceJob | tuple[float, int, float, float | None]],
    cores: int,
    policy: QueuePolicy | str = QueuePolicy.EASY,
    *,
    bsld_threshold: float = BSLD_THRESHOLD,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 4096,
    scheduler_factory: Callable[[int, QueuePolicy], LocalScheduler] = LocalScheduler,
) -> ReplayResult:
    """Replay ``jobs`` on one machine of ``cores`` cores with ``policy`` (fcfs or easy).

    Jobs may be :class:`TraceJob` or plain ``(submit, processors, run_time, requested_time)``
    tuples. ``progress``, if given, is called with the number of jobs started so far every
    ``progress_every`` starts and once at the end. ``scheduler_factory(cores, policy)`` builds the
    local scheduler (a subclass may observe or extend it).
    """
    trace = [j if isinstance(j, TraceJob) else TraceJob(*j) for j in jobs]
    for k, tj in enumerate(trace):
        if tj.processors > cores:
            raise InvalidInput(
                f"jobs[{k}].processors", f"at most the machine's {cores} cores", tj.processors
            )
    n = len(trace)
    order = list(range(n))
    if any(trace[k].submit > trace[k + 1].submit for k in range(n - 1)):
        order.sort(key=lambda k: trace[k].submit)  # stable: equal arrivals keep trace order

    scheduler = scheduler_factory(cores, QueuePolicy(policy))
    kernel = Kernel(start=trace[order[0]].submit if n else 0.0)
    start = [0.0] * n
    end = [0.0] * n
    started = 0
    pass_posted = False
    next_arrival = 0

    def request_pass() -> None:
        nonlocal pass_posted
        if not pass_posted:
            pass_posted = True
            kernel.defer(schedule_pass)

    def arrive(k: int) -> None:
        nonlocal next_arrival
        tj = trace[k]
        scheduler.submit(Job(str(k), tj.processors, tj.requested_time))
        next_arrival += 1
        if next_arrival < n:
            nk = order[next_arrival]
            kernel.at(trace[nk].submit, arrive, nk, _ARRIVAL)
        request_pass()

    def complete(k: int) -> None:
        scheduler.finish(str(k))
        request_pass()

    def schedule_pass() -> None:
        nonlocal pass_posted, started
        pass_posted = False
        now = kernel.now
        for command in scheduler.schedule(now):
            if not isinstance(command, StartJob):  # no malleability here: see sim.malleable
                raise InternalError(f"replay cannot resize jobs: {command}")
            k = int(command.job.id)
            start[k] = now
            end[k] = finish = now + trace[k].run_time
            kernel.at(finish, complete, k, _COMPLETION)
            started += 1
            if progress is not None and started % progress_every == 0:
                progress(started)

    if n:
        kernel.at(trace[order[0]].submit, arrive, order[0], _ARRIVAL)
    kernel.run()
    if progress is not None:
        progress(started)
    if started != n:  # every job fits the machine, so every job must have run
        raise InternalError(f"replay started {started} of {n} jobs")

    summary = summarize(
        [tj.submit for tj in trace],
        start,
        end,
        [tj.processors for tj in trace],
        cores,
        bsld_threshold,
    )
    return ReplayResult(trace, start, end, cores, QueuePolicy(policy), summary)
