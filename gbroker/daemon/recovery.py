"""Recovery: a restarted broker resumes from its journal before it serves (ARCHITECTURE §6).

Theory of operation. The journal holds each owned job's description, state and placements (each
written before the dispatch was sent; a grant before the claim was answered) and each hosted
job's phase, process group and unacknowledged end report. :func:`recover` rebuilds the driver's
core objects from them, in this order:

1. **Owned jobs**: a job with no placement is submitted again; a placed one is restored into the
   owner :class:`~gbroker.core.dispatch.Broker` with its placements and grant, and its ``accept``
   re-sent to every site that may still run it (sites accept idempotently).
2. **Hosted jobs**, running ones first so their cores are taken before the queue is considered:
   a running job's process group is adopted (:meth:`~gbroker.site.executor.Executor.adopt`);
   a launching one (its token journaled before its process could exist) is settled with
   :meth:`~gbroker.site.executor.Executor.settle_launch`: adopted if the launcher's record
   says it started, reported failed if it says the start failed, and otherwise re-queued (it
   never began, and now cannot), to claim its start again;
   a finished one's report is re-sent until acknowledged; a queued one is re-queued with a void
   lease, so it starts only if its owner grants a claim; one whose files were arriving is staged
   again.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import msgpack

from gbroker.core.dispatch import JobSubmitted
from gbroker.core.model import Job, JobClass
from gbroker.core.states import JobState
from gbroker.daemon.driver import Driver, Hosted, JobStatus
from gbroker.errors import GBrokerError, InternalError
from gbroker.jobs.mapping import from_mapping

__all__ = ["recover"]

log = logging.getLogger("gbroker.daemon")


async def recover(driver: Driver) -> None:
    """Resume from the journal: the jobs owned here, then the jobs hosted here."""
    journal, site = driver.journal, driver.site
    now = time.time()
    placements = await journal.placements()
    resubmit: list[Job] = []
    resend: list[tuple[Job, str, bool]] = []
    for row in await journal.unfinished():
        try:
            desc = from_mapping(msgpack.unpackb(row.spec), document=f"journaled job {row.id}")
            job = desc.to_job(row.id, site)
        except GBrokerError as exc:  # journaled by an older release, now refused: it fails
            log.error("%s: journaled job %s cannot be resumed: %s", site, row.id, exc)
            await journal.update(row.id, JobState.FAILED, now)
            continue
        driver.descriptions[row.id] = desc
        placed = placements.get(row.id, {})
        driver.own(
            JobStatus(
                row.id,
                row.state if placed else JobState.SUBMITTED,  # never placed: submitted again
                row.submitted_at,
                desc.name,
                site=row.site,
                started_at=row.started_at,  # the site's time, journaled (gbroker.daemon.history)
                submitter=row.submitter,
                used=row.used,  # what it used before its latest move, and since when it ran on
                moved_at=row.moved_at,
            )
        )
        if not placed:
            resubmit.append(job)
            continue
        if row.state is JobState.RUNNING:  # a malleable one may have been resized
            driver.jobs[row.id].allocations = await journal.allocations(row.id)
        granted = next((s for s, (_, g) in placed.items() if g), None)
        if row.state is JobState.RUNNING and granted is None:
            granted = row.site
        driver.broker.restore(
            job, row.submitted_at, {s: q for s, (q, _) in placed.items()}, granted, now
        )
        replica = len(placed) > 1
        resend.extend((job, s, replica) for s in placed if granted in (None, s))
    hosted = await journal.hosted()
    # Running jobs moving here from another site (gbroker.daemon.moving): their bundles.
    incoming = {row.job_id: row for row in await journal.moves("in")}
    moves = driver.moves
    # Running jobs first: their cores are taken before the queue is considered.
    for h in sorted(hosted, key=lambda h: h.phase not in ("running", "launching")):
        try:
            desc = from_mapping(msgpack.unpackb(h.spec), document=f"hosted job {h.job_id}")
            job = desc.to_job(h.job_id, h.owner)
        except GBrokerError as exc:  # as above; its owner hears nothing more of it from us
            log.error("%s: hosted job %s cannot be resumed: %s", site, h.job_id, exc)
            await journal.unhost(h.job_id)
            continue
        if h.phase == "launching" and h.token is not None:
            # Settle the write-ahead launch: it began (the launcher's record) or never will.
            record = await driver.executor.settle_launch(h.token)
            if record is None:  # never began: back in the queue, to claim its start again
                if job.id in incoming and moves is not None:  # to be restored, not started
                    image = moves.incoming(job.id)
                    if image is None:
                        raise InternalError(f"journal: {job.id} moves here but has no image")
                    moves.restoring[job.id] = image
                driver.agent.accept(job, h.owner, h.replica, lease_until=now)
                driver.hosted[job.id] = Hosted(
                    driver.stager.localize(desc), h.owner, h.submitter, h.used
                )
                await journal.hosted_phase(job.id, "queued", now)
                continue
            driver.launches[job.id] = h.token
            if record.pid is None:  # it began and failed: no program ran; tell the owner
                body = {"ok": False, "exit_code": None, "error": record.error, "at": now}
                driver.tasks.spawn(driver.finish_hosted(job.id, h.owner, **body), f"fail:{job.id}")
                continue
            h = dataclasses.replace(
                h, phase="running", pgid=record.pid, started_at=record.started_at
            )
        if h.phase == "running":
            if h.pgid is None or h.cores is None or h.started_at is None:
                raise InternalError(f"journal: running job {job.id} has no process on record")
            driver.agent.resume_running(job, h.owner, h.cores, h.started_at)
            driver.hosted[job.id] = Hosted(desc, h.owner, h.submitter, h.used)
            stream = driver.stager.stream_name
            driver.outputs[job.id] = (stream(desc, "stdout"), stream(desc, "stderr"))
            limit = float(desc.wall_time_limit) if desc.wall_time_limit else None
            # A job moved here keeps to what was left of its limit when it was restored.
            driver.executor.adopt(
                job.id,
                h.pgid,
                h.cores,
                h.started_at,
                limit,
                driver.exited,
                h.token,
                h.slots,
                used=h.used,
            )
            if job.id in incoming and moves is not None:  # restored before the restart
                await moves.restored(job.id)
            malleable = job.job_class is JobClass.MALLEABLE and driver.resizer is not None
            if malleable and driver.executor.running_job(job.id):
                assert driver.resizer is not None
                driver.resizer.follow(job.id)
        elif h.phase == "finished" and h.report is not None:
            report = msgpack.unpackb(h.report)
            driver.tasks.spawn(driver.deliver_report(h.owner, report), f"report:{job.id}")
        elif job.id in incoming and moves is not None and h.phase in ("queued", "staging"):
            # A running job moving here: restored once its bundle is here, unpacked.
            move, image = incoming[job.id], moves.incoming(job.id)
            there = Hosted(desc, h.owner, h.submitter, h.used)
            if h.phase == "queued" and image is not None:
                moves.restoring[job.id] = image
                driver.agent.accept(job, h.owner, h.replica, lease_until=now)
                driver.hosted[job.id] = there
            elif move.bundle and move.size is not None and driver.agent.stage(job.id):
                driver.tasks.spawn(
                    moves.move_in(job, there, move.source, move.bundle, move.size, 0.0),
                    f"move-in:{job.id}",
                )
        elif h.phase == "queued":
            # Its lease is void after a restart: it starts only if its owner still agrees.
            driver.agent.accept(job, h.owner, h.replica, lease_until=now)
            # Staged before the restart: its file systems' paths are made this site's again.
            driver.hosted[job.id] = Hosted(driver.stager.localize(desc), h.owner, h.submitter)
        elif h.phase == "staging" and driver.agent.stage(job.id):
            driver.tasks.spawn(
                driver.stage_then_queue(job, Hosted(desc, h.owner, h.submitter), h.replica, now),
                f"stage:{job.id}",
            )
    if driver.jobs or hosted:
        log.info(
            "%s: recovered %d owned and %d hosted jobs from the journal",
            site,
            len(driver.jobs),
            len(hosted),
        )
    for job, target, replica in resend:
        driver.tasks.spawn(driver.send_accept(job, target, replica), f"redispatch:{job.id}")
    for job in resubmit:
        try:
            driver.to_broker(JobSubmitted(job))
        except GBrokerError as exc:  # no site of the neighbourhood fits it any more
            failed = driver.set_state(job.id, JobState.FAILED, error=str(exc))
            driver.tasks.spawn(failed, f"fail:{job.id}")
    driver.kick()
