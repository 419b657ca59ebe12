"""The broker network in simulated time: the daemons' core, driven by virtual events.

Theory of operation. Every site has a :class:`~gbroker.core.site.SiteAgent` (its local scheduler)
and a :class:`~gbroker.core.dispatch.Broker`. With the central and GridWay baselines, one broker
at the central site receives every job instead (it is ticked when its core says,
:meth:`~gbroker.core.dispatch.Broker.next_tick`). The simulator is a thin driver, the mirror of
the daemon's (:mod:`gbroker.daemon.driver`). It turns simulated I/O into core events and carries
out the core's commands:
- **Messages** between sites arrive after the latency of the pair's link; within a site, at once.
- **Staging**: input files move over :class:`~gbroker.sim.network.FlowNetwork`, where concurrent
  transfers share bandwidth; a deferred dispatch moves them only once its claim is granted.
- **DCSMon** publishes a site's state at the next multiple of the period after it changes, seen
  one link latency later: brokers decide on stale data, as in reality, and on their own site
  exactly. **NetMon** probes load the links like any transfer and feed the shared forecaster.
- **Jobs** run for their actual run time scaled by the site's speed; resizes (malleability,
  SD-Policy), background load, running-job migration (Dynamite), co-allocated jobs (KOALA) and
  cancels each carry a job's remaining work over or end it as the daemon would.
- **Scheduling passes** of every site touched in an instant run once at the instant's end.

Every command of the core (:mod:`gbroker.core.events`) is carried out here or refused aloud, and
each dispatch on commands ends in ``assert_never``.

What each of these models, in full: docs/EXPERIMENTS.md, "What the simulator models".
Nothing here decides where a job goes or when it starts: that is all in the core.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from gbroker.core.arrays import element_id
from gbroker.core.coalloc import (
    CoAllocation,
    CoPolicy,
    Placed,
    Placement,
    PlacementFailed,
    PlacementQueue,
)
from gbroker.core.dispatch import (
    Abandon,
    Broker,
    BrokerCommand,
    BrokerEvent,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.dynamite import MigrationPolicy, Move, RunningJob, SiteLoad, decide_migrations
from gbroker.core.events import CancelRequested, GangGranted, Kill, SiteExcluded
from gbroker.core.localsched import QueuePolicy
from gbroker.core.malleable import MalleabilityPolicy
from gbroker.core.metrics import BSLD_THRESHOLD
from gbroker.core.model import Gang, Job, Observation, SiteState
from gbroker.core.sdpolicy import SdPolicy
from gbroker.core.site import Claim, Fetch, Launch, Phase, Resized, SiteAgent
from gbroker.errors import InternalError, InvalidInput
from gbroker.sim.kernel import Kernel, P
from gbroker.sim.network import FlowNetwork, Resource, Transfer
from gbroker.topology import Topology
from gbroker.workloads.speedup import SpeedupModel
from gbroker.workloads.streams import Arrival
from netmon.ensemble import make_forecaster

__all__ = ["GridConfig", "GridResult", "GridSimulation", "GridSummary", "JobRecord"]

MB = 1_000_000


@dataclass(frozen=True, slots=True)
class GridConfig:
    """How the simulated grid behaves besides the topology and the dispatch policy."""

    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    queue_policy: QueuePolicy = QueuePolicy.EASY
    dcsmon_period: float = 5.0
    netmon_period: float = 300.0
    forecaster: str = "table"  # netmon.ensemble.FORECASTERS
    netmon_sizes: tuple[int, ...] = (1 * MB, 10 * MB)
    central_site: str | None = None
    malleability: MalleabilityPolicy | None = None
    sd_policy: SdPolicy | None = None
    migration: MigrationPolicy | None = None  # running jobs migrate by Dynamite's rule
    # (time, site, relative speed): background load arriving at a site (or leaving it).
    speed_changes: tuple[tuple[float, str, float], ...] = ()
    # How owners place co-allocated jobs (arrivals with ``components``): KOALA's policy and
    # placement queue, and the brokers' claim timeout and rounds. Ordinary jobs never meet it.
    coallocation: CoAllocation = field(default_factory=CoAllocation)
    # Seconds a site holding a component's cores waits before it asks its owner again, when
    # told to wait for the component's mates (the daemon's 0.5 s).
    claim_poll: float = 0.5

    def __post_init__(self) -> None:
        for k, (at, _site, speed) in enumerate(self.speed_changes):
            if not 0 <= at < math.inf:
                raise InvalidInput(f"speed_changes[{k}].time", "seconds >= 0", at)
            if not 0 < speed < math.inf:
                raise InvalidInput(f"speed_changes[{k}].speed", "a relative speed > 0", speed)
        if not self.dcsmon_period >= 0:
            raise InvalidInput("dcsmon_period", "seconds >= 0", self.dcsmon_period)
        if not self.netmon_period >= 0:
            raise InvalidInput("netmon_period", "seconds >= 0 (0: no probes)", self.netmon_period)
        if any(size <= 0 for size in self.netmon_sizes):
            raise InvalidInput("netmon_sizes", "test sizes in bytes > 0", self.netmon_sizes)
        if not 0 < self.claim_poll < math.inf:
            raise InvalidInput("claim_poll", "seconds > 0", self.claim_poll)


@dataclass(slots=True)
class JobRecord:
    arrival: float
    entry: str
    rank: int
    run_time: float  # actual, on ``rank`` cores at speed 1: simulation truth
    start: float = math.nan
    end: float = math.nan
    site: str = ""
    cores: int = 0
    starts: int = 0
    # A malleable job while it runs: the fraction of its work done by ``since``, from which it
    # runs on ``cores`` (after a reconfiguration pause until ``resumes``); ``version`` counts
    # its rescheduled ends. ``resizes``: how many times it changed size; ``used``: the
    # core-seconds it held before its latest size.
    done: float = 0.0
    since: float = 0.0
    resumes: float = 0.0
    version: int = 0
    resizes: int = 0
    used: float = 0.0
    current: int = 0
    rate: float = 0.0  # its effective cores while it runs (SD-Policy: not always ``current``)
    speedup: SpeedupModel | None = None  # its run time on n cores, if not linear
    rejected: str = ""  # why no site of its entry's neighbourhood took it (it never ran)
    # Cancelled by its user (GridSimulation.cancel): out of the figures from then on; killed:
    # its processes were stopped at its site, so the end it had on the agenda is void.
    cancelled: bool = False
    killed: bool = False
    # Running-job migration: its image's bytes, whether it is frozen on its way to another
    # site, how often and when it last moved, and the seconds it stood still moving.
    image_size: int = 0
    frozen: bool = False
    migrations: int = 0
    last_moved: float | None = None
    downtime: float = 0.0
    # A co-allocated job: its components' (site, cores) once placed, its placement tries, and
    # why it failed (KOALA's threshold of tries, or its claims' rounds; it never ran).
    placement: tuple[tuple[str, int], ...] = ()
    tries: int = 0
    failed: str = ""

    def time_on(self, cores: float, speed: float) -> float:
        """Seconds its whole work takes on ``cores`` (effective) cores of a site of ``speed``."""
        if self.speedup is not None:
            return self.speedup.run_time(max(1, round(cores))) / speed
        return self.run_time * self.rank / cores / speed

    def core_seconds(self) -> float:
        """Cores times seconds it held them, over every size it had."""
        if not self.resizes:
            return (self.end - self.start) * self.cores
        return self.used + (self.end - self.since) * self.current


@dataclass(frozen=True, slots=True)
class GridSummary:
    """The paper's B, T, W and the rest of ARCHITECTURE §8 for one run."""

    jobs: int
    throughput: float
    mean_service_time: float
    mean_wait: float
    mean_bounded_slowdown: float
    utilization: float
    makespan: float
    file_bytes: int
    probe_bytes: int
    messages: int
    dispatches: int
    withdrawals: int
    claims_denied: int
    decision_time_mean: float
    decision_time_p99: float
    resizes: int = 0  # changes of size of malleable jobs
    rejected: int = 0  # jobs no site of their entry's neighbourhood could run
    migrations: int = 0  # running jobs moved by checkpoint (GridConfig.migration)
    image_bytes: int = 0  # the bytes of their images
    migration_downtime: float = 0.0  # core-seconds moved jobs stood still: work lost to moving
    work_moved: float = 0.0  # core-seconds (at nominal speed) of remaining work that moved
    coallocated: int = 0  # co-allocated jobs that ran (their components together)
    coalloc_failed: int = 0  # co-allocated jobs failed: tries past the threshold, or rounds
    placement_tries: float = 0.0  # mean placement tries of a co-allocated job (failed too)
    coalloc_sites: float = 0.0  # mean sites a co-allocated job that ran spanned
    claim_timeouts: int = 0  # rounds of components' claims that timed out (they requeued)
    rounds_out: int = 0  # of the failed co-allocated jobs, those failed by their rounds


@dataclass(slots=True)
class GridResult:
    records: dict[str, JobRecord]
    summary: GridSummary
    decision_times: list[float]


@dataclass(slots=True)
class _CoJob:
    """A co-allocated job of ``owner``: once placed, its components' sites (in rank order)
    and how many of them have started."""

    job: Job
    owner: str
    sites: tuple[str, ...] = ()
    started: int = 0


class _Published:
    """One site's DCSMon publications: the latest and the one before (what a neighbour sees
    until the latest reaches it)."""

    __slots__ = ("latest", "previous")

    def __init__(self, latest: Observation) -> None:
        self.previous: Observation | None = None
        self.latest = latest


class _BoardView:
    """What one broker sees: its own site exactly, others as DCSMon last delivered them.

    A decision reads the view of every site of its neighbourhood; at thousands of sites that data
    is mostly out of the CPU caches by then, and each object read costs a cache miss. So, like a
    real broker's view, each view keeps its neighbours' latest and previous publications in
    small tables of its own (DCSMon writes them there when it publishes), and their publication
    delay as one number when it is the same for all (the usual case: one default link). A read
    touches that table and the observation, and no table or record of the whole grid.
    """

    __slots__ = ("delay", "delays", "latest", "local", "owner", "previous", "sim")

    def __init__(self, sim: GridSimulation, owner: str, neighbourhood: Sequence[str]) -> None:
        self.sim = sim
        self.owner = owner
        self.local = sim.sites[owner].local
        self.latest = {nb: sim.board[nb].latest for nb in neighbourhood}
        self.previous = {nb: sim.board[nb].previous for nb in neighbourhood}
        self.delays = {nb: sim.latency(nb, owner) for nb in neighbourhood}
        uniform = set(self.delays.values())
        self.delay = uniform.pop() if len(uniform) == 1 else None

    def get(self, site: str, /) -> Observation | None:
        latest = self.latest.get(site)
        if latest is None:
            if site == self.owner:
                return Observation(self.local.state(), self.sim.kernel.now)
            published = self.sim.board.get(site)
            if published is None:
                return None
            latest = published.latest
            if latest.observed_at + self.sim.latency(site, self.owner) <= self.sim.kernel.now:
                return latest
            return published.previous
        delay = self.delays[site] if self.delay is None else self.delay
        if latest.observed_at + delay <= self.sim.kernel.now:
            return latest
        return self.previous[site]


class GridSimulation:
    """One run of a workload over a topology with one dispatch policy. Build, then :meth:`run`."""

    def __init__(self, topology: Topology, config: GridConfig | None = None, seed: int = 0) -> None:
        self.topology = topology
        self.config = config or GridConfig()
        self.kernel = Kernel()
        self.rng = random.Random(seed)
        policy = self.config.policy
        self.sites = {
            name: SiteAgent(
                name,
                spec.cores,
                self.config.queue_policy,
                malleability=self.config.malleability,
                sd_policy=self.config.sd_policy,
            )
            for name, spec in topology.sites.items()
        }
        self.speed = {name: spec.speed for name, spec in topology.sites.items()}
        for k, (_, site, _speed) in enumerate(self.config.speed_changes):
            if site not in topology.sites:
                raise InvalidInput(f"speed_changes[{k}].site", "a site of the topology", site)
        self.forecaster = make_forecaster(self.config.forecaster, topology.default_link.bandwidth)
        self.network = FlowNetwork(self.kernel, self._route, self._capacity)
        self._latency: dict[tuple[str, str], float] = {}
        # Publications share equal states and the instant they were made: a decision then reads
        # objects that every decision reads, likely still in the CPU caches, not one per site.
        self._states: dict[SiteState, SiteState] = {}
        self._published_at = 0.0
        self._observations: dict[SiteState, Observation] = {}  # published at _published_at
        self.board = {
            name: _Published(Observation(self._shared(agent.state()), self._published_at))
            for name, agent in self.sites.items()
        }
        self.brokers: dict[str, Broker] = {}
        # Brokers call the bound method: a plain call, not the instance's __call__ looked up anew.
        forecast = self.forecaster.forecast
        properties = topology.properties()  # what jobs' requirements are matched against
        coallocation = self.config.coallocation

        def broker(site: str, neighbourhood: Sequence[str]) -> Broker:
            return Broker(
                site,
                neighbourhood,
                policy,
                forecast,
                self.rng,
                properties=properties,
                coalloc_timeout=coallocation.timeout,
                coalloc_rounds=coallocation.rounds,
            )

        if policy.centralized:
            central = self.config.central_site or next(iter(topology.data.values()), None)
            central = central or next(iter(topology.sites))
            if central not in topology.sites:
                raise InvalidInput("central_site", "a site of the topology", central)
            self.central: str | None = central
            self.brokers[central] = broker(central, [s for s in topology.sites if s != central])
        else:
            self.central = None
            for name in topology.sites:
                self.brokers[name] = broker(name, topology.neighbours(name))
        self.views = {
            name: _BoardView(self, name, broker.neighbourhood)
            for name, broker in self.brokers.items()
        }
        # Where DCSMon delivers each site's publications: the views that hold it.
        self._watchers: dict[str, list[_BoardView]] = {name: [] for name in self.sites}
        for view in self.views.values():
            for nb in view.latest:
                self._watchers[nb].append(view)

        self.records: dict[str, JobRecord] = {}
        self.decision_times: list[float] = []
        self._dirty: set[str] = set()
        self._pass_pending = False
        self._publish_pending: set[str] = set()
        self._ticking: set[str] = set()
        self._feed: Iterator[Arrival] | None = None
        self._in_system = 0  # arrived, not yet finished
        self._awaiting = False  # an arrival is on the agenda
        self.file_bytes = 0
        self.messages = 0
        self.dispatches = 0
        self.withdrawals = 0
        self.claims_denied = 0
        self.sites_excluded = 0  # black holes (none without a health policy, which it never sets)
        self.migrations = 0
        self.image_bytes = 0
        self.work_moved = 0.0
        self._progress: Callable[[int], None] | None = None
        self._finished = 0
        # Co-allocated jobs: each owner's placement queue, the jobs, and which job each
        # component (a job of its owner's broker) belongs to.
        self._placement_queues: dict[str, PlacementQueue] = {}
        self._co_jobs: dict[str, _CoJob] = {}
        self._parts: dict[str, str] = {}  # component id -> its co-allocated job's id
        self._co_scanning: set[str] = set()  # owners with a scan of their queue on the agenda
        self._kills: set[str] = set()  # killed while granted, before they launched
        self.claim_timeouts = 0
        self.rounds_out = 0  # co-allocated jobs failed by their claims' rounds

    def cancel(self, job_id: str, at: float) -> None:
        """Its user cancels job ``job_id`` at time ``at`` (the daemon's ``gbroker cancel``), which
        must be at or after its arrival. Call before :meth:`run`. Not for a co-allocated job,
        nor in a run with running-job migration."""
        if self.config.migration is not None:
            raise InvalidInput("cancel", "a run without running-job migration", job_id)
        if not at >= 0:
            raise InvalidInput("cancel.at", "a time >= 0", at)
        self.kernel.at(at, self._cancel, job_id, priority=3)  # after an arrival at that instant

    # -- wiring ----------------------------------------------------------------------------------

    def latency(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        key = (a, b)
        value = self._latency.get(key)
        if value is None:
            value = self._latency[key] = self.topology.link(a, b).latency
        return value

    def _route(self, a: str, b: str) -> tuple[tuple[Resource, ...], float]:
        resources: tuple[Resource, ...] = (("up", a), ("down", b))
        if (a, b) in self.topology.links:
            resources += (("link", a, b),)
        return resources, self.latency(a, b)

    def _capacity(self, resource: Resource) -> float:
        kind, *where = resource
        if kind == "up":
            return self.topology.uplink(where[0])
        if kind == "down":
            return self.topology.downlink(where[0])
        return self.topology.links[(where[0], where[1])].bandwidth

    def _send(self, src: str, dst: str, action: Callable[[P], None], payload: P) -> None:
        if src != dst:
            self.messages += 1
        self.kernel.after(self.latency(src, dst), action, payload)

    # -- the run ---------------------------------------------------------------------------------

    def run(
        self, arrivals: Iterable[Arrival], progress: Callable[[int], None] | None = None
    ) -> GridResult:
        """Serve the workload to the end. A list is taken in time order (stable); any other
        iterable must already be in time order, and is read one arrival ahead, so that a
        workload of millions of jobs never sits in memory (or cold in cache) all at once.
        """
        if self._feed is not None:
            raise InternalError("a GridSimulation runs once")
        self._progress = progress
        if isinstance(arrivals, Sequence):
            arrivals = sorted(arrivals, key=lambda a: a.time)
        self._feed = iter(arrivals)
        first = next(self._feed, None)
        if first is not None:
            self._admit(first)
            if self.config.netmon_period > 0:
                for site in self.topology.sites:
                    offset = self.rng.random() * self.config.netmon_period
                    self.kernel.at(offset, self._probe_cycle, site)
            for at, site, speed in self.config.speed_changes:
                self.kernel.at(at, self._speed_changed, (site, speed))
            if self.config.migration is not None:
                self.kernel.at(self.config.migration.interval, self._migration_check, None)
        # The records live for the whole run, and the run makes few reference cycles (NetMon's
        # probe closures): the cycle collector would only rescan a large, live heap again and
        # again. It is off while the kernel runs and catches up at the end.
        was_enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            self.kernel.run()
        finally:
            gc.unfreeze()
            if was_enabled:
                gc.enable()
        if self._active:
            raise InternalError(f"{self._in_system} jobs never finished")
        return GridResult(self.records, self._summary(), self.decision_times)

    @property
    def _active(self) -> bool:
        """Jobs are still in the system or still to come."""
        return self._in_system > 0 or self._awaiting

    def _admit(self, arrival: Arrival) -> None:
        """Put the next arrival on the agenda."""
        job = arrival.job
        if arrival.entry not in self.sites:
            raise InvalidInput(f"arrival[{job.id}].entry", "a site of the topology", arrival.entry)
        if job.id in self.records:
            raise InvalidInput("arrival.job.id", "unique job ids", job.id)
        if arrival.time < self.kernel.now:
            raise InvalidInput(f"arrival[{job.id}].time", "arrivals in time order", arrival.time)
        if arrival.components and sum(arrival.components) != job.rank:
            raise InvalidInput(
                f"arrival[{job.id}].components",
                f"cores summing to the job's rank ({job.rank})",
                arrival.components,
            )
        self.records[job.id] = JobRecord(
            arrival.time,
            arrival.entry,
            job.rank,
            arrival.run_time,
            speedup=arrival.speedup,
            image_size=arrival.image_size,
        )
        self.kernel.at(arrival.time, self._arrive, arrival, priority=1)
        self._awaiting = True

    def _arrive(self, arrival: Arrival) -> None:
        assert self._feed is not None
        self._in_system += 1
        upcoming = next(self._feed, None)
        self._awaiting = False
        if upcoming is not None:
            self._admit(upcoming)
        owner = self.central or arrival.entry
        if arrival.components:
            self._co_submit(owner, arrival)
            return
        try:
            self._to_broker((owner, JobSubmitted(arrival.job)))
        except InvalidInput as exc:  # no site fits it: a daemon would answer 400
            self.records[arrival.job.id].rejected = str(exc)[:300]
            self._in_system -= 1

    # -- brokers ---------------------------------------------------------------------------------

    def _to_broker(self, payload: tuple[str, BrokerEvent]) -> None:
        owner, event = payload
        broker = self.brokers[owner]
        if type(event) is ClaimRequested and event.job_id in self._parts:
            self._component_claim(owner, broker, event)
            return
        began = time.perf_counter()
        commands = broker.handle(event, self.kernel.now, self.views[owner])
        if isinstance(event, JobSubmitted) and event.job.gang is None:  # a component is placed
            self.decision_times.append(time.perf_counter() - began)
        self._carry_out(owner, commands)
        if broker.policy.periodic and owner not in self._ticking and broker.needs_tick:
            self._ticking.add(owner)
            self.kernel.at(broker.next_tick(self.kernel.now), self._tick, owner)

    def _cancel(self, job_id: str) -> None:
        """The user's cancel at the owner (the daemon's ``Driver.cancel``): the job leaves the
        figures at once; its broker withdraws it where it waits and kills it where it runs."""
        record = self.records.get(job_id)
        if record is None or record.arrival > self.kernel.now:
            raise InvalidInput("cancel", "a job of the workload, after its arrival", job_id)
        if job_id in self._co_jobs:
            raise InvalidInput("cancel", "a job that is not co-allocated", job_id)
        if record.rejected or record.failed or record.cancelled or not math.isnan(record.end):
            return  # it has ended
        record.cancelled = True
        self._in_system -= 1
        self._finished += 1
        self._to_broker((self.central or record.entry, CancelRequested(job_id)))

    def _tick(self, owner: str) -> None:
        self._ticking.discard(owner)
        if self._active:
            self._to_broker((owner, Tick()))

    def _report(self, site: str, owner: str, event: BrokerEvent) -> None:
        self._send(site, owner, self._to_broker, (owner, event))

    def _carry_out(self, owner: str, commands: list[BrokerCommand]) -> None:
        for command in commands:
            match command:
                case Dispatch(job, site, replica, deferred):
                    self.dispatches += 1
                    self._send(owner, site, self._stage, (job, site, owner, replica, deferred))
                case Withdraw(job_id, site):
                    self._send(owner, site, self._withdraw, (job_id, site, owner))
                case ClaimAnswer(job_id, site, granted, wait, requeue):
                    if wait:  # the site holds the cores and asks again after a poll
                        if owner != site:
                            self.messages += 1
                        due = self.latency(owner, site) + self.config.claim_poll
                        self.kernel.after(due, self._claim_again, (job_id, site, owner))
                        continue
                    if not granted:
                        self.claims_denied += 1
                    payload = (job_id, site, granted, requeue)
                    self._send(owner, site, self._claim_answered, payload)
                case Abandon(job_id, reason):
                    if job_id in self._parts:
                        if self._co_failed(self._parts[job_id], reason):
                            self.rounds_out += 1
                    elif job_id in self.records:  # a job of its own, not a component
                        raise InternalError(
                            f"job {job_id} abandoned ({reason}): only a lost site or a refused "
                            "dispatch abandons a job, and no simulated site is lost or refuses"
                        )
                    # Else a component of a co-allocated job that failed already: each of its
                    # components is abandoned, and the first one failed the job.
                case GangGranted():
                    pass  # nothing to make durable in virtual time: each grant is a ClaimAnswer
                case Kill(job_id, site):
                    self._send(owner, site, self._kill, (job_id, site, owner))
                case SiteExcluded():
                    self.sites_excluded += 1  # the daemon logs and counts it
                case _:
                    assert_never(command)

    # -- sites -----------------------------------------------------------------------------------

    def _stage(self, payload: tuple[Job, str, str, bool, bool]) -> None:
        job, site, owner, replica, deferred = payload
        if not self.sites[site].stage(job.id):
            return  # a repeated dispatch
        if deferred:  # its files come once its claim is granted (_fetch)
            self._staged(job, site, owner, replica, deferred)
            return
        self._move_inputs(job, site, lambda: self._staged(job, site, owner, replica))

    def _move_inputs(self, job: Job, site: str, then: Callable[[], None]) -> None:
        """Move ``job``'s input files that are not at ``site`` there; ``then`` once all are."""
        remote = [f for f in job.input_files if f.site != site]
        if not remote:
            then()
            return
        left = [len(remote)]

        def arrived(_: Transfer) -> None:
            left[0] -= 1
            if left[0] == 0:
                then()

        for f in remote:
            self.file_bytes += f.size
            self.network.send(f.site, site, f.size, arrived)

    def _staged(
        self, job: Job, site: str, owner: str, replica: bool, deferred: bool = False
    ) -> None:
        agent = self.sites[site]
        if agent.staged(job, owner, replica, deferred=deferred):  # unless withdrawn meanwhile
            self._changed(site)
            self._report(site, owner, JobQueued(job.id, site))

    def _fetch(self, site: str, fetch: Fetch) -> None:
        """A granted deferred job: its files come while its cores wait; then it starts."""

        def fetched() -> None:
            launch = self.sites[site].fetched(fetch.job.id)
            if launch is not None:
                self._launch(site, launch)

        self._move_inputs(fetch.job, site, fetched)

    def _withdraw(self, payload: tuple[str, str, str]) -> None:
        job_id, site, owner = payload
        agent = self.sites[site]
        was_queued = job_id in agent.hosted
        withdrawn = agent.withdraw(job_id)
        if withdrawn:
            self.withdrawals += 1
            if was_queued:  # a staging job leaves no trace in the queue
                self._changed(site)
        self._report(site, owner, WithdrawAnswered(job_id, site, withdrawn))

    def _kill(self, payload: tuple[str, str, str]) -> None:
        """The owner cancelled a job granted here (the daemon's ``/peer/v1/kill``): a running job
        stops now and its end is reported, failed, as any end; one granted but not launched yet
        (its grant, or its files, on the way) stops as it launches."""
        job_id, site, owner = payload
        hosted = self.sites[site].hosted.get(job_id)
        if hosted is None:
            return  # it ended meanwhile
        if hosted.phase is not Phase.RUNNING:
            self._kills.add(job_id)
            return
        record = self.records[job_id]
        record.killed = True
        record.version += 1  # a resizable job's end on the agenda is void too
        record.end = self.kernel.now
        self._stopped(site, job_id, owner)

    def _stopped(self, site: str, job_id: str, owner: str) -> None:
        """A killed job's processes are gone: its cores are free, its owner hears it failed."""
        self.sites[site].finished(job_id)
        self._changed(site)
        self._report(site, owner, JobFinished(job_id, site, ok=False))

    def _claim_answered(self, payload: tuple[str, str, bool, bool]) -> None:
        job_id, site, granted, requeue = payload
        launch = self.sites[site].claim_answered(job_id, granted, requeue)
        if isinstance(launch, Fetch):
            self._fetch(site, launch)
        elif launch is not None:
            self._launch(site, launch)
        else:
            self._changed(site)

    def _claim_again(self, payload: tuple[str, str, str]) -> None:
        """A component's owner said wait: its site asks again if it still holds the cores."""
        job_id, site, owner = payload
        hosted = self.sites[site].hosted.get(job_id)
        if hosted is not None and hosted.phase is Phase.CLAIMING:
            self._report(site, owner, ClaimRequested(job_id, site))

    def _changed(self, site: str) -> None:
        """A site's queue or cores changed: schedule it at the instant's end; publish later."""
        self._dirty.add(site)
        if not self._pass_pending:
            self._pass_pending = True
            self.kernel.defer(self._passes)
        self._publish_later(site)

    def _publish_later(self, site: str) -> None:
        """DCSMon publishes the site's state at the next period boundary (now, with period 0)."""
        if site not in self._publish_pending:
            self._publish_pending.add(site)
            period = self.config.dcsmon_period
            now = self.kernel.now
            at = (math.floor(now / period) + 1) * period if period > 0 else now
            self.kernel.at(at, self._publish, site, priority=2)

    def _passes(self) -> None:
        self._pass_pending = False
        dirty = sorted(self._dirty)
        self._dirty.clear()
        for site in dirty:
            commands = self.sites[site].schedule(self.kernel.now)
            if commands:
                self._publish_later(site)  # its free cores changed
            for command in commands:
                match command:
                    case Launch():
                        self._launch(site, command)
                    case Claim():
                        self._report(site, command.owner, ClaimRequested(command.job_id, site))
                    case Resized():
                        self._resized(site, command)
                    case _:
                        assert_never(command)

    def _launch(self, site: str, launch: Launch) -> None:
        job = launch.job
        if job.gang is not None:
            self._component_launched(site, launch)
            return
        if self._kills and job.id in self._kills:  # killed while its grant or files came
            self._kills.discard(job.id)
            self.records[job.id].killed = True
            self._stopped(site, job.id, launch.owner)
            return
        record = self.records[job.id]
        record.starts += 1
        now = self.kernel.now
        if record.starts == 1:
            record.start = now
            record.site = site
            record.cores = launch.cores
        run = record.time_on(launch.effective_cores, self.speed[site])
        # The record rides along with the completion: no second look-up in a table of every job.
        config = self.config
        if (
            job.malleability is None
            and config.malleability is None
            and config.sd_policy is None
            and config.migration is None
            and not config.speed_changes
        ):
            self.kernel.after(run, self._job_done, (site, job.id, launch.owner, record))
        else:
            record.done, record.since, record.resumes = 0.0, now, now
            record.current, record.rate = launch.cores, launch.effective_cores
            self.kernel.after(run, self._malleable_done, (site, job.id, launch.owner, record, 0))
        self._report(site, launch.owner, JobStarted(job.id, site))

    def _resized(self, site: str, resized: Resized) -> None:
        """Carry a running job's remaining work over to its new size (linear in its cores,
        after its reconfiguration cost) and reschedule its end."""
        record = self.records[resized.job_id]
        hosted = self.sites[site].hosted[resized.job_id]
        now = self.kernel.now
        speed = self.speed[site]
        if now > record.resumes:  # the fraction of its work done on the old size
            ran = now - max(record.since, record.resumes)
            record.done += ran / record.time_on(record.rate, speed)
        record.done = min(record.done, 1.0)
        cost = hosted.job.malleability.reconfiguration_cost if hosted.job.malleability else 0.0
        record.used += (now - record.since) * resized.old
        record.current, record.rate = resized.cores, resized.effective_cores
        record.since, record.resumes = now, now + cost
        record.version += 1
        record.resizes += 1
        left = (1.0 - record.done) * record.time_on(record.rate, speed)
        payload = (site, resized.job_id, resized.owner, record, record.version)
        self.kernel.at(record.resumes + left, self._malleable_done, payload)

    def _malleable_done(self, payload: tuple[str, str, str, JobRecord, int]) -> None:
        site, job_id, owner, record, version = payload
        if version == record.version:  # else it was resized since: a later end is scheduled
            self._job_done((site, job_id, owner, record))

    def _job_done(self, payload: tuple[str, str, str, JobRecord]) -> None:
        site, job_id, owner, record = payload
        if record.killed:
            return  # its processes were stopped before this end (_kill)
        self.sites[site].finished(job_id)
        if math.isnan(record.end):
            record.end = self.kernel.now
        self._changed(site)
        self._report(site, owner, JobFinished(job_id, site))
        if record.cancelled:
            return  # it left the figures when it was cancelled (it ran on: it had started)
        self._in_system -= 1
        self._finished += 1
        if self._progress is not None and (self._finished % 1024 == 0 or not self._active):
            self._progress(self._finished)

    def _publish(self, site: str) -> None:
        self._publish_pending.discard(site)
        published = self.board[site]
        state = self.sites[site].state()
        if state != published.latest.state:
            now = self.kernel.now
            if now != self._published_at:
                self._published_at = now
                self._observations.clear()
            observation = self._observations.get(state)
            if observation is None:
                observation = Observation(self._shared(state), self._published_at)
                self._observations[state] = observation
            previous = published.previous = published.latest
            published.latest = observation
            for view in self._watchers[site]:
                view.previous[site] = previous
                view.latest[site] = observation

    def _shared(self, state: SiteState) -> SiteState:
        return self._states.setdefault(state, state)

    # -- background load and running-job migration ---------------------------------------------

    def _carry_over(self, record: JobRecord, speed: float) -> None:
        """Add the work a running job did since ``since`` at ``speed`` to ``done``; from now."""
        now = self.kernel.now
        if now > record.resumes:
            ran = now - max(record.since, record.resumes)
            record.done += ran / record.time_on(record.rate, speed)
        record.done = min(record.done, 1.0)
        record.used += (now - record.since) * record.current
        record.since = now

    def _reschedule(self, site: str, job_id: str, owner: str, record: JobRecord) -> None:
        """Put the job's end on the agenda at ``site``'s speed now (voiding the older end)."""
        record.version += 1
        left = (1.0 - record.done) * record.time_on(record.rate, self.speed[site])
        start = max(record.resumes, self.kernel.now)
        payload = (site, job_id, owner, record, record.version)
        self.kernel.at(start + left, self._malleable_done, payload)

    def _running_here(self, site: str) -> Iterator[tuple[str, str, JobRecord]]:
        """(job id, owner, record) of the jobs running at ``site`` and not frozen to move."""
        for job_id, hosted in self.sites[site].hosted.items():
            if hosted.job.gang is not None:  # co-allocated: its run time is set at its start
                continue
            record = self.records[job_id]
            if hosted.phase is Phase.RUNNING and not record.frozen:
                yield job_id, hosted.owner, record

    def _speed_changed(self, payload: tuple[str, float]) -> None:
        site, speed = payload
        running = list(self._running_here(site))
        for _, _, record in running:
            self._carry_over(record, self.speed[site])
        self.speed[site] = speed
        for job_id, owner, record in running:
            self._reschedule(site, job_id, owner, record)

    def _migration_check(self, _: None) -> None:
        """Dynamite's decider over every site, every interval S, while jobs are in the system."""
        policy = self.config.migration
        if policy is None or not self._active:
            return
        now = self.kernel.now
        loads = [
            SiteLoad(name, agent.state(), self.speed[name]) for name, agent in self.sites.items()
        ]
        running = []
        for name in self.sites:
            speed = self.speed[name]
            for job_id, _owner, record in self._running_here(name):
                estimate = self._remaining_estimate(name, job_id, record, speed)
                if estimate is None:
                    continue
                running.append(
                    RunningJob(
                        job_id,
                        name,
                        record.current,
                        record.start,
                        estimate,
                        record.image_size,
                        record.last_moved,
                    )
                )
        for move in decide_migrations(policy, loads, running, self.forecaster.forecast, now):
            self._freeze(move, policy)
        self.kernel.after(policy.interval, self._migration_check, None)

    def _remaining_estimate(
        self, site: str, job_id: str, record: JobRecord, speed: float
    ) -> float | None:
        """What a site would estimate: the job's requested time less the work it did, at its
        size and the site's speed now (None when it requested no time)."""
        requested = self.sites[site].hosted[job_id].job.requested_time
        if requested is None or record.run_time <= 0:
            return None
        done = record.done
        now = self.kernel.now
        if now > record.resumes:
            done += (now - max(record.since, record.resumes)) / record.time_on(record.rate, speed)
        nominal = record.time_on(record.rate, 1.0)  # its true run time at its size, speed 1
        return max(0.0, requested / record.run_time - done) * nominal / speed

    def _freeze(self, move: Move, policy: MigrationPolicy) -> None:
        """Freeze the job and take its cores at the target; dump its image at the source."""
        source, target = self.sites[move.source], self.sites[move.target]
        hosted = source.hosted[move.job_id]
        record = self.records[move.job_id]
        now = self.kernel.now
        self._carry_over(record, self.speed[move.source])
        record.version += 1  # its end at the source is void
        record.frozen = True
        record.migrations += 1
        record.last_moved = now
        self.migrations += 1
        self.work_moved += (1.0 - record.done) * record.time_on(record.rate, 1.0) * record.rate
        target.resume_running(hosted.job, hosted.owner, hosted.cores, now)
        self._changed(move.target)
        dump = record.image_size / policy.checkpoint_rate
        self.kernel.after(dump, self._dumped, (move, hosted.owner, record, now, policy))

    def _dumped(self, payload: tuple[Move, str, JobRecord, float, MigrationPolicy]) -> None:
        move, owner, record, frozen_at, policy = payload
        self.sites[move.source].finished(move.job_id)
        self._changed(move.source)
        self.image_bytes += record.image_size

        def arrived(_: Transfer) -> None:
            restore = record.image_size / policy.restore_rate
            self.kernel.after(restore, self._restored, (move, owner, record, frozen_at))

        self.network.send(move.source, move.target, record.image_size, arrived)

    def _restored(self, payload: tuple[Move, str, JobRecord, float]) -> None:
        move, owner, record, frozen_at = payload
        now = self.kernel.now
        record.frozen = False
        record.site = move.target
        record.downtime += now - frozen_at
        record.used += (now - record.since) * record.current
        record.since = record.resumes = now
        self._reschedule(move.target, move.job_id, owner, record)

    # -- NetMon ----------------------------------------------------------------------------------

    def _probe_cycle(self, site: str) -> None:
        if not self._active:
            return
        plan = [
            (nb, size) for nb in self.topology.neighbours(site) for size in self.config.netmon_sizes
        ]
        cycle_start = self.kernel.now

        def probe(k: int) -> None:
            if k == len(plan) or not self._active:
                nxt = cycle_start + self.config.netmon_period
                self.kernel.at(max(nxt, self.kernel.now), self._probe_cycle, site)
                return
            target, size = plan[k]

            def measured(t: Transfer) -> None:
                assert t.finished_at is not None
                self.forecaster.observe(site, target, size, t.finished_at - t.started_at)
                probe(k + 1)

            self.network.send(site, target, size, measured)

        probe(0)

    # -- co-allocated jobs (KOALA) -----------------------------------------------------------

    def _co_submit(self, owner: str, arrival: Arrival) -> None:
        job = arrival.job
        record = self.records[job.id]
        broker = self.brokers[owner]
        # A job that could never fit the owner's sites, empty, would wait forever: refused, as
        # an ordinary job that no site fits.
        sizes = sorted(
            (self.topology.sites[s].cores for s in (owner, *broker.neighbourhood)),
            reverse=True,
        )
        need = sorted(arrival.components, reverse=True)
        fits = (
            sum(sizes) >= job.rank
            if arrival.flexible and self.config.coallocation.policy is CoPolicy.FCM
            else bool(sizes) and need[0] <= sizes[0]
        )
        if not fits:
            record.rejected = (
                f"arrival[{job.id}].components: {list(arrival.components)} cannot fit the"
                f" sites of {owner}'s neighbourhood, even empty"
            )
            self._in_system -= 1
            return
        self._co_jobs[job.id] = _CoJob(job, owner)
        queue = self._placement_queues.get(owner)
        if queue is None:
            queue = self._placement_queues[owner] = PlacementQueue(self.config.coallocation)
        offers = broker.offers(job, self.views[owner])
        placed = queue.submit(job.id, arrival.components, offers, flexible=arrival.flexible)
        self._co_placed(owner, [] if placed is None else [placed])

    def _co_scan(self, owner: str) -> None:
        """KOALA's periodic scan of the placement queue, head to tail."""
        self._co_scanning.discard(owner)
        broker, view = self.brokers[owner], self.views[owner]
        placed = self._placement_queues[owner].scan(
            lambda job_id: broker.offers(self._co_jobs[job_id].job, view)
        )
        self._co_placed(owner, placed)

    def _co_placed(self, owner: str, placed: list[Placement]) -> None:
        """Submit each placed job's components to the owner's broker (as the daemon does); a
        job past the threshold of tries fails. Scan the queue again in an interval."""
        for outcome in placed:
            record = self.records[outcome.job_id]
            record.tries = outcome.tries
            if isinstance(outcome, PlacementFailed):
                self._co_failed(outcome.job_id, f"no placement in {outcome.tries} tries")
                continue
            assert isinstance(outcome, Placed)
            co = self._co_jobs[outcome.job_id]
            co.sites = tuple(site for site, _ in outcome.placement)
            record.placement = outcome.placement
            size = len(outcome.placement)
            for k, (site, cores) in enumerate(outcome.placement):
                # The job's input files go once to each of its sites, with the first
                # component placed there.
                files = co.job.input_files if site not in co.sites[:k] else ()
                part = Job(
                    element_id(co.job.id, k + 1),
                    cores,
                    co.job.requested_time,
                    input_files=files,
                    gang=Gang(co.job.id, size, k, site),
                )
                self._parts[part.id] = co.job.id
                self._to_broker((owner, JobSubmitted(part)))
        if self._placement_queues[owner] and owner not in self._co_scanning:
            self._co_scanning.add(owner)
            self.kernel.after(self.config.coallocation.interval, self._co_scan, owner)

    def _component_claim(self, owner: str, broker: Broker, event: ClaimRequested) -> None:
        """A component's claim, answered by the owner's broker; counts the rounds that time
        out (the last one of a job that fails too)."""
        gang = self._parts[event.job_id]
        rounds = broker.gang_rounds(gang)
        commands = broker.handle(event, self.kernel.now, self.views[owner])
        if broker.gang_rounds(gang) > rounds or any(isinstance(c, Abandon) for c in commands):
            self.claim_timeouts += 1
        self._carry_out(owner, commands)

    def _co_failed(self, job_id: str, reason: str) -> bool:
        """The job never runs: its tries passed the threshold, or its claims' rounds did (its
        broker withdraws its components, and denies those holding cores when they ask again).
        False if it had failed already (each of its components is abandoned)."""
        co = self._co_jobs.pop(job_id, None)
        if co is None:
            return False
        self.records[job_id].failed = reason
        for k in range(len(co.sites)):
            self._parts.pop(element_id(job_id, k + 1), None)
        self._in_system -= 1
        self._finished += 1  # it is done with, for progress
        return True

    def _component_launched(self, site: str, launch: Launch) -> None:
        """A granted component started. Once all have, the job runs: its run time is the same at
        every component, at the slowest of their sites' speeds, and they end together."""
        gang = launch.job.gang
        assert gang is not None
        self._report(site, launch.owner, JobStarted(launch.job.id, site))
        co = self._co_jobs[gang.id]
        co.started += 1
        if co.started < gang.size:
            return
        record = self.records[gang.id]
        now = self.kernel.now
        record.start = now
        record.starts += 1
        record.cores = record.rank
        record.site = "+".join(dict.fromkeys(co.sites))
        speed = min(self.speed[s] for s in co.sites)
        self.kernel.after(record.run_time / speed, self._co_done, gang.id)

    def _co_done(self, job_id: str) -> None:
        co = self._co_jobs.pop(job_id)
        for k, site in enumerate(co.sites):
            component_id = element_id(job_id, k + 1)
            del self._parts[component_id]
            self.sites[site].finished(component_id)
            self._changed(site)
            self._report(site, co.owner, JobFinished(component_id, site))
        self.records[job_id].end = self.kernel.now
        self._in_system -= 1
        self._finished += 1
        if self._progress is not None and (self._finished % 1024 == 0 or not self._active):
            self._progress(self._finished)

    # -- results ---------------------------------------------------------------------------------

    def _summary(self) -> GridSummary:
        recs = [r for r in self.records.values() if not r.rejected and not r.failed]
        failed = sum(1 for r in self.records.values() if r.failed)
        rejected = len(self.records) - len(recs) - failed
        recs = [r for r in recs if not r.cancelled]
        co = [r for r in self.records.values() if r.tries]
        spanned = [len({site for site, _ in r.placement}) for r in recs if r.placement]
        m = len(recs)
        times = sorted(self.decision_times)
        blank = GridSummary(
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            rejected=rejected,
            coallocated=len(spanned),
            coalloc_failed=failed,
            placement_tries=sum(r.tries for r in co) / len(co) if co else 0.0,
            coalloc_sites=sum(spanned) / len(spanned) if spanned else 0.0,
            claim_timeouts=self.claim_timeouts,
            rounds_out=self.rounds_out,
        )
        if m == 0:
            return blank
        moved = [r for r in recs if r.migrations]
        first = min(r.arrival for r in recs)
        last = max(r.end for r in recs)
        span = last - first
        core_seconds = sum(r.core_seconds() for r in recs)
        total_cores = sum(spec.cores for spec in self.topology.sites.values())
        bsld = 0.0
        for r in recs:
            run = r.end - r.start
            bsld += max(1.0, (r.end - r.arrival) / max(run, BSLD_THRESHOLD))
        return dataclasses.replace(
            blank,
            jobs=m,
            throughput=m / span if span > 0 else 0.0,
            mean_service_time=sum(r.end - r.arrival for r in recs) / m,
            mean_wait=sum(r.start - r.arrival for r in recs) / m,
            mean_bounded_slowdown=bsld / m,
            utilization=core_seconds / (total_cores * span) if span > 0 else 0.0,
            makespan=span,
            file_bytes=self.file_bytes,
            probe_bytes=self.network.bytes_moved - self.file_bytes - self.image_bytes,
            messages=self.messages,
            dispatches=self.dispatches,
            withdrawals=self.withdrawals,
            claims_denied=self.claims_denied,
            resizes=sum(r.resizes for r in recs),
            migrations=self.migrations,
            image_bytes=self.image_bytes,
            migration_downtime=sum(r.downtime * r.current for r in moved),
            work_moved=self.work_moved,
            decision_time_mean=sum(times) / len(times) if times else 0.0,
            decision_time_p99=times[min(len(times) - 1, int(0.99 * len(times)))] if times else 0.0,
        )
