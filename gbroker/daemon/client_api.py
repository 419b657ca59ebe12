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
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from dcsmon.service import STATE_PATH, state_document
from gbroker.core.model import Observation
from gbroker.daemon.driver import Driver, JobStatus
from gbroker.daemon.files import bad_request
from gbroker.daemon.metrics import CONTENT_TYPE, describe, status_page
from gbroker.daemon.peers import PeerClient
from gbroker.errors import GBrokerError
from gbroker.jsdl import loads_job_description

__all__ = ["ClientApi"]


class ClientApi:
    """The client routes of one broker; ``url()`` is where it serves (for ``/api/v1/info``)."""

    def __init__(self, driver: Driver, peers: PeerClient, url: Callable[[], str]) -> None:
        self.driver = driver
        self.peers = peers
        self.url = url

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

    def _describe(self) -> dict[str, Any]:
        driver = self.driver
        neighbours = driver.config.topology.neighbours(driver.site)
        state = driver.agent.state()
        jobs = driver.jobs.values()
        return describe(driver.site, self.url(), state, neighbours, driver.view, jobs, time.time())

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self._describe())

    async def _status_page(self, request: web.Request) -> web.Response:
        return web.Response(text=status_page(self._describe()), content_type="text/html")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.driver.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _state(self, request: web.Request) -> web.Response:
        """DCSMon's sample of this site: what a standalone ``gbroker dcsmon serve`` reads."""
        observation = Observation(self.driver.agent.state(), time.time())
        return web.json_response(state_document(self.driver.site, observation))

    # -- jobs ----------------------------------------------------------------------------------

    async def _submit(self, request: web.Request) -> web.Response:
        began = time.perf_counter()
        metrics = self.driver.metrics
        metrics.submission_received()
        raw = await request.read()
        try:
            job_id = await self.driver.submit(loads_job_description(raw))
        except GBrokerError as exc:
            return bad_request(exc)
        metrics.submission_accepted(time.perf_counter() - began)
        return web.json_response({"id": job_id, "owner": self.driver.site}, status=201)

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"jobs": [s.as_dict() for s in self.driver.jobs.values()]})

    @staticmethod
    def _owner(job_id: str) -> str:
        return job_id.split(".", 1)[0]

    async def _forward(self, request: web.Request, job_id: str) -> web.StreamResponse:
        owner = self._owner(job_id)
        base = self.peers.peers.get(owner)
        if base is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
        assert self.peers.session is not None
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
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

    async def _mine(self, request: web.Request) -> JobStatus | web.StreamResponse:
        """The status of a job this broker owns, or the response to send instead: the owner's
        answer (forwarded) for another broker's job, 404 for an unknown one."""
        job_id = request.match_info["id"]
        if self._owner(job_id) != self.driver.site:
            return await self._forward(request, job_id)
        status = self.driver.jobs.get(job_id)
        if status is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
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
            return self._read_output(status.id, stream)
        assert self.peers.session is not None
        url = f"{self.peers.peers[status.site]}/peer/v1/output/{status.id}/{stream}"
        async with self.peers.session.get(url, headers=self.peers.headers()) as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status)

    def _read_output(self, job_id: str, stream: str) -> web.StreamResponse:
        names = self.driver.outputs.get(job_id)
        if stream not in ("stdout", "stderr") or names is None:
            return web.json_response(
                {"error": f"{stream}: expected stdout or stderr of a job run here"}, status=404
            )
        path = self.driver.executor.job_dir(job_id) / names[stream == "stderr"]
        if not path.is_file():
            return web.json_response({"error": f"no {stream} for {job_id}"}, status=404)
        return web.FileResponse(path)

    async def _peer_output(self, request: web.Request) -> web.StreamResponse:
        """A peer's read of a job's output stream (guarded as peer traffic by the middleware)."""
        return self._read_output(request.match_info["id"], request.match_info["stream"])
