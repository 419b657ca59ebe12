"""The domain model: jobs and site states (ARCHITECTURE §2).

A job asks for ``rank`` cores (the paper's r, its number of parallel branches). Rigid jobs run on
exactly ``rank``; moldable jobs get a size in ``[rank, max_rank]`` chosen at start; malleable jobs
may also grow and shrink within those bounds while running. ``requested_time`` is the user's
estimate of the run time on ``rank`` cores; we assume linear speed-up when a job gets more cores
(:meth:`Job.planned_time`), which is what the local scheduler plans with.

Every value validates itself on construction and names the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gbroker.core.malleable import Malleability, SizeKind
from gbroker.core.requirements import Requirements
from gbroker.errors import InvalidInput

__all__ = ["Gang", "InputFile", "Job", "JobClass", "Observation", "SiteState"]


class JobClass(StrEnum):
    """How a job's core count may change (KOALA's classification)."""

    RIGID = "rigid"
    MOLDABLE = "moldable"
    MALLEABLE = "malleable"


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input file l of size z_l bytes that lives at site h_l."""

    name: str
    size: int
    site: str

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("input_file.name", "a non-empty name", self.name)
        if self.size < 0:
            raise InvalidInput(f"input_file[{self.name}].size", "bytes >= 0", self.size)
        if not self.site:
            raise InvalidInput(f"input_file[{self.name}].site", "a site name", self.site)


@dataclass(frozen=True, slots=True)
class Gang:
    """A job's place in a co-allocated job: component ``index`` (from 0) of the
    ``size`` components of ``id``, placed at ``site``. Components start together or not at all:
    each claims its start and the owner grants every claim at once (:mod:`gbroker.core.dispatch`).
    """

    id: str
    size: int
    index: int
    site: str

    def __post_init__(self) -> None:
        if self.size < 1:
            raise InvalidInput("gang.size", "an integer >= 1", self.size)
        if not 0 <= self.index < self.size:
            raise InvalidInput("gang.index", f"from 0 to {self.size - 1}", self.index)
        if not self.site:
            raise InvalidInput("gang.site", "a site name", self.site)


@dataclass(frozen=True, slots=True)
class Job:
    """A parallel job as the schedulers see it.

    Attributes:
        id: globally unique job id.
        rank: r, the fewest cores the job runs on (all it asks for, when rigid).
        requested_time: estimated run time in seconds on ``rank`` cores; None when unknown.
        job_class: rigid, moldable or malleable.
        max_rank: the most cores it can use; equals ``rank`` for rigid jobs.
        input_files: files to stage to the executing site before it starts.
        malleability: what a malleable job declares beyond its bounds (the sizes it accepts,
            who may resize it, ...); None: any size, resized by the scheduler.
        requirements: what it needs of a site besides cores (:mod:`gbroker.core.requirements`);
            None: any site with enough cores fits.
        gang: set when the job is one component of a co-allocated job (:class:`Gang`).
    """

    id: str
    rank: int
    requested_time: float | None = None
    job_class: JobClass = JobClass.RIGID
    max_rank: int = 0
    input_files: tuple[InputFile, ...] = ()
    malleability: Malleability | None = None
    requirements: Requirements | None = None
    gang: Gang | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidInput("job.id", "a non-empty id", self.id)
        if self.rank < 1:
            raise InvalidInput(f"job[{self.id}].rank", "an integer >= 1", self.rank)
        if self.max_rank == 0:
            object.__setattr__(self, "max_rank", self.rank)
        elif self.max_rank < self.rank:
            raise InvalidInput(f"job[{self.id}].max_rank", f">= rank ({self.rank})", self.max_rank)
        if self.job_class is JobClass.RIGID and self.max_rank != self.rank:
            raise InvalidInput(
                f"job[{self.id}].max_rank", "equal to rank for a rigid job", self.max_rank
            )
        if self.requested_time is not None and not self.requested_time >= 0:
            raise InvalidInput(
                f"job[{self.id}].requested_time", "seconds >= 0 or None", self.requested_time
            )

    def planned_time(self, cores: int) -> float:
        """Planned run time on ``cores`` cores (linear speed-up); +inf when unknown."""
        if self.requested_time is None:
            return float("inf")
        if cores == self.rank:
            return self.requested_time
        return self.requested_time * self.rank / cores

    @property
    def shares_cores(self) -> bool:
        """Whether SD-Policy (:mod:`gbroker.core.sdpolicy`) may start it on cores that running
        mates give up, and shrink it to lend cores: a malleable job of any size whose size the
        scheduler may change (DROM's thread-level malleability; jobs that accept only some sizes
        are left to KOALA's policies)."""
        if self.job_class is not JobClass.MALLEABLE:
            return False
        declared = self.malleability
        return declared is None or (
            declared.scheduler_may_resize and declared.sizes.kind is SizeKind.ANY
        )


@dataclass(frozen=True, slots=True)
class SiteState:
    """What DCSMon reports about a site: n_j cores, c_j free, q_j queued, s_j running jobs.

    ``draining``: the site takes no new work (``gbroker fleet drain``); it is then no candidate
    in F(j) (:mod:`gbroker.core.ranking`), whatever its cores.
    ``shrinkable``: busy cores the site would free at once for a new job by shrinking its running
    malleable jobs (:mod:`gbroker.core.malleable`, PWA): F(j) counts them as free.
    ``shareable``: busy cores SD-Policy's mates would give at once to one new job that may share
    (:attr:`Job.shares_cores`; :mod:`gbroker.core.sdpolicy`): F(j) counts them as free for such a
    job only, since a rigid job cannot start on them (:meth:`for_job`).
    ``cpu``: the forecast fraction of a core a newly started process gets there (NWS's CPU
    availability, 0 < cpu <= 1: :mod:`netmon.cpu`, measured by DCSMon's sensor); None when
    it is not measured (a site that does not, or a peer that predates it).
    """

    total_cores: int
    free_cores: int
    queued: int = 0
    running: int = 0
    draining: bool = field(default=False, kw_only=True)
    shrinkable: int = field(default=0, kw_only=True)
    shareable: int = field(default=0, kw_only=True)
    cpu: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.total_cores < 1:
            raise InvalidInput("site.total_cores", "an integer >= 1", self.total_cores)
        if not 0 <= self.free_cores <= self.total_cores:
            raise InvalidInput(
                "site.free_cores",
                f"between 0 and total_cores ({self.total_cores})",
                self.free_cores,
            )
        if self.queued < 0:
            raise InvalidInput("site.queued", "an integer >= 0", self.queued)
        if self.running < 0:
            raise InvalidInput("site.running", "an integer >= 0", self.running)
        if not 0 <= self.shrinkable <= self.total_cores - self.free_cores:
            raise InvalidInput(
                "site.shrinkable",
                f"between 0 and the busy cores ({self.total_cores - self.free_cores})",
                self.shrinkable,
            )
        if not 0 <= self.shareable <= self.total_cores - self.free_cores - self.shrinkable:
            raise InvalidInput(
                "site.shareable",
                "between 0 and the busy cores not shrinkable "
                f"({self.total_cores - self.free_cores - self.shrinkable})",
                self.shareable,
            )
        cpu = self.cpu
        if cpu is not None and (
            isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0 < cpu <= 1
        ):
            raise InvalidInput("site.cpu", "a fraction of a core, 0 < cpu <= 1", cpu)

    @property
    def available(self) -> int:
        """c_j as F(j) sees it: the free cores, and those shrinking would free at once."""
        return self.free_cores + self.shrinkable

    def for_job(self, job: Job) -> SiteState:
        """The state as F(j) weighs it for ``job``: for a job that may share, the cores
        SD-Policy's mates would give count as shrinkable (c_j = free + shrinkable + shareable);
        for any other job, they are busy."""
        if not self.shareable:
            return self
        return SiteState(
            self.total_cores,
            self.free_cores,
            self.queued,
            self.running,
            draining=self.draining,
            shrinkable=self.shrinkable + self.shareable if job.shares_cores else self.shrinkable,
            cpu=self.cpu,
        )

    @property
    def load_per_core(self) -> float:
        """w_j = q_j / n_j."""
        return self.queued / self.total_cores


@dataclass(frozen=True, slots=True)
class Observation:
    """A site's state as sampled at ``observed_at`` (what DCSMon publishes)."""

    state: SiteState
    observed_at: float
