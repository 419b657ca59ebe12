"""The broker daemon: a site's broker and local scheduler driven by real I/O (ARCHITECTURE §3-§6).

Theory of operation. The daemon is the second driver of the core; the simulator is the first.
It owns no scheduling logic. It turns HTTP requests, MQTT messages, process exits and timers
into core events, and carries out the commands that come back:
- **Core objects**: the owner :class:`~gbroker.core.dispatch.Broker` (where jobs go) and the
  :class:`~gbroker.core.site.SiteAgent` (what runs here).
- **Client API** (JSON, ``/api/v1``): submit a JSDL/JSON/YAML job, status, list, cancel, wait,
  output. Any broker answers for any job: a job id names its owner (``<site>.<n>``), and
  requests about another broker's job are forwarded to it.
- **Peer API** (MessagePack, ``/peer/v1``):
  - accept a dispatched job;
  - withdraw it;
  - claim the right to start a replica;
  - report queued, started and finished back to the owner.

  All of them are idempotent by job id. A command addressed to this site itself skips HTTP.
- **File store**: content-addressed by sha256 (``PUT``/``GET /files/<sha256>``), streamed and
  verified on upload. A site fetches a dispatched job's inputs into the job's directory before
  queueing it, verifying their sha256 again, so staging takes real time on real links.
- **Security baseline**: the APIs bind to loopback by default; binding elsewhere needs a client
  token (``Authorization: Bearer``), and a fleet secret (``X-GBroker-Secret``) guards the peer
  API and the file downloads between sites. Requests without them get 401.
- **Journal**: a submission is answered only after the SQLite journal has made it durable.
- **Executor**: real processes, one process group per job.
- **DCSMon and liveness over MQTT** (:mod:`gbroker.daemon.mqtt`): the site's state is published
  (retained) whenever it changes, at most once per ``dcsmon_period``. Neighbours' states feed a
  :class:`~dcsmon.view.NeighbourhoodView`, and a neighbour whose last-will says ``offline`` is
  forgotten, so no more jobs go to it.

Not yet here (issue 4, in progress): leases and recovery of in-flight jobs after a restart,
NetMon probes, /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import msgpack
from aiohttp import ClientSession, ClientTimeout, web

from dcsmon.view import NeighbourhoodView
from gbroker.core.dispatch import (
    Broker,
    BrokerCommand,
    BrokerEvent,
    CancelRequested,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Kill,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.localsched import QueuePolicy
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.site import Claim, Launch, SiteAgent
from gbroker.core.states import TERMINAL_STATES, JobState
from gbroker.daemon.executor import Executor, ExitResult, JobSpec
from gbroker.daemon.journal import Journal
from gbroker.daemon.mqtt import LinkError, SiteLink
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.jsdl import JobDescription, from_mapping, loads_job_description, to_mapping
from gbroker.topology import Topology
from netmon.forecast import PiecewiseLinearForecaster

__all__ = ["BrokerDaemon", "DaemonConfig", "JobStatus"]

log = logging.getLogger("gbroker.daemon")
PACK = "application/msgpack"
SECRET_HEADER = "X-GBroker-Secret"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    site: str
    topology: Topology
    data_dir: Path
    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    queue_policy: QueuePolicy = QueuePolicy.EASY
    host: str = "127.0.0.1"
    port: int = 0
    mqtt_url: str | None = None
    dcsmon_period: float = 1.0
    max_upload: int = 1 << 30  # bytes per file in the store
    token: str | None = None  # clients must send it (required off loopback)
    secret: str | None = None  # the fleet's peers must send it


@dataclass(slots=True)
class JobStatus:
    """What the owner tells clients about a job."""

    id: str
    state: JobState
    submitted_at: float
    name: str | None = None
    site: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": str(self.state),
            "name": self.name,
            "site": self.site,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "error": self.error,
        }


class _View:
    """The broker's view: its own site exactly, neighbours as DCSMon last delivered them."""

    def __init__(self, daemon: BrokerDaemon) -> None:
        self.daemon = daemon

    def get(self, site: str, /) -> Observation | None:
        if site == self.daemon.site:
            return Observation(self.daemon.agent.state(), time.time())
        return self.daemon.view.get(site)


class BrokerDaemon:
    """``async with BrokerDaemon(config) as daemon:`` serves until the block ends."""

    def __init__(self, config: DaemonConfig) -> None:
        topology = config.topology
        if config.site not in topology.sites:
            raise InvalidInput("site", f"a site of {topology.name}", config.site)
        if config.token is None and not _loopback(config.host):
            raise InvalidInput(
                "token", f"a client token when binding to the non-loopback {config.host}", None
            )
        self.config = config
        self.site = config.site
        self.forecaster = PiecewiseLinearForecaster(topology.default_link.bandwidth)
        self.broker = Broker(
            self.site, topology.neighbours(self.site), config.policy, self.forecaster
        )
        self.agent = SiteAgent(self.site, topology.sites[self.site].cores, config.queue_policy)
        self.view = NeighbourhoodView()
        # Until DCSMon reports, assume each neighbour idle as the topology describes it; any
        # real observation is newer and replaces this.
        for name in topology.neighbours(self.site):
            cores = topology.sites[name].cores
            self.view.update(name, SiteState(cores, cores), observed_at=0.0)
        self._own_view = _View(self)
        self.jobs: dict[str, JobStatus] = {}  # owned here
        self.descriptions: dict[str, JobDescription] = {}  # owned here
        self.hosted: dict[str, tuple[JobDescription, str]] = {}  # running or queued here
        self.outputs: dict[str, tuple[str, str]] = {}  # stdout, stderr file of jobs run here
        self.journal = Journal(config.data_dir / "journal.sqlite")
        self.executor = Executor(config.data_dir / "jobs", site=self.site)
        self._ids = itertools.count(1)
        self._session: ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pass_pending = False
        self._ticking = False
        self.files = config.data_dir / "files"
        self._state_changed = asyncio.Event()
        self.url = ""
        self.peers = {
            name: spec.http for name, spec in topology.sites.items() if spec.http is not None
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> BrokerDaemon:
        self.files.mkdir(parents=True, exist_ok=True)
        await self.journal.__aenter__()
        self._session = ClientSession(timeout=ClientTimeout(total=30))
        app = web.Application(client_max_size=1 << 20, middlewares=[self._guard])
        app.add_routes(self._routes())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = self.config.port
        if port == 0 and self.peers.get(self.site):
            port = int(self.peers[self.site].rsplit(":", 1)[1].rstrip("/"))
        http_site = web.TCPSite(self._runner, self.config.host, port)
        await http_site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        self.peers[self.site] = self.url
        if self.config.mqtt_url is not None:
            self._spawn(self._mqtt(self.config.mqtt_url), "mqtt")
        return self

    async def _mqtt(self, url: str) -> None:
        """Keep the MQTT link up: join, feed the view and publish; on any loss, rejoin.

        A broker whose MQTT link is down keeps serving on its last view (DCSMon degraded); it
        never dies of it. Cancellation (shutdown) closes the link cleanly, which says offline.
        """
        neighbours = self.config.topology.neighbours(self.site)
        backoff = 0.5
        while True:
            try:
                async with SiteLink(url, self.site, neighbours, timeout=15.0) as link:
                    backoff = 0.5
                    self._state_changed.set()  # publish our state on every (re)join
                    async with asyncio.TaskGroup() as tasks:
                        tasks.create_task(link.feed(self.view), name="mqtt-feed")
                        tasks.create_task(self._publish_states(link), name="dcsmon-publish")
            except* (LinkError, OSError, aiomqtt.MqttError) as group:  # joining, or later
                log.warning(
                    "%s: MQTT link %s: %s; rejoining in %.1f s",
                    self.site,
                    url,
                    group.exceptions[0],
                    backoff,
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    async def _publish_states(self, link: SiteLink) -> None:
        """DCSMon: publish the site's state when it changes, at most once per period."""
        last = None
        while True:
            await self._state_changed.wait()
            self._state_changed.clear()
            state = self.agent.state()
            if state != last:
                await link.publish_state(state, time.time())
                last = state
            await asyncio.sleep(self.config.dcsmon_period)

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.executor.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await self.journal.aclose()

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed", self.site, task.get_name(), exc_info=task.exception())

    @web.middleware
    async def _guard(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Peer routes need the fleet secret, client routes the client token, when set. File
        downloads are peer traffic (staging) unless the client token opens them."""
        path = request.path
        secret, token = self.config.secret, self.config.token
        peer_ok = secret is None or hmac.compare_digest(
            request.headers.get(SECRET_HEADER, ""), secret
        )
        client_ok = token is None or hmac.compare_digest(
            request.headers.get("Authorization", ""), f"Bearer {token}"
        )
        if path.startswith("/peer/"):
            allowed = peer_ok
        elif path.startswith("/files/") and request.method == "GET":
            allowed = peer_ok or (token is not None and client_ok)
        else:
            allowed = client_ok
        if not allowed:
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    # -- HTTP routes -----------------------------------------------------------------------------

    def _routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/info", self._info),
            web.put("/files/{sha256}", self._put_file),
            web.get("/files/{sha256}", self._get_file),
            web.post("/api/v1/jobs", self._submit),
            web.get("/api/v1/jobs", self._list),
            web.get("/api/v1/jobs/{id}", self._status),
            web.delete("/api/v1/jobs/{id}", self._cancel),
            web.get("/api/v1/jobs/{id}/wait", self._wait),
            web.get("/api/v1/jobs/{id}/output/{stream}", self._output),
            *(web.post(path, self._peer_route(path)) for path in self._peer_handlers),
            web.get("/peer/v1/output/{id}/{stream}", self._peer_output),
        ]

    @staticmethod
    def _bad(error: GBrokerError) -> web.Response:
        body: dict[str, Any] = {"error": str(error)}
        if isinstance(error, InvalidInput):
            body.update(field=error.field, expected=error.expected)
        return web.json_response(body, status=400)

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response({"site": self.site, "url": self.url})

    # -- the content-addressed file store ---------------------------------------------------------

    def _file_path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidInput("sha256", "64 lowercase hex digits", digest)
        return self.files / digest

    async def _put_file(self, request: web.Request) -> web.Response:
        """Store an upload under its sha256, streaming; refuse it unless the bytes match."""
        try:
            path = self._file_path(request.match_info["sha256"])
        except InvalidInput as exc:
            return self._bad(exc)
        if path.exists():
            return web.json_response({"sha256": path.name, "size": path.stat().st_size})
        limit = self.config.max_upload
        digest = hashlib.sha256()
        size = 0
        partial = path.with_suffix(f".part{next(self._ids)}")
        try:
            with partial.open("wb") as out:
                async for chunk in request.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        return web.json_response(
                            {"error": f"upload larger than the limit of {limit} bytes"},
                            status=413,
                        )
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != path.name:
                return web.json_response(
                    {
                        "error": f"sha256 mismatch: the body hashes to {digest.hexdigest()}",
                        "field": "sha256",
                        "expected": "the sha256 of the body",
                    },
                    status=400,
                )
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return web.json_response({"sha256": path.name, "size": size}, status=201)

    async def _get_file(self, request: web.Request) -> web.StreamResponse:
        try:
            path = self._file_path(request.match_info["sha256"])
        except InvalidInput as exc:
            return self._bad(exc)
        if not path.is_file():
            return web.json_response({"error": f"no file {path.name}"}, status=404)
        return web.FileResponse(path)

    async def _stage_in(self, job_id: str, desc: JobDescription) -> None:
        """Fetch a job's input files into its directory; a /files/<sha256> source is verified."""
        assert self._session is not None
        directory = self.executor.job_dir(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        for entry in desc.stage_in:
            target = directory / entry.file_name
            if entry.inline_data is not None:
                target.write_text(entry.inline_data)
                continue
            source = entry.source or ""
            if not source.startswith(("http://", "https://")):
                raise InvalidInput(f"staging[{entry.file_name}].source", "an http(s) URL", source)
            digest = hashlib.sha256()
            async with self._session.get(source, headers=self._peer_headers()) as response:
                if response.status != 200:
                    raise InvalidInput(
                        f"staging[{entry.file_name}].source",
                        "a file that can be fetched",
                        f"{source}: HTTP {response.status}",
                    )
                with target.open("wb") as out:
                    async for chunk in response.content.iter_chunked(1 << 16):
                        digest.update(chunk)
                        out.write(chunk)
            expected = source.rstrip("/").rsplit("/files/", 1)
            if len(expected) == 2 and digest.hexdigest() != expected[1]:
                raise InvalidInput(
                    f"staging[{entry.file_name}]",
                    f"content with sha256 {expected[1]}",
                    digest.hexdigest(),
                )

    async def _submit(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            desc = loads_job_description(raw)
            job_id = f"{self.site}.{int(time.time() * 1000)}{next(self._ids):04d}"
            job = desc.to_job(job_id, self.site)
        except GBrokerError as exc:
            return self._bad(exc)
        now = time.time()
        spec = msgpack.packb(to_mapping(desc))
        await self.journal.submit(job_id, self.site, spec, now)  # durable before we answer
        self.jobs[job_id] = JobStatus(job_id, JobState.SUBMITTED, now, desc.name)
        self.descriptions[job_id] = desc
        try:
            self._to_broker(JobSubmitted(job))
        except GBrokerError as exc:
            await self._set_state(job_id, JobState.FAILED, error=str(exc))
            return self._bad(exc)
        return web.json_response({"id": job_id, "owner": self.site}, status=201)

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"jobs": [s.as_dict() for s in self.jobs.values()]})

    def _owner(self, job_id: str) -> str:
        return job_id.split(".", 1)[0]

    async def _forward(self, request: web.Request, job_id: str) -> web.StreamResponse:
        owner = self._owner(job_id)
        base = self.peers.get(owner)
        if base is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
        async with self._session.request(
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
        if self._owner(job_id) != self.site:
            return await self._forward(request, job_id)
        status = self.jobs.get(job_id)
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
        if status.state not in TERMINAL_STATES:
            self._to_broker(CancelRequested(status.id))
            await self._set_state(status.id, JobState.CANCELLED)
        return web.json_response(status.as_dict())

    async def _output(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus):
            return status
        if status.site is None:
            return web.json_response({"error": f"no output for {status.id} (yet)"}, status=404)
        stream = request.match_info["stream"]
        if status.site == self.site:
            return self._read_output(status.id, stream)
        assert self._session is not None
        url = f"{self.peers[status.site]}/peer/v1/output/{status.id}/{stream}"
        async with self._session.get(url, headers=self._peer_headers()) as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status)

    def _read_output(self, job_id: str, stream: str) -> web.StreamResponse:
        names = self.outputs.get(job_id)
        if stream not in ("stdout", "stderr") or names is None:
            return web.json_response(
                {"error": f"{stream}: expected stdout or stderr of a job run here"}, status=404
            )
        path = self.executor.job_dir(job_id) / names[stream == "stderr"]
        if not path.is_file():
            return web.json_response({"error": f"no {stream} for {job_id}"}, status=404)
        return web.FileResponse(path)

    async def _peer_output(self, request: web.Request) -> web.StreamResponse:
        return self._read_output(request.match_info["id"], request.match_info["stream"])

    # -- peer protocol ---------------------------------------------------------------------------

    async def _call(self, site: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A peer call; to ourselves it is a direct call."""
        if site == self.site:
            return await self._peer_handlers[path](body)
        assert self._session is not None
        async with self._session.post(
            self.peers[site] + path, data=msgpack.packb(body), headers=self._peer_headers(PACK)
        ) as response:
            response.raise_for_status()
            reply: dict[str, Any] = msgpack.unpackb(await response.read())
            return reply

    def _peer_headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {SECRET_HEADER: self.config.secret} if self.config.secret else {}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    @property
    def _peer_handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]:
        return {
            "/peer/v1/accept": self._accept,
            "/peer/v1/withdraw": self._withdraw,
            "/peer/v1/claim": self._claim,
            "/peer/v1/report": self._report,
            "/peer/v1/kill": self._kill,
        }

    def _peer_route(self, path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        """An HTTP handler for one peer message: MessagePack in, MessagePack out, 400 if bad."""
        handler = self._peer_handlers[path]

        async def route(request: web.Request) -> web.Response:
            try:
                body = msgpack.unpackb(await request.read())
                if not isinstance(body, dict):
                    raise InvalidInput("peer message", "a MessagePack map", type(body).__name__)
                reply = await handler(body)
            except (GBrokerError, KeyError, ValueError, TypeError) as exc:
                return web.Response(status=400, text=f"bad peer message: {exc!r}")
            return web.Response(body=msgpack.packb(reply), content_type=PACK)

        return route

    async def _accept(self, body: dict[str, Any]) -> dict[str, Any]:
        desc = from_mapping(body["description"], document=f"job {body['id']}")
        job = desc.to_job(body["id"], body["owner"])
        if not self.agent.stage(job.id):
            return {"ok": True}  # a repeated dispatch
        self._spawn(
            self._stage_then_queue(job, desc, body["owner"], bool(body.get("replica", False))),
            f"stage:{job.id}",
        )
        return {"ok": True}

    async def _stage_then_queue(
        self, job: Job, desc: JobDescription, owner: str, replica: bool
    ) -> None:
        try:
            await self._stage_in(job.id, desc)
        except (GBrokerError, OSError, aiohttp.ClientError) as exc:
            if self.agent.abandon(job.id):  # unless it was withdrawn meanwhile
                await self._call_owner(
                    owner,
                    "finished",
                    job.id,
                    ok=False,
                    exit_code=None,
                    error=f"staging failed at {self.site}: {exc}",
                )
            return
        if not self.agent.staged(job, owner, replica):
            return  # withdrawn while its files were on the way
        self.hosted[job.id] = (desc, owner)
        await self._call_owner(owner, "queued", job.id)
        self._kick()

    async def _withdraw(self, body: dict[str, Any]) -> dict[str, Any]:
        withdrawn = self.agent.withdraw(body["id"])  # a staging job's task sees it and stops
        if withdrawn:
            self.hosted.pop(body["id"], None)
            self._kick()
        return {"withdrawn": withdrawn}

    async def _claim(self, body: dict[str, Any]) -> dict[str, Any]:
        granted = False
        for command in self._to_broker(ClaimRequested(body["id"], body["site"])):
            if isinstance(command, ClaimAnswer) and command.site == body["site"]:
                granted = command.granted
        return {"granted": granted}

    async def _report(self, body: dict[str, Any]) -> dict[str, Any]:
        job_id, site, kind = body["id"], body["site"], body["kind"]
        status = self.jobs.get(job_id)
        if kind == "queued":
            self._to_broker(JobQueued(job_id, site))
            if status is not None and status.state in (JobState.SUBMITTED, JobState.STAGING):
                await self._set_state(job_id, JobState.QUEUED, site=site)
        elif kind == "started":
            self._to_broker(JobStarted(job_id, site))
            if status is not None and status.state not in TERMINAL_STATES:
                status.started_at = body.get("at")
                await self._set_state(job_id, JobState.RUNNING, site=site)
        elif kind == "finished":
            ok = bool(body.get("ok"))
            self._to_broker(JobFinished(job_id, site, ok))
            if status is not None and status.state not in TERMINAL_STATES:
                status.ended_at = body.get("at")
                status.exit_code = body.get("exit_code")
                status.error = body.get("error")
                await self._set_state(job_id, JobState.DONE if ok else JobState.FAILED, site=site)
        else:
            raise InvalidInput("report.kind", "queued, started or finished", kind)
        return {"ok": True}

    async def _kill(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": self.executor.cancel(body["id"])}

    async def _call_owner(self, owner: str, kind: str, job_id: str, **extra: Any) -> None:
        body = {"id": job_id, "site": self.site, "kind": kind, "at": time.time(), **extra}
        await self._call(owner, "/peer/v1/report", body)

    # -- the core --------------------------------------------------------------------------------

    def _to_broker(self, event: BrokerEvent) -> list[BrokerCommand]:
        commands = self.broker.handle(event, time.time(), self._own_view)
        for command in commands:
            match command:
                case Dispatch(job, site, replica):
                    self._spawn(self._dispatch(job, site, replica), f"dispatch:{job.id}")
                case Withdraw(job_id, site):
                    self._spawn(self._withdraw_at(job_id, site), f"withdraw:{job_id}")
                case Kill(job_id, site):
                    self._spawn(self._call(site, "/peer/v1/kill", {"id": job_id}), f"kill:{job_id}")
                case ClaimAnswer():
                    pass  # answered in the claim's HTTP response
        if self.broker.needs_tick and not self._ticking:
            self._ticking = True
            self._spawn(self._tick(), "tick")
        return commands

    async def _dispatch(self, job: Job, site: str, replica: bool) -> None:
        desc = self.descriptions[job.id]
        body = {
            "id": job.id,
            "owner": self.site,
            "replica": replica,
            "description": to_mapping(desc),
        }
        if self.jobs[job.id].state is JobState.SUBMITTED:
            await self._set_state(job.id, JobState.STAGING, site=site)
        await self._call(site, "/peer/v1/accept", body)

    async def _withdraw_at(self, job_id: str, site: str) -> None:
        reply = await self._call(site, "/peer/v1/withdraw", {"id": job_id})
        self._to_broker(WithdrawAnswered(job_id, site, bool(reply["withdrawn"])))

    async def _tick(self) -> None:
        try:
            while self.broker.needs_tick:
                await asyncio.sleep(self.broker.policy.interval)
                self._to_broker(Tick())
        finally:
            self._ticking = False

    def _kick(self) -> None:
        """Run a scheduling pass once the current burst of changes is in."""
        if not self._pass_pending:
            self._pass_pending = True
            asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self._pass_pending = False
        self._state_changed.set()
        for command in self.agent.schedule(time.time()):
            if isinstance(command, Launch):
                self._spawn(self._launch(command), f"launch:{command.job.id}")
            elif isinstance(command, Claim):
                self._spawn(self._claim_start(command), f"claim:{command.job_id}")

    async def _claim_start(self, claim: Claim) -> None:
        reply = await self._call(
            claim.owner, "/peer/v1/claim", {"id": claim.job_id, "site": self.site}
        )
        launch = self.agent.claim_answered(claim.job_id, bool(reply["granted"]))
        if launch is not None:
            await self._launch(launch)
        else:
            self.hosted.pop(claim.job_id, None)
            self._kick()

    async def _launch(self, launch: Launch) -> None:
        desc, owner = self.hosted[launch.job.id]
        try:
            spec = JobSpec(
                job_id=launch.job.id,
                executable=desc.executable or desc.application_name or "",
                arguments=desc.arguments,
                environment=dict(desc.environment),
                working_directory=desc.working_directory,
                stdin=desc.input,
                stdout=desc.output or "stdout",
                stderr=desc.error or "stderr",
                time_limit=float(desc.wall_time_limit) if desc.wall_time_limit else None,
            )
            self.outputs[launch.job.id] = (spec.stdout, spec.stderr)
            await self.executor.start(spec, launch.cores, self._exited)
        except InvalidInput as exc:
            # The description cannot run here (e.g. an absolute output path): give the cores
            # back and tell the owner, instead of holding them for a job that never starts.
            now = time.time()
            self._exited(ExitResult(launch.job.id, None, None, now, now, error=str(exc)))
            return
        await self._call_owner(owner, "started", launch.job.id)

    def _exited(self, result: ExitResult) -> None:
        desc_owner = self.hosted.pop(result.job_id, None)
        self.agent.finished(result.job_id)
        self._kick()
        if desc_owner is not None:
            ok = result.succeeded
            self._spawn(
                self._call_owner(
                    desc_owner[1],
                    "finished",
                    result.job_id,
                    ok=ok,
                    exit_code=result.exit_code,
                    error=result.error,
                ),
                f"finished:{result.job_id}",
            )

    async def _set_state(
        self, job_id: str, state: JobState, site: str | None = None, error: str | None = None
    ) -> None:
        status = self.jobs[job_id]
        status.state = state
        if site is not None:
            status.site = site
        if error is not None:
            status.error = error
        await self.journal.update(job_id, state, time.time(), site)
        if state in TERMINAL_STATES:
            status.done.set()
