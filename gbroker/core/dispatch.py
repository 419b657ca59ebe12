"""The owner broker: where a job goes, and its authoritative record (ARCHITECTURE §2, §6).

Theory of operation. A broker i owns the jobs submitted to it. It sees its own site exactly
and its neighbourhood L(i) through a possibly stale view (DCSMon's latest observations). It feeds
each decision to the ranking F(j) of :mod:`gbroker.core.ranking`. Drivers turn I/O into events
and carry out the commands that :meth:`Broker.handle` returns; every event and command is in the
catalogue, :mod:`gbroker.core.events` (imported here too).

Every algorithm is O(|S(i)|) per decision, independent of the number of sites: DLO dispatches to
j* = argmin F; DR(m) queues replicas that bind late, the owner granting exactly one claim per job
so that no job starts twice; DM(Δ, ε) re-ranks queued jobs on every :class:`Tick` and migrates
one once the old site confirms its withdrawal; DRM combines the two; the baselines (central,
GridWay 5.6.1, random, round-robin, worst-fit, close-to-files, Sparrow, Slurm's federation) are
run by the same broker (docs/DESIGN.md, "The owner broker's algorithms").

The view is stale between observations, so the broker counts its own dispatches that its latest
observation of a site cannot yet reflect (``account_own_dispatches``); otherwise a burst of jobs
would all land on the site that looked best a moment ago.

Leases (ARCHITECTURE §6). A site may start a job on its own only while the lease that came with
the dispatch is valid; after that it must claim, as a replica does, so a lost site's job is
dispatched anew once its lease has run out and runs once. A move (Dynamite) passes the grant
from the frozen source to the target by the target's claim. Draining sites, black holes
(:mod:`gbroker.core.health`) and sites that fail a job's requirements
(:mod:`gbroker.core.requirements`) are left out of S(i) for every algorithm.
:meth:`Broker.restore` rebuilds an owned job from a journal after a restart; finished jobs leave
the broker's memory.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gbroker.core.apples import PerformanceModel, Plan, Resource, plan
from gbroker.core.arrays import element_id
from gbroker.core.coalloc import CoPolicy, Offer, place
from gbroker.core.events import (
    Abandon,
    BrokerCommand,
    BrokerEvent,
    CancelRequested,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchRefused,
    GangGranted,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Kill,
    PlacementReleased,
    SiteBack,
    SiteExcluded,
    SiteLost,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.federation import sibling_sites
from gbroker.core.gridway import Bind, GridWay, GridWayPolicy
from gbroker.core.health import HealthPolicy, SiteHealth
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.names import count
from gbroker.core.ranking import (
    Candidate,
    Score,
    SiteRow,
    Terms,
    TransferForecast,
    best_sites,
    f_terms,
    rank_sites,
    staging_time,
)
from gbroker.core.requirements import (
    Need,
    Requirements,
    SiteProperties,
    Unmet,
    candidate_hosts_at,
    closest_unmet,
    known_names,
    unmet,
)
from gbroker.core.sparrow import DEFAULT_PROBE_RATIO, probe_count, probe_sites
from gbroker.core.states import JobState, check_transition
from gbroker.errors import InvalidInput

__all__ = [
    "Abandon",
    "Algorithm",
    "Broker",
    "BrokerCommand",
    "BrokerEvent",
    "CancelRequested",
    "ClaimAnswer",
    "ClaimRequested",
    "Dispatch",
    "DispatchPolicy",
    "DispatchRefused",
    "GangGranted",
    "JobFinished",
    "JobQueued",
    "JobStarted",
    "JobSubmitted",
    "Kill",
    "PlacementReleased",
    "RandomSource",
    "SiteBack",
    "SiteExcluded",
    "SiteLost",
    "SiteView",
    "Tick",
    "Verdict",
    "Withdraw",
    "WithdrawAnswered",
]


class Algorithm(StrEnum):
    DLO = "dlo"
    DR = "dr"
    DM = "dm"
    DRM = "drm"
    CENTRAL = "central"
    GRIDWAY = "gridway"
    RANDOM = "random"
    ROUNDROBIN = "roundrobin"
    WORSTFIT = "worstfit"
    CLOSETOFILES = "closetofiles"
    SPARROW = "sparrow"
    FEDERATION = "federation"


# Algorithms that send a new job to the best sites by F alone (the others re-sort or draw).
_RANKED_BY_F = frozenset((Algorithm.DLO, Algorithm.DR, Algorithm.DM, Algorithm.DRM))
# Algorithms whose every placement is a reservation that claims its start (the baselines of
# gbroker.core.sparrow and gbroker.core.federation).
_RESERVING = frozenset((Algorithm.SPARROW, Algorithm.FEDERATION))


@dataclass(frozen=True, slots=True)
class DispatchPolicy:
    """An algorithm and its parameters: m replicas, interval Δ (s) and threshold ε; Sparrow's
    probe ratio d; whether Sparrow's reservations and the federation's siblings stage their
    inputs when placed (``stage_reservations``) or only once granted (the default); GridWay's
    settings for ``gridway``."""

    algorithm: Algorithm = Algorithm.DLO
    replicas: int = 2
    interval: float = 30.0
    epsilon: float = 0.2
    account_own_dispatches: bool = True
    probe_ratio: float = DEFAULT_PROBE_RATIO
    stage_reservations: bool = False
    gridway: GridWayPolicy = field(default_factory=GridWayPolicy)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "algorithm", Algorithm(self.algorithm))
        except ValueError:
            raise InvalidInput(
                "algorithm", f"one of {', '.join(Algorithm)}", self.algorithm
            ) from None
        if self.replicas < 1:
            raise InvalidInput("replicas", "an integer >= 1", self.replicas)
        if not self.interval > 0:
            raise InvalidInput("interval", "seconds > 0", self.interval)
        if not self.epsilon >= 0:
            raise InvalidInput("epsilon", "a threshold >= 0", self.epsilon)
        probe_count(self.probe_ratio)  # checks it: a finite ratio >= 1
        if not isinstance(self.gridway, GridWayPolicy):
            raise InvalidInput("gridway", "GridWay's settings (a GridWayPolicy)", self.gridway)

    @property
    def replicating(self) -> bool:
        return self.algorithm in (Algorithm.DR, Algorithm.DRM) and self.replicas > 1

    @property
    def migrating(self) -> bool:
        return self.algorithm in (Algorithm.DM, Algorithm.DRM)

    @property
    def reserving(self) -> bool:
        """Sparrow and federation: every placement is a reservation that claims its start."""
        return self.algorithm in _RESERVING

    @property
    def periodic(self) -> bool:
        """Whether the broker needs a :class:`Tick` (:meth:`Broker.next_tick`) while it holds
        jobs."""
        return self.migrating or self.centralized

    @property
    def centralized(self) -> bool:
        """Whether one broker receives every job and sees every site (central, gridway)."""
        return self.algorithm in (Algorithm.CENTRAL, Algorithm.GRIDWAY)


class SiteView(Protocol):
    """The latest known state of sites (DCSMon's neighbourhood view)."""

    def get(self, site: str, /) -> Observation | None: ...


class RandomSource(Protocol):
    """A seeded generator (``random.Random``) passed in; the core draws no global randomness."""

    def randrange(self, stop: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """One candidate site of a job as :meth:`Broker.explain` sees it now.

    ``terms`` holds F(j) term by term when the site is in S(i) (``reason`` is then empty),
    ``penalty`` what black-hole protection adds to its F(j); ``best`` marks the site the
    local-optimal rule picks (argmin of F plus penalty); ``hosts``, the site's hosts the job's
    candidate hosts hold it to there (empty: any of them). Otherwise ``reason`` says why the
    site is left out, and ``unmet`` names the requirement it fails, if that is why.
    """

    site: str
    reason: str = ""
    terms: Terms | None = None
    penalty: float = 0.0
    best: bool = False
    unmet: Unmet | None = None
    hosts: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return self.terms is not None


# -- the owner's records -----------------------------------------------------------------------


class Placement(StrEnum):
    STAGING = "staging"  # dispatched, files on their way
    QUEUED = "queued"  # in the site's queue
    WITHDRAWING = "withdrawing"  # a withdrawal is in flight


@dataclass(slots=True)
class Move:
    """A running job's move from ``source`` to ``target`` (see the module docstring);
    ``ready`` once the source has frozen it and its checkpoint is ready."""

    source: str
    target: str
    ready: bool = False


@dataclass(slots=True)
class GangClaims:
    """The claims of a co-allocated job's components that the owner holds: component id ->
    when it first claimed in this round; ``released``: components told to queue again;
    ``rounds``: rounds that timed out."""

    held: dict[str, float] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    rounds: int = 0


MOVE_VERDICTS = ("wait", "release", "resume")
"""What :meth:`Broker.move_verdict` tells a job's source."""


@dataclass(slots=True)
class OwnedJob:
    job: Job
    submitted_at: float
    state: JobState = JobState.SUBMITTED
    placements: dict[str, Placement] = field(default_factory=dict)
    queued_at: dict[str, float] = field(default_factory=dict)
    dispatched_at: dict[str, float] = field(default_factory=dict)  # when each lease began
    migrate_to: dict[str, str] = field(default_factory=dict)  # withdrawing site -> target
    granted: str | None = None
    moving: Move | None = None  # a running job on its way from one site to another

    def move(self, new: JobState) -> None:
        self.state = check_transition(self.state, new)


class Broker:
    """One site's broker: owner of the jobs submitted to it. See the module docstring."""

    __slots__ = (
        "_fits",
        "_gangs",
        "_gridway",
        "_inflight",
        "_lost",
        "_now",
        "_refusing",
        "_round_robin",
        "_waiting",
        "coalloc_rounds",
        "coalloc_timeout",
        "forecast",
        "health",
        "jobs",
        "lease",
        "neighbourhood",
        "policy",
        "properties",
        "rng",
        "site",
    )

    def __init__(
        self,
        site: str,
        neighbourhood: Sequence[str],
        policy: DispatchPolicy,
        forecast: TransferForecast,
        rng: RandomSource | None = None,
        lease: float = float("inf"),
        health: HealthPolicy | None = None,
        properties: Mapping[str, SiteProperties] | None = None,
        coalloc_timeout: float = 60.0,
        coalloc_rounds: int = 10,
    ) -> None:
        if site in neighbourhood:
            raise InvalidInput("neighbourhood", f"sites other than the broker's own ({site})", site)
        if not lease > 0:
            raise InvalidInput("lease", "seconds > 0", lease)
        if not coalloc_timeout > 0:
            raise InvalidInput("coalloc_timeout", "seconds > 0", coalloc_timeout)
        if coalloc_rounds < 1:
            raise InvalidInput("coalloc_rounds", "an integer >= 1", coalloc_rounds)
        if policy.algorithm in (Algorithm.RANDOM, Algorithm.SPARROW) and rng is None:
            raise InvalidInput(
                "rng", f"a seeded random source for the {policy.algorithm} baseline", None
            )
        self.site = site
        self.neighbourhood = tuple(neighbourhood)
        self.policy = policy
        self.forecast = forecast
        self.rng = rng
        self.lease = lease
        # Black-hole protection (gbroker.core.health); None: every site is trusted.
        self.health = SiteHealth(health) if health is not None else None
        self._now = 0.0  # the time of the event being handled (leases are stamped with it)
        self._lost: set[str] = set()  # sites lost and not heard from since
        # Sites that refused a dispatch (draining), with when: passed over until an observation
        # newer than the refusal says what they are now.
        self._refusing: dict[str, float] = {}
        self.jobs: dict[str, OwnedJob] = {}
        self._waiting: list[str] = []  # central: jobs held in the broker's own queue
        # Own dispatches a site's latest observation may not show yet: site -> {job id: rank}.
        self._inflight: dict[str, dict[str, int]] = {}
        self._round_robin = 0
        # What each site offers beyond cores; None: only candidate hosts are matched (by the
        # sites' names), and every site with enough cores meets any other requirement.
        self.properties = dict(properties) if properties is not None else None
        # The sites of L(i) ∪ {i} that meet each distinct set of requirements for a rank
        # (properties are static, so each pair is matched once).
        self._fits: dict[tuple[Requirements, int], frozenset[str]] = {}
        # Co-allocated jobs: the claims held until every component has claimed, by gang id.
        self.coalloc_timeout = coalloc_timeout
        self.coalloc_rounds = coalloc_rounds
        self._gangs: dict[str, GangClaims] = {}
        self._gridway = (
            GridWay(policy.gridway, (site, *self.neighbourhood))
            if policy.algorithm is Algorithm.GRIDWAY
            else None
        )

    # -- the one entry point ---------------------------------------------------------------------

    def handle(self, event: BrokerEvent, now: float, view: SiteView) -> list[BrokerCommand]:
        self._now = now
        if self._gridway is not None:
            self._tell_gridway(event, now)
        match event:
            case JobSubmitted(job):
                return self._submit(job, now, view)
            case JobQueued(job_id, site):
                self._queued(job_id, site, now)
                return []
            case ClaimRequested(job_id, site):
                return self._claim(job_id, site)
            case JobStarted(job_id, site):
                self._started(job_id, site)
                return []
            case JobFinished(job_id, site, ok, run_time):
                return self._finished(job_id, site, ok, run_time, now, view)
            case WithdrawAnswered(job_id, site, withdrawn):
                return self._withdraw_answered(job_id, site, withdrawn)
            case Tick():
                return self._tick(view)
            case CancelRequested(job_id):
                return self._cancel(job_id)
            case SiteLost(site):
                return self._site_lost(site, now, view)
            case SiteBack(site):
                self._lost.discard(site)
                return []
            case DispatchRefused(job_id, site):
                return self._refused(job_id, site, view)
            case PlacementReleased(job_id, site):
                return self._released(job_id, site, view)
        raise InvalidInput("event", "a broker event", event)

    @property
    def needs_tick(self) -> bool:
        """Whether a periodic broker holds jobs that a :class:`Tick` could move."""
        return self.policy.periodic and bool(self._waiting or self.jobs)

    def next_tick(self, now: float) -> float:
        """When the driver sends the next :class:`Tick` (while :attr:`needs_tick`): Δ after
        ``now``, or when GridWay's next timer fires."""
        if self._gridway is not None:
            return self._gridway.next_tick(now)
        return now + self.policy.interval

    # -- ranking ---------------------------------------------------------------------------------

    def candidates(
        self, job: Job, view: SiteView, exclude_self_from: str | None = None
    ) -> list[Candidate]:
        """S(i)'s raw material: every known site of L(i) ∪ {i} with its (adjusted) state."""
        return [Candidate(*row) for row in self._rows(job, view, exclude_self_from)]

    def _rows(
        self,
        job: Job,
        view: SiteView,
        exclude_self_from: str | None = None,
        avoid: Collection[str] = (),
        forecast: bool = True,
    ) -> list[SiteRow]:
        """:meth:`candidates` as plain rows, which a decision ranks without an object per site.

        Sites in ``avoid`` and sites excluded as black holes are left out. Without
        ``forecast`` every t_j is 0 and NetMon is not asked (a decision that never weighs it)."""
        excluded = self.health.excluded(self._now) if self.health is not None else ()
        inflight = self._inflight
        if inflight:
            # Drop the sites whose dispatches have all started or ended: usually none is left,
            # and then no site needs adjusting (nor an empty table of its own read, at thousands
            # of sites out of the CPU caches).
            for site in tuple(inflight):
                if not inflight[site]:
                    del inflight[site]
        adjust = bool(inflight)
        fits = self._fitting(job.requirements, job.rank)
        out = []
        files = job.input_files
        for site in (self.site, *self.neighbourhood):
            seen = view.get(site)
            if seen is None or (avoid and site in avoid) or (excluded and site in excluded):
                continue
            if fits is not None and site not in fits:
                continue
            if self._refusing and site in self._refusing:
                if seen.observed_at <= self._refusing[site]:
                    continue
                del self._refusing[site]
            state = self._adjusted(site, seen, job.id) if adjust else seen.state
            if site == exclude_self_from and state.queued > 0:
                state = SiteState(
                    state.total_cores,
                    state.free_cores,
                    state.queued - 1,
                    state.running,
                    draining=state.draining,
                    shrinkable=state.shrinkable,
                    shareable=state.shareable,
                    cpu=state.cpu,
                )
            if state.shareable:  # SD-Policy's mates' cores: free for a job that may share
                state = state.for_job(job)
            t_j = staging_time(files, site, self.forecast) if forecast else 0.0
            if not t_j >= 0:  # as Candidate checks it (also rejects NaN)
                raise InvalidInput(f"candidate[{site}].transfer_time", "seconds >= 0", t_j)
            out.append((site, state, t_j, seen.observed_at))
        return out

    def _fitting(self, requirements: Requirements | None, rank: int) -> frozenset[str] | None:
        """The sites of L(i) ∪ {i} that meet ``requirements`` for a job of ``rank`` cores
        (cores aside: those change with the site's state); None when every site does. The rank
        matters: memory and disk in all grow with the cores a job gets."""
        matched = self._matched(requirements)
        if matched is None:
            return None
        fits = self._fits.get((matched, rank))
        if fits is None:
            fits = self._fits[matched, rank] = frozenset(
                site
                for site in (self.site, *self.neighbourhood)
                if not any(
                    u.need is not Need.CORES for u in unmet(matched, site, self._props(site), rank)
                )
            )
        return fits

    def _matched(self, requirements: Requirements | None) -> Requirements | None:
        """What of ``requirements`` this broker matches (None: nothing). Without site
        properties only candidate hosts, which name sites, can be: a job pinned to a site
        runs only there whatever else its broker knows."""
        if requirements is None or requirements.empty:
            return None
        if self.properties is None:
            if not requirements.candidate_hosts:
                return None
            return Requirements(candidate_hosts=requirements.candidate_hosts)
        return requirements

    def _props(self, site: str) -> SiteProperties:
        known = self.properties.get(site) if self.properties is not None else None
        return known or SiteProperties()

    def _adjusted(self, site: str, seen: Observation, skip_job: str) -> SiteState:
        """The observed state plus our own dispatches it cannot show yet."""
        inflight = self._inflight.get(site)
        if not inflight or not self.policy.account_own_dispatches:
            return seen.state
        state = seen.state
        free, queued, shrinkable = state.free_cores, state.queued, state.shrinkable
        shareable = state.shareable
        observed_at, jobs = seen.observed_at, self.jobs
        settled = []  # the observation already includes them, or they are gone
        # Once per decision over every dispatch in flight to the site: kept tight.
        for job_id, rank in inflight.items():
            owned = jobs.get(job_id)
            if owned is None:
                settled.append(job_id)
                continue
            queued_at = owned.queued_at.get(site)
            if queued_at is not None and queued_at <= observed_at:
                settled.append(job_id)
                continue
            if job_id == skip_job:
                continue
            lent = shareable if shareable and owned.job.shares_cores else 0
            if free + shrinkable + lent >= rank and queued == 0:
                # Free cores first, then those shrinking frees, then SD-Policy's mates'.
                taken = min(free, rank)
                free -= taken
                shrunk = min(shrinkable, rank - taken)
                shrinkable -= shrunk
                shareable -= rank - taken - shrunk
            else:
                queued += 1
        for job_id in settled:
            del inflight[job_id]
        return SiteState(
            state.total_cores,
            free,
            queued,
            state.running,
            draining=state.draining,
            shrinkable=shrinkable,
            shareable=shareable,
            cpu=state.cpu,
        )

    def _penalties(self) -> dict[str, float]:
        """What black-hole protection adds to F(j) of each suspect site (usually nothing)."""
        return self.health.penalties(self._now) if self.health is not None else {}

    def _choose(
        self, job: Job, view: SiteView, how_many: int, avoid: Collection[str] = ()
    ) -> list[str]:
        algorithm = self.policy.algorithm
        if algorithm in _RANKED_BY_F:
            rows = self._rows(job, view, avoid=avoid)
            penalties = self._penalties()
            if not penalties:
                return best_sites(job.rank, rows, how_many)
            scores = rank_sites(job.rank, [Candidate(*row) for row in rows])
            scores.sort(key=lambda s: (s.value + penalties.get(s.site, 0.0), *s.sort_key()[1:]))
            return [s.site for s in scores[:how_many]]
        if algorithm in _RESERVING:
            return self._reservations(job, view, avoid)
        cands = [Candidate(*row) for row in self._rows(job, view, avoid=avoid)]
        if algorithm in (Algorithm.RANDOM, Algorithm.ROUNDROBIN):
            feasible = sorted(
                c.site for c in cands if c.state.total_cores >= job.rank and not c.state.draining
            )
            if not feasible:
                return []
            if algorithm is Algorithm.RANDOM:
                assert self.rng is not None
                return [feasible[self.rng.randrange(len(feasible))]]
            self._round_robin += 1
            return [feasible[(self._round_robin - 1) % len(feasible)]]
        scores = rank_sites(job.rank, cands)
        if algorithm is Algorithm.WORSTFIT:
            free = {c.site: c.state.free_cores for c in cands}
            scores.sort(key=lambda s: (-free[s.site], *s.sort_key()))
        elif algorithm is Algorithm.CLOSETOFILES:
            t = {c.site: c.transfer_time for c in cands}
            scores.sort(key=lambda s: (t[s.site], *s.sort_key()))
        return [s.site for s in scores[:how_many]]

    def _reservations(self, job: Job, view: SiteView, avoid: Collection[str]) -> list[str]:
        """Sparrow's probed sites or the federation's siblings, from the eligible sites of
        S(i): big enough, meeting the job's requirements, taking work. Neither F(j), nor a
        site's load, nor NetMon's forecast has a say (see the baselines' modules)."""
        eligible = [
            site
            for site, state, _, _ in self._rows(job, view, avoid=avoid, forecast=False)
            if state.total_cores >= job.rank and not state.draining
        ]
        if self.policy.algorithm is Algorithm.FEDERATION:
            return sibling_sites(eligible)
        assert self.rng is not None
        return probe_sites(eligible, probe_count(self.policy.probe_ratio), self.rng)

    # -- events ----------------------------------------------------------------------------------

    def _submit(self, job: Job, now: float, view: SiteView) -> list[BrokerCommand]:
        if job.id in self.jobs:
            return []  # idempotent by job id
        if job.gang is not None:  # a component: placed with its mates when it was submitted
            site = job.gang.site
            if site != self.site and site not in self.neighbourhood:
                raise InvalidInput(
                    f"job[{job.id}].site",
                    f"{self.site} or a site of its neighbourhood",
                    site,
                )
            owned = self.jobs[job.id] = OwnedJob(job, now)
            owned.move(JobState.STAGING)
            return [self._dispatch(owned, site, replica=False)]
        if self.policy.centralized:
            if not any(c.state.total_cores >= job.rank for c in self.candidates(job, view)):
                raise self._too_big(job)
            self.jobs[job.id] = OwnedJob(job, now)
            if self._gridway is not None:  # held in GridWay's queue until an action binds it
                fits = self._fitting(job.requirements, job.rank)
                self._gridway.submit(job.id, job.rank, fits, now)
                return []
            self._waiting.append(job.id)
            return self._match_waiting(view)
        replicas = self.policy.replicas if self.policy.replicating else 1
        sites = self._choose(job, view, replicas)
        if not sites:
            raise self._no_site(job, view)
        owned = self.jobs[job.id] = OwnedJob(job, now)
        owned.move(JobState.STAGING)
        return [self._dispatch(owned, site, replica=len(sites) > 1) for site in sites]

    def place_components(
        self,
        job: Job,
        components: Sequence[tuple[int, str | None]],
        policy: str,
        view: SiteView,
    ) -> list[tuple[str, int]]:
        """Where a co-allocated job's components go: (site, cores) each, by KOALA's ``policy``
        (:mod:`gbroker.core.coalloc`) over the sites of L(i) ∪ {i} that meet ``job``'s
        requirements and take work. A component may name its site (``components[i]`` is
        (cores, site or None)); the others are placed on the idle cores left. Components that
        do not fit the idle cores now are placed on the sites' cores as if idle: they wait in
        the sites' queues, and their claims are held until all can start (late binding). With
        ``fcm`` the unnamed components' cores are re-split over the fewest sites. Raises
        :class:`InvalidInput` naming ``components[i].site`` or ``components``."""
        offered = self.offers(job, view)
        rows = [offer.site for offer in offered]
        staging = {offer.site: offer.staging for offer in offered}
        known = (self.site, *self.neighbourhood)
        free = {offer.site: offer.free for offer in offered}
        total = {offer.site: offer.total for offer in offered}
        pinned: dict[int, tuple[str, int]] = {}
        for i, (cores, site) in enumerate(components):
            if site is None:
                continue
            if site not in known:
                raise InvalidInput(
                    f"components[{i}].site", f"{self.site} or a site of its neighbourhood", site
                )
            if site not in rows or total[site] < cores:
                has = "no new work" if site not in rows else f"{total[site]} cores"
                raise InvalidInput(
                    f"components[{i}].site", f"a site that takes {cores} cores", f"{site}: {has}"
                )
            free[site] = max(0, free[site] - cores)
            total[site] -= cores
            pinned[i] = (site, cores)
        loose = [(i, cores) for i, (cores, site) in enumerate(components) if site is None]
        chosen: list[tuple[str, int]] | None = []
        if loose:
            sizes = [cores for _, cores in loose]
            flexible = policy == CoPolicy.FCM
            chosen = None
            for room in (free, total):  # idle cores first; else every core, queued for
                seen = [
                    Offer(site, min(room[site], total[site]), max(1, total[site]), staging[site])
                    for site in rows
                    if total[site] >= 1
                ]
                if seen:
                    chosen = place(sizes, seen, CoPolicy(policy), flexible=flexible)
                if chosen is not None:
                    break
            if chosen is None:
                raise InvalidInput(
                    "components",
                    f"components that {len(rows)} site(s) of {self.site}'s neighbourhood can "
                    f"hold ({sum(total.values())} cores left in all)",
                    sizes,
                )
        assert chosen is not None
        out = [pinned[i] for i in sorted(pinned)]
        if len(chosen) == len(loose):  # in the components' order, the named ones where named
            out = []
            placed = iter(chosen)
            for i in range(len(components)):
                out.append(pinned[i] if i in pinned else next(placed))
        else:  # FCM re-split the unnamed ones
            out.extend(chosen)
        return out

    def offers(self, job: Job, view: SiteView) -> list[Offer]:
        """What this broker sees for co-allocated ``job`` (KOALA's placement,
        :mod:`gbroker.core.coalloc`) at each site of L(i) ∪ {i} that meets its requirements and
        takes work: its idle cores (with what shrinking frees, less this broker's dispatches the
        view cannot show yet), its cores and t_j."""
        return [
            Offer(site, state.available, state.total_cores, t_j)
            for site, state, t_j, _ in self._rows(job, view)
            if not state.draining
        ]

    def gang_rounds(self, gang: str) -> int:
        """Rounds of claims of co-allocated job ``gang`` that timed out so far (0 once it was
        granted, or failed: then it has no rounds under way)."""
        claims = self._gangs.get(gang)
        return 0 if claims is None else claims.rounds

    def model_resources(
        self, job: Job, view: SiteView, speeds: Mapping[str, float]
    ) -> list[Resource]:
        """What the AppLeS planner may use for ``job``: the sites of L(i) ∪ {i} that meet its
        requirements and take work, each with its idle cores, its forecast CPU availability
        (DCSMon's NWS forecast; 1 where none is published) and its ``speeds``."""
        return [
            Resource(site, state.available, state.cpu or 1.0, speeds.get(site, 1.0))
            for site, state, _, _ in self._rows(job, view)
            if not state.draining
        ]

    def plan_model(
        self,
        job: Job,
        model: PerformanceModel,
        view: SiteView,
        speeds: Mapping[str, float],
        select: bool = True,
        resources: Sequence[Resource] | None = None,
    ) -> Plan:
        """AppLeS (:mod:`gbroker.core.apples`): the sites, partition and predicted time of a job
        with a performance model, over ``resources`` (default :meth:`model_resources`) and the
        links as NetMon forecasts them. The locus is this broker's site. Raises
        :class:`InvalidInput` (field ``model``) when no set of sites fits."""
        if resources is None:
            resources = self.model_resources(job, view, speeds)
        probe = max(1, int(model.exchange) or 1 << 20)

        def link(a: str, b: str) -> tuple[float, float]:
            if a == b:
                return math.inf, 0.0
            latency = max(0.0, self.forecast(a, b, 0))
            moving = self.forecast(a, b, probe) - latency
            return (probe / moving if moving > 0 else math.inf), latency

        locus = self.site if any(r.site == self.site for r in resources) else None
        return plan(model, resources, link, locus=locus, select=select)

    def check(self, job: Job, view: SiteView) -> None:
        """Raise what submitting ``job`` now would raise (no site of L(i) ∪ {i} takes it),
        changing nothing: a driver checks every kind of job of an array before taking any."""
        if self.policy.centralized:
            if not any(c.state.total_cores >= job.rank for c in self.candidates(job, view)):
                raise self._too_big(job)
            return
        rows = self._rows(job, view)
        if not any(state.total_cores >= job.rank and not state.draining for _, state, _, _ in rows):
            raise self._no_site(job, view)

    @staticmethod
    def _too_big(job: Job) -> InvalidInput:
        return InvalidInput(
            f"job[{job.id}].rank",
            "at most the cores of some known site in the neighbourhood",
            job.rank,
        )

    def _no_site(self, job: Job, view: SiteView) -> InvalidInput:
        """Why no site takes ``job``: none is big enough, none meets its requirements (named,
        with the closest site's value), or those that do take no work now."""
        known = [site for site in (self.site, *self.neighbourhood) if view.get(site) is not None]
        fits = [
            site
            for site in known
            if (seen := view.get(site)) is not None and seen.state.total_cores >= job.rank
        ]
        if not fits:
            return self._too_big(job)
        matching = self._fitting(job.requirements, job.rank)
        if matching is not None and not matching.intersection(fits):
            sites = {site: self._props(site) for site in fits}
            closest = closest_unmet(self._matched(job.requirements), job.rank, sites)
            assert closest is not None  # none of them matches
            expected = f"a site of the neighbourhood of {self.site} with {closest.wanted}"
            if closest.need is Need.CANDIDATE_HOSTS:
                expected += f" (names it knows: {known_names(sites)})"
            return InvalidInput(
                f"job[{job.id}].{closest.need}",
                expected,
                f"{closest.has} at site {closest.site}, the closest of {len(fits)}",
            )
        fits = [site for site in fits if matching is None or site in matching]
        return InvalidInput(
            f"job[{job.id}]",
            "a site that takes new work (every site that fits it is draining or excluded "
            f"as a black hole: {', '.join(sorted(fits))})",
        )

    def _dispatch(self, owned: OwnedJob, site: str, replica: bool) -> Dispatch:
        owned.placements[site] = Placement.STAGING
        owned.dispatched_at[site] = self._now
        self._inflight.setdefault(site, {})[owned.job.id] = owned.job.rank
        if self.policy.reserving and owned.job.gang is None:
            # A reservation or sibling claims its start even when it is the only one, and by
            # default waits for its files only once granted.
            return Dispatch(owned.job, site, True, deferred=not self.policy.stage_reservations)
        return Dispatch(owned.job, site, replica)

    def _queued(self, job_id: str, site: str, now: float) -> None:
        owned = self.jobs.get(job_id)
        if owned is None or owned.placements.get(site) is not Placement.STAGING:
            return  # duplicate, or a placement we already gave up
        owned.placements[site] = Placement.QUEUED
        owned.queued_at[site] = now
        if owned.state is JobState.STAGING:
            owned.move(JobState.QUEUED)

    def _claim(self, job_id: str, site: str) -> list[BrokerCommand]:
        owned = self.jobs.get(job_id)
        if owned is not None and owned.moving is not None and owned.moving.target == site:
            return [ClaimAnswer(job_id, site, granted=self._move_claim(owned, owned.moving))]
        if owned is None or site not in owned.placements:
            return [ClaimAnswer(job_id, site, granted=False)]
        if owned.granted is not None:
            return [ClaimAnswer(job_id, site, granted=owned.granted == site)]
        if owned.job.gang is not None:
            return self._gang_claim(owned, site)
        if owned.placements[site] is Placement.WITHDRAWING:
            # Only a migration withdraws with no grant given. The site is about to start the
            # job, so its answer to the withdrawal will be "stays": let it start, the migration
            # is moot. (Denying would make the site drop the job while that answer says it
            # stays: the job would be lost.)
            self._moot_migration(owned, site)
            owned.placements[site] = Placement.QUEUED
            if owned.state is JobState.MIGRATING:
                owned.move(JobState.QUEUED)
        owned.granted = site
        out: list[BrokerCommand] = [ClaimAnswer(job_id, site, granted=True)]
        for other, placement in owned.placements.items():
            if other != site and placement is not Placement.WITHDRAWING:
                owned.placements[other] = Placement.WITHDRAWING
                out.append(Withdraw(job_id, other))
        return out

    def _members(self, gang: str, size: int) -> list[OwnedJob | None]:
        """The components of co-allocated job ``gang`` this broker still holds, in rank order."""
        return [self.jobs.get(element_id(gang, i)) for i in range(1, size + 1)]

    def _gang_claim(self, owned: OwnedJob, site: str) -> list[BrokerCommand]:
        """A component's claim: held (``wait``) until every component has claimed, then all are
        granted at once (:class:`GangGranted`). A round that does not complete within
        ``coalloc_timeout`` of its first claim is called off: each held component is told to
        queue again (``requeue``), its cores going back to its site meanwhile; after
        ``coalloc_rounds`` such rounds the job fails, as KOALA's placement queue gives up."""
        gang = owned.job.gang
        assert gang is not None
        job_id = owned.job.id
        claims = self._gangs.setdefault(gang.id, GangClaims())
        if job_id in claims.released:
            claims.released.discard(job_id)
            return [ClaimAnswer(job_id, site, granted=False, requeue=True)]
        members = self._members(gang.id, gang.size)
        if any(m is None for m in members):  # a mate was cancelled or failed: none starts
            return [ClaimAnswer(job_id, site, granted=False)]
        claims.held.setdefault(job_id, self._now)
        if len(claims.held) == gang.size:
            grants = []
            for member in members:
                assert member is not None
                assert member.job.gang is not None
                member.granted = member.job.gang.site
                grants.append((member.job.id, member.granted))
            del self._gangs[gang.id]
            return [ClaimAnswer(job_id, site, granted=True), GangGranted(gang.id, tuple(grants))]
        if self._now - min(claims.held.values()) < self.coalloc_timeout:
            return [ClaimAnswer(job_id, site, granted=False, wait=True)]
        claims.rounds += 1
        claims.released = set(claims.held) - {job_id}
        claims.held.clear()
        if claims.rounds < self.coalloc_rounds:
            return [ClaimAnswer(job_id, site, granted=False, requeue=True)]
        reason = (
            f"its {gang.size} components did not all get their cores within "
            f"{self.coalloc_timeout:g} s, {claims.rounds} times"
        )
        return [
            ClaimAnswer(job_id, site, granted=False),
            *self._fail_gang(gang.id, gang.size, reason),
        ]

    def _fail_gang(self, gang: str, size: int, reason: str) -> list[BrokerCommand]:
        """Every component of ``gang`` fails (none has started): withdraw each from its site
        (a claiming one stays there, and its next claim is denied: it is dropped)."""
        self._gangs.pop(gang, None)
        out: list[BrokerCommand] = []
        for member in self._members(gang, size):
            if member is None:
                continue
            del self.jobs[member.job.id]
            for placed in member.placements:
                self._inflight.get(placed, {}).pop(member.job.id, None)
                out.append(Withdraw(member.job.id, placed))
            out.append(Abandon(member.job.id, reason))
        return out

    @staticmethod
    def _move_claim(owned: OwnedJob, move: Move) -> bool:
        """The target of a move claims the start: the grant passes from the source to it,
        once the source has frozen the job (and not if the move was abandoned meanwhile)."""
        if owned.granted == move.target:
            return True  # a repeated claim
        if not move.ready or owned.granted != move.source:
            return False
        owned.granted = move.target
        owned.placements.pop(move.source, None)
        owned.placements[move.target] = Placement.QUEUED
        return True

    # -- moving running jobs -----------------------------------------------------------------

    def begin_move(self, job_id: str, target: str) -> str:
        """Record that a running job moves to ``target``; its source (where it runs now).
        :class:`InvalidInput` if it cannot move (not running, moving already, ``target`` where
        it runs or outside the neighbourhood)."""
        owned = self.jobs.get(job_id)
        if owned is None or owned.state is not JobState.RUNNING or owned.granted is None:
            found = "unknown" if owned is None else owned.state.value
            raise InvalidInput("job", "a running job", found)
        if owned.moving is not None:
            raise InvalidInput(
                "job", "a job not moving already", f"moving to {owned.moving.target}"
            )
        if target == owned.granted:
            raise InvalidInput("to", "a site other than the one the job runs at", target)
        if target != self.site and target not in self.neighbourhood:
            raise InvalidInput("to", f"a site of {self.site}'s neighbourhood", target)
        owned.moving = Move(owned.granted, target)
        return owned.granted

    def move_ready(self, job_id: str, source: str, target: str) -> bool:
        """The source froze the job and its checkpoint is ready: the target is placed, and may
        claim it. False if no such move is under way (the source then resumes the job)."""
        owned = self.jobs.get(job_id)
        move = None if owned is None else owned.moving
        if owned is None or move is None or (move.source, move.target) != (source, target):
            return False
        if not move.ready:
            move.ready = True
            owned.placements.setdefault(target, Placement.STAGING)
            owned.dispatched_at[target] = self._now
        return True

    def move_verdict(self, job_id: str, source: str) -> str:
        """What the source of a move does with its frozen copy (:data:`MOVE_VERDICTS`):
        ``resume`` only while it holds the grant and no move of it is under way; ``release``
        once another site holds the grant and has started the job, or the job is over; else
        ``wait``."""
        owned = self.jobs.get(job_id)
        if owned is None:
            return "release"  # ended or cancelled: nothing of it may run again
        move = owned.moving
        moving_from_here = move is not None and move.source == source
        if owned.granted == source:
            return "wait" if moving_from_here else "resume"
        return "wait" if moving_from_here else "release"

    def abandon_move(self, job_id: str) -> str | None:
        """The move is off: the source could not checkpoint the job, or the target refused it
        or could not restore it (never started it). The grant is the source's again; the
        target (None if no move was under way), whose placement is given up."""
        owned = self.jobs.get(job_id)
        if owned is None or owned.moving is None:
            return None
        move, owned.moving = owned.moving, None
        owned.placements.pop(move.target, None)
        owned.dispatched_at.pop(move.target, None)
        owned.granted = move.source
        owned.placements.setdefault(move.source, Placement.QUEUED)
        return move.target

    def moving_of(self, job_id: str) -> Move | None:
        """The move of ``job_id`` under way, if any."""
        owned = self.jobs.get(job_id)
        return None if owned is None else owned.moving

    def restore_move(self, job_id: str, source: str, target: str, ready: bool) -> None:
        """Rebuild a move under way from a journal after a restart (after :meth:`restore`)."""
        owned = self.jobs.get(job_id)
        if owned is None or owned.granted not in (source, target):
            return
        owned.moving = Move(source, target, ready)
        if ready:
            owned.placements.setdefault(target, Placement.STAGING)
            owned.dispatched_at.setdefault(target, self._now)

    def _moot_migration(self, owned: OwnedJob, site: str) -> None:
        """The move from ``site`` will not happen (the job claims or started there while being
        withdrawn, or the placement there is given up): its target no longer counts the job."""
        target = owned.migrate_to.pop(site, None)
        if target is not None and target not in owned.placements:
            self._inflight.get(target, {}).pop(owned.job.id, None)

    def _started(self, job_id: str, site: str) -> None:
        owned = self.jobs.get(job_id)
        if owned is not None and owned.moving is not None and owned.granted == site:
            if owned.moving.target == site:  # restored at the target: the move is over
                owned.moving = None
            return
        if owned is None or owned.state is JobState.RUNNING:
            return
        owned.granted = site
        if owned.state is JobState.STAGING:  # a replica queued and started before we heard
            owned.move(JobState.QUEUED)
        owned.move(JobState.RUNNING)
        self._inflight.get(site, {}).pop(job_id, None)
        self._moot_migration(owned, site)

    def _finished(
        self,
        job_id: str,
        site: str,
        ok: bool,
        run_time: float | None,
        now: float,
        view: SiteView,
    ) -> list[BrokerCommand]:
        owned = self.jobs.pop(job_id, None)
        if owned is None:
            return []
        if owned.state is JobState.STAGING:
            owned.move(JobState.QUEUED)
        if owned.state is not JobState.RUNNING:
            owned.move(JobState.RUNNING)
        owned.move(JobState.DONE if ok else JobState.FAILED)
        for placed in owned.placements:
            self._inflight.get(placed, {}).pop(job_id, None)
        # A site has freed cores: the central queue may place more.
        out = self._match_waiting(view) if self._waiting else []
        if self.health is not None:
            out.extend(self.health.record(site, ok, run_time, now))
        return out

    def _withdraw_answered(self, job_id: str, site: str, withdrawn: bool) -> list[BrokerCommand]:
        owned = self.jobs.get(job_id)
        if owned is None or owned.placements.get(site) is not Placement.WITHDRAWING:
            return []
        target = owned.migrate_to.pop(site, None)
        if target is not None and target not in owned.placements:
            self._inflight.get(target, {}).pop(job_id, None)  # re-added if the move goes ahead
        if not withdrawn and owned.granted is not None and owned.granted != site:
            del owned.placements[site]  # a losing replica mid-claim: its claim gets denied
            return []
        if not withdrawn:
            # It started (or is claiming) there first: the migration did not happen.
            owned.placements[site] = Placement.QUEUED
            if owned.state is JobState.MIGRATING:
                owned.move(JobState.QUEUED)
            return []
        del owned.placements[site]
        owned.queued_at.pop(site, None)
        self._inflight.get(site, {}).pop(job_id, None)
        if target is None or owned.granted is not None or target in owned.placements:
            return []
        if owned.state is JobState.MIGRATING:
            owned.move(JobState.STAGING)
        return [self._dispatch(owned, target, replica=self.policy.replicating)]

    def _cancel(self, job_id: str) -> list[BrokerCommand]:
        """Withdraw every waiting placement, kill a running one; the job is then forgotten, so
        any late claim for it is denied and late reports are ignored."""
        owned = self.jobs.pop(job_id, None)
        if owned is None:
            return []
        owned.move(JobState.CANCELLED)
        if job_id in self._waiting:
            self._waiting.remove(job_id)
        out: list[BrokerCommand] = []
        for site in owned.placements:
            self._inflight.get(site, {}).pop(job_id, None)
            # The granted site runs the job (or is about to): kill it there; withdraw elsewhere.
            out.append(Kill(job_id, site) if owned.granted == site else Withdraw(job_id, site))
        return out

    def _site_lost(self, site: str, now: float, view: SiteView) -> list[BrokerCommand]:
        """Give up the placements at ``site`` whose lease ran out; re-dispatch what is left
        with no placement. A job granted (running) there stays: the site reports its end."""
        self._lost.add(site)
        out: list[BrokerCommand] = []
        for owned in list(self.jobs.values()):
            move = owned.moving
            if move is not None and move.target == site and owned.granted != site:
                if move.ready and owned.dispatched_at.get(site, now) + self.lease > now:
                    continue  # it may still claim: wait (lease_pending)
                # The target never claimed the grant, so it never ran the job and now cannot:
                # the move is off and the frozen copy resumes at its source.
                self.abandon_move(owned.job.id)
                continue
            if site not in owned.placements or owned.granted == site:
                continue
            if owned.job.gang is not None:
                continue  # a component waits for its site: its mates' claims time out meanwhile
            if owned.dispatched_at[site] + self.lease > now:
                continue  # the site may still start it on its lease: wait (lease_pending)
            del owned.placements[site]
            owned.queued_at.pop(site, None)
            owned.dispatched_at.pop(site, None)
            self._moot_migration(owned, site)  # a move from there is given up with it
            self._inflight.get(site, {}).pop(owned.job.id, None)
            if owned.placements or owned.granted is not None:
                continue  # other replicas carry on
            if owned.state in (JobState.QUEUED, JobState.MIGRATING):
                if owned.state is JobState.QUEUED:
                    owned.move(JobState.MIGRATING)
                owned.move(JobState.STAGING)
            replicas = self.policy.replicas if self.policy.replicating else 1
            sites = self._choose(owned.job, view, replicas, avoid=self._lost)
            if not sites:
                del self.jobs[owned.job.id]
                out.append(Abandon(owned.job.id, f"its site {site} was lost and no other fits it"))
                continue
            out.extend(self._dispatch(owned, s, replica=len(sites) > 1) for s in sites)
        return out

    def _refused(self, job_id: str, site: str, view: SiteView) -> list[BrokerCommand]:
        """``site`` does not hold the job and will not take it: drop the placement and, if none
        is left, place the job elsewhere (or abandon it if no other site fits it). The site is
        passed over until an observation of it newer than the refusal comes."""
        self._refusing[site] = self._now
        owned = self.jobs.get(job_id)
        placement = owned.placements.get(site) if owned is not None else None
        if owned is None or placement not in (Placement.STAGING, Placement.QUEUED):
            return []  # unknown, or a withdrawal is in flight: its answer settles it
        if owned.job.gang is not None:  # its site was chosen with its mates': none runs
            gang = owned.job.gang
            return self._fail_gang(gang.id, gang.size, f"site {site} takes no new work")
        del owned.placements[site]
        owned.queued_at.pop(site, None)
        owned.dispatched_at.pop(site, None)
        self._inflight.get(site, {}).pop(job_id, None)
        if owned.placements or owned.granted is not None:
            return []  # other replicas carry on
        if owned.state in (JobState.QUEUED, JobState.MIGRATING):
            if owned.state is JobState.QUEUED:
                owned.move(JobState.MIGRATING)
            owned.move(JobState.STAGING)
        replicas = self.policy.replicas if self.policy.replicating else 1
        sites = self._choose(owned.job, view, replicas, avoid={site, *self._lost})
        if not sites:
            del self.jobs[job_id]
            return [Abandon(job_id, f"site {site} takes no new work and no other site fits it")]
        return [self._dispatch(owned, s, replica=len(sites) > 1) for s in sites]

    def _released(self, job_id: str, site: str, view: SiteView) -> list[BrokerCommand]:
        """``site`` hands back the job waiting there: withdraw it and, once withdrawn, dispatch
        it to the best other site, as a migration does. Nothing if no other site fits it."""
        owned = self.jobs.get(job_id)
        if owned is None or owned.granted is not None or owned.job.gang is not None:
            return []  # a component stays where it was placed with its mates
        if owned.placements.get(site) not in (Placement.STAGING, Placement.QUEUED):
            return []  # not placed there, or already being withdrawn
        avoid = {site, *owned.placements, *self._lost}
        targets = self._choose(owned.job, view, 1, avoid=avoid)
        if not targets and len(owned.placements) == 1:
            return []  # nowhere else to go: it runs where it is
        owned.placements[site] = Placement.WITHDRAWING
        if targets:
            owned.migrate_to[site] = targets[0]
            self._inflight.setdefault(targets[0], {})[job_id] = owned.job.rank
        if len(owned.placements) == 1 and owned.state is JobState.QUEUED:
            owned.move(JobState.MIGRATING)
        return [Withdraw(job_id, site)]

    def explain(self, job: Job, view: SiteView, now: float) -> list[Verdict]:
        """Each site of L(i) ∪ {i} for ``job`` as a decision at ``now`` would see it: its F(j)
        terms if it is in S(i), else why not. Pure: it changes nothing (a round-robin turn is
        not taken, nothing is dispatched). Feasible sites come first, best first."""
        self._now = now
        excluded = self.health.excluded(now) if self.health is not None else {}
        penalties = self._penalties()
        fits = self._fitting(job.requirements, job.rank)
        rows = {row[0]: row for row in self._rows(job, view)}
        out: list[Verdict] = []
        for site in (self.site, *self.neighbourhood):
            seen = view.get(site)
            failures = unmet(self._matched(job.requirements), site, self._props(site), job.rank)
            if seen is None:
                reason = "lost (offline)" if site in self._lost else "no state known yet"
                out.append(Verdict(site, reason))
            elif excluded and site in excluded:
                out.append(Verdict(site, "excluded as a black hole (its jobs fail fast)"))
            elif site not in rows and fits is not None and site not in fits:
                first = next(u for u in failures if u.need is not Need.CORES)
                out.append(Verdict(site, str(first), unmet=first))
            elif seen.state.total_cores < job.rank:
                has = seen.state.total_cores
                why = Unmet(site, Need.CORES, count(job.rank, "core"), f"{has}")
                out.append(Verdict(site, f"too small: {count(has, 'core')}", unmet=why))
            elif seen.state.draining:
                out.append(Verdict(site, "draining: it takes no new work"))
            elif site not in rows:
                out.append(Verdict(site, "refused a dispatch (draining); not heard from since"))
        terms = f_terms(job.rank, [Candidate(*row) for row in rows.values()])
        ranked = sorted(
            terms,
            key=lambda t: (t.value + penalties.get(t.site, 0.0), -t.observed_at, t.site),
        )
        feasible = [
            Verdict(
                t.site,
                terms=t,
                penalty=penalties.get(t.site, 0.0),
                best=k == 0,
                hosts=self._held_to(job, t.site),
            )
            for k, t in enumerate(ranked)
        ]
        return feasible + out

    def _held_to(self, job: Job, site: str) -> tuple[str, ...]:
        """The hosts of ``site`` that ``job``'s candidate hosts hold it to (empty: any)."""
        hosts = job.requirements.candidate_hosts if job.requirements is not None else ()
        if not hosts:
            return ()
        props = self._props(site)
        allowed = candidate_hosts_at(hosts, site, props) or ()
        return allowed if len(allowed) < len(props.host_names(site)) else ()

    def placed(self, job_id: str, site: str) -> bool:
        """Whether ``site`` may speak for ``job_id``: the job is placed there, or was granted to
        it. Reports from any other site are forged or stale (ARCHITECTURE §10)."""
        owned = self.jobs.get(job_id)
        return owned is not None and (site in owned.placements or owned.granted == site)

    def waiting_at(self, site: str) -> set[str]:
        """The jobs placed at ``site`` that it has not been granted (it may still start them
        on their lease, or they wait there for one)."""
        return {
            job_id
            for job_id, owned in self.jobs.items()
            if site in owned.placements and owned.granted != site
        }

    def lease_pending(self, site: str) -> float | None:
        """When the next unexpired placement at a lost ``site`` runs out (None: there is none)."""
        if site not in self._lost:
            return None
        ends = [
            self.jobs[job_id].dispatched_at[site] + self.lease
            for job_id in self.waiting_at(site)
            if site in self.jobs[job_id].dispatched_at and self.jobs[job_id].job.gang is None
        ]
        return min(ends, default=None)

    def restore(
        self,
        job: Job,
        submitted_at: float,
        placements: dict[str, bool],
        granted: str | None,
        now: float,
    ) -> None:
        """Rebuild an owned job from a journal after a restart.

        ``placements`` maps each site the job was dispatched to onto whether it was queued
        there; ``granted`` is the site that was granted the start (or reported it). The driver
        re-sends every placement (sites accept idempotently), so each lease begins ``now``.
        A job with no placement is not restored: submit it again instead.
        """
        if job.id in self.jobs:
            return
        owned = self.jobs[job.id] = OwnedJob(job, submitted_at)
        owned.move(JobState.STAGING)
        for site, queued in placements.items():
            owned.placements[site] = Placement.QUEUED if queued else Placement.STAGING
            owned.dispatched_at[site] = now
            if queued:
                owned.queued_at[site] = now
        if any(placements.values()):
            owned.move(JobState.QUEUED)
        if granted is not None:
            owned.granted = granted
            if owned.state is JobState.STAGING:
                owned.move(JobState.QUEUED)
            owned.move(JobState.RUNNING)

    def _tick(self, view: SiteView) -> list[BrokerCommand]:
        if self._gridway is not None:
            return self._gridway_decisions(view)
        if self.policy.algorithm is Algorithm.CENTRAL:
            return self._match_waiting(view)
        if not self.policy.migrating:
            return []
        out: list[BrokerCommand] = []
        for owned in self.jobs.values():
            if owned.granted is not None or owned.state not in (JobState.QUEUED, JobState.STAGING):
                continue
            for site, placement in list(owned.placements.items()):
                if placement is Placement.QUEUED:
                    command = self._consider_migration(owned, site, view)
                    if command is not None:
                        out.append(command)
        return out

    def _consider_migration(self, owned: OwnedJob, current: str, view: SiteView) -> Withdraw | None:
        job = owned.job
        if job.gang is not None:
            return None  # a component stays where it was placed with its mates
        scores = {s.site: s for s in rank_sites(job.rank, self.candidates(job, view, current))}
        here = scores.get(current)
        if here is None:
            return None  # we no longer see the current site: leave the job where it is
        penalties = self._penalties()  # a suspect black hole's F(j) is scored down

        def key(score: Score) -> tuple[float, float, str]:
            return (score.value + penalties.get(score.site, 0.0), *score.sort_key()[1:])

        best: Score | None = None
        for score in scores.values():
            if score.site in owned.placements:
                continue
            if best is None or key(score) < key(best):
                best = score
        if best is None or key(here)[0] - key(best)[0] <= self.policy.epsilon:
            return None
        owned.placements[current] = Placement.WITHDRAWING
        owned.migrate_to[current] = best.site
        # Count the move against its target now, so that the other jobs weighed in this tick
        # do not all pick the same site that looked best (a herd).
        self._inflight.setdefault(best.site, {})[job.id] = job.rank
        if len(owned.placements) == 1 and owned.state is JobState.QUEUED:
            owned.move(JobState.MIGRATING)
        return Withdraw(job.id, current)

    def _gridway_decisions(self, view: SiteView) -> list[BrokerCommand]:
        """GridWay's timers at this tick: bind each job it dispatches (stage it there, early
        binding); move a rescheduled one as DM does (withdraw it, then dispatch it)."""
        assert self._gridway is not None
        out: list[BrokerCommand] = []
        for decision in self._gridway.tick(self._now, view):
            owned = self.jobs[decision.job_id]
            if isinstance(decision, Bind):
                owned.move(JobState.STAGING)
                out.append(self._dispatch(owned, decision.site, replica=False))
                continue
            owned.placements[decision.source] = Placement.WITHDRAWING
            owned.migrate_to[decision.source] = decision.target
            if owned.state is JobState.QUEUED:
                owned.move(JobState.MIGRATING)
            out.append(Withdraw(decision.job_id, decision.source))
        return out

    def _tell_gridway(self, event: BrokerEvent, now: float) -> None:
        """What GridWay hears of its jobs (GRAM's callbacks; the cancel of a move)."""
        assert self._gridway is not None
        match event:
            case JobQueued(job_id, site):
                self._gridway.queued(job_id, site, now)
            case JobStarted(job_id, site):
                self._gridway.started(job_id, site, now)
            case JobFinished(job_id, site, ok, _):
                self._gridway.finished(job_id, site, ok, now)
            case WithdrawAnswered(job_id, site, withdrawn):
                self._gridway.withdrawn(job_id, site, withdrawn, now)
            case CancelRequested(job_id):
                self._gridway.cancelled(job_id, now)

    def _match_waiting(self, view: SiteView) -> list[BrokerCommand]:
        """Central: place each held job, in arrival order, on a site that can start it now."""
        out: list[BrokerCommand] = []
        still: list[str] = []
        for job_id in self._waiting:
            owned = self.jobs[job_id]
            ready = [
                c
                for c in self.candidates(owned.job, view)
                if c.state.free_cores >= owned.job.rank and c.state.queued == 0
            ]
            best = min(rank_sites(owned.job.rank, ready), key=Score.sort_key, default=None)
            if best is None:
                still.append(job_id)
                continue
            owned.move(JobState.STAGING)
            out.append(self._dispatch(owned, best.site, replica=False))
        self._waiting = still
        return out
