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

FCFS never lets a job overtake an earlier one; EASY backfilling lets a later job start only where
it cannot delay the head's reservation at the *shadow time*. Moldable and malleable jobs start at
the largest size the policy allows. With a :class:`MalleabilityPolicy` each pass also resizes
running malleable jobs (:class:`ResizeJob`, by PRA or PWA, :mod:`gbroker.core.malleable`); with
an :class:`SdPolicy` (EASY only) a malleable job may start at once on cores its running *mates*
lend it (:mod:`gbroker.core.sdpolicy`). A resize takes effect at once here and moves the job's
planned end by the linear model plus its reconfiguration cost. Every rule of these policies:
docs/DESIGN.md, "A site's local scheduler".
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
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
from gbroker.core.sdpolicy import (
    Mate,
    NewJob,
    SdDecision,
    SdPolicy,
    Segment,
    average_slowdown,
    guest_cores,
    sd_backfill,
    speed,
)
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
    speed: float = 1.0  # the fraction of its static speed it runs at (SD-Policy's shares)


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
    """Command: start ``job`` now on ``cores`` cores.

    ``effective``: the cores' worth of work it does per second when that is not ``cores`` (an
    SD-Policy guest's speed times the cores it asked); None: ``cores``."""

    job: Job
    cores: int
    effective: float | None = None

    @property
    def effective_cores(self) -> float:
        return self.cores if self.effective is None else self.effective


@dataclass(frozen=True, slots=True)
class ResizeJob:
    """Command: the running job ``job_id`` now has ``cores`` cores (it had ``old``).

    ``effective``: as for :class:`StartJob`."""

    job_id: str
    old: int
    cores: int
    effective: float | None = None

    @property
    def effective_cores(self) -> float:
        return self.cores if self.effective is None else self.effective


SchedulerCommand = StartJob | ResizeJob


@dataclass(slots=True)
class _Shares:
    """SD-Policy's bookkeeping (see the module docstring)."""

    policy: SdPolicy
    unstamped: list[str] = field(default_factory=list)  # queued since the last pass
    queued_at: dict[str, float] = field(default_factory=dict)  # first pass that saw it queued
    waited: dict[str, float] = field(default_factory=dict)  # running job: its wait
    extended: dict[str, float] = field(default_factory=dict)  # running job: predicted increase
    guests: dict[str, list[Segment]] = field(default_factory=dict)  # guest: its segments
    lending: dict[str, tuple[str, int]] = field(default_factory=dict)  # mate: (guest, given)
    work: dict[str, tuple[float, float]] = field(default_factory=dict)  # planned work at since
    pending: list[tuple[str, str]] = field(default_factory=list)  # (mate, guest) that ended
    # Jobs taken back after a restart on fewer cores than they asked: their shares were lost
    # with it, so they grow back from cores the queue leaves free (_sd_regrow).
    short: set[str] = field(default_factory=set)
    # Caches for one state of the running jobs (stale after any start, end or change of size).
    stale: bool = True
    mates: list[Mate] = field(default_factory=list)
    offered: int = 0
    cutoff: float | None = None
    times: list[float] = field(default_factory=list)  # planned ends, ascending
    freed: list[int] = field(default_factory=list)  # free cores once each of them has ended

    @staticmethod
    def shares(job: Job) -> bool:
        """Whether SD-Policy may start ``job`` small or shrink it (:attr:`Job.shares_cores`)."""
        return job.shares_cores


class LocalScheduler:
    """One site's queue and cores. See the module docstring for the policies."""

    __slots__ = (
        "_by_end",
        "_queue",
        "_queued_ids",
        "_running",
        "_sd",
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
        sd_policy: SdPolicy | None = None,
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
        if sd_policy is not None:
            if malleability is not None:
                raise InvalidInput(
                    "sd_policy", "no KOALA malleability policy beside it (choose one)", sd_policy
                )
            if self.policy is not QueuePolicy.EASY:
                raise InvalidInput(
                    "policy", "easy with an SD-Policy (it is a backfill variant)", self.policy
                )
        self._sd = None if sd_policy is None else _Shares(sd_policy)
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
        if self._sd is not None:
            self._sd.unstamped.append(job.id)

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
        if self._sd is not None:
            self._sd_ended(job_id)
        return alloc

    def resume(self, job: Job, cores: int, started_at: float) -> Allocation:
        """Record a job already running on ``cores`` cores since ``started_at`` (a site taking
        its jobs back after a restart). Resume running jobs before queueing new ones.

        Under SD-Policy a job that may share, taken back on fewer cores than it asked, may
        have been a mate or a guest: its share was lost with the restart, so it grows back
        to what it asked from the cores left free once nobody is queued (:meth:`_sd_regrow`)."""
        if job.id in self._running or job.id in self._queued_ids:
            raise InvalidInput("job.id", "an id not already at this site", job.id)
        if not 1 <= cores <= self.free_cores:
            raise InvalidInput(
                f"job[{job.id}].cores", f"between 1 and the {self.free_cores} free cores", cores
            )
        self._start(job, cores, started_at)
        self._settled = 0
        if self._sd is not None:
            self._sd.stale = True
            if job.shares_cores and cores < job.max_rank:
                self._sd.short.add(job.id)  # it may have shared: see _sd_regrow
                # Planned as any job that shares: at its cores over those it asked.
                self._running[job.id].speed = cores / job.max_rank
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
                if self._sd is not None:
                    self._sd.queued_at.pop(job_id, None)
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
        """n, c, q, s as DCSMon publishes them; (PWA) the busy cores that shrinking the running
        malleable jobs would free for a new job at once; (SD-Policy) the busy cores its mates
        would give at once to one new job that may share (:meth:`shareable`)."""
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
            shareable=0 if self._sd is None else self.shareable(),
        )

    def shareable(self) -> int:
        """SD-Policy's cores a new job could start on now: the most that ``m`` of the running
        mates give (each its SharingFactor of its cores, down to its minimum), counting only
        mates whose predicted slowdown is already under MAX_SLOWDOWN (a share only raises it:
        constraint 2). An upper bound: whether a given job shares also depends on its own
        times (it must end sooner than by waiting, and inside its mates' allocations). 0
        without SD-Policy."""
        if self._sd is None:
            return 0
        shares = self._sd_refresh()
        cutoff = shares.cutoff
        assert cutoff is not None
        factor = shares.policy.sharing_factor
        offers = sorted(
            (m.offer(factor) for m in shares.mates if m.slowdown < cutoff), reverse=True
        )
        return sum(o for o in offers[: shares.policy.max_mates] if o > 0)

    # -- decisions -------------------------------------------------------------------------------

    def schedule(self, now: float) -> list[SchedulerCommand]:
        """Start every job the policy allows at ``now`` and, with a malleability policy, resize
        the running malleable jobs; return what was started and resized."""
        policy = self.malleability
        if self._sd is not None:
            return self._schedule_sd(now)
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
        growth again (a :meth:`took` cap is lifted). Under SD-Policy a job that shares (a
        guest, or a mate lending cores) may not ask: its size is its share's."""
        alloc = self._malleable(job_id)
        alloc.cap = None
        if self._sd is not None and alloc.job.shares_cores:
            return self._sd_settle_size(alloc, cores, now)
        return self._settle(alloc, cores, now)

    def took(self, job_id: str, cores: int, now: float) -> ResizeJob | None:
        """A running malleable job took ``cores`` of what it was offered: fewer than a grow
        offered, or more given back than a shrink asked (a real application answers for
        itself, KOALA's voluntary changes). Its size becomes that, within its bounds (as
        :meth:`request`); having taken less than it had been given, it is offered no more
        growth until it asks for it (:meth:`request`): a job that declines would otherwise be
        offered the same cores at every pass. None when its size stays as it is.

        Under SD-Policy a job that shares may only give back: a mate that gave more than it
        lent, or a guest that declined a share it could take back (:meth:`_sd_settle_size`)."""
        alloc = self._malleable(job_id, giving_back=True)
        if self._sd is not None and alloc.job.shares_cores:
            change = self._sd_settle_size(alloc, cores, now)
        else:
            change = self._settle(alloc, cores, now)
        if change is not None and change.cores < change.old:
            alloc.cap = change.cores
        return change

    def _malleable(self, job_id: str, giving_back: bool = False) -> Allocation:
        alloc = self._running.get(job_id)
        if alloc is None:
            raise InvalidInput("job_id", "a job running at this site", job_id)
        job = alloc.job
        if job.job_class is not JobClass.MALLEABLE:
            raise InvalidInput(f"job[{job_id}]", "a malleable job to resize", job.job_class)
        shares = self._sd
        if (
            not giving_back
            and shares is not None
            and (job_id in shares.guests or job_id in shares.lending)
        ):
            raise InvalidInput(f"job[{job_id}]", "a job not sharing its cores (SD-Policy)", job_id)
        return alloc

    def _settle(self, alloc: Allocation, cores: int, now: float) -> ResizeJob | None:
        job = alloc.job
        granted = max(job.rank, min(cores, job.max_rank, alloc.cores + self.free_cores))
        if granted == alloc.cores:
            return None
        change = self._resize(alloc, granted, now)
        if self._sd is not None:
            self._sd.stale = True
        return change

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
            resumed = self._resume()
            if resumed is None:
                return started
            shadow, extra, i = resumed
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

    def _resume(self) -> tuple[float, int, int] | None:
        """After a pass that only arrivals followed, the jobs it examined still cannot start
        (same free cores, same reservation, and a later ``now`` only tightens the time rule):
        the head's shadow time and extra cores and the first job to examine, or None when
        nothing blocks the queue."""
        if self.reservation is None:
            return None
        return self.reservation.shadow_time, self.reservation.extra_cores, self._settled

    def _reservation(self, need: int) -> tuple[float, int]:
        """Shadow time and extra cores for a blocked head that needs ``need`` cores.

        Every job planned to end at the shadow time frees its cores then, so all of them count
        towards the extra cores, not only those reached before ``need`` was met."""
        available = self.free_cores
        shadow: float | None = None
        shares = self._sd
        for planned_end, _seq, alloc in self._by_end:
            if shadow is not None and planned_end > shadow:
                break
            available += alloc.cores if shares is None else self._releases(alloc)
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

    def _start(
        self, job: Job, cores: int, now: float, planned_end: float | None = None
    ) -> StartJob:
        self._queued_ids.discard(job.id)
        self.free_cores -= cores
        seq = self._seq
        self._seq = seq + 1
        if planned_end is None:
            planned_end = now + job.planned_time(cores)
        alloc = Allocation(job, cores, now, planned_end, seq)
        self._running[job.id] = alloc
        insort(self._by_end, (alloc.planned_end, seq, alloc))
        return StartJob(job, cores)

    # -- SD-Policy (see the module docstring and gbroker.core.sdpolicy) ---------------------------

    def _schedule_sd(self, now: float) -> list[SchedulerCommand]:
        shares = self._sd
        assert shares is not None
        shares.stale = True  # the running jobs may have changed since (resume, finish)
        for job_id in shares.unstamped:
            if job_id in self._queued_ids:
                shares.queued_at[job_id] = now
        shares.unstamped.clear()
        out: list[SchedulerCommand] = self._sd_settle(now)
        out.extend(self._place_sd(now))
        if shares.short and not self._queue and self.free_cores:
            out.extend(self._sd_regrow(now))
        return out

    def _sd_regrow(self, now: float) -> list[SchedulerCommand]:
        """Grow the jobs resumed short (:meth:`resume`) back towards the cores they asked, with
        the free cores, oldest first. Only with nobody queued: their plans never counted on
        these cores, so they must not take what a waiting job was promised."""
        shares = self._sd
        assert shares is not None
        out: list[SchedulerCommand] = []
        for alloc in sorted(self._running.values(), key=lambda a: a.seq):
            job_id = alloc.job.id
            if job_id not in shares.short:
                continue
            asked = alloc.job.max_rank
            cores = min(asked, alloc.cores + self.free_cores)
            if cores > alloc.cores:
                old = alloc.cores
                self._rework(alloc, now)
                self._move(alloc, cores, cores / asked, now)
                self._replan(alloc)
                out.append(ResizeJob(job_id, old, cores))
            if cores == asked:
                shares.short.discard(job_id)
            if not self.free_cores:
                break
        if out:
            shares.stale = True
            self._settled = 0
        return out

    def _place_sd(self, now: float) -> list[SchedulerCommand]:
        """EASY with malleable backfill after each failed static trial (Listing 1)."""
        shares = self._sd
        assert shares is not None
        queue = self._queue
        out: list[SchedulerCommand] = []
        if self._settled:
            # Nor malleably: a later ``now`` only moves its malleable end later, and nothing
            # else its decision read has changed.
            resumed = self._resume()
            if resumed is None:
                return out
            shadow, extra, i = resumed
        else:
            while queue:
                head = queue[0]
                need = self._need(head)
                if need <= self.free_cores:
                    del queue[0]
                    out.append(self._sd_start(head, self._static_size(head, self.free_cores), now))
                    continue
                if shares.shares(head):
                    shadow, _ = self._reservation(need)
                    decision = self._sd_decide(head, max(now, shadow), now, None)
                    if decision is not None:
                        del queue[0]
                        out.extend(self._share(head, decision, now))
                        continue
                break
            if not queue:
                self.reservation = None
                return out
            shadow, extra = self._reservation(self._need(queue[0]))
            i = 1
        head = queue[0]
        head_need = self._need(head)
        head_time = head.planned_time(head_need)
        while i < len(queue):
            job = queue[i]
            need = self._need(job)
            free = self.free_cores
            if need <= free:
                cores = self._static_size(job, free)
                if shadow >= now and now + job.planned_time(cores) <= shadow:
                    pass  # ends before the head's reservation: cannot delay it
                elif need <= extra:
                    cores = min(cores, extra)
                    extra -= cores
                else:
                    cores = 0
                if cores:
                    del queue[i]
                    out.append(self._sd_start(job, cores, now))
                    continue
            if shares.shares(job):
                requested = job.planned_time(need)
                begin = self._static_start(need, requested, now, shadow, head_need, head_time)
                decision = self._sd_decide(job, begin, now, shadow)
                if decision is not None:
                    del queue[i]
                    out.extend(self._share(job, decision, now))
                    continue
            i += 1
        self._settled = len(queue)
        self.reservation = Reservation(queue[0].id, shadow, extra)
        return out

    def _need(self, job: Job) -> int:
        """The cores a job needs to start statically: what a sharing job asked, else its rank."""
        assert self._sd is not None
        return job.max_rank if self._sd.shares(job) else job.rank

    def _static_size(self, job: Job, free: int) -> int:
        assert self._sd is not None
        return job.max_rank if self._sd.shares(job) else self._size(job, free)

    def _sd_start(self, job: Job, cores: int, now: float) -> StartJob:
        """A static start under SD-Policy: its wait is noted for the penalties."""
        assert self._sd is not None
        self._sd.waited[job.id] = now - self._sd.queued_at.pop(job.id, now)
        self._sd.stale = True
        return self._start(job, cores, now)

    def _static_of(self, alloc: Allocation) -> int:
        """The cores a running job asked for: its speed is relative to them."""
        assert self._sd is not None
        return alloc.job.max_rank if self._sd.shares(alloc.job) else alloc.cores

    def _releases(self, alloc: Allocation) -> int:
        """The cores the pool gets back when ``alloc`` ends as planned: a guest's lent cores go
        back to its mates, and a mate ends with them back."""
        shares = self._sd
        assert shares is not None
        lent = shares.lending.get(alloc.job.id)
        if lent is not None:
            return alloc.cores + lent[1]
        segments = shares.guests.get(alloc.job.id)
        if segments is not None:
            return alloc.cores - sum(s.cores for s in segments if s.mate is not None)
        return alloc.cores

    def _sd_refresh(self) -> _Shares:
        """Rebuild the caches one state of the running jobs gives: the mates, their offers, the
        dynamic cut-off, and the planned free cores over time."""
        shares = self._sd
        assert shares is not None
        if not shares.stale:
            return shares
        mates = []
        factor = shares.policy.sharing_factor
        slowdowns = []
        for job_id, alloc in self._running.items():
            job = alloc.job
            static = self._static_of(alloc)
            requested = job.planned_time(static)
            if not 0 < requested < math.inf:
                continue
            wait = shares.waited.get(job_id, 0.0)
            extended = shares.extended.get(job_id, 0.0)
            slowdowns.append((wait + extended + requested) / requested)
            if (
                alloc.cores == static
                and job_id not in shares.guests
                and job_id not in shares.lending
                and shares.shares(job)
            ):
                end = alloc.planned_end
                mates.append(Mate(job_id, alloc.cores, job.rank, wait, requested, extended, end))
        shares.mates = mates
        shares.offered = sum(max(0, m.offer(factor)) for m in mates)
        policy_cut = shares.policy.max_slowdown
        shares.cutoff = policy_cut if policy_cut is not None else average_slowdown(slowdowns)
        times: list[float] = []
        freed: list[int] = []
        available = self.free_cores
        for planned_end, _seq, alloc in self._by_end:
            available += self._releases(alloc)
            if times and times[-1] == planned_end:
                freed[-1] = available
            else:
                times.append(planned_end)
                freed.append(available)
        shares.times, shares.freed = times, freed
        shares.stale = False
        return shares

    def _free_at(self, shares: _Shares, t: float) -> int:
        """Free cores at ``t`` by the plan (jobs planned to have ended by then count as free)."""
        k = bisect_right(shares.times, t)
        return shares.freed[k - 1] if k else self.free_cores

    def _static_start(
        self,
        need: int,
        duration: float,
        now: float,
        shadow: float,
        head_need: int,
        head_time: float,
    ) -> float:
        """When a job of ``need`` cores for ``duration`` would start statically: the earliest
        time it fits the plan (running jobs by planned end, the head's reservation from
        ``shadow`` for ``head_time``), the paper's "map of jobs reservations in time"."""
        shares = self._sd_refresh()
        hold_end = shadow + head_time

        def fits(t: float) -> bool:
            free = self._free_at(shares, t) - (head_need if shadow <= t < hold_end else 0)
            if t < shadow < t + duration:  # free cores only grow, but the hold starts then
                free = min(free, self._free_at(shares, shadow) - head_need)
            return free >= need

        if fits(now):
            return now
        k = bisect_right(shares.times, now)
        candidates = shares.times[k:]
        if now < hold_end < math.inf:
            insort(candidates, hold_end)
        for t in candidates:
            if fits(t):
                return t
        return math.inf

    def _sd_decide(
        self, job: Job, static_start: float, now: float, protect: float | None
    ) -> SdDecision | None:
        shares = self._sd_refresh()
        asked = job.max_rank
        if shares.offered < guest_cores(asked, job.rank, shares.policy.sharing_factor):
            return None  # every mate together could not give enough
        assert shares.cutoff is not None
        candidate = NewJob(job.id, asked, job.rank, job.planned_time(asked), static_start)
        return sd_backfill(candidate, shares.mates, now, shares.policy, shares.cutoff, protect)

    def _share(self, job: Job, decision: SdDecision, now: float) -> list[SchedulerCommand]:
        """Carry a decision out: shrink the mates, start the guest on what they gave."""
        shares = self._sd
        assert shares is not None
        out: list[SchedulerCommand] = []
        model = shares.policy.runtime_model
        asked = job.max_rank
        segments = [Segment(m, decision.nominal[m], g) for m, g in decision.given.items()]
        rate = speed(model, segments, asked)
        requested = job.planned_time(asked)
        shares.guests[job.id] = segments
        shares.extended[job.id] = requested / rate - requested
        shares.work[job.id] = (requested, now)
        for mate_id, given in decision.given.items():
            alloc = self._running[mate_id]
            old = alloc.cores
            self._rework(alloc, now)
            self._move(alloc, old - given, (old - given) / old, now)
            shares.lending[mate_id] = (job.id, given)
            shares.extended[mate_id] = (
                shares.extended.get(mate_id, 0.0) + decision.increases[mate_id]
            )
            out.append(ResizeJob(mate_id, old, old - given))
        shares.waited[job.id] = now - shares.queued_at.pop(job.id, now)
        start = self._start(job, decision.cores, now, now + requested / rate)
        alloc = self._running[job.id]
        alloc.speed = rate
        alloc.history = [(now, decision.cores)]
        for mate_id in decision.given:
            self._replan(self._running[mate_id])
        shares.stale = True
        out.append(StartJob(job, start.cores, rate * asked))
        return out

    def _sd_ended(self, job_id: str) -> None:
        """A job ended: note the shares to undo at the next pass."""
        shares = self._sd
        assert shares is not None
        shares.stale = True
        shares.short.discard(job_id)
        shares.waited.pop(job_id, None)
        shares.extended.pop(job_id, None)
        shares.work.pop(job_id, None)
        segments = shares.guests.pop(job_id, None)
        if segments is not None:
            for segment in segments:
                if segment.mate is not None:
                    shares.pending.append((segment.mate, job_id))
        lent = shares.lending.get(job_id)
        if lent is not None:
            shares.pending.append((job_id, lent[0]))

    def _sd_settle(self, now: float) -> list[SchedulerCommand]:
        """Undo the shares of the jobs that ended: a mate whose guest ended grows back; a guest
        whose mate ended takes that mate's share (§3.3, Listing 3)."""
        shares = self._sd
        assert shares is not None
        out: list[SchedulerCommand] = []
        model = shares.policy.runtime_model
        for mate_id, guest_id in shares.pending:
            lent = shares.lending.pop(mate_id, None)
            mate = self._running.get(mate_id)
            guest = self._running.get(guest_id)
            if mate is not None and lent is not None:  # the guest ended: the mate grows back
                old = mate.cores
                cores = min(old + lent[1], old + self.free_cores)
                self._rework(mate, now)
                self._move(mate, cores, cores / self._static_of(mate), now)
                self._replan(mate)
                out.append(ResizeJob(mate_id, old, cores))
            elif guest is not None:  # the mate ended: the guest takes its share
                segments = shares.guests[guest_id]
                segment = next(s for s in segments if s.mate == mate_id)
                segment.mate = None
                asked = guest.job.max_rank
                more = min(
                    max(0, round(segment.nominal) - segment.cores),
                    self.free_cores,
                    asked - guest.cores,
                )
                if more:
                    segment.cores += more
                    old = guest.cores
                    self._rework(guest, now)
                    rate = speed(model, segments, asked)
                    self._move(guest, old + more, rate, now)
                    self._replan(guest)
                    for other in segments:
                        mate = self._running.get(other.mate) if other.mate else None
                        if mate is not None:  # it grows back sooner now
                            self._replan(mate)
                    out.append(ResizeJob(guest_id, old, old + more, rate * asked))
        shares.pending.clear()
        if out:
            shares.stale = True
            self._settled = 0
        return out

    def _sd_settle_size(self, alloc: Allocation, cores: int, now: float) -> ResizeJob | None:
        """A sharing-capable job's own size under SD-Policy (:meth:`took`, :meth:`request`),
        planned by its speed as every change of such a job is, its shares kept.

        A job that shares only gives back. A mate that gave more than it was asked runs on
        fewer cores and grows back, when its guest ends, by what it lent (the cores it gave
        beyond are free now). A guest that declined a share it could take back (a mate ended
        first) gives back cores of the ended mates' shares only, each down to one core: the
        cores its living mates lent are what they grow back by. It keeps at least that, and
        a job that gives back more than that leaves the rest idle until its share ends."""
        shares = self._sd
        assert shares is not None
        job = alloc.job
        old = alloc.cores
        segments = shares.guests.get(job.id)
        floor = job.rank
        if segments is not None or job.id in shares.lending:
            cores = min(cores, old)
        if segments is not None:
            floor = max(floor, sum(s.cores if s.mate is not None else 1 for s in segments))
        granted = max(floor, min(cores, job.max_rank, old + self.free_cores))
        shares.short.discard(job.id)  # its size is its own now
        if granted == old:
            return None
        self._rework(alloc, now)
        asked = job.max_rank
        if segments is not None:
            drop = old - granted
            for segment in segments:
                if segment.mate is None and drop:
                    given = min(drop, segment.cores - 1)
                    segment.cores -= given
                    drop -= given
            rate = speed(shares.policy.runtime_model, segments, asked)
        else:
            rate = min(1.0, granted / asked)
        self._move(alloc, granted, rate, now)
        self._replan(alloc)
        for segment in segments or ():
            mate = self._running.get(segment.mate) if segment.mate else None
            if mate is not None:  # it grows back when its guest is planned to end
                self._replan(mate)
        shares.stale = True
        self._settled = 0
        sharing = segments is not None or job.id in shares.lending
        return ResizeJob(job.id, old, granted, rate * asked if sharing else None)

    def _rework(self, alloc: Allocation, now: float) -> None:
        """Bring the planned work left of ``alloc`` up to ``now`` at its current speed."""
        shares = self._sd
        assert shares is not None
        job_id = alloc.job.id
        record = shares.work.get(job_id)
        if record is None:  # never shared yet: at its speed since it started (1, unless resumed)
            left = (alloc.planned_end - now) * alloc.speed
        else:
            left = record[0] - (now - record[1]) * alloc.speed
        shares.work[job_id] = (max(0.0, left), now)

    def _move(self, alloc: Allocation, cores: int, rate: float, now: float) -> None:
        """Give ``alloc`` ``cores`` cores at speed ``rate`` (its plan is redone by _replan)."""
        job = alloc.job
        if not job.rank <= cores <= job.max_rank or cores - alloc.cores > self.free_cores:
            raise InternalError(f"resize of {job.id} to {cores} cores is out of bounds")
        if alloc.history is None:
            alloc.history = [(alloc.start, alloc.cores)]
        alloc.history.append((now, cores))
        self.free_cores -= cores - alloc.cores
        alloc.cores = cores
        alloc.speed = rate

    def _replan(self, alloc: Allocation) -> None:
        """Its planned end from its planned work left and speed; a mate grows back, by what it
        lent, when its guest is planned to end (the guest's plan must be current)."""
        shares = self._sd
        assert shares is not None
        job_id = alloc.job.id
        left, since = shares.work[job_id]
        end = since + left / alloc.speed
        lent = shares.lending.get(job_id)
        if lent is not None:
            # At full speed once its guest is planned to end (at once if the guest overran, or
            # has ended and the next pass grows it back).
            guest = self._running.get(lent[0])
            guest_end = since if guest is None else max(since, guest.planned_end)
            if guest_end < end:
                # Back by what it lent: its whole size, unless it gave more than it was asked.
                back = min(1.0, (alloc.cores + lent[1]) / self._static_of(alloc))
                end = guest_end + (left - alloc.speed * (guest_end - since)) / back
        by_end = self._by_end
        i = bisect_left(by_end, (alloc.planned_end, alloc.seq))
        if by_end[i][2] is not alloc:
            raise InternalError(f"allocation index lost job {job_id}")
        del by_end[i]
        alloc.planned_end = end
        insort(by_end, (end, alloc.seq, alloc))
