"""The client API (JSON over HTTP, ``/api/v1``) and what a broker shows an operator.

Theory of operation. A user may talk to any broker. Submitting makes that broker the job's
owner (:meth:`~gbroker.daemon.driver.Driver.submit`; answered 201 only once the job is durable).
Every other request names a job, and a job id names its owner (``<site>.<n>``): a broker answers
for its own jobs and forwards requests about another broker's jobs to it, so a client needs to
know one broker only. A job's output lives at the site that ran it; the owner fetches it from
there over the peer API.

Beside the jobs: ``/api/v1/info`` and the status page at ``/`` (the site's facts,
:mod:`gbroker.daemon.metrics`), ``/metrics`` (Prometheus), and DCSMon's sample of the site at
:data:`~dcsmon.service.STATE_PATH` (what a standalone ``gbroker dcsmon serve`` reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from dcsmon.service import STATE_PATH, state_document
from gbroker.auth import User
from gbroker.core.model import Observation
from gbroker.daemon.driver import Driver, JobStatus
from gbroker.daemon.files import bad_request, open_inside
from gbroker.daemon.guard import PEER, USER
from gbroker.daemon.metrics import CONTENT_TYPE, describe, status_page
from gbroker.daemon.peers import PeerClient
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.jsdl import loads_job_description
from gbroker.names import check_job_id, job_owner

__all__ = ["ClientApi"]


class ClientApi:
    """The client routes of one broker; ``url()`` is where it serves (for ``/api/v1/info``)."""

    def __init__(
        self,
        driver: Driver,
        peers: PeerClient,
        url: Callable[[], str],
        health: Callable[[], dict[str, Any]],
    ) -> None:
        self.driver = driver
        self.peers = peers
        self.url = url
        self.health = health

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/info", self._info),
            web.get("/metrics", self._metrics),
            web.get("/", self._status_page),
            web.get("/status", self._status_page),
            web.get(STATE_PATH, self._state),
            web.post("/api/v1/jobs", self._submit),
            web.get("/api/v1/jobs", self._list),
            web.get("/api/v1/jobs/{id}", self._status),
            web.delete("/api/v1/jobs/{id}", self._cancel),
            web.get("/api/v1/jobs/{id}/wait", self._wait),
            web.get("/api/v1/jobs/{id}/output/{stream}", self._output),
            web.get("/peer/v1/output/{id}/{stream}", self._peer_output),
        ]

    # -- the site ------------------------------------------------------------------------------

    def _describe(self, user: User) -> dict[str, Any]:
        """The site's facts, with the jobs ``user`` may see, and its health."""
        driver = self.driver
        neighbours = driver.config.topology.neighbours(driver.site)
        state = driver.site_state()
        jobs = [s for s in driver.jobs.values() if user.may_see(s.submitter)]
        info = describe(driver.site, self.url(), state, neighbours, driver.view, jobs, time.time())
        info["draining"] = state.draining
        info["health"] = self.health()
        return info

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self._describe(request[USER]))

    async def _status_page(self, request: web.Request) -> web.Response:
        page = status_page(self._describe(request[USER]))
        return web.Response(text=page, content_type="text/html")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.driver.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _state(self, request: web.Request) -> web.Response:
        """DCSMon's sample of this site: what a standalone ``gbroker dcsmon serve`` reads."""
        observation = Observation(self.driver.site_state(), time.time())
        return web.json_response(state_document(self.driver.site, observation))

    # -- jobs ----------------------------------------------------------------------------------

    async def _submit(self, request: web.Request) -> web.Response:
        began = time.perf_counter()
        metrics = self.driver.metrics
        metrics.submission_received()
        raw = await request.read()
        user = request[USER]
        try:
            desc = loads_job_description(raw)
            self.driver.stager.check(desc)  # sources we would never fetch: refused now
            job_id = await self.driver.submit(desc, user.name)
        except GBrokerError as exc:
            return bad_request(exc)
        metrics.submission_accepted(time.perf_counter() - began)
        return web.json_response({"id": job_id, "owner": self.driver.site}, status=201)

    async def _list(self, request: web.Request) -> web.Response:
        """The caller's jobs; every user's with ``?all=1`` (admins only)."""
        user = request[USER]
        everyone = request.query.get("all", "0") not in ("0", "", "false")
        if everyone and not user.admin:
            return web.json_response(
                {"error": "all: only an admin lists every user's jobs"}, status=403
            )
        jobs = self.driver.jobs.values()
        shown = jobs if everyone else (s for s in jobs if s.submitter == user.name)
        return web.json_response({"jobs": [s.as_dict() for s in shown]})

    def _job_id(self, request: web.Request) -> str:
        """The job id of the request's path, checked before anything is done with it."""
        sites = self.driver.config.topology.sites
        return check_job_id(request.match_info["id"], field="job id", known_sites=sites)

    async def _forward(self, request: web.Request, job_id: str) -> web.StreamResponse:
        """The owner's answer about its job, asked with the caller's own token."""
        base = self.peers.peers.get(job_owner(job_id))
        if base is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
        assert self.peers.session is not None
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
        try:
            async with self.peers.session.request(
                request.method,
                base + request.rel_url.path_qs,
                data=await request.read(),
                headers=headers,
            ) as upstream:
                return web.Response(
                    body=await upstream.read(),
                    status=upstream.status,
                    content_type=upstream.content_type,
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            owner = job_owner(job_id)
            return web.json_response(
                {"error": f"{job_id}: its owner {owner} is unreachable ({type(exc).__name__})"},
                status=502,
            )

    async def _mine(self, request: web.Request) -> JobStatus | web.StreamResponse:
        """The status of a job this broker owns, or the response to send instead: the owner's
        answer (forwarded) for another broker's job, 404 for an unknown one, 403 for another
        user's."""
        try:
            job_id = self._job_id(request)
        except InvalidInput as exc:
            return bad_request(exc)
        if job_owner(job_id) != self.driver.site:
            return await self._forward(request, job_id)
        status = self.driver.jobs.get(job_id)
        if status is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
        user = request[USER]
        if not user.may_see(status.submitter):
            return web.json_response({"error": f"{job_id} belongs to another user"}, status=403)
        return status

    async def _status(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus):
            return status
        return web.json_response(status.as_dict())

    async def _wait(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus):
            return status
        try:
            timeout = float(request.query.get("timeout", "60"))
        except ValueError:
            return web.json_response({"error": "timeout: expected seconds"}, status=400)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(status.done.wait(), timeout)
        return web.json_response(status.as_dict())

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus):
            return status
        await self.driver.cancel(status)
        return web.json_response(status.as_dict())

    async def _output(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus):
            return status
        if status.site is None:
            return web.json_response({"error": f"no output for {status.id} (yet)"}, status=404)
        stream = request.match_info["stream"]
        if status.site == self.driver.site:
            return await self._read_output(request, status.id, stream)
        if stream not in ("stdout", "stderr"):
            return bad_request(InvalidInput("stream", "stdout or stderr", stream))
        assert self.peers.session is not None
        url = f"{self.peers.peers[status.site]}/peer/v1/output/{status.id}/{stream}"
        try:
            headers = self.peers.headers("GET", url)
            async with self.peers.session.get(url, headers=headers) as upstream:
                return web.Response(body=await upstream.read(), status=upstream.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return web.json_response(
                {"error": f"{status.id}: site {status.site} is unreachable ({exc})"[:300]},
                status=502,
            )

    async def _read_output(
        self, request: web.Request, job_id: str, stream: str
    ) -> web.StreamResponse:
        """A job's output stream, read here, where it ran, without following links."""
        names = self.driver.outputs.get(job_id)
        if stream not in ("stdout", "stderr") or names is None:
            return web.json_response(
                {"error": f"{stream[:20]}: expected stdout or stderr of a job run here"},
                status=404,
            )
        directory = self.driver.executor.job_dir(job_id)
        try:
            descriptor = open_inside(directory, names[stream == "stderr"])
        except FileNotFoundError:
            return web.json_response({"error": f"no {stream} for {job_id}"}, status=404)
        except (InvalidInput, OSError) as exc:
            return web.json_response({"error": f"{stream} of {job_id}: {exc}"}, status=403)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        with os.fdopen(descriptor, "rb") as source:
            left = response.content_length = os.fstat(source.fileno()).st_size  # as of now
            await response.prepare(request)
            while left > 0 and (chunk := source.read(min(left, 1 << 16))):
                left -= len(chunk)
                await response.write(chunk)
        await response.write_eof()
        return response

    async def _peer_output(self, request: web.Request) -> web.StreamResponse:
        """The owner's read of its job's output stream (a peer route: signed by the owner)."""
        job_id = request.match_info["id"]
        if job_owner(job_id) != request[PEER]:
            return web.json_response(
                {"error": f"{request[PEER]} does not own {job_id}"}, status=403
            )
        return await self._read_output(request, job_id, request.match_info["stream"])
