"""The site's seam: what a broker asks of whatever runs its jobs (ARCHITECTURE §11).

Theory of operation. Everything above a site decides *where* a job runs; a **back-end** runs it
there. The driver (:mod:`gbroker.daemon.driver`) and recovery (:mod:`gbroker.daemon.recovery`)
talk to a back-end only through :class:`Backend`:

- :meth:`~Backend.start` a job (a :class:`~gbroker.site.executor.JobSpec`, always with a launch
  token the caller journaled first), hear how it ended through ``on_exit``, exactly once;
- after a restart, :meth:`~Backend.settle_launch` a journaled token: the back-end finds what it
  started under it (a launch record, a batch job's comment) and the caller
  :meth:`~Backend.adopt`\\ s it by its **handle** (a process group id for ``local``, the batch
  system's job id for ``slurm``), or learns that it never began and never will (the caller then
  queues the job again: exactly once);
- :meth:`~Backend.cancel` a job; :meth:`~Backend.running` and :meth:`~Backend.running_job` show
  what runs;
- :meth:`~Backend.capacity`: what the machine behind the site has free and queued, *all* its
  users included (None: the site's own scheduler is the whole truth, as for ``local``, whose
  cores only GBroker uses). DCSMon publishes the site's state with it laid over
  (:func:`seen_with`), so F(j) ranks a Slurm site by what Slurm can really give.

Back-ends: ``local`` (:class:`~gbroker.site.executor.Executor`: launchers, a cgroup and a uid per
job, resizes of malleable jobs), ``slurm`` (:class:`~gbroker.site.slurm.SlurmBackend`: sbatch,
squeue, scancel against a cluster's slurmctld) and ``gridengine``
(:class:`~gbroker.site.gridengine.GridEngineBackend`: qsub, qstat, qacct, qdel against a cell's
qmaster). A back-end that cannot resize a running job says
so (:attr:`Backend.resizes`); the driver then runs malleable jobs there at their start size.

Moving a running job (issue 27, Dynamite): a back-end that can (:attr:`Backend.checkpoints` not
empty) :meth:`~Backend.checkpoint`\\ s a running job into a directory and leaves it **frozen**
(not running, not ended, its cores still held); the caller then either :meth:`~Backend.resume`\\ s
it (the move was abandoned) or :meth:`~Backend.release`\\ s it (it runs elsewhere now: killed, its
``on_exit`` never called). Another site :meth:`~Backend.restore`\\ s the checkpoint like a
start: with a launch token journaled first, so that a restarted broker settles it exactly once
(:meth:`~Backend.settle_launch`). Two kinds: ``criu`` (a CRIU image of the job's process tree,
any program) and ``application`` (the job saves its own state through
:mod:`gbroker.app.malleable`'s hooks and is started again to restore it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gbroker.core.limits import NOTHING, Used
from gbroker.core.model import SiteState
from gbroker.errors import InvalidInput
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.executor import ExitCallback, JobSpec, LaunchRecord, RunningJob
from gbroker.site.safe_paths import Account

__all__ = ["MANAGERS", "Backend", "Capacity", "Checkpoint", "CheckpointError", "seen_with"]

MANAGERS = ("local", "slurm", "gridengine")
"""The back-ends a site may name (its topology's ``manager``, ``gbroker serve --manager``)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the machine behind a site reports, every user's work included.

    Attributes:
        total_cores: the cores it has (a batch system's CPUs in its partitions).
        free_cores: the cores idle now.
        queued: jobs waiting in its own queue that GBroker did not put there (the cluster's own
            users' load, which F(j)'s q_j should see).
        running: jobs running there that GBroker did not start.
    """

    total_cores: int
    free_cores: int
    queued: int = 0
    running: int = 0

    def __post_init__(self) -> None:
        for name in ("total_cores", "free_cores", "queued", "running"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"capacity.{name}", "an integer >= 0", value)


def seen_with(state: SiteState, capacity: Capacity | None) -> SiteState:
    """The site's own state (its scheduler's) as DCSMon reports it, the back-end's figures laid
    over: no more free cores than the machine has idle, and the others' queue and running jobs
    counted. None leaves the state as it is."""
    if capacity is None:
        return state
    free = min(state.free_cores, capacity.free_cores)
    shrinkable = min(state.shrinkable, state.total_cores - free)
    return SiteState(
        state.total_cores,
        free,
        state.queued + capacity.queued,
        state.running + capacity.running,
        draining=state.draining,
        shrinkable=shrinkable,
        shareable=min(state.shareable, state.total_cores - free - shrinkable),
        cpu=state.cpu,
    )


class Backend(Protocol):
    """What runs a site's jobs; see the module's docstring."""

    name: str
    """The back-end's manager name (:data:`MANAGERS`)."""
    root: Path
    """Where job directories live (:meth:`job_dir`)."""
    resizes: bool
    """Whether a running job's cores can change (malleable jobs)."""
    confinement: str
    """How jobs are confined, for people (the health report, ``fleet status``)."""

    def job_dir(self, job_id: str) -> Path:
        """The job's directory: where its inputs are staged and its outputs written."""
        ...

    def account_for(self, submitter: str) -> str | None:
        """The local account ``submitter``'s jobs run as (:attr:`JobSpec.user`); None: the
        site's default account."""
        ...

    def owner_for(self, submitter: str | None) -> Account:
        """The uid and gid ``submitter``'s jobs run as here (None: the site's default account):
        their directories' owner, whose rights the broker takes to touch what is in them
        (:mod:`gbroker.site.safe_paths`). Raises :class:`InvalidInput` as a start would."""
        ...

    async def start(self, spec: JobSpec, cores: int, on_exit: ExitCallback) -> None:
        """Start a job on ``cores`` cores; return once it runs or failed to start (the failure
        then goes to ``on_exit``). ``on_exit`` hears how it ended, exactly once."""
        ...

    checkpoints: tuple[str, ...]
    """The kinds of :class:`Checkpoint` it can take and restore (``()``: none, as at a batch
    system's site)."""

    async def checkpoint(self, job_id: str, into: Path) -> Checkpoint:
        """Freeze a running job and write its state into ``into`` (a new, empty directory);
        the job stays frozen, holding its cores, until :meth:`resume` or :meth:`release`.
        :class:`CheckpointError` if it cannot (the job then runs on)."""
        ...

    async def resume(self, job_id: str) -> None:
        """Let a frozen job run on where it is (its move was abandoned)."""
        ...

    async def release(self, job_id: str) -> None:
        """A frozen job runs elsewhere now: kill it here, quietly (its ``on_exit`` is not
        called), and free its cores."""
        ...

    async def restore(self, spec: JobSpec, image: Path, cores: int, on_exit: ExitCallback) -> None:
        """Start a job from a checkpoint's ``image``, its directory already in place at
        :meth:`job_dir`; as :meth:`start` otherwise (``spec`` carries the launch token)."""
        ...

    async def settle_launch(self, token: str, patience: float = 5.0) -> LaunchRecord | None:
        """After a restart: what began under ``token`` (its handle in ``pid``), or None if
        nothing did and nothing ever will."""
        ...

    def forget_launch(self, token: str) -> None:
        """The job's end was acknowledged: its launch's record may go."""
        ...

    def adopt(
        self,
        job_id: str,
        pgid: int,
        cores: int,
        started_at: float,
        time_limit: float | None,
        on_exit: ExitCallback,
        launch_token: str | None = None,
        slots: tuple[int, ...] = (),
        used: Used = NOTHING,
    ) -> None:
        """Take over a job an earlier broker started (``pgid``: its handle); ``used``: what a
        job moved here used before (:attr:`JobSpec.used`)."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Stop a running job; False if none runs under that id."""
        ...

    def running_job(self, job_id: str) -> RunningJob | None: ...

    def running(self) -> Mapping[str, RunningJob]: ...

    def capacity(self) -> Capacity | None:
        """The machine's own figures (None: the site's scheduler knows everything)."""
        ...

    @property
    def closed(self) -> bool: ...

    async def aclose(self, detach: bool = False) -> None:
        """Stop: the jobs with it, or (``detach``) leave them running for a successor."""
        ...
