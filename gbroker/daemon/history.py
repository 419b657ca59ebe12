"""What an owner remembers of its finished jobs, and when it forgets them (ARCHITECTURE §6).

Theory of operation. An owner keeps its unfinished jobs in memory and every job in its journal
(:mod:`gbroker.daemon.journal`). A job that finished before the broker last started is not loaded
again (a broker may hold millions): the client API reads it from the journal when asked.

**True times.** A site reports when a job started and ended (``at`` in its reports: the
supervisor's own records). The owner records those times, never when it learned them: a report
may come late, after a restart of either side, or overtake another (a short job's ``finished``
may arrive before its ``started``). :func:`reported_time` bounds a reported time: a job neither
starts before it was submitted nor after the owner heard of it (a site's clock running ahead is
pulled back to the owner's). :func:`settled_start` keeps ``started_at <= ended_at``: when a start
learned late postdates the end, the start is the one in doubt, and is brought back to the end.

**Retention.** :class:`Retention` says how long finished jobs are kept: ``days`` after they ended
(at the owner) and at most ``jobs`` of them, oldest purged first; unfinished jobs are never
purged. :func:`purge_expired` purges in batches of ``batch`` jobs, each one small write through
the journal's writer, each followed by a pause as long as it took: submissions committed
meanwhile wait behind at most one batch, and the writer spends at most half its time purging.
:func:`keep_history` runs it every ``period`` seconds. A purged job is unknown: its id answers 404,
with a message that names the policy (:meth:`Retention.describe`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import overload

from gbroker.daemon.config import Retention
from gbroker.daemon.journal import Journal
from gbroker.errors import GBrokerError

__all__ = [
    "Retention",
    "keep_history",
    "purge_expired",
    "reported_time",
    "settled_start",
]

log = logging.getLogger("gbroker.daemon")

DAY = 86_400.0


def reported_time(at: float, submitted_at: float, now: float) -> float:
    """A time a site reported for a job, bounded by what the owner knows: not before the job
    was submitted, not after the owner heard of it (``now``)."""
    return min(max(at, submitted_at), max(now, submitted_at))


@overload
def settled_start(started_at: float, ended_at: float | None) -> float: ...
@overload
def settled_start(started_at: float | None, ended_at: float | None) -> float | None: ...
def settled_start(started_at: float | None, ended_at: float | None) -> float | None:
    """The start to record, given the end: never after it (see the module docstring)."""
    if started_at is None or ended_at is None:
        return started_at
    return min(started_at, ended_at)


async def purge_expired(
    journal: Journal,
    retention: Retention,
    now: float,
    forget: Callable[[Sequence[str]], None] = lambda ids: None,
) -> int:
    """Purge the finished jobs past ``retention`` as of ``now``, oldest first, ``batch`` at a
    time; ``forget`` hears each batch's ids once they are gone from the journal (the driver
    drops them from memory). Returns how many were purged."""
    before = now - retention.days * DAY
    excess = max(0, await journal.finished_count() - retention.jobs)
    purged = 0
    while True:
        oldest = await journal.oldest_finished(retention.batch)
        # Both conditions pick a prefix of the oldest: the union is the longer one.
        doomed = [job_id for n, (job_id, at) in enumerate(oldest) if n < excess or at < before]
        if not doomed:
            return purged
        began = time.perf_counter()
        await journal.purge(doomed)
        forget(doomed)
        purged += len(doomed)
        excess -= len(doomed)
        if len(doomed) < len(oldest):
            return purged
        # As long again before the next batch: the writer spends at most half its time purging
        # (each deleted row is a page written to the WAL, a few ms per batch).
        await asyncio.sleep(time.perf_counter() - began)


async def keep_history(
    journal: Journal,
    retention: Retention,
    forget: Callable[[Sequence[str]], None] = lambda ids: None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Purge expired jobs now and every ``retention.period`` seconds, until cancelled."""
    while True:
        began = time.perf_counter()
        try:
            purged = await purge_expired(journal, retention, clock(), forget)
        except GBrokerError as exc:  # the journal failed a write: try again next period
            log.error("journal %s: purge failed: %s", journal.path, exc)
            purged = 0
        if purged:
            log.info(
                "journal %s: purged %d finished jobs in %.2f s (%s)",
                journal.path,
                purged,
                time.perf_counter() - began,
                retention.describe(),
            )
        await asyncio.sleep(retention.period)
