"""Draining a site: it stops taking new work, hands its queued jobs back, lets running ones end.

Theory of operation. An admin drains a site (``POST /api/v1/drain {"drain": true}``, what
``gbroker fleet drain`` sends) before taking it down for maintenance; ``{"drain": false}`` lifts
it. While a site drains:

- **It takes no new work.** The driver's ``draining`` flag marks the site's state
  (``SiteState.draining``), which DCSMon publishes at once, so every owner, this site's own
  broker included, leaves it out of F(j) (:mod:`gbroker.core.ranking`). A dispatch that crossed
  that news is refused with 503 (:class:`~gbroker.daemon.peers.Unavailable`); its owner places
  the job elsewhere (``DispatchRefused`` in the core). A repeated dispatch of a job already here
  is still answered yes: it is not new work.
- **Its queued jobs move.** :meth:`DrainControl.hand_back` reports each job waiting here (staged
  or queued, not claiming or running) to its owner as ``withdrawable``; the owner withdraws it
  and dispatches it to its best other site, as a migration does (``PlacementReleased``). A job
  that no other site fits stays and runs here. The report is repeated every
  :attr:`DrainControl.RESEND` seconds while the job is still here (an owner that was down hears
  it when it is back).
- **Running jobs finish**, and their end reports reach their owners; or, with ``{"migrate":
  true}`` (``gbroker fleet drain --migrate``), they **move** (:mod:`gbroker.daemon.moving`): each
  job running here is reported to its owner as ``movable`` (again every :attr:`DrainControl.RESEND`
  seconds while it stays), and the owner moves it, by checkpoint, to its best other site. A job
  whose move does not happen (no site fits it, its checkpoint failed) runs on and ends here.
  The site is *drained* when nothing is staging, queued, claiming or running here and no end
  report waits in the journal's outbox for an owner's acknowledgement: then it can be stopped
  without losing anything.

The flag survives a restart: it lives in ``<data_dir>/draining`` (JSON ``{"since": <time>}``),
written atomically and fsynced before the request is answered, read before the broker serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gbroker.core.names import job_owner
from gbroker.core.site import Phase
from gbroker.daemon.driver import Driver
from gbroker.daemon.guard import USER

__all__ = ["DRAIN_PATH", "DrainControl"]

log = logging.getLogger("gbroker.daemon")

DRAIN_PATH = "/api/v1/drain"


class DrainControl:
    """The drain of one site: its persisted flag, its progress, its hand-back loop, its route."""

    RESEND = 5.0  # seconds before a job still here is reported withdrawable again
    PERIOD = 0.5  # seconds between two looks at what is still here

    def __init__(self, driver: Driver, path: Path) -> None:
        self.driver = driver
        self.path = path
        self.since: float | None = None
        self.migrate = False  # running jobs move away too (gbroker fleet drain --migrate)
        self._wake = asyncio.Event()
        self._changing = asyncio.Lock()  # one change at a time: a file write awaits in between
        self._reported: dict[str, float] = {}  # job id -> when we last reported it withdrawable

    @property
    def draining(self) -> bool:
        return self.since is not None

    def load(self) -> None:
        """Take the flag back from a previous run (before serving)."""
        try:
            record = json.loads(self.path.read_text())
            since = float(record["since"])
            self.migrate = record.get("migrate") is True
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as exc:
            # A damaged file still says "draining": the safe reading for an operator's intent.
            log.warning("%s: %s unreadable (%s): draining anyway", self.driver.site, self.path, exc)
            since = time.time()
        self._apply(since)

    async def set(self, drain: bool, migrate: bool = False) -> None:
        """Start or lift the drain (``migrate``: running jobs move too); durable before it
        returns."""
        async with self._changing:
            await self._set(drain, migrate and drain)

    async def _set(self, drain: bool, migrate: bool) -> None:
        if drain == self.draining and migrate == self.migrate:
            return
        if drain:
            since = self.since or time.time()
            record = json.dumps({"since": since, "migrate": migrate})
            await asyncio.to_thread(_write_durably, self.path, record)
            self.migrate = migrate
            self._apply(since)
            log.warning(
                "%s: draining: no new work; queued jobs go back to their owners", self.driver.site
            )
        else:
            await asyncio.to_thread(_remove_durably, self.path)
            self.migrate = False
            self._apply(None)
            self._reported.clear()
            log.warning("%s: drain lifted: taking new work again", self.driver.site)

    def _apply(self, since: float | None) -> None:
        self.since = since
        self.driver.draining = since is not None
        self.driver.state_changed.set()  # DCSMon publishes the new state now
        self._wake.set()

    async def progress(self) -> dict[str, Any]:
        """What is still here: ``drained`` once nothing is and the drain is on."""
        agent = self.driver.agent
        phases = {phase: 0 for phase in Phase}
        for hosted in agent.hosted.values():
            phases[hosted.phase] += 1
        reporting = sum(1 for h in await self.driver.journal.hosted() if h.phase == "finished")
        left = {
            "staging": len(agent.staging),
            "queued": phases[Phase.QUEUED],
            "claiming": phases[Phase.CLAIMING],
            "running": phases[Phase.RUNNING],
            "reporting": reporting,
        }
        # Which jobs are here, in which phase: what `fleet drain` says it waits for.
        jobs = [{"id": j, "phase": "staging"} for j in sorted(agent.staging)]
        jobs += [{"id": j, "phase": str(h.phase)} for j, h in sorted(agent.hosted.items())]
        return {
            "site": self.driver.site,
            "draining": self.draining,
            "since": self.since,
            "drained": self.draining and not any(left.values()),
            "migrate": self.migrate,
            **left,
            "jobs": jobs,
        }

    def waiting(self) -> list[str]:
        """The jobs here to hand back: staging, or queued; with :attr:`migrate`, running too
        (unless a move of it is under way)."""
        agent = self.driver.agent
        queued = [j for j, h in agent.hosted.items() if h.phase is Phase.QUEUED]
        running: list[str] = []
        if self.migrate:
            moving = self.driver.moves.moving_out() if self.driver.moves is not None else set()
            running = [
                j for j, h in agent.hosted.items() if h.phase is Phase.RUNNING and j not in moving
            ]
        return sorted(agent.staging) + queued + running

    async def hand_back(self) -> None:
        """Run for the daemon's life: while draining, report the jobs waiting here withdrawable
        to their owners (again every RESEND seconds while they stay)."""
        while True:
            if not self.draining:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = time.time()
            waiting = self.waiting()
            for job_id in list(self._reported):
                if job_id not in waiting:
                    del self._reported[job_id]
            for job_id in waiting:
                if now - self._reported.get(job_id, -self.RESEND) >= self.RESEND:
                    self._reported[job_id] = now
                    self.driver.tasks.spawn(self._report(job_id), f"withdrawable:{job_id}")
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that lands
            # as the event is set, and this loop would then outlive the broker's shutdown.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.PERIOD):
                    await self._wake.wait()
            self._wake.clear()

    async def _report(self, job_id: str) -> None:
        owner = job_owner(job_id)
        hosted = self.driver.agent.hosted.get(job_id)
        running = hosted is not None and hosted.phase is Phase.RUNNING
        kind = "movable" if running else "withdrawable"
        body = {"id": job_id, "site": self.driver.site, "kind": kind, "at": time.time()}
        try:
            await self.driver.peers.call(owner, "/peer/v1/report", body)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            site = self.driver.site
            log.info("%s: owner %s not told %s is withdrawable: %s", site, owner, job_id, exc)

    # -- the client route (admins only to change it) ------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.get(DRAIN_PATH, self._get), web.post(DRAIN_PATH, self._post)]

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(await self.progress())

    async def _post(self, request: web.Request) -> web.Response:
        if not request[USER].admin:
            return web.json_response({"error": "drain: only an admin drains a site"}, status=403)
        try:
            document = await request.json()
        except ValueError:
            document = None
        drain = document.get("drain") if isinstance(document, dict) else None
        if not isinstance(drain, bool):
            return web.json_response(
                {"error": 'drain: expected a JSON object {"drain": true|false}', "field": "drain"},
                status=400,
            )
        assert isinstance(document, dict)
        migrate = document.get("migrate", False)
        if not isinstance(migrate, bool):
            return web.json_response(
                {"error": "migrate: expected true or false", "field": "migrate"}, status=400
            )
        await self.set(drain, migrate)
        return web.json_response(await self.progress())


def _write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: the new content or the old, never half, across a crash."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    temporary.replace(path)
    _sync_directory(path.parent)


def _remove_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
