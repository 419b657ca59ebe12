"""GridWay 5.6.1 as a baseline: its scheduler, dispatch manager and information manager. Pure.

Theory of operation. The paper compared GBroker with GridWay 5.6.1 "configured as its developers
recommend". This module follows what GridWay 5.6.1 does with its shipped configuration, read from
its source (github.com/GridWay/gridway, the commit tagged 5.6.1, f4a35b4). It replaces nothing of
GridWay's logic by ours: where our world lacks something, it is simplified and said so. One
:class:`GridWay` stands for one ``gwd`` daemon with its built-in scheduler; the owner broker
(:mod:`gbroker.core.dispatch`, ``Algorithm.GRIDWAY``) feeds it events and carries out what it
decides, and the simulator builds one at the data site, as for the central baseline.

GridWay schedules from its own, stale view: the information manager copies a host's cores and
free cores into a snapshot only when it monitors the host, while GridWay's own used slots and a
user's running jobs are exact and immediate. Each scheduling action times out jobs pending too
long in a host's queue (banning the host for the user), matches the jobs on its list against
the hosts, orders hosts by usage (the host whose last job took least first) and jobs by
priority, and dispatches under its chunk and its per-user and per-resource limits. Binding is
early: a dispatched job is staged to its host and queued there, where it waits if the view was
wrong. At most NUMBER_OF_JOBS jobs are in GridWay; the rest wait outside it in arrival order.

The driver ticks :meth:`GridWay.tick` when :meth:`GridWay.next_tick` says; it need not while
GridWay holds no job: timers missed then are caught up at the next tick, and the hosts look as
they did when they fell due (nothing of GridWay's ran in the gap). Times are exact here where
GridWay counts whole seconds (ban lengths are truncated as it does).

Every rule with its source file and line, the options and what is simplified:
docs/EXPERIMENTS.md, "The GridWay 5.6.1 model".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gbroker.core.model import Observation
from gbroker.errors import InvalidInput

__all__ = [
    "IM_TIMER",
    "Bind",
    "GridWay",
    "GridWayDecision",
    "GridWayPolicy",
    "Information",
    "Migrate",
    "Reason",
    "estimated_time",
    "host_priorities",
    "job_priorities",
]

IM_TIMER = 5.0
"""Seconds between the information manager's timer ticks (``src/im/gw_im.c:289``)."""

# sched.conf's shipped values that no option here changes (our world gives them nothing to do).
RP_WEIGHT = 1.0  # sched.conf:170; RP_IM[DEFAULT] = 01 (:171): every host's nRP is 1
RA_WEIGHT = 1.0  # sched.conf:204; the template's RANK is empty (job_template.default:111): 0
UG_HISTORY_RATIO = 0.25  # sched.conf:195, w in T = (1 - w) T_hist + w T_last
SH_SHARE = 5  # SH_USER[DEFAULT], sched.conf:95
SH_WINDOW_SIZE = 86400.0  # SH_WINDOW_SIZE = 1 day, sched.conf:97
SH_WINDOW_DEPTH = 5  # sched.conf:98
_EPS = 1e-9


class Information(StrEnum):
    """What GridWay's information driver reports as a host's free cores at each monitoring."""

    DYNAMIC = "dynamic"  # MDS2, MDS4, BDII: the free cores the host shows then
    STATIC = "static"  # gw_im_mad_static: its host file's count (every core), whatever the load


class Reason(StrEnum):
    """Why a job is on the scheduler's list (``gw_migration_reason_t``, the two met here)."""

    NONE = "none"  # never scheduled
    SUSPENSION_TIME = "suspension_time"  # pending too long in a host's queue


def _number(name: str, value: object, expected: str, low: float, open_low: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"gridway.{name}", expected, value)
    if not (value > low if open_low else value >= low) or not math.isfinite(value):
        raise InvalidInput(f"gridway.{name}", expected, value)


def _integer(name: str, value: object, expected: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInput(f"gridway.{name}", expected, value)


@dataclass(frozen=True, slots=True)
class GridWayPolicy:
    """GridWay 5.6.1's settings, each defaulting to the shipped value (file:line in 5.6.1).

    Attributes:
        scheduling_interval: SCHEDULING_INTERVAL, s between scheduling actions (gwd.conf:50).
        discovery_interval: DISCOVERY_INTERVAL, s between discoveries of hosts (gwd.conf:51).
        monitoring_interval: MONITORING_INTERVAL, s between monitorings of a host (gwd.conf:52).
        number_of_jobs: NUMBER_OF_JOBS, the job pool (gwd.conf:30).
        dispatch_chunk: DISPATCH_CHUNK, dispatches per action; 0: no limit (sched.conf:40).
        max_running_user: MAX_RUNNING_USER, a user's jobs dispatched and not done; 0: no limit
            (sched.conf:41).
        max_running_resource: MAX_RUNNING_RESOURCE, against a host's used slots plus this
            action's dispatches there; 0: no limit (sched.conf:144).
        wt_weight: WT_WEIGHT, the waiting-time job policy (sched.conf:108).
        sh_weight: SH_WEIGHT, the share job policy (sched.conf:94).
        ug_weight: UG_WEIGHT, the usage host policy (sched.conf:193).
        suspension_timeout: SUSPENSION_TIMEOUT, s a job may wait in a host's queue before it is
            moved; 0: never (job_template.default:138).
        fr_max_banned: FR_MAX_BANNED, the longest ban of a failing host, s; 0: no bans
            (sched.conf:216).
        fr_banned_c: FR_BANNED_C, the ban's growth constant, s (sched.conf:217).
        information: what the information driver reports (:class:`Information`).
    """

    scheduling_interval: float = 15.0
    discovery_interval: float = 300.0
    monitoring_interval: float = 180.0
    number_of_jobs: int = 200
    dispatch_chunk: int = 15
    max_running_user: int = 30
    max_running_resource: int = 10
    wt_weight: float = 0.0
    sh_weight: float = 1.0
    ug_weight: float = 1.0
    suspension_timeout: float = 600.0
    fr_max_banned: float = 3600.0
    fr_banned_c: float = 650.0
    information: Information = Information.DYNAMIC

    def __post_init__(self) -> None:
        for name in ("scheduling_interval", "discovery_interval", "monitoring_interval"):
            _number(name, getattr(self, name), "seconds > 0", 0.0, open_low=True)
        _integer("number_of_jobs", self.number_of_jobs, "an integer >= 1 (jobs)", 1)
        _integer(
            "dispatch_chunk", self.dispatch_chunk, "an integer >= 0 (0: as many as possible)", 0
        )
        _integer("max_running_user", self.max_running_user, "an integer >= 0 (0: no limit)", 0)
        _integer(
            "max_running_resource", self.max_running_resource, "an integer >= 0 (0: no limit)", 0
        )
        for name in ("wt_weight", "sh_weight", "ug_weight"):
            _number(name, getattr(self, name), "a weight >= 0", 0.0, open_low=False)
        _number(
            "suspension_timeout",
            self.suspension_timeout,
            "seconds >= 0 (0: never)",
            0.0,
            open_low=False,
        )
        _number(
            "fr_max_banned", self.fr_max_banned, "seconds >= 0 (0: no bans)", 0.0, open_low=False
        )
        _number("fr_banned_c", self.fr_banned_c, "seconds > 0", 0.0, open_low=True)
        try:
            object.__setattr__(self, "information", Information(self.information))
        except ValueError:
            raise InvalidInput(
                "gridway.information", f"one of {', '.join(Information)}", self.information
            ) from None


@dataclass(frozen=True, slots=True)
class Bind:
    """Stage the job to ``site`` and submit it to its queue (early binding: GRAM submit)."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Cancel the job in ``source``'s queue and, once cancelled, stage it to ``target``."""

    job_id: str
    source: str
    target: str


GridWayDecision = Bind | Migrate


class HostView(Protocol):
    """What the information driver can see of hosts (the broker's view of its sites)."""

    def get(self, site: str, /) -> Observation | None: ...


# -- the scheduler's policies, as pure functions -------------------------------------------------


def estimated_time(history: float, last: float) -> float:
    """T of the usage policy (``gw_scheduler_hosts.c:219-240``): T_last when no history is
    known, T_hist when no last job is, else (1 − w) T_hist + w T_last."""
    if history == 0:
        return last
    if last == 0:
        return history
    return (1 - UG_HISTORY_RATIO) * history + UG_HISTORY_RATIO * last


def host_priorities(usages: Sequence[float], ug_weight: float) -> list[float]:
    """Each candidate host's priority, in the candidates' order (``gw_scheduler_hosts.c:266-348``):
    RP·1 + RA·0 + UG·nUG, with nUG = T_min / T (T_min: the least non-zero T), T_min / T_max for a
    host with no estimate (T = 0), and 0 for every host when none has one. ``usages``: each
    host's T (ignored when ``ug_weight`` is 0: GridWay does not estimate then, ``:300-301``)."""
    usage = [u if ug_weight > 0 else 0.0 for u in usages]
    known = [u for u in usage if u != 0]
    low = min(known, default=math.inf)
    high = max(usage, default=0.0)
    no_estimate = low / high if high != 0 else 0.0  # nUG of a host without one
    n_rp, n_ra = 1.0, 0.0
    return [
        RP_WEIGHT * n_rp + RA_WEIGHT * n_ra + ug_weight * (low / u if u != 0 else no_estimate)
        for u in usage
    ]


def job_priorities(
    waiting: Sequence[float], past_jobs: int, wt_weight: float, sh_weight: float
) -> list[int]:
    """The scheduler's order of its list (``gw_scheduler_jobs.c:732-856``), as indices into it.

    ``waiting``: each listed job's seconds on the list, in list order; ``past_jobs``: U, the
    user's dispatches remembered by its share windows. FP and DL are 0 for our jobs. First a stable
    sort by WT·nWT (descending), then, if SH weighs, each job's share term is added in that order
    and the list is sorted again (stable)."""
    n = len(waiting)
    longest = max(waiting, default=0.0)
    priority = [wt_weight * (w / longest if longest > 0 else 0.0) for w in waiting]
    order = sorted(range(n), key=lambda k: -priority[k])
    if sh_weight > 0 and n:
        total = n + past_jobs
        max_share = max(1, (total - 1) // SH_SHARE)
        for rank, k in enumerate(order):
            share = max_share - (past_jobs + rank) // SH_SHARE
            priority[k] += sh_weight * share / max_share
        order = sorted(order, key=lambda k: -priority[k])
    return order


# -- GridWay's records ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Host:
    """What GridWay knows of one host."""

    name: str
    discovered_at: float
    monitored_at: float | None = None  # None: discovered, its first monitoring still to come
    monitored: bool = False  # a monitoring succeeded: the host has a queue to match
    free: int = 0  # QUEUE_FREENODECOUNT at the last monitoring
    nodes: int = 0  # QUEUE_NODECOUNT
    used_slots: int = 0  # the np of GridWay's jobs there (exact, immediate)
    running_jobs: int = 0
    banned: float = -math.inf  # not a candidate while now <= banned
    first_failure: float | None = None  # last_banned: the first failure since the last success
    last_time: float = 0.0  # T_last: transfer + queue + execution of the last job done there

    def slots(self) -> int:
        """min(QUEUE_FREENODECOUNT, QUEUE_NODECOUNT − used slots), at least 0."""
        return max(0, min(self.free, self.nodes - self.used_slots))


@dataclass(slots=True)
class _Job:
    """GridWay's record of one job of its pool."""

    id: str
    np: int
    fits: frozenset[str] | None  # the hosts its REQUIREMENTS match; None: any
    entered: float = 0.0  # when it (re)entered the scheduler's list
    reason: Reason = Reason.NONE
    listed: bool = False
    host: str | None = None  # where it is bound (the head of its history)
    history: list[str] = field(default_factory=list)
    bound_at: float = 0.0  # when its prolog there began
    queued_at: float | None = None  # submitted to the host's queue (GRAM PENDING) since
    started_at: float | None = None
    target: str | None = None  # being moved there (the cancel at ``host`` is under way)


def _grid_ceil(now: float, period: float) -> float:
    """The first multiple of ``period`` at or after ``now``."""
    return math.ceil(now / period - _EPS) * period


def _grid_after(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now``."""
    return (math.floor(now / period + _EPS) + 1) * period


class GridWay:
    """One GridWay 5.6.1 daemon over ``hosts`` (its host list, in order). See the module
    docstring. Feed it submissions and the jobs' reports; :meth:`tick` returns its decisions."""

    __slots__ = (
        "_backlog",
        "_hosts",
        "_jobs",
        "_last_discovery",
        "_list",
        "_next_action",
        "_next_im",
        "_next_window",
        "_order",
        "_running",
        "_windows",
        "policy",
    )

    def __init__(self, policy: GridWayPolicy, hosts: Sequence[str]) -> None:
        if len(set(hosts)) != len(hosts):
            raise InvalidInput("hosts", "distinct host names", list(hosts))
        self.policy = policy
        self._order = tuple(hosts)
        self._hosts: dict[str, _Host] = {}  # discovered, in discovery (host id) order
        self._jobs: dict[str, _Job] = {}  # the job pool, in submission order
        self._backlog: deque[_Job] = deque()  # submissions a full pool refused, to retry
        self._list: list[_Job] = []  # the scheduler's list, in its order
        self._running = 0  # the user's running jobs: dispatched and not done
        self._windows = [0] * SH_WINDOW_DEPTH  # the user's dispatches per share window
        self._next_window = SH_WINDOW_SIZE
        self._last_discovery: float | None = None
        self._next_im = IM_TIMER
        self._next_action = policy.scheduling_interval

    # -- clocks ----------------------------------------------------------------------------------

    def _catch_up(self, now: float) -> None:
        """Timers missed while nobody ticked (GridWay held no job): from the next grid point."""
        if self._next_im < now - _EPS:
            self._next_im = _grid_ceil(now, IM_TIMER)
        if self._next_action < now - _EPS:
            self._next_action = _grid_ceil(now, self.policy.scheduling_interval)

    def next_tick(self, now: float) -> float:
        """When the next timer (information or dispatch manager) fires: tick then."""
        self._catch_up(now)
        return max(now, min(self._next_im, self._next_action))

    def tick(self, now: float, view: HostView) -> list[GridWayDecision]:
        """Run the timers due at ``now``: the information manager's, then a scheduling action."""
        self._catch_up(now)
        out: list[GridWayDecision] = []
        if now >= self._next_im - _EPS:
            self._information(now, view)
            self._next_im = _grid_after(now, IM_TIMER)
        if now >= self._next_action - _EPS:
            out = self._action(now)
            self._next_action = _grid_after(now, self.policy.scheduling_interval)
        return out

    # -- the information manager -----------------------------------------------------------------

    def _information(self, now: float, view: HostView) -> None:
        policy = self.policy
        if (
            self._last_discovery is None
            or now - self._last_discovery >= policy.discovery_interval - _EPS
        ):
            self._last_discovery = now
            for name in self._order:
                if name not in self._hosts and view.get(name) is not None:
                    self._hosts[name] = _Host(name, discovered_at=now)
        for host in self._hosts.values():
            if host.monitored_at is None:
                if host.discovered_at >= now - _EPS:
                    continue  # discovered this tick: monitored on the next one
            elif now - host.monitored_at < policy.monitoring_interval - _EPS:
                continue
            host.monitored_at = now
            seen = view.get(host.name)
            if seen is None:  # the query failed: its dynamic information is cleared
                host.free = 0
                continue
            host.monitored = True
            host.nodes = seen.state.total_cores
            static = policy.information is Information.STATIC
            host.free = seen.state.total_cores if static else seen.state.free_cores

    # -- a scheduling action ---------------------------------------------------------------------

    def _action(self, now: float) -> list[GridWayDecision]:
        timeout = self.policy.suspension_timeout
        if timeout > 0:  # gw_dm_action_schedule.c:74-80, 115-161
            for job in self._jobs.values():
                if (
                    job.reason is Reason.NONE
                    and job.target is None
                    and job.queued_at is not None
                    and job.started_at is None
                    and job.host is not None
                    and now - job.queued_at > timeout
                ):
                    job.reason = Reason.SUSPENSION_TIME
                    self._fail(self._hosts[job.host], now)
                    self._enlist(job, now)
        out: list[GridWayDecision] = []
        if self._hosts and self._list:  # gw_scheduler_common.c:317-319
            out = self._schedule(now)
        if now > self._next_window:  # gw_scheduler_common.c:337-346
            self._next_window = now + SH_WINDOW_SIZE
            self._windows = [0, *self._windows[:-1]]
        return out

    def _candidates(self, job: _Job, now: float) -> list[_Host] | None:
        """The job's hosts in priority order; None when a rescheduled job has none left (the
        scheduler's ``SCHEDULE_JOB FAILED``)."""
        matched = [
            host
            for host in self._hosts.values()
            if host.monitored and (job.fits is None or host.name in job.fits)
        ]
        if not matched:
            return []  # no match at all: nothing is said (gw_scheduler_jobs.c:475-480)
        kept = [
            host
            for host in matched
            if not now <= host.banned
            and not (job.reason is Reason.SUSPENSION_TIME and host.name in job.history)
        ]
        if not kept:
            return None if job.reason is not Reason.NONE else []
        usages = [estimated_time(0.0, host.last_time) for host in kept]
        priority = host_priorities(usages, self.policy.ug_weight)
        order = sorted(range(len(kept)), key=lambda k: -priority[k])
        return [kept[k] for k in order]

    def _schedule(self, now: float) -> list[GridWayDecision]:
        policy = self.policy
        # The scheduler's copies at the action's start (its messages are read after it).
        used = {name: host.used_slots for name, host in self._hosts.items()}
        slots = {name: host.slots() for name, host in self._hosts.items()}
        running = self._running
        # Matching, then the job policies' order (kept as the list's new order).
        hosts: dict[str, list[_Host]] = {}
        unchecked: list[_Job] = []
        for job in self._list:
            found = self._candidates(job, now)
            if found is None:
                unchecked.append(job)
                found = []
            hosts[job.id] = found
        past = sum(int(n * math.exp(-i / 3.5)) for i, n in enumerate(self._windows))
        order = job_priorities(
            [now - job.entered for job in self._list], past, policy.wt_weight, policy.sh_weight
        )
        self._list = [self._list[k] for k in order]
        # Two passes: new jobs, then rescheduled ones, one chunk for both.
        chunk = policy.dispatch_chunk or len(self._list)
        dispatched = 0
        user_dispatched = 0
        host_dispatched = dict.fromkeys(self._hosts, 0)
        out: list[GridWayDecision] = []
        for rescheduled in (False, True):
            i = 0
            while i < len(self._list) and dispatched < chunk:
                job = self._list[i]
                if policy.max_running_user and running + user_dispatched >= policy.max_running_user:
                    i += 1
                    continue
                if (job.reason is not Reason.NONE) is not rescheduled:
                    i += 1
                    continue
                for host in hosts[job.id]:
                    here = host_dispatched[host.name]
                    limit = policy.max_running_resource
                    if limit and used[host.name] + here >= limit:
                        continue
                    if slots[host.name] - here >= job.np:
                        dispatched += 1
                        user_dispatched += 1
                        host_dispatched[host.name] = here + 1
                        del self._list[i]
                        job.listed = False
                        self._windows[0] += 1  # gw_scheduler_jobs.c:651-652
                        out.append(self._dispatch(job, host, now))
                        break
                else:
                    i += 1
        for job in unchecked:  # gw_dm_action_schedule.c:220-238
            if job.listed:
                self._unlist(job)
                job.reason = Reason.NONE
        return out

    def _dispatch(self, job: _Job, host: _Host, now: float) -> GridWayDecision:
        """gw_dm_action_dispatch.c: count the slots at once; bind a new job, move a queued one."""
        host.used_slots += job.np
        host.running_jobs += 1
        job.history.append(host.name)
        if job.host is None:
            self._running += 1
            job.host = host.name
            job.bound_at = now
            return Bind(job.id, host.name)
        job.reason = Reason.NONE  # its new history record's
        job.target = host.name
        return Migrate(job.id, job.host, host.name)

    def _fail(self, host: _Host, now: float) -> None:
        """gw_scheduler_jobs.c:93-121: ban a host that failed one of the user's jobs."""
        max_banned = self.policy.fr_max_banned
        if host.first_failure is None:
            host.first_failure = now
            delta = float(int(0.1 * max_banned))
        else:
            t = now - host.first_failure
            if t <= 10:
                delta = 0.0
            else:
                delta = float(int(max_banned * (1 - math.exp(-t / self.policy.fr_banned_c))))
        if delta != 0:
            host.banned = now + delta

    def _enlist(self, job: _Job, now: float) -> None:
        job.entered = now
        job.listed = True
        self._list.append(job)

    def _unlist(self, job: _Job) -> None:
        self._list.remove(job)
        job.listed = False

    # -- what the broker tells it ----------------------------------------------------------------

    def submit(self, job_id: str, np: int, fits: Collection[str] | None, now: float) -> None:
        """A job of ``np`` cores whose requirements ``fits`` hosts (None: any) is submitted. A
        full pool refuses it: it waits outside, and its submitter tries again."""
        if np < 1:
            raise InvalidInput(f"job[{job_id}].np", "an integer >= 1", np)
        if job_id in self._jobs or any(job.id == job_id for job in self._backlog):
            return
        job = _Job(job_id, np, None if fits is None else frozenset(fits))
        if len(self._jobs) < self.policy.number_of_jobs:
            self._jobs[job_id] = job
            self._enlist(job, now)
        else:
            self._backlog.append(job)

    def queued(self, job_id: str, site: str, now: float) -> None:
        """The job's prolog is done at ``site``: it is in its queue (PENDING) from now."""
        job = self._jobs.get(job_id)
        if job is None or job.host != site or job.target is not None or job.queued_at is not None:
            return
        job.queued_at = now

    def started(self, job_id: str, site: str, now: float) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.host != site or job.started_at is not None:
            return
        job.started_at = now
        if job.listed:  # rescheduled, not moved yet: it stays where it runs (module docstring)
            self._unlist(job)
            job.reason = Reason.NONE

    def finished(self, job_id: str, site: str, ok: bool, now: float) -> None:
        """The job's wrapper ended at ``site``: its slots and its pool place are free."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        self._release(job)
        host = self._hosts.get(site)
        if host is not None and job.host == site:
            if ok:  # gw_scheduler_jobs.c:178-183
                host.first_failure = None
                host.banned = -math.inf
                host.last_time = now - job.bound_at
            else:
                self._fail(host, now)
        self._admit(now)

    def withdrawn(self, job_id: str, site: str, withdrawn: bool, now: float) -> None:
        """The answer to a move's cancel at ``site``: cancelled (the prolog at the target begins)
        or not (the job started there first: it stays, the target's slots are freed)."""
        job = self._jobs.get(job_id)
        if job is None or job.target is None or job.host != site:
            return
        target = self._hosts[job.target]
        job.target = None
        if withdrawn:
            source = self._hosts[site]
            source.used_slots -= job.np
            source.running_jobs -= 1
            job.host = target.name
            job.bound_at = now
            job.queued_at = job.started_at = None
        else:
            target.used_slots -= job.np
            target.running_jobs -= 1
            job.history.pop()

    def cancelled(self, job_id: str, now: float) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:
            self._backlog = deque(j for j in self._backlog if j.id != job_id)
            return
        self._release(job)
        self._admit(now)

    def _release(self, job: _Job) -> None:
        if job.listed:
            self._unlist(job)
        for name in (job.host, job.target):
            host = self._hosts.get(name) if name is not None else None
            if host is not None:
                host.used_slots -= job.np
                host.running_jobs -= 1
        if job.host is not None:
            self._running -= 1

    def _admit(self, now: float) -> None:
        while self._backlog and len(self._jobs) < self.policy.number_of_jobs:
            job = self._backlog.popleft()
            self._jobs[job.id] = job
            self._enlist(job, now)

    # -- what it holds (for tests and reports) ---------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether it holds or awaits any job."""
        return bool(self._jobs or self._backlog)

    def listed(self) -> list[str]:
        """The scheduler's list, in its order."""
        return [job.id for job in self._list]

    def waiting_outside(self) -> list[str]:
        """Submissions the full pool refused, in the order they will be retried."""
        return [job.id for job in self._backlog]

    def used_slots(self, host: str) -> int:
        known = self._hosts.get(host)
        return 0 if known is None else known.used_slots

    def snapshot(self, host: str) -> tuple[int, int, float | None] | None:
        """(free, nodes, monitored at) of GridWay's view of ``host``; None: not discovered."""
        known = self._hosts.get(host)
        return None if known is None else (known.free, known.nodes, known.monitored_at)

    def banned_until(self, host: str) -> float:
        known = self._hosts.get(host)
        return -math.inf if known is None else known.banned

    @property
    def running(self) -> int:
        """The user's running jobs (dispatched and not done)."""
        return self._running
