"""The local scheduler of one site: a pure state machine over cores (ARCHITECTURE §7).

Theory of operation. The scheduler owns a site's cores, its queue of waiting jobs (in arrival
order) and the allocations of its running jobs. Callers feed it changes — :meth:`submit` a job,
:meth:`finish` or :meth:`cancel` one — which only update the state, and then call
:meth:`schedule` with the current time, which returns the :class:`StartJob` commands for every job
that starts now. Drivers call :meth:`schedule` once per instant after applying all changes of that
instant (completions, then arrivals), so that simultaneous events are seen together.

Plans use requested times (``Job.planned_time``); the driver decides when a job really ends
(the simulator from the trace's actual run time, the daemon when the process exits). A job that
runs past its plan keeps its cores until it really ends; its planned end then lies in the past.

Policies:
- FCFS starts jobs strictly in queue order and stops at the first that does not fit: no job ever
  overtakes an earlier one.
- EASY backfilling starts the queue head whenever it fits. When it does not, the head gets a
  reservation at the *shadow time*: walking the running jobs by planned end, the earliest time at
  which enough cores will be free for it; the cores free then beyond its need are the *extra*
  cores. A later job may start now only if it fits in the free cores now and either ends, by its
  requested time, no later than the shadow time, or uses no more than the extra cores (which it
  then consumes). Either way the head's reservation is never delayed.

Job classes: rigid jobs take exactly ``rank`` cores; moldable and malleable jobs start with the
largest size in ``[rank, max_rank]`` that the policy allows at that moment (and, for a job that
declares the sizes it accepts, the largest of those; its ``rank`` always does).

Malleability (:mod:`gbroker.core.malleable`). With a :class:`MalleabilityPolicy`, each pass also
resizes the running malleable jobs whose size the scheduler may change, and returns a
:class:`ResizeJob` per change, next to the :class:`StartJob` commands:

- PRA: first grow them with the free cores beyond the reserve (FPSMA or EGS), then serve the
  queue with what is left (KOALA §5.2: running applications take precedence), then grow again
  if jobs started (a job declaring an ``initial`` size starts on it and is grown at once).
- PWA: first serve the queue; if its head does not fit, shrink them to make room for it when
  their minimums allow it (then serve the queue again: the head starts now), else grow them with
  the free cores beyond the reserve; with an empty queue, grow them likewise. Without
  ``shrink_for_head`` it never shrinks: it serves the queue, then grows (ElastiSim's example).

A resize takes effect at once here (the simulator's jobs answer by their declared sizes; the
daemon enforces a site's decision through the job's CPU affinity). It moves the job's planned end:
the remaining planned time scales by old/new cores (the linear model the plans use) plus the
job's reconfiguration cost. :meth:`LocalScheduler.request` is an evolving job's own request
(application initiative): a shrink is granted down to its ``rank``, a growth up to the free cores
(ElastiSim's ``clip_evolving_requests``). Every allocation keeps its history of sizes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from enum import StrEnum

from gbroker.core.malleable import (
    Malleability,
    MalleabilityPolicy,
    Member,
    Precedence,
    Resize,
    grow,
    shrink,
)
from gbroker.core.model import Job, JobClass, SiteState
from gbroker.errors import InternalError, InvalidInput

__all__ = [
    "Allocation",
    "LocalScheduler",
    "QueuePolicy",
    "Reservation",
    "ResizeJob",
    "SchedulerCommand",
    "StartJob",
]

_ANY_SIZE = Malleability()


class QueuePolicy(StrEnum):
    FCFS = "fcfs"
    EASY = "easy"


@dataclass(slots=True)
class Allocation:
    """A running job's cores. Mutable: malleable jobs are resized in place."""

    job: Job
    cores: int
    start: float
    planned_end: float
    seq: int
    history: list[tuple[float, int]] | None = None  # (when, cores) of each size, for malleable
    cap: int | None = None  # no growth beyond: the job took less than it was offered (took)


@dataclass(frozen=True, slots=True)
class Reservation:
    """EASY's promise to a blocked queue head: it starts no later than ``shadow_time``.

    ``extra_cores`` are the cores free at the shadow time beyond the head's need that no
    backfilled job has claimed yet.
    """

    job_id: str
    shadow_time: float
    extra_cores: int


@dataclass(frozen=True, slots=True)
class StartJob:
    """Command: start ``job`` now on ``cores`` cores."""

    job: Job
    cores: int


@dataclass(frozen=True, slots=True)
class ResizeJob:
    """Command: the running job ``job_id`` now has ``cores`` cores (it had ``old``)."""

    job_id: str
    old: int
    cores: int


SchedulerCommand = StartJob | ResizeJob


class LocalScheduler:
    """One site's queue and cores. See the module docstring for the policies."""

    __slots__ = (
        "_by_end",
        "_queue",
        "_queued_ids",
        "_running",
        "_seq",
        "_settled",
        "free_cores",
        "malleability",
        "policy",
        "reservation",
        "total_cores",
    )

    def __init__(
        self,
        total_cores: int,
        policy: QueuePolicy | str = QueuePolicy.EASY,
        malleability: MalleabilityPolicy | None = None,
    ) -> None:
        if total_cores < 1:
            raise InvalidInput("total_cores", "an integer >= 1", total_cores)
        try:
            self.policy = QueuePolicy(policy)
        except ValueError:
            raise InvalidInput("policy", f"one of {', '.join(QueuePolicy)}", policy) from None
        if malleability is not None and malleability.reserve >= total_cores:
            raise InvalidInput(
                "malleability.reserve", f"fewer than the site's {total_cores} cores", malleability
            )
        self.malleability = malleability
        self.total_cores = total_cores
        self.free_cores = total_cores
        self._queue: list[Job] = []
        self._queued_ids: set[str] = set()
        self._running: dict[str, Allocation] = {}
        # Running allocations ordered by (planned_end, seq): the shadow-time walk reads it in order.
        self._by_end: list[tuple[float, int, Allocation]] = []
        self._seq = 0
        # How many queued jobs (from the head) the last pass examined and could not start. Only
        # arrivals since then (which append) keep that verdict valid; 0 means examine them all.
        self._settled = 0
        # The queue head's reservation as of the last pass (EASY only; None when it is not blocked).
        self.reservation: Reservation | None = None

    # -- changes ---------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job``. It must fit the machine at its smallest size."""
        if job.rank > self.total_cores:
            raise InvalidInput(
                f"job[{job.id}].rank", f"at most the site's {self.total_cores} cores", job.rank
            )
        if job.id in self._running or job.id in self._queued_ids:
            raise InvalidInput("job.id", "an id not already at this site", job.id)
        self._queue.append(job)
        self._queued_ids.add(job.id)

    def finish(self, job_id: str) -> Allocation:
        """Release the cores of a running job (it ended, failed or was killed)."""
        alloc = self._running.pop(job_id, None)
        if alloc is None:
            raise InvalidInput("job_id", "a job running at this site", job_id)
        by_end = self._by_end
        i = bisect_left(by_end, (alloc.planned_end, alloc.seq))
        if by_end[i][2] is not alloc:
            raise InternalError(f"allocation index lost job {job_id}")
        del by_end[i]
        self.free_cores += alloc.cores
        self._settled = 0
        return alloc

    def resume(self, job: Job, cores: int, started_at: float) -> Allocation:
        """Record a job already running on ``cores`` cores since ``started_at`` (a site taking
        its jobs back after a restart). Resume running jobs before queueing new ones."""
        if job.id in self._running or job.id in self._queued_ids:
            raise InvalidInput("job.id", "an id not already at this site", job.id)
        if not 1 <= cores <= self.free_cores:
            raise InvalidInput(
                f"job[{job.id}].cores", f"between 1 and the {self.free_cores} free cores", cores
            )
        self._start(job, cores, started_at)
        self._settled = 0
        return self._running[job.id]

    def cancel(self, job_id: str) -> Job | None:
        """Withdraw a queued job; None if it is not queued (it may be running or unknown)."""
        if job_id not in self._queued_ids:
            return None
        for i, job in enumerate(self._queue):
            if job.id == job_id:
                del self._queue[i]
                self._queued_ids.discard(job_id)
                self._settled = 0
                return job
        raise InternalError(f"queue index lost job {job_id}")

    # -- views -----------------------------------------------------------------------------------

    @property
    def queue(self) -> tuple[Job, ...]:
        return tuple(self._queue)

    @property
    def running(self) -> tuple[Allocation, ...]:
        return tuple(self._running.values())

    def allocation(self, job_id: str) -> Allocation | None:
        return self._running.get(job_id)

    def state(self) -> SiteState:
        """n, c, q, s as DCSMon publishes them, and (PWA) the busy cores that shrinking the
        running malleable jobs would free for a new job at once."""
        policy = self.malleability
        shrinkable = 0
        if policy is not None and policy.precedence is Precedence.PWA and policy.shrink_for_head:
            shrinkable = sum(m.can_give for m in self._members())
        return SiteState(
            self.total_cores,
            self.free_cores,
            len(self._queue),
            len(self._running),
            shrinkable=shrinkable,
        )

    # -- decisions -------------------------------------------------------------------------------

    def schedule(self, now: float) -> list[SchedulerCommand]:
        """Start every job the policy allows at ``now`` and, with a malleability policy, resize
        the running malleable jobs; return what was started and resized."""
        policy = self.malleability
        if policy is None:
            return list(self._place(now))
        out: list[SchedulerCommand] = []
        if policy.precedence is Precedence.PRA:
            out.extend(self._grow(now))
            started = self._place(now)
            out.extend(started)
            if started:  # the jobs just started are running malleable jobs too: grow them
                out.extend(self._grow(now))
            return out
        out.extend(self._place(now))
        queue = self._queue
        if not queue:
            out.extend(self._grow(now))
        elif queue[0].rank > self.free_cores:
            need = queue[0].rank - self.free_cores
            members = self._members()
            if policy.shrink_for_head and sum(m.can_give for m in members) >= need:
                out.extend(self._apply(shrink(policy.policy, members, need), now))
                out.extend(self._place(now))
            else:
                out.extend(self._grow(now))
        return out

    def request(self, job_id: str, cores: int, now: float) -> ResizeJob | None:
        """An evolving job asks for ``cores`` cores: granted down to its rank and up to its
        maximum and the free cores. None when its size stays as it is. It may be offered
        growth again (a :meth:`took` cap is lifted)."""
        alloc = self._malleable(job_id)
        alloc.cap = None
        return self._settle(alloc, cores, now)

    def took(self, job_id: str, cores: int, now: float) -> ResizeJob | None:
        """A running malleable job took ``cores`` of what it was offered: fewer than a grow
        offered, or more given back than a shrink asked (a real application answers for
        itself, KOALA's voluntary changes). Its size becomes that, within its bounds (as
        :meth:`request`); having taken less than it had been given, it is offered no more
        growth until it asks for it (:meth:`request`): a job that declines would otherwise be
        offered the same cores at every pass. None when its size stays as it is."""
        alloc = self._malleable(job_id)
        change = self._settle(alloc, cores, now)
        if change is not None and change.cores < change.old:
            alloc.cap = change.cores
        return change

    def _malleable(self, job_id: str) -> Allocation:
        alloc = self._running.get(job_id)
        if alloc is None:
            raise InvalidInput("job_id", "a job running at this site", job_id)
        job = alloc.job
        if job.job_class is not JobClass.MALLEABLE:
            raise InvalidInput(f"job[{job_id}]", "a malleable job to resize", job.job_class)
        return alloc

    def _settle(self, alloc: Allocation, cores: int, now: float) -> ResizeJob | None:
        job = alloc.job
        granted = max(job.rank, min(cores, job.max_rank, alloc.cores + self.free_cores))
        if granted == alloc.cores:
            return None
        return self._resize(alloc, granted, now)

    def _members(self) -> list[Member]:
        out = []
        for alloc in self._running.values():
            job = alloc.job
            if job.job_class is not JobClass.MALLEABLE:
                continue
            declared = job.malleability or _ANY_SIZE
            if declared.scheduler_may_resize:
                most = job.max_rank if alloc.cap is None else max(alloc.cores, alloc.cap)
                out.append(Member(job.id, alloc.start, alloc.cores, job.rank, most, declared.sizes))
        return out

    def _grow(self, now: float) -> list[ResizeJob]:
        assert self.malleability is not None
        amount = self.free_cores - self.malleability.reserve
        if amount <= 0:
            return []
        members = self._members()
        return self._apply(grow(self.malleability.policy, members, amount), now) if members else []

    def _apply(self, resizes: list[Resize], now: float) -> list[ResizeJob]:
        return [self._resize(self._running[r.job_id], r.cores, now) for r in resizes]

    def _resize(self, alloc: Allocation, cores: int, now: float) -> ResizeJob:
        job = alloc.job
        if not job.rank <= cores <= job.max_rank or cores - alloc.cores > self.free_cores:
            raise InternalError(f"resize of {job.id} to {cores} cores is out of bounds")
        by_end = self._by_end
        i = bisect_left(by_end, (alloc.planned_end, alloc.seq))
        if by_end[i][2] is not alloc:
            raise InternalError(f"allocation index lost job {job.id}")
        del by_end[i]
        old = alloc.cores
        cost = (job.malleability or _ANY_SIZE).reconfiguration_cost
        left = alloc.planned_end - now
        if left > 0:  # work remains by the plan: it scales with the cores (linear model)
            alloc.planned_end = now + left * old / cores + cost
        self.free_cores -= cores - old
        alloc.cores = cores
        if alloc.history is None:
            alloc.history = [(alloc.start, old)]
        alloc.history.append((now, cores))
        insort(by_end, (alloc.planned_end, alloc.seq, alloc))
        self._settled = 0
        return ResizeJob(job.id, old, cores)

    def _place(self, now: float) -> list[StartJob]:
        """Start every queued job the queue policy allows at ``now``."""
        queue = self._queue
        started: list[StartJob] = []
        if self._settled:
            # Only arrivals since the last pass: the jobs it examined still cannot start (same
            # free cores, same reservation, and a later ``now`` only tightens the time rule).
            if self.reservation is None:
                return started
            shadow = self.reservation.shadow_time
            extra = self.reservation.extra_cores
            i = self._settled
        else:
            # The head starts whenever it fits, under either policy.
            while queue:
                head = queue[0]
                if head.rank > self.free_cores:
                    break
                del queue[0]
                started.append(self._start(head, self._size(head, self.free_cores), now))
            if not queue:
                self.reservation = None
                return started
            self._settled = len(queue)
            if self.policy is QueuePolicy.FCFS:
                self.reservation = None
                return started
            shadow, extra = self._reservation(queue[0].rank)
            i = 1
        free = self.free_cores
        while free > 0 and i < len(queue):
            job = queue[i]
            if job.rank > free:
                i += 1
                continue
            cores = job.max_rank if job.max_rank < free else free
            if cores != job.rank and job.malleability is not None:
                cores = self._size(job, cores)
            if shadow >= now and now + job.planned_time(cores) <= shadow:
                pass  # ends before the head's reservation: cannot delay it
            elif job.rank <= extra:
                cores = min(cores, extra)
                extra -= cores
            else:
                i += 1
                continue
            del queue[i]
            started.append(self._start(job, cores, now))
            free = self.free_cores
        self._settled = len(queue)
        self.reservation = Reservation(queue[0].id, shadow, extra)
        return started

    def _reservation(self, need: int) -> tuple[float, int]:
        """Shadow time and extra cores for a blocked head that needs ``need`` cores.

        Every job planned to end at the shadow time frees its cores then, so all of them count
        towards the extra cores, not only those reached before ``need`` was met."""
        available = self.free_cores
        shadow: float | None = None
        for planned_end, _seq, alloc in self._by_end:
            if shadow is not None and planned_end > shadow:
                break
            available += alloc.cores
            if shadow is None and available >= need:
                shadow = planned_end
        if shadow is not None:
            return shadow, available - need
        raise InternalError(f"a job of {need} cores can never fit {self.total_cores} cores")

    @staticmethod
    def _size(job: Job, limit: int) -> int:
        """The size ``job`` starts with when ``limit`` cores are free (limit >= its rank): the
        largest it may take, among the sizes it accepts if it declares them."""
        cores = min(job.max_rank, limit)
        if cores == job.rank or job.malleability is None:
            return cores
        if job.malleability.initial is not None:
            cores = min(cores, max(job.rank, job.malleability.initial))
        return job.malleability.sizes.largest(job.rank, cores) or job.rank

    def _start(self, job: Job, cores: int, now: float) -> StartJob:
        self._queued_ids.discard(job.id)
        self.free_cores -= cores
        seq = self._seq
        self._seq = seq + 1
        alloc = Allocation(job, cores, now, now + job.planned_time(cores), seq)
        self._running[job.id] = alloc
        insort(self._by_end, (alloc.planned_end, seq, alloc))
        return StartJob(job, cores)
