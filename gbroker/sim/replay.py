"""Single-site trace replay: a workload of jobs through one local scheduler in virtual time.

The driver turns each trace job into a core :class:`~gbroker.core.model.Job` (planned with its
requested time), submits it at its arrival time, and ends it after its *actual* run time. At every
instant the kernel runs completions first (priority 0), then arrivals (1), and then, deferred to
the end of the instant, one scheduling pass, so the scheduler sees all changes of an instant
together.

With an :class:`~gbroker.core.sdpolicy.SdPolicy` (``sd_policy``) the jobs flagged ``malleable``
may run on fewer cores than they asked and change size while they run: each such job asks its
processors and runs on no fewer than half of them. A job's actual run time is its work at the
size it asked; it progresses at the speed its commands give (effective cores over asked cores,
SD-Policy's runtime model, which the paper's simulator also runs jobs by), and its end is
rescheduled at every change.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from gbroker.core.localsched import LocalScheduler, QueuePolicy, StartJob
from gbroker.core.metrics import BSLD_THRESHOLD, Summary, summarize
from gbroker.core.model import Job, JobClass
from gbroker.core.sdpolicy import SdPolicy
from gbroker.errors import InternalError, InvalidInput
from gbroker.sim.kernel import Kernel
from gbroker.workloads.trace import TraceJob

__all__ = ["JobOutcome", "ReplayResult", "TraceJob", "choose_malleable", "replay"]

_COMPLETION, _ARRIVAL = 0, 1


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
    shared: int = 0  # jobs started on cores that mates gave (SD-Policy)
    resizes: int = 0  # changes of size of running jobs

    def outcomes(self) -> Iterator[JobOutcome]:
        for job, b, e in zip(self.jobs, self.start, self.end, strict=True):
            yield JobOutcome(job, b, e)


def choose_malleable(jobs: Sequence[TraceJob], fraction: float, seed: int) -> list[bool]:
    """Which jobs are malleable: each with probability ``fraction`` (one draw per job, in trace
    order, from ``random.Random(seed)``), if it has more than one processor."""
    if not 0 <= fraction <= 1:
        raise InvalidInput("malleable_fraction", "a fraction in [0, 1]", fraction)
    rng = random.Random(seed)
    return [rng.random() < fraction and tj.processors > 1 for tj in jobs]


def _core_job(k: int, tj: TraceJob, malleable: bool) -> Job:
    if not malleable:
        return Job(str(k), tj.processors, tj.requested_time)
    low = -(-tj.processors // 2)  # half its processors, rounded up
    requested = tj.requested_time
    if requested is not None:
        requested = requested * tj.processors / low  # Job states it on its rank
    return Job(str(k), low, requested, JobClass.MALLEABLE, tj.processors)


def replay(
    jobs: Iterable[TraceJob | tuple[float, int, float, float | None]],
    cores: int,
    policy: QueuePolicy | str = QueuePolicy.EASY,
    *,
    bsld_threshold: float = BSLD_THRESHOLD,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 4096,
    scheduler_factory: Callable[[int, QueuePolicy], LocalScheduler] | None = None,
    sd_policy: SdPolicy | None = None,
    malleable: Sequence[bool] | None = None,
) -> ReplayResult:
    """Replay ``jobs`` on one machine of ``cores`` cores with ``policy`` (fcfs or easy).

    Jobs may be :class:`TraceJob` or plain ``(submit, processors, run_time, requested_time)``
    tuples. ``progress``, if given, is called with the number of jobs started so far every
    ``progress_every`` starts and once at the end. ``scheduler_factory(cores, policy)`` builds the
    local scheduler (a subclass may observe or extend it); by default a LocalScheduler with
    ``sd_policy``. ``malleable[k]`` makes job k malleable (see the module docstring).
    """
    trace = [j if isinstance(j, TraceJob) else TraceJob(*j) for j in jobs]
    if malleable is not None and len(malleable) != len(trace):
        raise InvalidInput("malleable", f"one flag per job ({len(trace)})", len(malleable))
    for k, tj in enumerate(trace):
        if tj.processors > cores:
            raise InvalidInput(
                f"jobs[{k}].processors", f"at most the machine's {cores} cores", tj.processors
            )
    n = len(trace)
    order = list(range(n))
    if any(trace[k].submit > trace[k + 1].submit for k in range(n - 1)):
        order.sort(key=lambda k: trace[k].submit)  # stable: equal arrivals keep trace order

    if scheduler_factory is None:
        scheduler = LocalScheduler(cores, policy, sd_policy=sd_policy)
    else:
        scheduler = scheduler_factory(cores, QueuePolicy(policy))
    kernel = Kernel(start=trace[order[0]].submit if n else 0.0)
    start = [0.0] * n
    end = [0.0] * n
    started = 0
    pass_posted = False
    next_arrival = 0
    # A job that changes size: its work left (seconds at the size it asked) as of ``since``, its
    # speed and cores since then, the core-seconds before, and which scheduled end is current.
    left: dict[int, float] = {}
    since: dict[int, float] = {}
    speed: dict[int, float] = {}
    held: dict[int, int] = {}
    used: dict[int, float] = {}
    version = [0] * n
    shared = resizes = 0

    def request_pass() -> None:
        nonlocal pass_posted
        if not pass_posted:
            pass_posted = True
            kernel.defer(schedule_pass)

    def arrive(k: int) -> None:
        nonlocal next_arrival
        tj = trace[k]
        scheduler.submit(_core_job(k, tj, malleable is not None and malleable[k]))
        next_arrival += 1
        if next_arrival < n:
            nk = order[next_arrival]
            kernel.at(trace[nk].submit, arrive, nk, _ARRIVAL)
        request_pass()

    def complete(payload: tuple[int, int]) -> None:
        k, current = payload
        if current != version[k]:
            return  # it changed size since: a later end is scheduled
        now = kernel.now
        end[k] = now
        if k in since:
            used[k] += (now - since[k]) * held[k]
        scheduler.finish(str(k))
        request_pass()

    def resized(k: int, cores: int, effective: float) -> None:
        now = kernel.now
        if k not in since:  # it ran at its size and full speed so far
            left[k], since[k], speed[k] = trace[k].run_time, start[k], 1.0
            held[k], used[k] = trace[k].processors, 0.0
        ran = now - since[k]
        left[k] = max(0.0, left[k] - ran * speed[k])
        used[k] += ran * held[k]
        since[k], held[k] = now, cores
        speed[k] = effective / trace[k].processors
        version[k] += 1
        kernel.at(now + left[k] / speed[k], complete, (k, version[k]), _COMPLETION)

    def schedule_pass() -> None:
        nonlocal pass_posted, started, shared, resizes
        pass_posted = False
        now = kernel.now
        for command in scheduler.schedule(now):
            if not isinstance(command, StartJob):
                resizes += 1
                resized(int(command.job_id), command.cores, command.effective_cores)
                continue
            k = int(command.job.id)
            start[k] = now
            run = trace[k].run_time
            if command.cores != trace[k].processors or command.effective is not None:
                shared += command.effective is not None
                rate = command.effective_cores / trace[k].processors
                left[k], since[k], speed[k] = run, now, rate
                held[k], used[k] = command.cores, 0.0
                run /= rate
            kernel.at(now + run, complete, (k, 0), _COMPLETION)
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

    processors = [tj.processors for tj in trace]
    core_seconds = None
    if used:  # some jobs did not hold their processors from start to end
        core_seconds = [used.get(k, (end[k] - start[k]) * processors[k]) for k in range(n)]
    summary = summarize(
        [tj.submit for tj in trace],
        start,
        end,
        processors,
        cores,
        bsld_threshold,
        core_seconds=core_seconds,
    )
    return ReplayResult(
        trace, start, end, cores, QueuePolicy(policy), summary, shared=shared, resizes=resizes
    )
