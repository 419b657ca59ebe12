"""The daemon's driver: real I/O in as core events, the core's commands carried out for real.

Theory of operation. This is the daemon's mirror of :mod:`gbroker.sim.grid`: the simulator feeds
the same core objects simulated events in virtual time; this driver feeds them requests,
messages, process exits and timers in wall-clock time. It owns no scheduling logic.

- **The owner side** (:class:`~gbroker.core.dispatch.Broker`): a submission
  (:meth:`Driver.submit`) is made durable in the journal, then handed to the core as
  ``JobSubmitted``; :meth:`Driver.to_broker` carries out the commands that come back. A
  placement is journaled *before* the site may hear of it, and a granted claim before the site
  hears it, so a restarted owner never forgets a site that may run its job nor grants twice.
- **The site side** (:class:`~gbroker.core.site.SiteAgent`): an accepted job is journaled,
  staged, then queued; a scheduling pass runs once per burst of changes (:meth:`Driver.kick`),
  its ``Launch`` commands start processes through the :class:`~gbroker.site.executor.Executor`
  and its ``Claim`` commands ask the owner first. A process's end goes to the owner through an
  outbox in the journal, kept until the owner acknowledges it.
- **Cancels**, **draining**, **black holes** and **lost sites** are events and commands of the
  core like any other: a cancelled job stays cancelled whatever its late end report says; a
  draining site refuses new work and hands back its queue; a lost site's jobs are placed anew
  once their leases (plus :attr:`Driver.LEASE_GRACE`) have run out.

Every event and command is in the core's catalogue (:mod:`gbroker.core.events`); each dispatch
on commands here ends in ``assert_never``, so a command left out is a type error. The peer
messages' handlers (:attr:`Driver.peer_handlers`) live here because each is one step of this
loop; :mod:`gbroker.daemon.peers` carries them over HTTP. How each guarantee holds under kills:
docs/RESILIENCE.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import random
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, assert_never

import aiohttp
import msgpack
from yarl import URL

from dcsmon.view import NeighbourhoodView
from gbroker.core.dispatch import (
    Abandon,
    Broker,
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
    SiteView,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.limits import NOTHING, Used
from gbroker.core.malleable import Malleability, Obligation
from gbroker.core.model import Job, JobClass, Observation, SiteState
from gbroker.core.names import job_owner
from gbroker.core.requirements import candidate_hosts_at
from gbroker.core.site import Claim, Fetch, Launch, Phase, Resized, SiteAgent
from gbroker.core.states import TERMINAL_STATES, JobState
from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.history import reported_time, settled_start
from gbroker.daemon.journal import JobRow, Journal
from gbroker.daemon.metrics import DaemonMetrics
from gbroker.daemon.peers import Forbidden, PeerClient, PeerHandler, Unavailable
from gbroker.daemon.staging import Stager
from gbroker.daemon.tasks import Tasks
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from gbroker.jobs.description import JobDescription, SpmdLauncher
from gbroker.jobs.mapping import from_mapping, to_mapping
from gbroker.protocol import wire
from gbroker.protocol.idempotency import IdempotencyKey
from gbroker.site.backend import Backend, ExitResult, JobSpec, Limits, seen_with
from gbroker.site.checkpoints import CheckpointError
from gbroker.site.resize import Change, Resizer
from gbroker.site.spmd import MpiFlavour, Ranks
from netmon.forecast import Forecaster

__all__ = ["Driver", "Hosted", "JobStatus"]

log = logging.getLogger("gbroker.daemon")
# How often a co-allocated job's component asks again while its owner holds its claim (s).
_GANG_POLL = 0.5


@dataclass(slots=True)
class JobStatus:
    """What the owner tells clients about a job."""

    id: str
    state: JobState
    submitted_at: float
    name: str | None = None
    site: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    submitter: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The cores it runs on: (since when, how many), from its start, each resize appended.
    allocations: list[tuple[float, int]] = field(default_factory=list)
    # What it used at the sites it ran at before its latest move, and when it started at the
    # target of that move (the target's time): gbroker.core.limits.
    used: Used = NOTHING
    moved_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": str(self.state),
            "name": self.name,
            "site": self.site,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "error": self.error,
            "submitter": self.submitter,
            "cores": self.allocations[-1][1] if self.allocations else None,
            "allocations": [[at, cores] for at, cores in self.allocations],
        }

    def run_time(self, now: float) -> float | None:
        """Seconds it ran in all: at the sites it ran at before its latest move, and at its
        present one from its start there to its end (or ``now``); None before its start, or
        once it has ended without its end known yet (a cancelled job's)."""
        since = self.moved_at if self.moved_at is not None else self.started_at
        if since is None or (self.ended_at is None and self.state in TERMINAL_STATES):
            return None
        until = now if self.ended_at is None else self.ended_at
        return self.used.wall + max(0.0, until - since)


class MoveHooks(Protocol):
    """What the driver asks of :class:`gbroker.daemon.moving.Mover` (which imports this
    module, so it is named by what it does)."""

    restoring: dict[str, Path]
    errors: dict[str, str]

    async def migrate(self, status: JobStatus, to: str | None) -> str: ...

    def handlers(self) -> dict[str, PeerHandler]: ...

    async def accept(
        self, body: dict[str, Any], job: Job, hosted: Hosted, spec: bytes, lease: float
    ) -> None: ...

    async def report(self, kind: str, body: dict[str, Any], status: JobStatus) -> bool: ...

    async def started_at_target(self, job_id: str, site: str, at: float) -> None: ...

    async def unrestored(self, job_id: str, hosted: Hosted, why: str) -> None: ...

    async def restored(self, job_id: str) -> None: ...

    async def withdrawn(self, job_id: str) -> None: ...

    def incoming(self, job_id: str) -> Path | None: ...

    def moving_out(self) -> set[str]: ...

    async def given_up(self, job_id: str, source: str, target: str, why: str) -> None: ...

    async def move_in(
        self, job: Job, hosted: Hosted, source: str, bundle: str, size: int, lease: float
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Hosted:
    """A job this site holds for its owner: what it runs, and for whom; a job moved here, what
    it used at the sites it ran at before (it gets what is left of its limits)."""

    desc: JobDescription
    owner: str
    submitter: str | None
    used: Used = NOTHING


class _View:
    """The broker's view: its own site exactly, neighbours as DCSMon last delivered them."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def get(self, site: str, /) -> Observation | None:
        if site == self.driver.site:
            return Observation(self.driver.site_state(), time.time())
        return self.driver.view.get(site)


class Driver:
    """One site's core objects, driven by real I/O; see the module docstring."""

    LEASE_GRACE = 1.0  # seconds beyond a lease before a lost site's jobs move (clock skew, latency)

    def __init__(
        self,
        config: DaemonConfig,
        forecaster: Forecaster,
        journal: Journal,
        executor: Backend,
        peers: PeerClient,
        stager: Stager,
        tasks: Tasks,
        state_changed: asyncio.Event,
    ) -> None:
        topology = config.topology
        self.config = config
        self.site = config.site
        self.broker = Broker(
            self.site,
            topology.neighbours(self.site),
            config.policy,
            forecaster,
            lease=config.lease,
            health=config.black_hole,
            properties=topology.properties(),  # jobs' requirements are matched against these
            coalloc_timeout=config.coalloc_timeout,
            coalloc_rounds=config.coalloc_rounds,
            # The random baseline's draws: seeded from the OS, as a real broker's are.
            rng=random.Random(secrets.randbits(64)),
        )
        self.site_properties = topology.properties()[self.site]
        # Each site's relative speed (the AppLeS planner weighs a job's model with them).
        self.speeds = {name: site.speed for name, site in topology.sites.items()}
        # Every start claims its owner's grant (see gbroker.core.site): exactly once, whatever
        # the clocks, messages and crashes.
        self.agent = SiteAgent(
            self.site,
            topology.sites[self.site].cores,
            config.queue_policy,
            claim_every_start=True,
            malleability=config.malleability,
            sd_policy=config.sd_policy,
        )
        # Malleable jobs' cores change only where the back-end can (the local one).
        resizable = executor.resizable()
        self.resizer = None if resizable is None else Resizer(resizable, self._job_asks)
        # A neighbour is a candidate once heard from: its state (DCSMon, a heartbeat's answer),
        # or its word that it is online (then taken as idle, as the topology describes it, until
        # its state comes); or once assume_unheard() took it so after config.neighbour_grace.
        self.view = NeighbourhoodView()
        self._unheard = set(topology.neighbours(self.site))
        self._own_view = _View(self)
        self.decision_view = self._own_view  # what the core decides on (gbroker explain)
        self.decided: Callable[[Job, list[BrokerCommand], SiteView], None] | None = None
        """Told of each submission's decision, with the view it was made on (the fleet
        dashboard, :mod:`gbroker.daemon.dashboard`, records them while someone watches)."""
        self.busy_changed: Callable[[float, int], None] | None = None
        """Told, after each scheduling pass, how many of the site's cores are busy (the
        dashboard keeps their history: :class:`~gbroker.daemon.dashboard.Utilization`)."""
        self.journal = journal
        self.executor = executor
        self.peers = peers
        self.stager = stager
        self.tasks = tasks
        self.state_changed = state_changed
        self.jobs: dict[str, JobStatus] = {}  # owned here
        self.descriptions: dict[str, JobDescription] = {}  # owned here
        # Their JSON/YAML form and its MessagePack bytes, made once (what dispatches carry).
        self._specs: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.hosted: dict[str, Hosted] = {}  # running or queued here
        self.outputs: dict[str, tuple[str, str]] = {}  # stdout, stderr file of jobs run here
        self.launches: dict[str, str] = {}  # job id -> launch token, until its end is acknowledged
        self._kills: set[str] = set()  # jobs hosted here whose owner cancelled them before start
        # Running jobs whose refused request (_job_asks) was logged: a job may ask again and
        # again, and is said once (cleared when it stops running here).
        self._asks_refused: set[str] = set()
        # Co-allocated jobs. Here as a site: where each component hosted here listens, and the
        # rank table its owner granted it with. As an owner: where each component claiming
        # now listens, by component id.
        self._endpoints: dict[str, dict[str, Any]] = {}
        self._ranks: dict[str, tuple[list[dict[str, Any]], str]] = {}
        self._claimed_at: dict[str, tuple[dict[str, Any], int]] = {}
        self._gang_starts: dict[str, dict[str, Any]] = {}  # gang -> {"ranks": [...], "key": hex}
        self.draining = False  # set by gbroker.daemon.drain: no new work is taken here
        self.moves: MoveHooks | None = None  # set by gbroker.daemon.moving: running jobs move
        self.cpu: Callable[[], float | None] | None = None
        """This site's forecast CPU availability (set by the server: DCSMon's sensor,
        :class:`dcsmon.cpu.CpuSensor`); None: not measured."""
        # Owned jobs by state, kept as they change (own, set_state, forget): a scrape of
        # /metrics reads it instead of counting every job the broker holds.
        self.by_state: Counter[JobState] = Counter()
        self.metrics = DaemonMetrics(self.site, self.site_state, lambda: self.by_state)
        # Sites lost, each with the timer that gives up on its jobs (None: nothing left there).
        self.lost: dict[str, asyncio.TimerHandle | None] = {}
        self._ids = itertools.count(1)
        # Launch tokens: unique and unpredictable (a keyed hash of a counter, the key random
        # per life of the broker and never written down), and cheap: a getrandom call per job
        # cost tens of microseconds here.
        self._launch_key = secrets.token_bytes(32)
        self._launch_numbers = itertools.count(1)
        self._pass_pending = False
        self._ticking = False
        peers.local = self.peer_handlers

    def forget(self, job_ids: Sequence[str]) -> None:
        """Finished jobs purged from the journal (gbroker.daemon.history) leave memory too."""
        for job_id in job_ids:
            status = self.jobs.get(job_id)
            if status is not None and status.state in TERMINAL_STATES:
                del self.jobs[job_id]
                self.by_state[status.state] -= 1
                self.descriptions.pop(job_id, None)
                self._specs.pop(job_id, None)

    def site_state(self) -> SiteState:
        """This site's state as DCSMon reports it: the local scheduler's, whether it drains, and
        its CPU availability forecast (:attr:`cpu`)."""
        # The machine's own figures laid over (a batch system's other users: gbroker.site.backend).
        state = seen_with(self.agent.state(), self.executor.capacity())
        cpu = None if self.cpu is None else self.cpu()
        if self.draining or cpu is not None:
            state = SiteState(
                state.total_cores,
                state.free_cores,
                state.queued,
                state.running,
                draining=self.draining,
                shrinkable=state.shrinkable,
                shareable=state.shareable,
                cpu=cpu,
            )
        return state

    def close(self) -> None:
        for timer in self.lost.values():
            if timer is not None:
                timer.cancel()

    # -- the owner: submissions and cancellations ---------------------------------------------

    async def submit(
        self,
        desc: JobDescription,
        submitter: str,
        key: IdempotencyKey | None = None,
        job_id: str | None = None,
    ) -> str | None:
        """Take ``submitter``'s job: durable in the journal (with its idempotency ``key``, in
        the same transaction) before the core (and the caller) hear of it. None, and nothing
        taken, when the journal holds ``key`` already (:mod:`gbroker.protocol.idempotency`).
        ``job_id``: the id to give it (an array's element), else a fresh one."""
        job_id = job_id or self.new_id()
        job = desc.to_job(job_id, self.site)
        now = time.time()
        mapping = to_mapping(desc)
        spec = msgpack.packb(mapping)
        # Durable, then answer.
        if not await self.journal.submit(job_id, self.site, spec, now, submitter, key) and key:
            return None
        self._specs[job_id] = (mapping, spec)
        self.own(JobStatus(job_id, JobState.SUBMITTED, now, desc.name, submitter=submitter))
        self.descriptions[job_id] = desc
        try:
            self.to_broker(JobSubmitted(job))
        except GBrokerError as exc:
            await self.set_state(job_id, JobState.FAILED, error=str(exc))
            raise
        return job_id

    def own(self, status: JobStatus) -> None:
        """Hold an owned job's status (a submission, or one recovered from the journal)."""
        self.jobs[status.id] = status
        self.by_state[status.state] += 1

    def new_id(self) -> str:
        """A fresh id of a job (or job array) owned here."""
        return f"{self.site}.{int(time.time() * 1000)}{next(self._ids):04d}"

    def _spec(self, job_id: str) -> tuple[dict[str, Any], bytes]:
        """An owned job's description as a mapping and as MessagePack (made once)."""
        spec = self._specs.get(job_id)
        if spec is None:  # a job recovered from the journal
            mapping = to_mapping(self.descriptions[job_id])
            spec = self._specs[job_id] = (mapping, msgpack.packb(mapping))
        return spec

    async def cancel(self, status: JobStatus, by: str) -> None:
        """User ``by`` cancels an owned job: the core withdraws its waiting placements and has
        the site that runs it (or is about to) stop it. It is cancelled at once, its record
        naming who cancelled it and the site it was at; its end time and how it ended come
        later, from that site's end report, once its processes are gone (:meth:`_late_end`)."""
        if status.state in TERMINAL_STATES:
            return
        commands = self.to_broker(CancelRequested(status.id))
        running_at = next((c.site for c in commands if isinstance(c, Kill)), None)
        self.metrics.job_cancelled()
        site = running_at or status.site
        await self.set_state(status.id, JobState.CANCELLED, site, error=f"cancelled by {by}")

    # -- peer messages ------------------------------------------------------------------------

    @property
    def peer_handlers(self) -> dict[str, PeerHandler]:
        return {
            "/peer/v1/accept": self._accept,
            "/peer/v1/withdraw": self._withdraw,
            "/peer/v1/claim": self._claim,
            "/peer/v1/report": self._report,
            "/peer/v1/kill": self._kill,
            **(self.moves.handlers() if self.moves is not None else {}),
        }

    @staticmethod
    def _owner_only(job_id: str, sender: str) -> None:
        """Only a job's owner (named by its id) may dispatch, withdraw or kill it."""
        if job_owner(job_id) != sender:
            raise Forbidden(f"{sender} does not own {job_id}")

    async def _accept(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        """Take a dispatched job: durable in the journal before the owner hears yes."""
        self._owner_only(body["id"], sender)
        if body["owner"] != sender:
            raise Forbidden(f"{sender} cannot dispatch for {body['owner']}")
        own = sender == self.site and body["id"] in self.descriptions
        if own:  # our own job placed here: parsed and packed once, at submission
            desc, spec = self.descriptions[body["id"]], self._spec(body["id"])[1]
        else:
            desc = from_mapping(body["description"], document=f"job {body['id']}")
            spec = msgpack.packb(body["description"])
        job = desc.to_job(body["id"], body["owner"])
        owner, replica = body["owner"], bool(body.get("replica", False))
        lease = float(body.get("lease", self.config.lease))
        submitter = body.get("submitter")
        if job.id in self.agent.staging or job.id in self.agent.hosted:
            return {"ok": True}  # a repeated dispatch
        if "restore_from" in body:  # a running job moves here from another site
            if self.moves is None:
                raise Unavailable(f"site {self.site} does not take moving jobs")
            await self.moves.accept(body, job, Hosted(desc, owner, submitter), spec, lease)
            return {"ok": True}
        if self.draining:  # new work: its owner places it elsewhere
            raise Unavailable(f"site {self.site} is draining: it takes no new work")
        phase = "staging" if desc.stage_in else "queued"
        if not await self.journal.host(
            job.id, owner, replica, spec, time.time(), submitter, phase=phase
        ):
            return {"ok": True}  # a repeated dispatch (its first copy is still being taken)
        if not self.agent.stage(job.id):
            return {"ok": True}
        self.tasks.spawn(
            self.stage_then_queue(
                job, Hosted(desc, owner, submitter), replica, time.time() + lease
            ),
            f"stage:{job.id}",
        )
        return {"ok": True}

    async def stage_then_queue(
        self, job: Job, hosted: Hosted, replica: bool, lease_until: float
    ) -> None:
        owner = hosted.owner
        try:  # it runs here with its file systems' paths made this site's
            hosted = dataclasses.replace(
                hosted, desc=await self.stager.stage_in(job.id, hosted.desc, hosted.submitter)
            )
        except (GBrokerError, OSError, aiohttp.ClientError) as exc:
            if self.agent.abandon(job.id):  # unless it was withdrawn meanwhile
                await self.finish_hosted(
                    job.id,
                    owner,
                    ok=False,
                    exit_code=None,
                    error=f"staging failed at {self.site}: {exc}",
                )
            return
        if not self.agent.staged(job, owner, replica, lease_until):
            return  # withdrawn while its files were on the way
        self.hosted[job.id] = hosted
        if hosted.desc.stage_in:  # else it was journaled queued at once
            await self.journal.hosted_phase(job.id, "queued", time.time())
        self.kick()
        await self._call_owner(owner, "queued", job.id)

    async def _withdraw(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        self._owner_only(body["id"], sender)
        withdrawn = self.agent.withdraw(body["id"])  # a staging job's task sees it and stops
        if withdrawn:
            self.hosted.pop(body["id"], None)
            await self.journal.unhost(body["id"])
            if self.moves is not None:
                await self.moves.withdrawn(body["id"])
            self.kick()
        return {"withdrawn": withdrawn}

    async def _claim(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        if body["site"] != sender:
            raise Forbidden(f"{sender} cannot claim for {body['site']}")
        job_id = body["id"]
        if "endpoint" in body:  # a co-allocated job's component: where it will listen
            self._claimed_at[job_id] = (body["endpoint"], body.get("cores", 1))
        answer = ClaimAnswer(job_id, body["site"], granted=False)
        gang: GangGranted | None = None
        for command in self.to_broker(ClaimRequested(job_id, body["site"])):
            if isinstance(command, ClaimAnswer) and command.site == body["site"]:
                answer = command
            elif isinstance(command, GangGranted):
                gang = command
        granted = answer.granted
        move = self.broker.moving_of(job_id)
        reply: dict[str, Any] = {"granted": granted}
        if gang is not None:
            # Every component's grant and the rank table, durable in one transaction before any
            # site hears of one: a restarted owner grants all of them again, or none.
            # The job's own key: its components know one another by it (each proves it holds
            # it to its neighbours), and no other user's program beside them does.
            start = {"ranks": self._rank_table(gang), "key": secrets.token_hex(32)}
            await self.journal.grant_gang(gang.gang, gang.grants, json.dumps(start))
            self._gang_starts[gang.gang] = start
            for component, _ in gang.grants:
                self._claimed_at.pop(component, None)
        elif granted and move is not None and move.target == body["site"]:
            # A running job's move: the grant passes from its source to its target, at once.
            await self.journal.move_granted(job_id, move.source, move.target)
        elif granted and self._gang_of(job_id) is None:
            # Durable before the site hears it: a restarted owner grants no other.
            await self.journal.grant(job_id, body["site"])
        if granted and (of := self._gang_of(job_id)) is not None:
            started = self._gang_starts.get(of) or await self.journal.gang_start(of)
            if started is None:
                # Granted by the core, not yet durable (another component's claim is writing
                # the grants now): ask again, as if held; never a grant before the journal has it.
                reply = {"granted": False, "wait": True}
                granted = False
            else:
                self._gang_starts[of] = started
                reply["ranks"], reply["key"] = started["ranks"], started["key"]
        elif answer.wait:
            reply["wait"] = True
        elif answer.requeue:
            reply["requeue"] = True
            self._claimed_at.pop(job_id, None)
        self.metrics.claim(granted)
        return reply

    def _gang_of(self, job_id: str) -> str | None:
        """The co-allocated job an owned component belongs to (None: not a component)."""
        owned = self.broker.jobs.get(job_id)
        desc = self.descriptions.get(job_id)
        if owned is not None and owned.job.gang is not None:
            return owned.job.gang.id
        if desc is not None and desc.component_of is not None:
            return desc.component_of.gang
        return None

    def _rank_table(self, gang: GangGranted) -> list[dict[str, Any]]:
        """Where each component of a co-allocated job listens, in rank order (the environment
        of every component: ``GBROKER_RANKS``)."""
        table = []
        for rank, (component, site) in enumerate(gang.grants):
            endpoint, cores = self._claimed_at.get(component, ({"host": site, "port": 1}, 1))
            entry = {"rank": rank, "site": site, **endpoint, "cores": cores}
            desc = self.descriptions.get(component)
            part = None if desc is None else desc.component_of
            if part is not None and part.units is not None:
                entry["units"] = part.units
            table.append(entry)
        return table

    async def _report(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        job_id, site, kind = body["id"], body["site"], body["kind"]
        if site != sender:
            raise Forbidden(f"{sender} cannot report for {site}")
        status = self.jobs.get(job_id)
        if status is None or status.state in TERMINAL_STATES:
            if kind == "started":  # overtaken by the job's end, or by our restart: still true
                await self._late_start(job_id, site, body["at"], status)
            elif kind == "finished":  # a cancelled job's processes are gone now
                await self._late_end(job_id, site, body, status)
            return {"ok": True}  # a repeat, or a job given up: acknowledged, nothing changes
        if not self.broker.placed(job_id, site):
            raise Forbidden(f"{job_id} is not placed at {site}")
        if self.moves is not None and await self.moves.report(kind, body, status):
            return {"ok": True}
        move = self.broker.moving_of(job_id)
        if kind == "started" and move is not None and move.target == site:
            # Restored at the target of its move: the job's record moves there.
            self.to_broker(JobStarted(job_id, site))
            await self.set_state(job_id, JobState.RUNNING, site=site)
            if self.moves is not None:
                await self.moves.started_at_target(job_id, site, body["at"])
            return {"ok": True}
        if kind == "queued":
            self.to_broker(JobQueued(job_id, site))
            if status.state in (JobState.SUBMITTED, JobState.STAGING):
                await self.set_state(job_id, JobState.QUEUED, site=site, placement="queued")
            else:
                await self.journal.placement_queued(job_id, site)
        elif kind == "started":
            owned = self.broker.jobs.get(job_id)
            # Granted through its claim (journaled then) unless it started on a lease.
            journal_grant = owned is None or owned.granted != site
            self.to_broker(JobStarted(job_id, site))
            allocation = None
            if status is not None and status.started_at is None:
                # Before any await: a short job's "finished" may overtake this report. The
                # time is the site's (history.reported_time), not when we heard of it.
                started = reported_time(body["at"], status.submitted_at, time.time())
                status.started_at = settled_start(started, status.ended_at)
                self.metrics.job_started(status.submitted_at, status.started_at)
                if "cores" in body and not status.allocations:
                    allocation = (status.started_at, body["cores"])
                    status.allocations.append(allocation)
            grant = "granted" if journal_grant else None
            if status.state not in TERMINAL_STATES:
                await self.set_state(  # one request, with the grant and the allocation
                    job_id,
                    JobState.RUNNING,
                    site=site,
                    started_at=status.started_at,
                    placement=grant,
                    allocation=allocation,
                )
            else:
                if allocation is not None:
                    await self.journal.allocated(job_id, *allocation)
                if grant is not None:
                    await self.journal.grant(job_id, site)
                await self.journal.record_times(job_id, started_at=status.started_at)
        elif kind == "withdrawable":  # a draining site hands the job back: move it
            self.to_broker(PlacementReleased(job_id, site))
        elif kind == "resized":  # a malleable job's new size, as its site carried it out
            at = reported_time(body["at"], status.submitted_at, time.time())
            status.allocations.append((at, body["cores"]))
            await self.journal.allocated(job_id, at, body["cores"])
        elif kind == "finished":
            ok = bool(body.get("ok"))
            began, ended = status.started_at, body.get("at")
            ran = None if began is None or ended is None else max(0.0, ended - began)
            self.to_broker(JobFinished(job_id, site, ok, ran))
            if status is not None and status.state not in TERMINAL_STATES:
                now = time.time()
                ended = reported_time(body["at"], status.submitted_at, now)
                if status.started_at is None and "started_at" in body:
                    status.started_at = reported_time(body["started_at"], status.submitted_at, now)
                status.started_at = settled_start(status.started_at, ended)
                status.ended_at = ended
                status.exit_code = body.get("exit_code")
                status.error = body.get("error")
                self.metrics.job_finished(ok)
                await self.set_state(
                    job_id,
                    JobState.DONE if ok else JobState.FAILED,
                    site=site,
                    error=status.error,
                    started_at=status.started_at,
                    ended_at=ended,
                    exit_code=status.exit_code,
                )
        else:
            raise InvalidInput("report.kind", " or ".join(wire.REPORT_KINDS), kind)
        return {"ok": True}

    async def _late_start(
        self, job_id: str, site: str, at: float, status: JobStatus | None
    ) -> None:
        """A start reported after the job's end reached us (in memory, or only in the journal
        after a restart): recorded if it comes from the site that ran the job, never after
        the end."""
        if status is None:
            row = await self.journal.get(job_id)
            if row is None or row.site != site or row.started_at is not None:
                return
            started = reported_time(at, row.submitted_at, time.time())
        else:
            if status.site != site or status.started_at is not None:
                return
            started = reported_time(at, status.submitted_at, time.time())
            status.started_at = settled_start(started, status.ended_at)
            self.metrics.job_started(status.submitted_at, status.started_at)
        await self.journal.record_times(job_id, started_at=started)

    async def _late_end(
        self, job_id: str, site: str, body: dict[str, Any], status: JobStatus | None
    ) -> None:
        """The end of a job cancelled while it ran at ``site`` (or was about to), which that
        site reports once the job's processes are gone: its end time (the site's record, as
        for any job) and how it ended are recorded, and the job stays cancelled. A report from
        another site, or of a job whose end is known, changes nothing (a repeat)."""
        if status is None:  # cancelled before our restart: only the journal knows it
            row = await self.journal.get(job_id)
            if (
                row is None
                or row.state is not JobState.CANCELLED
                or row.site != site
                or row.ended_at is not None
            ):
                return
            submitted_at, started_at, cancelled = row.submitted_at, row.started_at, row.error
        else:
            if (
                status.state is not JobState.CANCELLED
                or status.site != site
                or status.ended_at is not None
            ):
                return
            submitted_at, started_at = status.submitted_at, status.started_at
            cancelled = status.error
        now = time.time()
        ended = reported_time(body["at"], submitted_at, now)
        if started_at is None and "started_at" in body:
            started_at = reported_time(body["started_at"], submitted_at, now)
        started_at = settled_start(started_at, ended)
        how = body.get("error")
        error = f"{cancelled or 'cancelled'} while it ran at {site}" + (
            f" ({how})" if how else ", but it had ended on its own first"
        )
        if status is not None:
            status.started_at, status.ended_at = started_at, ended
            status.exit_code, status.error = body.get("exit_code"), error
        await self.journal.record_times(
            job_id,
            started_at=started_at,
            ended_at=ended,
            exit_code=body.get("exit_code"),
            error=error,
        )

    async def _kill(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        """The owner cancelled a job granted here: stop it. One granted but not started yet
        (its grant, or its launch, on the way) is stopped as soon as it starts."""
        self._owner_only(body["id"], sender)
        job_id = body["id"]
        if self.executor.cancel(job_id):
            return {"ok": True}
        if job_id in self.hosted:
            self._kills.add(job_id)
            return {"ok": True}
        return {"ok": False}

    async def _call_owner(self, owner: str, kind: str, job_id: str, **extra: Any) -> None:
        body = {"id": job_id, "site": self.site, "kind": kind, "at": time.time(), **extra}
        await self.peers.call_until_answered(owner, "/peer/v1/report", body)

    async def finish_hosted(self, job_id: str, owner: str, **report: Any) -> None:
        """Tell the owner how a job hosted here ended. The report waits in the journal (an
        outbox) until the owner has acknowledged it, across restarts of either side."""
        if report.get("error"):  # a report carries at most MAX_ERROR_CHARS of it
            report["error"] = report["error"][: wire.MAX_ERROR_CHARS]
        body = {"id": job_id, "site": self.site, "kind": "finished", "at": time.time(), **report}
        outbox = self.journal.hosted_phase_soon(
            job_id, "finished", body["at"], report=msgpack.packb(body)
        )
        if owner != self.site:
            await outbox  # durable before the report leaves for its owner
        # Our own job's end: the owner's record of it, queued in this round of the loop by the
        # call below, commits with the outbox (the same transaction), or after it.
        try:
            await self.deliver_report(owner, body)
        finally:
            await outbox

    async def deliver_report(self, owner: str, body: dict[str, Any]) -> None:
        await self.peers.call_until_answered(owner, "/peer/v1/report", body)
        await self.journal.unhost(body["id"])
        token = self.launches.pop(body["id"], None)
        if token is not None:
            self.executor.forget_launch(token)

    # -- lost sites ------------------------------------------------------------------------------

    def site_unreachable(self, site: str) -> None:
        """``site`` is gone (its last-will said offline, or a call to it failed): choose it no
        more, and once the leases of the jobs placed there have run out, place them elsewhere."""
        if site == self.site or site in self.lost:
            return
        log.warning("%s: site %s lost; its jobs move once their leases run out", self.site, site)
        self.view.forget(site)
        self._schedule_lost(site, self.config.lease + self.LEASE_GRACE)

    def _schedule_lost(self, site: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self.lost[site] = loop.call_later(max(delay, 0.0), self._give_up_on, site)

    def _give_up_on(self, site: str) -> None:
        before = self.broker.waiting_at(site)
        moving_there = {
            job_id: owned.moving
            for job_id, owned in self.broker.jobs.items()
            if owned.moving is not None and owned.moving.target == site
        }
        self.to_broker(SiteLost(site))
        for job_id, move in moving_there.items():  # a move the lost target never took is off
            if self.broker.moving_of(job_id) is None and self.moves is not None:
                why = f"{site} was lost before it took the job"
                self.tasks.spawn(self.moves.given_up(job_id, move.source, site, why), "move-off")
        for job_id in before - self.broker.waiting_at(site):  # given up: the journal follows
            self.tasks.spawn(self.journal.unplace(job_id, site), f"unplace:{job_id}")
        pending = self.broker.lease_pending(site)
        if pending is None:
            self.lost[site] = None
        else:
            self._schedule_lost(site, pending + self.LEASE_GRACE - time.time())

    def assume_unheard(self) -> list[str]:
        """Take each neighbour never heard from (and not lost) as idle, as the topology says;
        any real observation is newer and replaces this. Returns their names."""
        unheard = [
            name
            for name in sorted(self._unheard)
            if self.view.get(name) is None and name not in self.lost
        ]
        for name in unheard:
            self._assume_idle(name)
        self._unheard.clear()
        return unheard

    def _assume_idle(self, site: str) -> None:
        cores = self.config.topology.sites[site].cores
        self.view.update(site, SiteState(cores, cores), observed_at=0.0)

    def liveness(self, site: str, online: bool) -> None:
        if online:
            self.peers.heard_online(site)
            self._site_back(site)
            if site in self._unheard:  # its first word: a candidate from now on
                self._unheard.discard(site)
                if self.view.get(site) is None:
                    self._assume_idle(site)
        else:
            self.site_unreachable(site)

    def _site_back(self, site: str) -> None:
        if site in self.lost:
            timer = self.lost.pop(site)
            if timer is not None:
                timer.cancel()
            self.to_broker(SiteBack(site))
            log.info("%s: site %s is back", self.site, site)

    # -- the owner's commands --------------------------------------------------------------------

    def to_broker(self, event: BrokerEvent) -> list[BrokerCommand]:
        began = time.perf_counter()
        commands = self.broker.handle(event, time.time(), self._own_view)
        if isinstance(event, JobSubmitted):
            self.metrics.decided(time.perf_counter() - began)
            if self.decided is not None:
                self.decided(event.job, commands, self._own_view)
        for command in commands:
            match command:
                case Dispatch(job, site, replica):
                    self.metrics.dispatched(site)
                    self.tasks.spawn(self._dispatch(job, site, replica), f"dispatch:{job.id}")
                case Withdraw(job_id, site):
                    self.tasks.spawn(self._withdraw_at(job_id, site), f"withdraw:{job_id}")
                case Kill(job_id, site):
                    kill = self.peers.call(site, "/peer/v1/kill", {"id": job_id})
                    self.tasks.spawn(kill, f"kill:{job_id}")
                case Abandon(job_id, reason):
                    failed = self.set_state(job_id, JobState.FAILED, error=reason)
                    self.tasks.spawn(failed, f"abandon:{job_id}")
                case ClaimAnswer() | GangGranted():
                    pass  # answered in the claim's HTTP response
                case SiteExcluded(site, until, failed, outcomes, rate, baseline):
                    log.warning(
                        "%s: site %s excluded as a black hole until %s: %d of its last %d jobs "
                        "failed fast (%.0f%%, other sites %.0f%%)",
                        self.site,
                        site,
                        time.strftime("%H:%M:%S", time.localtime(until)),
                        failed,
                        outcomes,
                        100 * rate,
                        100 * baseline,
                    )
                    self.metrics.black_hole_excluded(site)
                case _:
                    assert_never(command)
        if self.broker.needs_tick and not self._ticking:
            self._ticking = True
            self.tasks.spawn(self._tick(), "tick")
        return commands

    async def _dispatch(self, job: Job, site: str, replica: bool) -> None:
        # The placement is durable before the site may hear of it: a restarted owner knows
        # every site that may run its job (with its new state, in one request).
        # To our own site, the placement is queued, not awaited: the site's record of the job,
        # queued after it in the same round of the loop, commits with it (or after it), so
        # one transaction makes both durable, and nothing leaves the process meanwhile.
        status = self.jobs[job.id]
        placed = None
        if status.state not in TERMINAL_STATES and status.state is not JobState.RUNNING:
            placed = self._state_soon(job.id, JobState.STAGING, site=site, placement="placed")
            if site != self.site:
                await placed
        else:
            await self.journal.place(job.id, site)
        try:
            await self.send_accept(job, site, replica)
        finally:
            if placed is not None:
                await placed

    def description_of(self, job_id: str) -> dict[str, Any]:
        """An owned job's description as dispatches carry it (JSON/YAML form)."""
        return self._spec(job_id)[0]

    def forget_moved(self, job_id: str) -> None:
        """A job that ran here moved away (its frozen copy was released): drop it quietly,
        its cores free, no end reported (it goes on at its target)."""
        self.hosted.pop(job_id, None)
        self.outputs.pop(job_id, None)
        held = self.agent.hosted.get(job_id)
        if held is not None and held.phase is Phase.RUNNING:
            self.agent.finished(job_id)
        token = self.launches.pop(job_id, None)
        if token is not None:
            self.executor.forget_launch(token)
        if self.resizer is not None and job_id in self.resizer.links:
            self.tasks.spawn(self.resizer.forget(job_id), f"unfollow:{job_id}")
        self._asks_refused.discard(job_id)
        self.tasks.spawn(self.journal.unhost(job_id), f"moved:{job_id}")
        self.kick()

    async def send_accept(self, job: Job, site: str, replica: bool) -> None:
        body = {
            "id": job.id,
            "owner": self.site,
            "replica": replica,
            "lease": self.config.lease,
            "description": self._spec(job.id)[0],
            "submitter": self.jobs[job.id].submitter,
        }
        backoff = 0.2
        while True:
            try:
                await self.peers.call(site, "/peer/v1/accept", body)
                return
            except Unavailable as exc:  # our own site drains
                await self._refused(job, site, exc)
                return
            except aiohttp.ClientResponseError as exc:
                if exc.status == 503:  # it drains, and did not take the job
                    await self._refused(job, site, exc)
                    return
                if 400 <= exc.status < 500:  # refused: it will not change its mind
                    log.error("%s: %s refused %s: %s", self.site, site, job.id, exc)
                    self.site_unreachable(site)  # the job moves once its lease is out
                    return
                error: Exception = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                error = exc
            # It may have arrived and the answer got lost: the job moves only once its lease
            # there has run out (see site_unreachable). Until then it is sent again, since the
            # site may be back before that and must then know of the job; sites accept a
            # repeat idempotently, and a copy that arrives after the job moved is never
            # granted its start.
            log.warning("%s: dispatch of %s to %s failed: %s", self.site, job.id, site, error)
            self.site_unreachable(site)
            if not self.broker.placed(job.id, site):
                return
            await self.peers.pause(site, backoff)
            backoff = min(backoff * 2, 5.0)

    async def _refused(self, job: Job, site: str, why: Exception) -> None:
        """``site`` takes no new work (it drains) and does not hold the job: place it elsewhere."""
        log.info("%s: %s refused %s: %s", self.site, site, job.id, why)
        await self.journal.unplace(job.id, site)
        self.to_broker(DispatchRefused(job.id, site))

    async def _withdraw_at(self, job_id: str, site: str) -> None:
        """Withdraw, asking again until the site answers: a call that failed may have removed
        the job there, so "it stays" cannot be assumed (the job would be lost). Sites answer a
        repeat "withdrawn". Meanwhile the site counts as lost, and once the lease is out the
        core gives the placement up and the job moves; the answer, if any, then changes
        nothing."""
        backoff = 0.2
        while True:
            try:
                reply = await self.peers.call(site, "/peer/v1/withdraw", {"id": job_id})
                break
            except aiohttp.ClientResponseError as exc:
                if 400 <= exc.status < 500:  # refused: it will not change its mind
                    reply = {"withdrawn": False}
                    break
                error: Exception = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                error = exc
            log.warning("%s: withdrawal of %s from %s failed: %s", self.site, job_id, site, error)
            self.site_unreachable(site)
            if not self.broker.placed(job_id, site):
                return  # given up meanwhile (its lease ran out): nothing to withdraw
            await self.peers.pause(site, backoff)
            backoff = min(backoff * 2, 5.0)
        withdrawn = bool(reply["withdrawn"])
        self.metrics.withdrawal(withdrawn)
        if withdrawn:
            await self.journal.unplace(job_id, site)
        self.to_broker(WithdrawAnswered(job_id, site, withdrawn))

    async def _tick(self) -> None:
        try:
            while self.broker.needs_tick:
                await asyncio.sleep(self.broker.policy.interval)
                self.to_broker(Tick())
        finally:
            self._ticking = False

    async def set_state(
        self,
        job_id: str,
        state: JobState,
        site: str | None = None,
        error: str | None = None,
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        placement: str | None = None,
        allocation: tuple[float, int] | None = None,
    ) -> None:
        """A new state of an owned job, journaled (in one request with its times and how it
        ended, if given: an error, e.g. why it was abandoned, is still known after a restart;
        and with what ``placement`` says of its placement at ``site`` and its first
        ``allocation``: see :meth:`Journal.update`)."""
        status = self.jobs[job_id]
        await self._state_soon(
            job_id,
            state,
            site,
            error,
            started_at=started_at,
            ended_at=ended_at,
            exit_code=exit_code,
            placement=placement,
            allocation=allocation,
        )
        if state in TERMINAL_STATES:
            self._specs.pop(job_id, None)  # no dispatch of it will follow
            status.done.set()

    def _state_soon(
        self,
        job_id: str,
        state: JobState,
        site: str | None = None,
        error: str | None = None,
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        placement: str | None = None,
        allocation: tuple[float, int] | None = None,
    ) -> asyncio.Future[bool]:
        """The state change of :meth:`set_state`, in memory now and queued for the journal;
        the future of its commit (:meth:`Journal.update_soon`)."""
        status = self.jobs[job_id]
        self.by_state[status.state] -= 1
        self.by_state[state] += 1
        status.state = state
        if site is not None:
            status.site = site
        if error is not None:
            status.error = error
        return self.journal.update_soon(
            job_id,
            state,
            time.time(),
            site,
            started_at=started_at,
            ended_at=ended_at,
            exit_code=exit_code,
            error=error,
            placement=placement,
            allocation=allocation,
        )

    # -- the site's commands ---------------------------------------------------------------------

    def kick(self) -> None:
        """Run a scheduling pass once the current burst of changes is in."""
        if not self._pass_pending:
            self._pass_pending = True
            asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self._pass_pending = False
        self.state_changed.set()
        now = time.time()
        for command in self.agent.schedule(now):
            match command:
                case Launch():
                    self.tasks.spawn(self._launch(command), f"launch:{command.job.id}")
                case Claim():
                    self.tasks.spawn(self._claim_start(command), f"claim:{command.job_id}")
                case Resized():
                    # Before the starts that follow it take slots: a shrink frees its own now.
                    self._resize(command)
                case _:
                    assert_never(command)
        if self.busy_changed is not None:  # every change of the cores ends in a pass
            local = self.agent.local
            self.busy_changed(now, local.total_cores - local.free_cores)

    # -- malleable jobs (gbroker.site.resize) ----------------------------------------------------

    def _resize(self, command: Resized) -> None:
        """Carry out the scheduler's resize of a running malleable job."""
        if self.resizer is None:  # no malleability policy is allowed at such a site
            raise InternalError(f"a resize of {command.job_id} at a site that cannot resize")
        try:
            change = self.resizer.begin(command.job_id, command.cores)
        except InvalidInput:  # it has ended meanwhile: its end report settles the cores
            return
        self.tasks.spawn(self._resized(command, change), f"resize:{command.job_id}")

    async def _resized(self, command: Resized, change: Change) -> None:
        hosted = self.agent.hosted.get(command.job_id)
        if hosted is None:
            return
        job = hosted.job
        declared = job.malleability or Malleability()
        assert self.resizer is not None
        outcome = await self.resizer.finish(
            job.id,
            change,
            declared.deadline,
            declared.obligation is Obligation.MANDATORY,
            job.rank,
        )
        if outcome is None:
            return  # superseded by a later change of the job, or it ended
        now = time.time()
        if outcome.cores != command.cores and job.id in self.agent.hosted:
            # The job took less, or gave back more: the scheduler settles on what it has.
            self.agent.took(job.id, outcome.cores, now)
            self.kick()
        log.info(
            "%s: job %s resized %d -> %d cores (CPUs %s)%s",
            self.site,
            job.id,
            command.old,
            outcome.cores,
            ",".join(map(str, outcome.cpus)),
            "" if outcome.answered else ", no answer",
        )
        await self.journal.resized(job.id, outcome.cores, outcome.slots, now)
        await self._call_owner(hosted.owner, "resized", job.id, cores=outcome.cores)

    def _job_asks(self, job_id: str, cores: int) -> None:
        """An evolving job asks for ``cores`` cores: the scheduler decides."""
        if job_id not in self.agent.hosted:
            return
        try:
            change = self.agent.request(job_id, cores, time.time())
        except InvalidInput as exc:  # not running here (any more), not malleable, or sharing
            if job_id not in self._asks_refused:  # once: a job may ask in a loop
                self._asks_refused.add(job_id)
                log.warning("%s: job %s asked for %d cores: %s", self.site, job_id, cores, exc)
            return
        if change is not None:
            self._resize(change)
            self.kick()

    async def _claim_start(self, claim: Claim) -> None:
        """Ask the owner for the right to start (a replica, or a job whose lease ran out); the
        cores stay held until it answers, however long it is away. A co-allocated job's
        component says where it will listen and is told to wait (asked again every
        ``_GANG_POLL`` seconds) until its mates have all claimed, or to queue again."""
        body: dict[str, Any] = {"id": claim.job_id, "site": self.site}
        hosted_job = self.agent.hosted.get(claim.job_id)
        if hosted_job is not None and hosted_job.job.gang is not None:
            body["endpoint"] = self._endpoint(claim.job_id)
            body["cores"] = hosted_job.cores
        while True:
            reply = await self.peers.call_until_answered(claim.owner, "/peer/v1/claim", body)
            told = reply is not None and ("ranks" in reply or "endpoint" not in body)
            if reply is None or not (reply.get("wait") or (reply.get("granted") and not told)):
                break  # answered (a component's grant only with its rank table: else ask again)
            if claim.job_id not in self.agent.hosted:  # withdrawn or killed meanwhile
                return
            await asyncio.sleep(_GANG_POLL)
        granted = reply is not None and bool(reply.get("granted"))
        requeue = reply is not None and bool(reply.get("requeue")) and not granted
        if granted and reply is not None and "ranks" in reply and "key" in reply:
            self._ranks[claim.job_id] = (reply["ranks"], reply["key"])
        launch = self.agent.claim_answered(claim.job_id, granted, requeue=requeue)
        if isinstance(launch, Fetch):  # only Sparrow and federation defer, which serve refuses
            raise InternalError(f"{claim.job_id}: a deferred job at a daemon's site")
        if launch is not None:
            await self._launch(launch)
        elif requeue:  # its cores go back meanwhile; it claims again when it gets them again
            self.kick()
        else:
            self.hosted.pop(claim.job_id, None)
            self._kills.discard(claim.job_id)
            await self.journal.unhost(claim.job_id)
            self.kick()

    def _memory_limit(self, job: Job, cores: int) -> int | None:
        """The memory ``job`` asked for here on ``cores`` cores (None: it asked for none)."""
        if job.requirements is None:
            return None
        return job.requirements.memory_at(self.site_properties, cores)

    async def _launch(self, launch: Launch) -> None:
        """Start a granted job: its launch token is journaled first, and the launcher records
        the launch under it, so a restarted site can tell "never started" from "started"."""
        hosted = self.hosted[launch.job.id]
        desc, owner = hosted.desc, hosted.owner
        if desc.staging_only:  # nothing to run: it staged in, it stages out as it "ends"
            now = time.time()
            self.exited(ExitResult(launch.job.id, 0, None, now, now))
            return
        number = next(self._launch_numbers).to_bytes(8, "big")
        token = hashlib.blake2b(number, key=self._launch_key, digest_size=12).hexdigest()
        try:
            user = None if hosted.submitter is None else self.executor.account_for(hosted.submitter)
            ranks = _spmd_ranks(desc, launch.cores)
            spmd_env = desc.spmd_environment(launch.cores)
            if ranks is not None:  # one core per rank unless ThreadsPerProcess says more
                spmd_env["OMP_NUM_THREADS"] = str(ranks.threads)
            granted = self._ranks.get(launch.job.id)
            gang_env = {}
            if launch.job.gang is not None and granted is not None:
                # A co-allocated job's component: its rank, where every rank listens and the
                # job's key (the owner's word: not the job's own Environment's).
                table, key = granted
                gang_env["GBROKER_RANK"] = str(launch.job.gang.index)
                gang_env["GBROKER_RANKS"] = json.dumps(table, separators=(",", ":"))
                gang_env["GBROKER_RANKS_KEY"] = key
            spec = JobSpec(
                job_id=launch.job.id,
                executable=desc.executable or desc.application_name or "",
                arguments=desc.arguments,
                # SPMD's counts and flavour (for a program that starts its processes itself);
                # the job's own Environment wins.
                environment={**spmd_env, **desc.environment, **gang_env},
                working_directory=desc.run_directory,
                stdin=desc.input,
                stdout=desc.output or "stdout",
                stderr=desc.error or "stderr",
                time_limit=float(desc.wall_time_limit) if desc.wall_time_limit else None,
                # POSIX CPUTimeLimit: the job's RLIMIT_CPU (0, as a WallTimeLimit of 0: none);
                # the memory it asked for, its cgroup's (else the site's default, or a share).
                limits=Limits(
                    cpu_time=desc.cpu_time_limit or None,
                    memory=self._memory_limit(launch.job, launch.cores),
                ),
                user=user,
                launch_token=token,
                control=launch.job.job_class is JobClass.MALLEABLE,
                hosts=self._held_to(desc),
                ranks=ranks,
                used=hosted.used,
            )
        except InvalidInput as exc:
            # The description cannot run here (e.g. an unknown account): give the cores back
            # and tell the owner, instead of holding them for a job that never starts.
            now = time.time()
            self.exited(ExitResult(launch.job.id, None, None, now, now, error=str(exc)))
            return
        self.outputs[launch.job.id] = (spec.stdout, spec.stderr)
        self.launches[launch.job.id] = token
        # Write-ahead: durable before the process may exist (ARCHITECTURE §6).
        await self.journal.hosted_phase(
            launch.job.id, "launching", time.time(), cores=launch.cores, token=token
        )
        image = None if self.moves is None else self.moves.restoring.get(launch.job.id)
        try:
            if image is None:
                await self.executor.start(spec, launch.cores, self.exited)
            else:  # a running job moved here: restored from its checkpoint, not started
                began = time.monotonic()
                await self.executor.restore(spec, image, launch.cores, self.exited)
                self.metrics.move_step("restore", time.monotonic() - began)
        except InvalidInput as exc:
            now = time.time()
            self.exited(ExitResult(launch.job.id, None, None, now, now, error=str(exc)))
            return
        except CheckpointError as exc:  # nothing of it ran here: it resumes where it was
            assert self.moves is not None
            self.launches.pop(launch.job.id, None)
            await self.moves.unrestored(launch.job.id, hosted, str(exc))
            return
        if image is not None and self.moves is not None:
            await self.moves.restored(launch.job.id)
        if launch.job.id in self._kills:  # cancelled by its owner while it was being started
            self._kills.discard(launch.job.id)
            self.executor.cancel(launch.job.id)
        running = self.executor.running_job(launch.job.id)
        started_at = running.started_at if running is not None else time.time()
        if launch.effective is not None:
            # An SD-Policy guest, on the cores its mates gave up: it runs on exactly those CPUs
            # at whatever speed they give it; ``effective`` is the speed the scheduler plans
            # its end with (docs/MALLEABILITY.md, "SD-Policy in the daemon").
            log.info(
                "%s: job %s started on %d cores lent by running mates (planned at %.3g cores'"
                " worth)",
                self.site,
                launch.job.id,
                launch.cores,
                launch.effective,
            )
        if (
            running is not None
            and launch.job.job_class is JobClass.MALLEABLE
            and self.resizer is not None
        ):
            self.resizer.follow(launch.job.id)
        await self._call_owner(owner, "started", launch.job.id, at=started_at, cores=launch.cores)

    def _endpoint(self, job_id: str) -> dict[str, Any]:
        """Where a co-allocated job's component will listen: this site's address and a port
        free now (bound and closed at once; the same one each time the component claims)."""
        endpoint = self._endpoints.get(job_id)
        if endpoint is None:
            host = self.config.host
            if host in ("0.0.0.0", "::", ""):
                host = URL(self.peers.peers.get(self.site, "http://127.0.0.1")).host or host
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
            endpoint = self._endpoints[job_id] = {"host": host, "port": port}
        return endpoint

    def _held_to(self, desc: JobDescription) -> tuple[str, ...]:
        """The hosts of this site a job's candidate hosts hold it to; () for all of them."""
        if not desc.candidate_hosts:
            return ()
        props = self.site_properties
        hosts = candidate_hosts_at(desc.candidate_hosts, self.site, props)
        return () if hosts is None or hosts == props.host_names(self.site) else hosts

    def exited(self, result: ExitResult) -> None:
        self._kills.discard(result.job_id)
        self._endpoints.pop(result.job_id, None)
        self._ranks.pop(result.job_id, None)
        hosted = self.hosted.pop(result.job_id, None)
        self.agent.finished(result.job_id)
        self.kick()
        if self.resizer is not None and result.job_id in self.resizer.links:
            self.tasks.spawn(self.resizer.forget(result.job_id), f"unfollow:{result.job_id}")
        self._asks_refused.discard(result.job_id)
        if hosted is not None:
            self.tasks.spawn(
                self._stage_out_then_finish(result, hosted), f"finished:{result.job_id}"
            )

    async def _stage_out_then_finish(self, result: ExitResult, hosted: Hosted) -> None:
        """Stage the job's outputs out (once its program ended on its own, whatever its
        status), then tell the owner how it ended; a failed stage-out fails the job."""
        # Why it ended, when the site ended it (its wall-time limit, a cancel): its user's
        # only clue, an error ("killed at its wall-time limit of ...") beside the signal.
        ok, error = result.succeeded, result.error or result.ended_by
        if result.error is None and not result.cancelled:
            problem = await self.stager.stage_out(result.job_id, hosted.desc, hosted.submitter)
            if problem is not None:
                ok, error = False, problem if error is None else f"{error}; {problem}"
        await self.finish_hosted(
            result.job_id,
            hosted.owner,
            ok=ok,
            exit_code=result.exit_status,  # minus the signal that ended it, if one did
            error=error,
            # The launcher's own times, not when we heard (ARCHITECTURE §6).
            at=result.ended_at,
            started_at=result.started_at,
        )


def status_of(row: JobRow) -> JobStatus:
    """What the owner tells clients about a job it knows only from its journal."""
    try:
        name = msgpack.unpackb(row.spec).get("name")
    except (ValueError, AttributeError, msgpack.UnpackException):
        name = None
    status = JobStatus(
        row.id,
        row.state,
        row.submitted_at,
        name if isinstance(name, str) else None,
        site=row.site,
        started_at=row.started_at,
        ended_at=row.ended_at,
        exit_code=row.exit_code,
        error=row.error,
        submitter=row.submitter,
        used=row.used,
        moved_at=row.moved_at,
    )
    if row.state in TERMINAL_STATES:
        status.done.set()
    return status


def _spmd_ranks(desc: JobDescription, cores: int) -> Ranks | None:
    """The MPI ranks an SPMD job is started as on ``cores`` cores (N, p, t and the flavour its
    variation names); None for a job run once (not SPMD, no variation, OpenMP or None)."""
    launcher = desc.spmd_launcher
    if launcher is None or launcher is SpmdLauncher.THREADS:
        return None
    return Ranks(
        MpiFlavour(launcher.value),
        desc.spmd_processes(cores),
        desc.processes_per_host,
        desc.spmd_threads(cores) or 1,
    )
