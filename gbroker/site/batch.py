"""What the batch-system back-ends share: the account a job is submitted as, a job as the queue
lists it, and a job as the back-end follows it (:mod:`.slurm`, whose follower :mod:`.gridengine`
reuses; the names are Slurm's)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from gbroker.site.backend import ExitCallback, ExitResult, RunningJob, StopReason
from gbroker.site.identity import LocalAccount

__all__ = ["BatchAccount", "BatchRun", "QueueRow"]


BatchAccount = LocalAccount
"""The account a job is submitted as: its user name, uid and gid (as every back-end's)."""


@dataclass(slots=True)
class QueueRow:
    """One job as ``squeue`` shows it."""

    slurm_id: int
    state: str
    started_at: float | None
    ended_at: float | None
    status: int
    reason: str
    comment: str


@dataclass(slots=True)
class BatchRun:
    """A job the back-end follows in the batch system, from its launch to its reported end."""

    job_id: str
    cores: int
    time_limit: float | None
    on_exit: ExitCallback
    token: str
    slurm_id: int | None = None
    started_at: float | None = None
    stopping: StopReason | None = None
    running: asyncio.Future[None] | None = None
    """For a start: done once Slurm runs the job (or it ended)."""
    returned: bool = True
    """:meth:`.slurm.SlurmBackend.start` has returned: its end may be reported."""
    result: ExitResult | None = None
    reported: bool = False
    missing: int = 0
    """Polls in a row that did not show the job."""
    stdout: Path | None = None
    timer: asyncio.TimerHandle | None = None
    held_since: float | None = None
    """Its release failed (monotonic time): it is released again at each poll."""
    releasing: bool = False
    release_error: str | None = None
    """The batch system would not release it in the back-end's patience: cancelled, with these
    words."""
    submitted_at: float = field(default_factory=time.time)

    def view(self) -> RunningJob:
        assert self.slurm_id is not None
        started = self.started_at if self.started_at is not None else self.submitted_at
        deadline = None if self.time_limit is None else started + self.time_limit
        return RunningJob(
            self.job_id, self.slurm_id, self.cores, started, deadline, self.stopping, self.token
        )
