"""Moving a running job from one site to another by checkpoint (Dynamite).

Theory of operation. Three brokers take part: the job's **owner** (which decides and holds the
one grant to run it), the **source** (the site that runs it) and the **target**. The owner's
core (:meth:`~gbroker.core.dispatch.Broker.begin_move` and after) keeps the invariant that one
site at a time holds the job's grant; every step is journaled (``moves``, one row per role)
before the next broker may hear of it, so that each of the three may be SIGKILLed at any step.

The steps: the owner journals the move (**asked**); the source freezes the job and writes its
checkpoint (**freezing**), packs image and job directory into one bundle named by its sha256
(**frozen**) and asks its owner ``moving`` until the verdict; the owner sends the target
``accept`` (**ready**); the target fetches and unpacks the bundle and claims, the claim passing
the grant from source to target; the target restores the job under a journaled launch token
(**restored**); the source, told ``release``, kills its frozen copy (**released**). A source
that cannot freeze, or a target that cannot restore, leaves the job running where it was:
the frozen copy resumes only on the owner's word, while the source holds the grant.

A job's wall-time and CPU-time limits travel with it (:mod:`gbroker.core.limits`): what it used
at the source is journaled at each broker with the move. Who decides: a user (``gbroker
migrate``), a draining site, or the owner itself with ``gbroker serve --migrate-running``
(:meth:`Mover.decide_every`, Dynamite's decider, :mod:`gbroker.core.dynamite`).

What each step journals and what a SIGKILL there ends with, the limits and the decider:
docs/MIGRATION.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gbroker.core.dynamite import (
    MigrationPolicy,
    RunningJob,
    SiteLoad,
    decide_migrations,
    remaining_estimate,
)
from gbroker.core.dynamite import Move as DecidedMove
from gbroker.core.limits import NOTHING, Used
from gbroker.core.model import Job
from gbroker.core.names import job_owner
from gbroker.core.site import Phase
from gbroker.core.states import JobState
from gbroker.daemon.driver import Driver, Hosted, JobStatus
from gbroker.daemon.guard import PEER
from gbroker.daemon.history import reported_time
from gbroker.daemon.peers import Forbidden, Unavailable
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.site import bundles
from gbroker.site.checkpoints import CheckpointError

__all__ = ["BUNDLE_PATH", "Mover"]

log = logging.getLogger("gbroker.daemon")

DEFAULT_IMAGE = 64 << 20
"""The image size the automatic decider assumes for a job that states no memory (bytes)."""

BUNDLE_PATH = "/peer/v1/bundle/{id}"
"""Where a source serves a moving job's bundle to its target (a signed peer route)."""


@dataclass(slots=True)
class _Out:
    """A move from this site: the job frozen here, its bundle ready once ``bundle`` is set."""

    target: str
    bundle: str | None = None
    size: int | None = None
    used: Used = NOTHING  # what the job used until it was frozen here, in all


class Mover:
    """The three roles of a move at one broker; see the module docstring."""

    ASK_EVERY = (0.1, 1.0)  # seconds between a source's questions to its owner: first, at most

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.root = driver.config.data_dir / "moves"
        self.out: dict[str, _Out] = {}  # source: job id -> its move
        self.restoring: dict[str, Path] = {}  # target: job id -> the image to restore
        self._sent: set[str] = set()  # owner: jobs whose target was sent its accept
        self.errors: dict[str, str] = {}  # owner: why a job's last move did not happen
        self.last_moved: dict[str, float] = {}  # owner: when the decider last moved each job
        config = driver.config
        self.max_bundle = config.max_upload if config.max_bundle is None else config.max_bundle
        self.carried: dict[str, Used] = {}  # owner: what each moving job used until it froze
        driver.moves = self
        driver.peers.local = driver.peer_handlers  # our own site's calls reach these too

    def handlers(self) -> dict[str, Any]:
        return {"/peer/v1/migrate": self._migrate, "/peer/v1/moving": self._moving}

    def routes(self) -> list[web.RouteDef]:
        return [web.get(BUNDLE_PATH, self._bundle)]

    def moving_out(self) -> set[str]:
        """The jobs moving from this site now."""
        return set(self.out)

    def directory(self, job_id: str) -> Path:
        return self.root / job_id

    # -- the owner ---------------------------------------------------------------------------

    def target_for(self, status: JobStatus) -> str:
        """The best site other than the one a job runs at (F(j), as a dispatch ranks them)."""
        driver = self.driver
        job = driver.broker.jobs[status.id].job
        left_out = []
        for verdict in driver.broker.explain(job, driver.decision_view, time.time()):
            if verdict.terms is not None and verdict.site != status.site:
                return verdict.site
            if verdict.site != status.site:
                left_out.append(f"{verdict.site}: {verdict.reason}")
        why = f": {'; '.join(left_out)}" if left_out else ""
        raise InvalidInput("to", f"a site the job could move to (none fits it now{why})", None)

    async def migrate(self, status: JobStatus, to: str | None) -> str:
        """Begin moving an owned running job (to ``to``, else the best other site); the
        target. :class:`InvalidInput` if it cannot move."""
        driver = self.driver
        if status.state is not JobState.RUNNING or status.site is None:
            raise InvalidInput("job", "a running job", status.state.value)
        target = to if to is not None else self.target_for(status)
        owned = driver.broker.jobs.get(status.id)
        if owned is not None and target != status.site:  # its requirements hold there
            verdicts = driver.broker.explain(owned.job, driver.decision_view, time.time())
            verdict = next((v for v in verdicts if v.site == target), None)
            if verdict is not None and verdict.terms is None:
                raise InvalidInput(
                    "to", "a site that can take the job", f"{target}: {verdict.reason}"
                )
        source = driver.broker.begin_move(status.id, target)
        self.errors.pop(status.id, None)
        # Durable before the source hears of it: a restarted owner knows a move is under way.
        await driver.journal.move(status.id, "owner", source, target, "asked", time.time())
        driver.tasks.spawn(self._ask_source(status.id, source, target), f"migrate:{status.id}")
        return target

    async def _ask_source(self, job_id: str, source: str, target: str) -> None:
        answer = await self.driver.peers.call_until_answered(
            source, "/peer/v1/migrate", {"id": job_id, "to": target}
        )
        if answer is None or not answer.get("ok"):
            await self._abandon(job_id, f"{source} could not begin the move")

    async def _moving(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        """The source's word that the job is frozen and its bundle ready; the verdict."""
        driver = self.driver
        job_id, source, target = body["id"], body["site"], body["to"]
        if sender != source:
            raise Forbidden(f"{sender} cannot speak for {source}")
        if job_owner(job_id) != driver.site:
            raise Forbidden(f"{driver.site} does not own {job_id}")
        used = Used.from_mapping(body["used"]) if "used" in body else NOTHING
        if driver.broker.move_ready(job_id, source, target):
            move = driver.broker.moving_of(job_id)
            if job_id not in self._sent and move is not None and move.ready:
                self._sent.add(job_id)
                self.carried[job_id] = used
                await driver.journal.move(
                    job_id,
                    "owner",
                    source,
                    target,
                    "ready",
                    time.time(),
                    body["bundle"],
                    body["bundle_size"],
                    used,
                )
                driver.tasks.spawn(
                    self._send_to_target(
                        job_id, source, target, body["bundle"], body["bundle_size"], used
                    ),
                    f"move-accept:{job_id}",
                )
        return {"verdict": driver.broker.move_verdict(job_id, source)}

    async def _send_to_target(
        self, job_id: str, source: str, target: str, bundle: str, size: int, used: Used
    ) -> None:
        """The target's ``accept`` of the moving job (with what it ``used`` until it froze),
        sent until it answers (while the move is still on); a refusal abandons the move."""
        driver = self.driver
        body = {
            "id": job_id,
            "owner": driver.site,
            "replica": False,
            "lease": driver.config.lease,
            "description": driver.description_of(job_id),
            "submitter": driver.jobs[job_id].submitter,
            "restore_from": source,
            "bundle": bundle,
            "bundle_size": size,
            "used": used.as_mapping(),
        }
        backoff = 0.2
        while driver.broker.moving_of(job_id) is not None:
            try:
                await driver.peers.call(target, "/peer/v1/accept", body)
                return
            except (Unavailable, Forbidden, InvalidInput) as exc:
                await self._abandon(job_id, f"{target} did not take it: {exc}")
                return
            except aiohttp.ClientResponseError as exc:
                if 400 <= exc.status < 500 or exc.status == 503:
                    await self._abandon(job_id, f"{target} did not take it: {exc.message}")
                    return
                error: Exception = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                error = exc
            log.warning("%s: %s's move to %s: %s; again", driver.site, job_id, target, error)
            await driver.peers.pause(target, backoff)
            backoff = min(backoff * 2, 5.0)

    async def _abandon(self, job_id: str, why: str, target_said: bool = False) -> None:
        """The move is off; the job's grant is its source's again (which then resumes it).
        Once the target holds the grant, only its own word (``target_said``: it never ran the
        job) calls the move off: it may be restoring it."""
        driver = self.driver
        move = driver.broker.moving_of(job_id)
        owned = driver.broker.jobs.get(job_id)
        if move is None or owned is None:
            return
        if owned.granted != move.source and not target_said:
            return
        driver.broker.abandon_move(job_id)
        await self.given_up(job_id, move.source, move.target, why)
        if move.ready:  # the target may hold it, not started: drop it
            driver.tasks.spawn(self._withdraw(job_id, move.target), f"withdraw:{job_id}")

    async def given_up(self, job_id: str, source: str, target: str, why: str) -> None:
        """The owner's core called a move off (the grant is the source's again): say why,
        journal it (the source hears ``resume`` when it asks next)."""
        driver = self.driver
        self._sent.discard(job_id)
        self.carried.pop(job_id, None)
        driver.metrics.moves.labels("off").inc()
        self.errors[job_id] = why[:500]
        log.warning("%s: the move of %s to %s is off: %s", driver.site, job_id, target, why)
        await driver.journal.move_abandoned(job_id, source, target)

    async def _withdraw(self, job_id: str, target: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, GBrokerError):
            await self.driver.peers.call(target, "/peer/v1/withdraw", {"id": job_id})

    async def report(self, kind: str, body: dict[str, Any], status: JobStatus) -> bool:
        """The owner's side of a site's move report (``unmoved``, ``unrestored``, ``movable``);
        whether ``kind`` was one."""
        driver = self.driver
        job_id, site = body["id"], body["site"]
        move = driver.broker.moving_of(job_id)
        if kind == "unmoved":
            if move is not None and move.source == site:
                await self._abandon(job_id, body.get("error") or f"{site} could not checkpoint it")
            return True
        if kind == "unrestored":
            if move is not None and move.target == site:
                why = body.get("error") or f"{site} could not restore it"
                await self._abandon(job_id, why, target_said=True)
            return True
        if kind == "movable":  # a draining site asks us to move its running job
            if move is None and status.site == site and status.state is JobState.RUNNING:
                try:
                    await self.migrate(status, None)
                except InvalidInput as exc:
                    log.info("%s: %s stays at draining %s: %s", driver.site, job_id, site, exc)
                    # Its status says why (`gbroker fleet drain --migrate` shows it).
                    self.errors[job_id] = f"not moved off draining {site}: {exc}"[:500]
            return True
        return False

    async def started_at_target(self, job_id: str, site: str, at: float) -> None:
        """The target started (restored) the job at ``at`` (its time): the move is over for
        the owner, which records what the job used before (``gbroker status`` shows it)."""
        driver = self.driver
        self._sent.discard(job_id)
        driver.metrics.moves.labels("moved").inc()
        used = self.carried.pop(job_id, None)
        status = driver.jobs.get(job_id)
        if used is not None and used.moves and status is not None:
            status.used = used
            status.moved_at = reported_time(at, status.submitted_at, time.time())
            await driver.journal.moved(job_id, used, status.moved_at)
        await driver.journal.move_done(job_id, "owner")

    async def decide_every(self, policy: MigrationPolicy) -> None:
        """Run for the daemon's life: Dynamite's decider every ``policy.interval`` seconds
        over this owner's running jobs (see the module docstring)."""
        while True:
            await asyncio.sleep(policy.interval)
            for move in self.decide(policy, time.time()):
                status = self.driver.jobs.get(move.job_id)
                if status is None:
                    continue
                try:
                    await self.migrate(status, move.target)
                except InvalidInput as exc:
                    log.info("%s: %s stays: %s", self.driver.site, move.job_id, exc)
                    continue
                self.last_moved[move.job_id] = time.time()
                log.info(
                    "%s: moving %s from %s to %s (saves %.0f s, costs %.0f s)",
                    self.driver.site,
                    move.job_id,
                    move.source,
                    move.target,
                    move.saving,
                    move.cost,
                )

    def decide(self, policy: MigrationPolicy, now: float) -> list[DecidedMove]:
        """One decision of Dynamite's rule over the neighbourhood as this owner sees it."""
        driver = self.driver
        topology = driver.config.topology
        sites = []
        for name in (driver.site, *topology.neighbours(driver.site)):
            seen = driver.decision_view.get(name)
            if seen is not None and name not in driver.lost:
                sites.append(SiteLoad(name, seen.state, topology.sites[name].speed))
        known = {load.site for load in sites}
        running = []
        for job_id, status in driver.jobs.items():
            owned = driver.broker.jobs.get(job_id)
            if (
                status.state is not JobState.RUNNING
                or owned is None
                or owned.moving is not None
                or status.site not in known
                or status.started_at is None
            ):
                continue
            desc = driver.descriptions.get(job_id)
            if desc is None:
                continue
            speed = topology.sites[status.site].speed
            remaining = remaining_estimate(
                desc.wall_time_limit, (now - status.started_at) * speed, speed
            )
            if remaining is None:
                continue
            needs = owned.job.requirements
            memory = None if needs is None else (needs.total_memory or needs.individual_memory)
            running.append(
                RunningJob(
                    job_id,
                    status.site,
                    owned.job.rank,
                    status.started_at,
                    remaining,
                    memory or DEFAULT_IMAGE,
                    self.last_moved.get(job_id),
                )
            )
        return decide_migrations(policy, sites, running, driver.broker.forecast, now)

    # -- the source --------------------------------------------------------------------------

    async def _migrate(self, body: dict[str, Any], sender: str) -> dict[str, Any]:
        """The owner asks us to move a job running here."""
        driver = self.driver
        job_id, target = body["id"], body["to"]
        if job_owner(job_id) != sender:
            raise Forbidden(f"{sender} does not own {job_id}")
        if job_id in self.out:
            return {"ok": self.out[job_id].target == target}  # a repeat
        if driver.executor.running_job(job_id) is None or job_id not in driver.hosted:
            return {"ok": False}
        self.out[job_id] = _Out(target)
        await driver.journal.move(job_id, "out", driver.site, target, "freezing", time.time())
        driver.tasks.spawn(self._move_out(job_id, target), f"move-out:{job_id}")
        return {"ok": True}

    async def _move_out(self, job_id: str, target: str) -> None:
        driver = self.driver
        directory = self.directory(job_id)
        await asyncio.to_thread(shutil.rmtree, directory, True)
        directory.mkdir(parents=True, mode=0o700)
        (directory / bundles.IMAGE).mkdir(mode=0o700)
        hosted = driver.hosted.get(job_id)
        try:
            began = time.monotonic()
            checkpoint = await driver.executor.checkpoint(job_id, directory / bundles.IMAGE)
            dumped = time.monotonic()
            bundle, size = await bundles.pack(
                directory / "bundle.tar",
                checkpoint.image,
                checkpoint.job_dir,
                checkpoint.account,
                self.max_bundle,
            )
            driver.metrics.move_step("checkpoint", dumped - began)
            driver.metrics.move_step("bundle", time.monotonic() - dumped)
        except (CheckpointError, OSError, bundles.BundleError) as exc:
            step = "checkpoint"
            if not isinstance(exc, CheckpointError):  # the bundle failed: the job runs on
                step = "bundle"
                with contextlib.suppress(CheckpointError):
                    await driver.executor.resume(job_id)
            await self._unmoved(job_id, f"{driver.site} could not {step} it: {exc}")
            return
        # What it used here, and before it came: it gets what is left of its limits there.
        before = NOTHING if hosted is None else hosted.used
        used = before.then(checkpoint.ran_for, checkpoint.cpu_time)
        await driver.journal.move(
            job_id, "out", driver.site, target, "frozen", time.time(), bundle, size, used
        )
        self.out[job_id] = _Out(target, bundle, size, used)
        log.info(
            "%s: %s frozen for its move to %s (%d bytes; frozen %.2f s; ran %.1f s, %.1f s of"
            " CPU, here)",
            driver.site,
            job_id,
            target,
            size,
            checkpoint.frozen_for,
            checkpoint.ran_for,
            checkpoint.cpu_time,
        )
        await self._until_verdict(job_id)

    async def _unmoved(self, job_id: str, why: str) -> None:
        driver = self.driver
        self.out.pop(job_id, None)
        await driver.journal.move_done(job_id, "out")
        await asyncio.to_thread(shutil.rmtree, self.directory(job_id), True)
        owner = job_owner(job_id)
        body = {"id": job_id, "site": driver.site, "kind": "unmoved", "at": time.time()}
        await driver.peers.call_until_answered(
            owner, "/peer/v1/report", {**body, "error": why[:2000]}
        )

    async def _until_verdict(self, job_id: str) -> None:
        """Ask the owner until it says what becomes of the frozen copy; do it."""
        driver = self.driver
        move = self.out[job_id]
        body = {
            "id": job_id,
            "site": driver.site,
            "to": move.target,
            "bundle": move.bundle,
            "bundle_size": move.size,
            "used": move.used.as_mapping(),
        }
        pause, most = self.ASK_EVERY
        while True:
            answer = await driver.peers.call_until_answered(
                job_owner(job_id), "/peer/v1/moving", body
            )
            verdict = "wait" if answer is None else answer["verdict"]
            if verdict != "wait":
                break
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, most)
        if verdict == "resume":
            with contextlib.suppress(CheckpointError):
                await driver.executor.resume(job_id)
            log.info("%s: %s resumed here (its move is off)", driver.site, job_id)
        else:
            with contextlib.suppress(CheckpointError):
                await driver.executor.release(job_id)
            driver.forget_moved(job_id)
            log.info("%s: %s released (it runs at %s now)", driver.site, job_id, move.target)
        self.out.pop(job_id, None)
        await driver.journal.move_done(job_id, "out")
        await asyncio.to_thread(shutil.rmtree, self.directory(job_id), True)

    async def _bundle(self, request: web.Request) -> web.StreamResponse:
        """A moving job's bundle, for its target only."""
        job_id = request.match_info["id"]
        move = self.out.get(job_id)
        if move is None or move.bundle is None:
            return web.json_response({"error": f"no bundle of {job_id} here"}, status=404)
        if request[PEER] != move.target:
            return web.json_response(
                {"error": f"{request[PEER]} is not where {job_id} moves"}, status=403
            )
        self.driver.metrics.move_bytes.inc(move.size or 0)
        return web.FileResponse(self.directory(job_id) / "bundle.tar")

    # -- the target --------------------------------------------------------------------------

    async def accept(
        self, body: dict[str, Any], job: Job, hosted: Hosted, spec: bytes, lease: float
    ) -> None:
        """A running job moves here: journal it, fetch its bundle, queue it to be restored
        (it claims its start as any job does). 503 unless it can start at once."""
        driver = self.driver
        local = driver.agent.local
        if driver.draining:
            raise Unavailable(f"site {driver.site} is draining: it takes no new work")
        if body["bundle_size"] > self.max_bundle:
            raise InvalidInput(
                "bundle_size",
                f"at most {self.max_bundle} bytes (site {driver.site}'s bundle cap)",
                body["bundle_size"],
            )
        if local.free_cores < job.rank or local.state().queued:
            raise Unavailable(f"site {driver.site} cannot restore {job.id} at once")
        source = body["restore_from"]
        if "used" in body:  # it gets what is left of its limits here
            hosted = dataclasses.replace(hosted, used=Used.from_mapping(body["used"]))
        if not await driver.journal.host_moving(
            job.id,
            body["owner"],
            spec,
            time.time(),
            body.get("submitter"),
            source,
            driver.site,
            body["bundle"],
            body["bundle_size"],
            hosted.used,
        ):
            return  # a repeat
        if driver.agent.stage(job.id):
            driver.tasks.spawn(
                self.move_in(job, hosted, source, body["bundle"], body["bundle_size"], lease),
                f"move-in:{job.id}",
            )

    async def move_in(
        self, job: Job, hosted: Hosted, source: str, bundle: str, size: int, lease: float
    ) -> None:
        """Fetch and unpack a moving job's bundle, then queue it to be restored."""
        driver = self.driver
        directory = self.directory(job.id)
        try:
            await asyncio.to_thread(shutil.rmtree, directory, True)
            directory.mkdir(parents=True, mode=0o700)
            began = time.monotonic()
            await self._fetch(job.id, source, bundle, size, directory / "bundle.tar")
            fetched = time.monotonic()
            # Into root's own directory, never the job's: the executor gives the job's
            # directory to its account here and moves it into place at the restore.
            image = await asyncio.to_thread(
                bundles.unpack, directory / "bundle.tar", directory, self.max_bundle
            )
            (directory / "bundle.tar").unlink()
            driver.metrics.move_step("transfer", fetched - began)
            driver.metrics.move_step("unpack", time.monotonic() - fetched)
        except (
            GBrokerError,
            OSError,
            aiohttp.ClientError,
            TimeoutError,
            tarfile.TarError,
            bundles.BundleError,
        ) as exc:
            await self.unrestored(job.id, hosted, f"the bundle did not arrive whole: {exc}")
            return
        self.restoring[job.id] = image
        if not driver.agent.staged(job, hosted.owner, False, time.time() + lease):
            return  # withdrawn meanwhile (the move was abandoned)
        driver.hosted[job.id] = hosted
        await driver.journal.hosted_phase(job.id, "queued", time.time())
        driver.kick()

    async def _fetch(self, job_id: str, source: str, bundle: str, size: int, into: Path) -> None:
        driver = self.driver
        url = driver.peers.peers[source] + BUNDLE_PATH.format(id=job_id)
        assert driver.peers.session is not None
        digest = hashlib.sha256()
        got = 0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
        async with driver.peers.session.get(
            url, headers=driver.peers.headers("GET", url), timeout=timeout
        ) as response:
            response.raise_for_status()
            with into.open("wb") as out:
                async for chunk in response.content.iter_chunked(1 << 20):
                    got += len(chunk)
                    if got > size:
                        raise InvalidInput("bundle", f"{size} bytes", f"more than {size}")
                    digest.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
        if got != size or digest.hexdigest() != bundle:
            raise InvalidInput("bundle", f"{size} bytes of sha256 {bundle}", f"{got} bytes")

    async def unrestored(self, job_id: str, hosted: Hosted, why: str) -> None:
        """The job could not be restored here (it never ran here): tell its owner, forget it."""
        driver = self.driver
        log.warning("%s: %s not restored: %s", driver.site, job_id, why)
        self.restoring.pop(job_id, None)
        if not driver.agent.abandon(job_id):  # its bundle arrived: it was queued, or launched
            held = driver.agent.hosted.get(job_id)
            if held is not None and held.phase is Phase.RUNNING:
                driver.agent.finished(job_id)
            elif held is not None:
                driver.agent.withdraw(job_id)
        driver.hosted.pop(job_id, None)
        await driver.journal.unhost(job_id)
        await driver.journal.move_done(job_id, "in")
        await asyncio.to_thread(shutil.rmtree, self.directory(job_id), True)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(shutil.rmtree, driver.executor.job_dir(job_id), True)
        body = {"id": job_id, "site": driver.site, "kind": "unrestored", "at": time.time()}
        await driver.peers.call_until_answered(
            hosted.owner, "/peer/v1/report", {**body, "error": why[:2000]}
        )
        driver.kick()

    async def withdrawn(self, job_id: str) -> None:
        """Its owner withdrew a job moving here (the move is off)."""
        self.restoring.pop(job_id, None)
        await self.driver.journal.move_done(job_id, "in")
        await asyncio.to_thread(shutil.rmtree, self.directory(job_id), True)

    def incoming(self, job_id: str) -> Path | None:
        """After a restart: the unpacked image of a job moving here, if it arrived."""
        image = self.directory(job_id) / bundles.IMAGE
        return image if image.is_dir() else None

    async def restored(self, job_id: str) -> None:
        """The job runs here now: the target's part is over."""
        image = self.restoring.pop(job_id, None)
        await self.driver.journal.move_done(job_id, "in")
        if image is not None:
            await asyncio.to_thread(shutil.rmtree, image.parent, True)

    # -- after a restart ---------------------------------------------------------------------

    async def recover(self) -> None:
        """Take the moves under way back from the journal (after :func:`recover`)."""
        driver = self.driver
        journal = driver.journal
        for row in await journal.moves("owner"):
            owned = driver.broker.jobs.get(row.job_id)
            if owned is None:
                await journal.move_done(row.job_id, "owner")
                continue
            ready = row.phase == "ready"
            driver.broker.restore_move(row.job_id, row.source, row.target, ready)
            if ready:
                self.carried[row.job_id] = row.used
            if driver.broker.moving_of(row.job_id) is None:
                await journal.move_done(row.job_id, "owner")
            elif not ready:  # the source may not have heard: ask it again
                driver.tasks.spawn(
                    self._ask_source(row.job_id, row.source, row.target),
                    f"migrate:{row.job_id}",
                )
            elif row.bundle is not None and row.size is not None and owned.granted == row.source:
                self._sent.add(row.job_id)
                driver.tasks.spawn(
                    self._send_to_target(
                        row.job_id, row.source, row.target, row.bundle, row.size, row.used
                    ),
                    f"move-accept:{row.job_id}",
                )
        for row in await journal.moves("out"):
            if row.job_id not in driver.hosted or driver.executor.running_job(row.job_id) is None:
                await journal.move_done(row.job_id, "out")
                continue
            if row.phase == "freezing":  # the checkpoint may be half done: the job runs on
                with contextlib.suppress(CheckpointError):
                    await driver.executor.resume(row.job_id)
                driver.tasks.spawn(
                    self._unmoved(row.job_id, f"{driver.site} restarted while it froze the job"),
                    f"unmoved:{row.job_id}",
                )
                continue
            self.out[row.job_id] = _Out(row.target, row.bundle, row.size, row.used)
            driver.tasks.spawn(self._until_verdict(row.job_id), f"move-out:{row.job_id}")
