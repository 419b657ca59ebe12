"""A running job's saved state, as every back-end speaks of it (:mod:`gbroker.site.backend`).

Here, not in :mod:`.backend`, so that the back-ends themselves (which :mod:`.backend` imports) can
name these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Checkpoint", "CheckpointError"]


class CheckpointError(Exception):
    """A job could not be checkpointed or restored here; the message says why, for people. A
    job whose checkpoint failed runs on where it was (it is resumed)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A running job's saved state (:meth:`Backend.checkpoint`).

    Attributes:
        job_id: the job.
        kind: ``criu`` or ``application``.
        image: the directory the state was written to (self-describing: it holds what
            :meth:`Backend.restore` needs, the job directory it was taken from included).
        job_dir: the job's directory at the source (what is moved with the image).
        size: bytes of state in ``image``.
        frozen_for: seconds the job was stopped before the checkpoint was written (the dump).
        account: the uid and gid the job runs as (its directory is read as them, never as
            root: :func:`gbroker.site.bundles.pack`); None: the broker's own.
        ran_for: wall seconds the job ran at this site before it was frozen (from its start,
            or its restore, here).
        cpu_time: CPU seconds its processes used at this site (:mod:`gbroker.core.limits`).
    """

    job_id: str
    kind: str
    image: Path
    job_dir: Path
    size: int
    frozen_for: float
    account: tuple[int, int] | None = None
    ran_for: float = 0.0
    cpu_time: float = 0.0
