"""The executing side of a site: its local scheduler and the claims of replicas (ARCHITECTURE §6).

Theory of operation. A site hosts jobs that owner brokers dispatched to it, its own broker
included. A dispatched job first *stages* (:meth:`SiteAgent.stage`), and is queued when its
files have all arrived (:meth:`SiteAgent.staged`) unless it was withdrawn meanwhile;
:meth:`SiteAgent.accept` queues a job directly; both are idempotent by job id.
:meth:`SiteAgent.schedule` runs the local scheduler and turns each start into a command: an
ordinary job gets :class:`Launch` at once; a replica gets :class:`Claim` instead, its cores held
while the owner decides (:meth:`SiteAgent.claim_answered`). So a replica never runs unless its
owner granted it, and the owner grants one claim per job.

An ordinary job carries a **lease** (``lease_until``): it starts on its own only while the lease
is valid, and claims like a replica after. A lease alone cannot promise exactly-once (an owner
that never heard of a start made on a lease re-dispatches the job once it runs out), so a site
built with ``claim_every_start`` claims *every* start: the daemon does, and then no job starts
without the owner's journaled grant. The simulator, which models neither crashes nor
partitions, starts on leases. :meth:`SiteAgent.withdraw` is atomic with respect to starting: it
succeeds only for a job still waiting in the queue.

Deferred jobs (Sparrow's reservations, the federation's siblings) are queued without their files
and always claim; once granted they get :class:`Fetch`, then :class:`Launch` when the files are
in. A co-allocated job's component always claims and may be told to requeue. With a
malleability policy or an SD-Policy the site also resizes running malleable jobs
(:class:`Resized`), which the driver carries out; launches and resizes then carry the job's
``effective`` cores, the work rate the simulator runs it at (the daemon imposes no rate). The
claims and leases: docs/RESILIENCE.md; gangs: docs/COALLOCATION.md; resizes and SD-Policy:
docs/MALLEABILITY.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gbroker.core.events import Claim, Fetch, Launch, Resized, SiteCommand
from gbroker.core.localsched import LocalScheduler, QueuePolicy, ResizeJob
from gbroker.core.malleable import MalleabilityPolicy
from gbroker.core.model import Job, SiteState
from gbroker.core.sdpolicy import SdPolicy
from gbroker.errors import InvalidInput

__all__ = ["Claim", "Fetch", "Hosted", "Launch", "Resized", "SiteAgent", "SiteCommand"]


class Phase(StrEnum):
    QUEUED = "queued"
    CLAIMING = "claiming"
    FETCHING = "fetching"  # granted, its cores held, its input files on their way (deferred)
    RUNNING = "running"


@dataclass(slots=True)
class Hosted:
    job: Job
    owner: str
    replica: bool
    phase: Phase = Phase.QUEUED
    cores: int = 0
    lease_until: float = float("inf")
    effective: float | None = None  # its work rate in cores, when not ``cores`` (SD-Policy)
    deferred: bool = False  # queued without its input files: staged once its claim is granted


class SiteAgent:
    """A site's queue and cores, the jobs it hosts and whose they are."""

    def __init__(
        self,
        name: str,
        total_cores: int,
        policy: QueuePolicy | str = QueuePolicy.EASY,
        *,
        claim_every_start: bool = False,
        malleability: MalleabilityPolicy | None = None,
        sd_policy: SdPolicy | None = None,
    ) -> None:
        self.name = name
        self.claim_every_start = claim_every_start
        self.local = LocalScheduler(total_cores, policy, malleability, sd_policy)
        self.hosted: dict[str, Hosted] = {}
        self.staging: set[str] = set()  # dispatched here, input files on their way

    def stage(self, job_id: str) -> bool:
        """The job's input files are on their way here. False if the job is already here."""
        if job_id in self.hosted or job_id in self.staging:
            return False
        self.staging.add(job_id)
        return True

    def staged(
        self,
        job: Job,
        owner: str,
        replica: bool = False,
        lease_until: float = float("inf"),
        deferred: bool = False,
    ) -> bool:
        """Its files have arrived (or, ``deferred``, are not awaited): queue it. False if it
        was withdrawn while they travelled."""
        if job.id not in self.staging:
            return False
        self.staging.discard(job.id)
        return self.accept(job, owner, replica, lease_until, deferred)

    def abandon(self, job_id: str) -> bool:
        """Staging failed: forget the job. False if it had been withdrawn already."""
        if job_id not in self.staging:
            return False
        self.staging.discard(job_id)
        return True

    def accept(
        self,
        job: Job,
        owner: str,
        replica: bool = False,
        lease_until: float = float("inf"),
        deferred: bool = False,
    ) -> bool:
        """Queue a job whose files are here (``deferred``: whose files come only once its
        claim is granted). False if it is already hosted (a duplicate)."""
        if job.id in self.hosted:
            return False
        self.local.submit(job)
        self.hosted[job.id] = Hosted(
            job, owner, replica, lease_until=lease_until, deferred=deferred
        )
        return True

    def resume_running(self, job: Job, owner: str, cores: int, started_at: float) -> bool:
        """Take back a job that was running here before a restart, on its cores. False if
        the job is already hosted."""
        if job.id in self.hosted:
            return False
        self.local.resume(job, cores, started_at)
        self.hosted[job.id] = Hosted(job, owner, False, Phase.RUNNING, cores)
        return True

    def schedule(self, now: float) -> list[SiteCommand]:
        out: list[SiteCommand] = []
        for start in self.local.schedule(now):
            if isinstance(start, ResizeJob):
                hosted = self.hosted[start.job_id]
                hosted.cores, hosted.effective = start.cores, start.effective
                if hosted.phase is not Phase.RUNNING:
                    continue  # claiming or fetching: it launches on its new size
                out.append(
                    Resized(start.job_id, hosted.owner, start.old, start.cores, start.effective)
                )
                continue
            hosted = self.hosted[start.job.id]
            hosted.cores, hosted.effective = start.cores, start.effective
            if (
                self.claim_every_start
                or hosted.replica
                or hosted.deferred
                or hosted.job.gang is not None
                or now >= hosted.lease_until
            ):
                hosted.phase = Phase.CLAIMING
                out.append(Claim(start.job.id, hosted.owner))
            else:
                hosted.phase = Phase.RUNNING
                out.append(Launch(start.job, start.cores, hosted.owner, start.effective))
        return out

    def claim_answered(
        self, job_id: str, granted: bool, requeue: bool = False
    ) -> Launch | Fetch | None:
        """The owner's answer to a claim: launch (a deferred job: fetch its files first), or
        give the cores back and drop the job (or, with ``requeue``, put it back at the end of
        the queue: a co-allocated job's component whose mates did not all get their cores in
        time, KOALA's placement retried)."""
        hosted = self.hosted.get(job_id)
        if hosted is None or hosted.phase is not Phase.CLAIMING:
            return None
        if granted and hosted.deferred:
            hosted.phase = Phase.FETCHING
            return Fetch(hosted.job, hosted.cores, hosted.owner)
        if granted:
            hosted.phase = Phase.RUNNING
            return Launch(hosted.job, hosted.cores, hosted.owner, hosted.effective)
        self.local.finish(job_id)
        if requeue:
            self.local.submit(hosted.job)
            hosted.phase, hosted.cores, hosted.effective = Phase.QUEUED, 0, None
            return None
        del self.hosted[job_id]
        return None

    def fetched(self, job_id: str) -> Launch | None:
        """A granted deferred job's input files have all arrived: launch it (None if it is not
        fetching here)."""
        hosted = self.hosted.get(job_id)
        if hosted is None or hosted.phase is not Phase.FETCHING:
            return None
        hosted.phase = Phase.RUNNING
        return Launch(hosted.job, hosted.cores, hosted.owner, hosted.effective)

    def withdraw(self, job_id: str) -> bool:
        """Remove a job that has not started; False if it is claiming or running (or, on a
        site that starts on leases, unknown)."""
        if job_id in self.staging:
            self.staging.discard(job_id)
            return True
        hosted = self.hosted.get(job_id)
        if hosted is None:
            # Not here: withdrawn before (the owner asks again, having missed the answer),
            # denied, or not arrived yet. When every start needs the owner's grant, "withdrawn"
            # is safe in each case (a late copy can never start); otherwise it stays False.
            return self.claim_every_start
        if hosted.phase is not Phase.QUEUED:
            return False
        self.local.cancel(job_id)
        del self.hosted[job_id]
        return True

    def request(self, job_id: str, cores: int, now: float) -> Resized | None:
        """A running evolving job asks for ``cores`` cores (:meth:`LocalScheduler.request
        <gbroker.core.localsched.LocalScheduler.request>`): the change, or None."""
        return self._settled(job_id, cores, now, self.local.request)

    def took(self, job_id: str, cores: int, now: float) -> Resized | None:
        """A running malleable job took ``cores`` of an offer (:meth:`LocalScheduler.took
        <gbroker.core.localsched.LocalScheduler.took>`): the change, or None."""
        return self._settled(job_id, cores, now, self.local.took)

    def _settled(
        self,
        job_id: str,
        cores: int,
        now: float,
        how: Callable[[str, int, float], ResizeJob | None],
    ) -> Resized | None:
        hosted = self.hosted.get(job_id)
        if hosted is None or hosted.phase is not Phase.RUNNING:
            raise InvalidInput("job_id", f"a job running at site {self.name}", job_id)
        change = how(job_id, cores, now)
        if change is None:
            return None
        hosted.cores = change.cores
        return Resized(job_id, hosted.owner, change.old, change.cores)

    def finished(self, job_id: str) -> Hosted:
        """A running job ended: release its cores."""
        hosted = self.hosted.get(job_id)
        if hosted is None or hosted.phase is not Phase.RUNNING:
            raise InvalidInput("job_id", f"a job running at site {self.name}", job_id)
        self.local.finish(job_id)
        del self.hosted[job_id]
        return hosted

    def state(self) -> SiteState:
        return self.local.state()
