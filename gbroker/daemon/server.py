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
- **Observability** (:mod:`gbroker.daemon.metrics`): ``/metrics`` (Prometheus), a status page
  at ``/`` and the same facts as JSON at ``/api/v1/info``, guarded like the client API.
- **NetMon** (:mod:`netmon.service`): peers' test transfers are read and discarded at ``POST
  /peer/v1/probe`` (at most ``max_probe`` bytes). The in-process agent probes the neighbours
  every ``netmon_period`` and feeds :attr:`forecaster` directly; neighbours' tables arriving over
  MQTT feed it too (:mod:`netmon.table` says which links are known).

- **Leases and recovery** (ARCHITECTURE §6). The journal also keeps each owned job's placements
  (written before the dispatch is sent; a grant before the claim is answered) and each hosted
  job's phase, process group and unacknowledged end report. A restarted broker rebuilds its
  core from them before it serves: it re-sends its jobs' placements (sites accept idempotently),
  adopts the processes that outlived it, re-queues waiting jobs (whose leases are void, so they
  start only on a granted claim) and re-sends reports until the owner acknowledges them. A
  dispatched job carries a lease of ``lease`` seconds: a site starts it on its own only within
  it. A site lost to its last-will (or to failed calls) has its waiting jobs placed elsewhere
  once their leases have run out, and a claim from it for such a job is denied.
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

from dcsmon.service import STATE_PATH, DcsMon, local_sampler, state_document
from dcsmon.view import NeighbourhoodView
from gbroker.core.dispatch import (
    Abandon,
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
    SiteBack,
    SiteLost,
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
from gbroker.daemon.metrics import CONTENT_TYPE, DaemonMetrics, describe, status_page
from gbroker.daemon.mqtt import LinkError, SiteLink
from gbroker.errors import GBrokerError, InternalError, InvalidInput
from gbroker.jsdl import JobDescription, from_mapping, loads_job_description, to_mapping
from gbroker.topology import Topology
from netmon.forecast import PiecewiseLinearForecaster
from netmon.service import (
    DEFAULT_PERIOD,
    DEFAULT_SIZES,
    MAX_PROBE,
    PROBE_PATH,
    NetMonAgent,
    probe_endpoint,
)
from netmon.table import TableFeed

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
    # Seconds a site may start a dispatched job without asking its owner (ARCHITECTURE §6).
    lease: float = 30.0
    # On a clean exit, stop the jobs running here; False leaves them running for the restarted
    # broker to adopt (`gbroker serve` does that, as a restarted slurmd would).
    stop_jobs_on_exit: bool = True
    max_upload: int = 1 << 30  # bytes per file in the store
    token: str | None = None  # clients must send it (required off loopback)
    secret: str | None = None  # the fleet's peers must send it
    netmon: bool = True  # run the NetMon agent in-process (off: `gbroker netmon serve` instead)
    netmon_period: float = DEFAULT_PERIOD  # seconds between NetMon probe rounds
    netmon_sizes: tuple[int, ...] = DEFAULT_SIZES  # NetMon test sizes in bytes
    max_probe: int = MAX_PROBE  # bytes a peer's NetMon probe may carry
    dcsmon: bool = True  # publish our state in-process (off: `gbroker dcsmon serve` instead)


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
            self.site,
            topology.neighbours(self.site),
            config.policy,
            self.forecaster,
            lease=config.lease,
        )
        # Sites lost, each with the timer that gives up on its jobs (None: nothing left there).
        self._lost: dict[str, asyncio.TimerHandle | None] = {}
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
        self.metrics = DaemonMetrics(self.site, self.agent.state, lambda: self.jobs.values())
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
        self.dcsmon = DcsMon(
            local_sampler(self.agent.state), config.dcsmon_period, self._state_changed
        )
        self.netmon: NetMonAgent | None = None
        if config.netmon:
            self.netmon = NetMonAgent(
                self.site,
                topology.neighbours(self.site),
                self.peers,
                self.forecaster,
                sizes=config.netmon_sizes,
                period=config.netmon_period,
                headers=self._peer_headers(),
            )
        # The forecaster knows our outgoing links (our agent feeds it directly, so the echo of
        # our own table is skipped) and our neighbours' (their tables, over MQTT); any other
        # link is forecast from the default bandwidth (netmon.table).
        self.tables = TableFeed(self.forecaster, ignore=(self.site,) if config.netmon else ())

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
        await self._recover()  # before serving: claims and reports must find the jobs
        http_site = web.TCPSite(self._runner, self.config.host, port)
        await http_site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        self.peers[self.site] = self.url
        if self.netmon is not None:
            self._spawn(self.netmon.run(), "netmon")
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
                    async with asyncio.TaskGroup() as tasks:
                        feed = link.feed(self.view, self.tables, self._liveness)
                        tasks.create_task(feed, name="mqtt-feed")
                        if self.config.dcsmon:  # publishes our state on every (re)join
                            publish = self.dcsmon.publish_states(link)
                            tasks.create_task(publish, name="dcsmon-publish")
                        if self.netmon is not None:  # and our latest NetMon table
                            tables = self.netmon.publish_tables(link)
                            tasks.create_task(tables, name="netmon-publish")
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

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for timer in self._lost.values():
            if timer is not None:
                timer.cancel()
        await self.executor.aclose(detach=not self.config.stop_jobs_on_exit)
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
            web.get("/metrics", self._metrics),
            web.get("/", self._status_page),
            web.get("/status", self._status_page),
            web.get(STATE_PATH, self._state),
            web.post(PROBE_PATH, probe_endpoint(self.config.max_probe)),
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

    def _describe(self) -> dict[str, Any]:
        neighbours = self.config.topology.neighbours(self.site)
        state = self.agent.state()
        jobs = self.jobs.values()
        return describe(self.site, self.url, state, neighbours, self.view, jobs, time.time())

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self._describe())

    async def _status_page(self, request: web.Request) -> web.Response:
        return web.Response(text=status_page(self._describe()), content_type="text/html")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _state(self, request: web.Request) -> web.Response:
        """DCSMon's sample of this site: what a standalone ``gbroker dcsmon serve`` reads."""
        observation = Observation(self.agent.state(), time.time())
        return web.json_response(state_document(self.site, observation))

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
        if desc.stage_in:  # else the executor makes it at launch: no disk work at admission
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
        began = time.perf_counter()
        self.metrics.submission_received()
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
        self.metrics.submission_accepted(time.perf_counter() - began)
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
            self.metrics.job_cancelled()
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
        try:
            async with self._session.post(
                self.peers[site] + path, data=msgpack.packb(body), headers=self._peer_headers(PACK)
            ) as response:
                response.raise_for_status()
                reply: dict[str, Any] = msgpack.unpackb(await response.read())
                return reply
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.metrics.peer_call_failed(site, path)
            raise

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
        """Take a dispatched job: durable in the journal before the owner hears yes."""
        desc = from_mapping(body["description"], document=f"job {body['id']}")
        job = desc.to_job(body["id"], body["owner"])
        owner, replica = body["owner"], bool(body.get("replica", False))
        lease = float(body.get("lease", self.config.lease))
        if job.id in self.agent.staging or job.id in self.agent.hosted:
            return {"ok": True}  # a repeated dispatch
        spec = msgpack.packb(body["description"])
        if not await self.journal.host(job.id, owner, replica, spec, time.time()):
            return {"ok": True}  # a repeated dispatch (its first copy is still being taken)
        if not self.agent.stage(job.id):
            return {"ok": True}
        self._spawn(
            self._stage_then_queue(job, desc, owner, replica, time.time() + lease),
            f"stage:{job.id}",
        )
        return {"ok": True}

    async def _stage_then_queue(
        self, job: Job, desc: JobDescription, owner: str, replica: bool, lease_until: float
    ) -> None:
        try:
            await self._stage_in(job.id, desc)
        except (GBrokerError, OSError, aiohttp.ClientError) as exc:
            if self.agent.abandon(job.id):  # unless it was withdrawn meanwhile
                await self._finish_hosted(
                    job.id,
                    owner,
                    ok=False,
                    exit_code=None,
                    error=f"staging failed at {self.site}: {exc}",
                )
            return
        if not self.agent.staged(job, owner, replica, lease_until):
            return  # withdrawn while its files were on the way
        self.hosted[job.id] = (desc, owner)
        await self.journal.hosted_phase(job.id, "queued", time.time())
        self._kick()
        await self._call_owner(owner, "queued", job.id)

    async def _withdraw(self, body: dict[str, Any]) -> dict[str, Any]:
        withdrawn = self.agent.withdraw(body["id"])  # a staging job's task sees it and stops
        if withdrawn:
            self.hosted.pop(body["id"], None)
            await self.journal.unhost(body["id"])
            self._kick()
        return {"withdrawn": withdrawn}

    async def _claim(self, body: dict[str, Any]) -> dict[str, Any]:
        granted = False
        for command in self._to_broker(ClaimRequested(body["id"], body["site"])):
            if isinstance(command, ClaimAnswer) and command.site == body["site"]:
                granted = command.granted
        if granted:  # durable before the site hears it: a restarted owner grants no other
            await self.journal.grant(body["id"], body["site"])
        self.metrics.claim(granted)
        return {"granted": granted}

    async def _report(self, body: dict[str, Any]) -> dict[str, Any]:
        job_id, site, kind = body["id"], body["site"], body["kind"]
        status = self.jobs.get(job_id)
        if kind == "queued":
            self._to_broker(JobQueued(job_id, site))
            await self.journal.placement_queued(job_id, site)
            if status is not None and status.state in (JobState.SUBMITTED, JobState.STAGING):
                await self._set_state(job_id, JobState.QUEUED, site=site)
        elif kind == "started":
            self._to_broker(JobStarted(job_id, site))
            if status is not None and status.started_at is None:
                # Before any await: a short job's "finished" may overtake this report, and a
                # job that ended has still started (and is counted once, repeats ignored).
                status.started_at = body.get("at") or time.time()
                self.metrics.job_started(status.submitted_at, status.started_at)
            if status is not None:
                await self.journal.grant(job_id, site)
            if status is not None and status.state not in TERMINAL_STATES:
                await self._set_state(job_id, JobState.RUNNING, site=site)
        elif kind == "finished":
            ok = bool(body.get("ok"))
            self._to_broker(JobFinished(job_id, site, ok))
            if status is not None and status.state not in TERMINAL_STATES:
                status.ended_at = body.get("at")
                status.exit_code = body.get("exit_code")
                status.error = body.get("error")
                self.metrics.job_finished(ok)
                await self._set_state(job_id, JobState.DONE if ok else JobState.FAILED, site=site)
        else:
            raise InvalidInput("report.kind", "queued, started or finished", kind)
        return {"ok": True}

    async def _kill(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": self.executor.cancel(body["id"])}

    async def _call_owner(self, owner: str, kind: str, job_id: str, **extra: Any) -> None:
        body = {"id": job_id, "site": self.site, "kind": kind, "at": time.time(), **extra}
        await self._call_until_answered(owner, "/peer/v1/report", body)

    async def _call_until_answered(
        self, site: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A peer call that must get through: retried with backoff while the peer is down or
        restarting. A peer that rejects the message (4xx) will not change its mind: None."""
        backoff = 0.2
        while True:
            try:
                return await self._call(site, path, body)
            except aiohttp.ClientResponseError as exc:
                if 400 <= exc.status < 500:
                    log.error(
                        "%s: %s rejected %s for %s: %s", self.site, site, path, body["id"], exc
                    )
                    return None
                error: Exception = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                error = exc
            log.info(
                "%s: %s%s unreachable (%s); retrying in %.1f s",
                self.site,
                site,
                path,
                error,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _finish_hosted(self, job_id: str, owner: str, **report: Any) -> None:
        """Tell the owner how a job hosted here ended. The report waits in the journal (an
        outbox) until the owner has acknowledged it, across restarts of either side."""
        body = {"id": job_id, "site": self.site, "kind": "finished", "at": time.time(), **report}
        await self.journal.hosted_phase(job_id, "finished", body["at"], report=msgpack.packb(body))
        await self._deliver_report(owner, body)

    async def _deliver_report(self, owner: str, body: dict[str, Any]) -> None:
        await self._call_until_answered(owner, "/peer/v1/report", body)
        await self.journal.unhost(body["id"])

    # -- leases, lost sites and recovery ---------------------------------------------------------

    LEASE_GRACE = 1.0  # seconds beyond a lease before a lost site's jobs move (clock skew, latency)

    def _site_unreachable(self, site: str) -> None:
        """``site`` is gone (its last-will said offline, or a call to it failed): choose it no
        more, and once the leases of the jobs placed there have run out, place them elsewhere."""
        if site == self.site or site in self._lost:
            return
        log.warning("%s: site %s lost; its jobs move once their leases run out", self.site, site)
        self.view.forget(site)
        self._schedule_lost(site, self.config.lease + self.LEASE_GRACE)

    def _schedule_lost(self, site: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._lost[site] = loop.call_later(max(delay, 0.0), self._give_up_on, site)

    def _give_up_on(self, site: str) -> None:
        before = self.broker.waiting_at(site)
        self._to_broker(SiteLost(site))
        for job_id in before - self.broker.waiting_at(site):  # given up: the journal follows
            self._spawn(self.journal.unplace(job_id, site), f"unplace:{job_id}")
        pending = self.broker.lease_pending(site)
        if pending is None:
            self._lost[site] = None
        else:
            self._schedule_lost(site, pending + self.LEASE_GRACE - time.time())

    def _liveness(self, site: str, online: bool) -> None:
        if online:
            self._site_back(site)
        else:
            self._site_unreachable(site)

    def _site_back(self, site: str) -> None:
        if site in self._lost:
            timer = self._lost.pop(site)
            if timer is not None:
                timer.cancel()
            self._to_broker(SiteBack(site))
            log.info("%s: site %s is back", self.site, site)

    async def _recover(self) -> None:
        """Resume from the journal: the jobs owned here, then the jobs hosted here."""
        now = time.time()
        placements = await self.journal.placements()
        resubmit: list[Job] = []
        resend: list[tuple[Job, str, bool]] = []
        for row in await self.journal.unfinished():
            desc = from_mapping(msgpack.unpackb(row.spec), document=f"journaled job {row.id}")
            job = desc.to_job(row.id, self.site)
            self.descriptions[row.id] = desc
            self.jobs[row.id] = JobStatus(
                row.id, row.state, row.submitted_at, desc.name, site=row.site
            )
            placed = placements.get(row.id, {})
            if not placed:
                self.jobs[row.id].state = JobState.SUBMITTED
                resubmit.append(job)
                continue
            granted = next((site for site, (_, g) in placed.items() if g), None)
            if row.state is JobState.RUNNING and granted is None:
                granted = row.site
            self.broker.restore(
                job, row.submitted_at, {site: q for site, (q, _) in placed.items()}, granted, now
            )
            replica = len(placed) > 1
            resend.extend((job, site, replica) for site in placed if granted in (None, site))
        hosted = await self.journal.hosted()
        # Running jobs first: their cores are taken before the queue is considered.
        for h in sorted(hosted, key=lambda h: h.phase != "running"):
            desc = from_mapping(msgpack.unpackb(h.spec), document=f"hosted job {h.job_id}")
            job = desc.to_job(h.job_id, h.owner)
            if h.phase == "running":
                if h.pgid is None or h.cores is None or h.started_at is None:
                    raise InternalError(f"journal: running job {job.id} has no process on record")
                self.agent.resume_running(job, h.owner, h.cores, h.started_at)
                self.hosted[job.id] = (desc, h.owner)
                self.outputs[job.id] = (desc.output or "stdout", desc.error or "stderr")
                limit = float(desc.wall_time_limit) if desc.wall_time_limit else None
                self.executor.adopt(job.id, h.pgid, h.cores, h.started_at, limit, self._exited)
            elif h.phase == "finished" and h.report is not None:
                report = msgpack.unpackb(h.report)
                self._spawn(self._deliver_report(h.owner, report), f"report:{job.id}")
            elif h.phase == "queued":
                # Its lease is void after a restart: it starts only if its owner still agrees.
                self.agent.accept(job, h.owner, h.replica, lease_until=now)
                self.hosted[job.id] = (desc, h.owner)
            elif h.phase == "staging" and self.agent.stage(job.id):
                self._spawn(
                    self._stage_then_queue(job, desc, h.owner, h.replica, now), f"stage:{job.id}"
                )
        if self.jobs or hosted:
            log.info(
                "%s: recovered %d owned and %d hosted jobs from the journal",
                self.site,
                len(self.jobs),
                len(hosted),
            )
        for job, site, replica in resend:
            self._spawn(self._send_accept(job, site, replica), f"redispatch:{job.id}")
        for job in resubmit:
            try:
                self._to_broker(JobSubmitted(job))
            except GBrokerError as exc:  # no site of the neighbourhood fits it any more
                self._spawn(
                    self._set_state(job.id, JobState.FAILED, error=str(exc)), f"fail:{job.id}"
                )
        self._kick()

    # -- the core --------------------------------------------------------------------------------

    def _to_broker(self, event: BrokerEvent) -> list[BrokerCommand]:
        began = time.perf_counter()
        commands = self.broker.handle(event, time.time(), self._own_view)
        if isinstance(event, JobSubmitted):
            self.metrics.decided(time.perf_counter() - began)
        for command in commands:
            match command:
                case Dispatch(job, site, replica):
                    self.metrics.dispatched(site)
                    self._spawn(self._dispatch(job, site, replica), f"dispatch:{job.id}")
                case Withdraw(job_id, site):
                    self._spawn(self._withdraw_at(job_id, site), f"withdraw:{job_id}")
                case Kill(job_id, site):
                    self._spawn(self._call(site, "/peer/v1/kill", {"id": job_id}), f"kill:{job_id}")
                case Abandon(job_id, reason):
                    self._spawn(
                        self._set_state(job_id, JobState.FAILED, error=reason), f"abandon:{job_id}"
                    )
                case ClaimAnswer():
                    pass  # answered in the claim's HTTP response
        if self.broker.needs_tick and not self._ticking:
            self._ticking = True
            self._spawn(self._tick(), "tick")
        return commands

    async def _dispatch(self, job: Job, site: str, replica: bool) -> None:
        # The placement is durable before the site may hear of it: a restarted owner knows
        # every site that may run its job.
        await self.journal.place(job.id, site)
        status = self.jobs[job.id]
        if status.state not in TERMINAL_STATES and status.state is not JobState.RUNNING:
            await self._set_state(job.id, JobState.STAGING, site=site)
        await self._send_accept(job, site, replica)

    async def _send_accept(self, job: Job, site: str, replica: bool) -> None:
        body = {
            "id": job.id,
            "owner": self.site,
            "replica": replica,
            "lease": self.config.lease,
            "description": to_mapping(self.descriptions[job.id]),
        }
        try:
            await self._call(site, "/peer/v1/accept", body)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # It may have arrived and the answer got lost: the job moves only once its lease
            # there has run out (see _site_unreachable).
            log.warning("%s: dispatch of %s to %s failed: %s", self.site, job.id, site, exc)
            self._site_unreachable(site)

    async def _withdraw_at(self, job_id: str, site: str) -> None:
        try:
            reply = await self._call(site, "/peer/v1/withdraw", {"id": job_id})
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("%s: withdrawal of %s from %s failed: %s", self.site, job_id, site, exc)
            reply = {"withdrawn": False}  # it stays there, as far as we know
            self._site_unreachable(site)
        withdrawn = bool(reply["withdrawn"])
        self.metrics.withdrawal(withdrawn)
        if withdrawn:
            await self.journal.unplace(job_id, site)
        self._to_broker(WithdrawAnswered(job_id, site, withdrawn))

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
        """Ask the owner for the right to start (a replica, or a job whose lease ran out); the
        cores stay held until it answers, however long it is away."""
        reply = await self._call_until_answered(
            claim.owner, "/peer/v1/claim", {"id": claim.job_id, "site": self.site}
        )
        granted = reply is not None and bool(reply.get("granted"))
        launch = self.agent.claim_answered(claim.job_id, granted)
        if launch is not None:
            await self._launch(launch)
        else:
            self.hosted.pop(claim.job_id, None)
            await self.journal.unhost(claim.job_id)
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
        running = self.executor.running().get(launch.job.id)
        if running is not None:  # its process group, so that a restarted site can adopt it
            await self.journal.hosted_phase(
                launch.job.id,
                "running",
                time.time(),
                pgid=running.pid,
                cores=launch.cores,
                started_at=running.started_at,
            )
        await self._call_owner(owner, "started", launch.job.id)

    def _exited(self, result: ExitResult) -> None:
        desc_owner = self.hosted.pop(result.job_id, None)
        self.agent.finished(result.job_id)
        self._kick()
        if desc_owner is not None:
            self._spawn(
                self._finish_hosted(
                    result.job_id,
                    desc_owner[1],
                    ok=result.succeeded,
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
