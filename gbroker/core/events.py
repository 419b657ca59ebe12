"""The catalogue: every event the core takes and every command it gives. Read this module first.

Theory of operation. The core (:mod:`gbroker.core`) does no I/O. Its two drivers, the daemon
(:mod:`gbroker.daemon.driver`) and the simulator (:mod:`gbroker.sim.grid`), turn what happens
(a submission, a peer's message, a process's end, a timer; or their simulated twins) into the
*events* below, hand them to the core with the time ``now``, and carry out the *commands* that
come back. Events and commands are frozen dataclasses: values that say what happened or what to
do, never how.

- The **owner broker** (:class:`~gbroker.core.dispatch.Broker`) has one entry point,
  ``Broker.handle(event, now, view) -> list[BrokerCommand]``: it takes a :data:`BrokerEvent`
  and gives :data:`BrokerCommand` s (:class:`SiteExcluded` among them is a notice: log it,
  count it).
- The **site agent** (:class:`~gbroker.core.site.SiteAgent`, a site's queue and cores) is told
  what happens through its methods (``stage``, ``staged``, ``accept``, ``withdraw``,
  ``claim_answered``, ``fetched``, ``finished``, ...), and its scheduling pass
  (``SiteAgent.schedule(now)``) gives :data:`SiteCommand` s; a claim's answer gives a
  :class:`Launch`, or a :class:`Fetch` for a deferred job.

Every driver ends its dispatch on a command with ``case _: assert_never(command)``, so a command
that a driver does not carry out (or explicitly refuse) is a type error under ``mypy --strict``,
not a silent drop.

Not (yet) events: a running job's move (``Broker.begin_move``, ``move_ready``,
``move_verdict``, ``abandon_move``, ``restore_move``), a co-allocated job's placement
(``Broker.place_components``, :mod:`gbroker.core.coalloc`), a restarted owner's records
(``Broker.restore``) and ``Broker.explain`` are direct calls on the broker.

May import: the core's model and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gbroker.core.model import Job

__all__ = [
    "Abandon",
    "BrokerCommand",
    "BrokerEvent",
    "CancelRequested",
    "Claim",
    "ClaimAnswer",
    "ClaimRequested",
    "Command",
    "Dispatch",
    "DispatchRefused",
    "Event",
    "Fetch",
    "GangGranted",
    "JobFinished",
    "JobQueued",
    "JobStarted",
    "JobSubmitted",
    "Kill",
    "Launch",
    "PlacementReleased",
    "Resized",
    "SiteBack",
    "SiteCommand",
    "SiteExcluded",
    "SiteLost",
    "Tick",
    "Withdraw",
    "WithdrawAnswered",
]

# -- the owner broker's events in ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: Job


@dataclass(frozen=True, slots=True)
class JobQueued:
    """The site has the job's files and has queued it."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class ClaimRequested:
    """A replica at ``site`` is about to start and asks for the right to."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class JobStarted:
    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class JobFinished:
    """The job ended at ``site``; ``run_time``: seconds from its start to its end as the site
    measured them (None: it never started, or the start is unknown)."""

    job_id: str
    site: str
    ok: bool = True
    run_time: float | None = None


@dataclass(frozen=True, slots=True)
class WithdrawAnswered:
    job_id: str
    site: str
    withdrawn: bool


@dataclass(frozen=True, slots=True)
class Tick:
    """Every Δ: migration (DM, DRM) or the central queue's matchmaking; GridWay's timers."""


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """The user cancels the job."""

    job_id: str


@dataclass(frozen=True, slots=True)
class SiteLost:
    """``site`` went away (its last-will, or calls to it fail): give up its expired placements."""

    site: str


@dataclass(frozen=True, slots=True)
class SiteBack:
    """A lost site is heard from again (it says ``online``): it may be chosen again."""

    site: str


@dataclass(frozen=True, slots=True)
class DispatchRefused:
    """``site`` refused to take the job (it takes no new work): place it elsewhere."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class PlacementReleased:
    """``site`` (draining) hands the job queued there back: move it elsewhere if one fits."""

    job_id: str
    site: str


BrokerEvent = (
    JobSubmitted
    | JobQueued
    | ClaimRequested
    | JobStarted
    | JobFinished
    | WithdrawAnswered
    | Tick
    | CancelRequested
    | SiteLost
    | SiteBack
    | DispatchRefused
    | PlacementReleased
)

# -- the owner broker's commands out ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Stage ``job``'s files to ``site`` and queue it there (as a replica: start only by claim).

    ``deferred`` (a reservation of Sparrow or a sibling of the federation, always a replica):
    queue it at once without its files; they are staged only if its claim is granted, while
    it holds its cores (:class:`Fetch`)."""

    job: Job
    site: str
    replica: bool = False
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Ask ``site`` to remove the queued job; it answers with :class:`WithdrawAnswered`."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """The owner's answer to ``site``'s claim. Not granted: the site drops the job, unless
    ``wait`` (a co-allocated job's component whose mates have not all claimed yet: keep the
    cores and ask again) or ``requeue`` (they did not all claim in time: give the cores back and
    queue the component again)."""

    job_id: str
    site: str
    granted: bool
    wait: bool = False
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class GangGranted:
    """Every component of co-allocated job ``gang`` was granted its start at once: the driver
    makes the grants (job id, site) durable together before any site hears of one."""

    gang: str
    grants: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Kill:
    """Stop the job's processes at ``site`` (it was cancelled while running)."""

    job_id: str
    site: str


@dataclass(frozen=True, slots=True)
class Abandon:
    """No site can take the job any more (its only sites were lost): it fails."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SiteExcluded:
    """A notice: ``site`` is excluded as a black hole until ``until`` (its figures when it was
    judged: :mod:`gbroker.core.health`)."""

    site: str
    until: float
    fast_failures: int
    outcomes: int
    rate: float
    baseline: float


BrokerCommand = Dispatch | Withdraw | ClaimAnswer | GangGranted | Kill | Abandon | SiteExcluded
"""What the driver carries out; :class:`SiteExcluded` is a notice (log it, count it)."""


# -- the site agent's commands out -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    """Start the job's processes now on ``cores`` cores (``effective``: see :class:`StartJob
    <gbroker.core.localsched.StartJob>`)."""

    job: Job
    cores: int
    owner: str
    effective: float | None = None

    @property
    def effective_cores(self) -> float:
        return self.cores if self.effective is None else self.effective


@dataclass(frozen=True, slots=True)
class Claim:
    """Ask ``owner`` whether this replica may start (its cores are held meanwhile)."""

    job_id: str
    owner: str


@dataclass(frozen=True, slots=True)
class Fetch:
    """A deferred job's claim was granted: stage its input files here while its ``cores`` stay
    held, then call :meth:`SiteAgent.fetched <gbroker.core.site.SiteAgent.fetched>` for its
    :class:`Launch`."""

    job: Job
    cores: int
    owner: str


@dataclass(frozen=True, slots=True)
class Resized:
    """The running job ``job_id`` of ``owner`` now has ``cores`` cores (it had ``old``)."""

    job_id: str
    owner: str
    old: int
    cores: int
    effective: float | None = None

    @property
    def effective_cores(self) -> float:
        return self.cores if self.effective is None else self.effective


SiteCommand = Launch | Claim | Resized
"""What a site agent's scheduling pass gives (``SiteAgent.schedule``)."""


# -- the whole catalogue ---------------------------------------------------------------------------

Event = BrokerEvent
"""Every event the core takes (the site agent is told through its methods)."""

Command = BrokerCommand | SiteCommand | Fetch
"""Every command the core gives: the broker's, and the site agent's (a :class:`Fetch` comes
from ``SiteAgent.claim_answered`` only)."""
