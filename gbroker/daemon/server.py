"""The broker daemon: a site's broker and local scheduler driven by real I/O (ARCHITECTURE §3-§6).

Theory of operation. The daemon is the second driver of the core; the simulator is the first.
It owns no scheduling logic. :class:`BrokerDaemon` builds the rooms below, serves their routes
over one aiohttp application, keeps the MQTT link up, and shuts everything down in order:

- :mod:`gbroker.daemon.driver`: feeds the core's :class:`~gbroker.core.dispatch.Broker` and
  :class:`~gbroker.core.site.SiteAgent` their events and carries out their commands.
- :mod:`gbroker.daemon.client_api` (``/api/v1``, the status page, ``/metrics``; any broker
  answers for any job by forwarding to its owner), :mod:`gbroker.daemon.peers` (``/peer/v1``,
  MessagePack, idempotent by job id), :mod:`gbroker.daemon.dashboard` (``/fleet``) and
  :mod:`gbroker.daemon.drain`.
- :mod:`gbroker.daemon.files` and :mod:`gbroker.daemon.staging`: the file store and staging.
- :mod:`gbroker.daemon.journal` (a submission is answered only once durable),
  :mod:`gbroker.daemon.recovery` (resuming from it before serving) and
  :mod:`gbroker.daemon.history` (finished jobs, purged under the retention policy).
- :mod:`gbroker.site.executor`: real processes, one process group per job.
- DCSMon and liveness over MQTT (:mod:`gbroker.mqtt.link`): the site's state, with its forecast
  CPU availability, is published whenever it changes, at most once per ``dcsmon_period``; a
  neighbour whose last-will says ``offline`` is lost to the driver. NetMon
  (:mod:`netmon.service`) probes the neighbours and feeds :attr:`BrokerDaemon.forecaster`.
- :mod:`gbroker.daemon.guard`: authentication, on always (client tokens, peer signatures).
- TLS (:mod:`gbroker.security.tls`): with a certificate the same port speaks HTTPS only, and
  every call to a peer verifies against the fleet CA.

Each room's own docstring says how it works; the map of all of them: docs/DESIGN.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import aiomqtt
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

from dcsmon.cpu import CpuSensor
from dcsmon.service import DcsMon, local_sampler
from gbroker.core.liveness import HeartbeatPolicy
from gbroker.daemon.bounded import Readers
from gbroker.daemon.client_api import ClientApi
from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.dashboard import Dashboard, Sessions
from gbroker.daemon.drain import DrainControl
from gbroker.daemon.driver import Driver, JobStatus
from gbroker.daemon.files import FileStore
from gbroker.daemon.guard import client_tokens, fleet_secret, guard
from gbroker.daemon.heartbeat import PING_PATH, HeartbeatLoop
from gbroker.daemon.history import keep_history
from gbroker.daemon.journal import Journal
from gbroker.daemon.moving import Mover
from gbroker.daemon.peers import PeerClient, peer_routes
from gbroker.daemon.recovery import recover
from gbroker.daemon.staging import Stager
from gbroker.daemon.tasks import Tasks
from gbroker.errors import InvalidInput
from gbroker.mqtt.link import LinkError, SiteLink
from gbroker.security import runtime
from gbroker.security.auth import PeerSigner, PeerVerifier
from gbroker.security.tls import check_endpoint, daemon_contexts
from gbroker.site.backend import MANAGERS, Backend
from gbroker.site.executor import Executor
from gbroker.site.gridengine import GridEngineBackend
from gbroker.site.identity import UidAllocator, host_database
from gbroker.site.slurm import SlurmBackend
from netmon.ensemble import make_forecaster
from netmon.service import PROBE_PATH, NetMonAgent, probe_endpoint
from netmon.table import TableFeed

__all__ = ["BrokerDaemon", "DaemonConfig", "JobStatus"]

log = logging.getLogger("gbroker.daemon")

_REJOIN_MIN = 0.25  # s before the first attempt to rejoin MQTT
_REJOIN_MAX = 2.0  # s at most between two attempts
_JOIN_TIMEOUT = 5.0  # s a join waits for each acknowledgement, at first
_JOIN_TIMEOUT_MAX = 20.0


def _reachable(host: str) -> str:
    """An address others can use for a bound ``host``: an unspecified one (0.0.0.0, ::) is not
    one, so this host's name stands in for it."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host
    return socket.getfqdn() if unspecified else host


class BrokerDaemon:
    """``async with BrokerDaemon(config) as daemon:`` serves until the block ends."""

    def __init__(self, config: DaemonConfig) -> None:
        topology = config.topology
        if config.site not in topology.sites:
            raise InvalidInput("site", f"a site of {topology.name}", config.site)
        self.config = config
        self._tls_server, self._tls_client = daemon_contexts(
            config.tls_cert, config.tls_key, config.tls_ca
        )
        check_endpoint(config.site, topology.sites[config.site].http, self._tls_server is not None)
        self.site = config.site
        self.url = ""
        self.tasks = Tasks(self.site)
        self.forecaster = make_forecaster(config.forecaster, topology.default_link.bandwidth)
        self.journal = Journal(config.data_dir / "journal.sqlite")
        self.executor = self._backend(config)
        self.identities = self.executor.jobs_run_as()
        log.info("%s: jobs run as %s", self.site, self.identities)
        if config.sd_policy is not None:
            log.info("%s: SD-Policy (%s)", self.site, config.sd_policy)
        peers = {name: spec.http for name, spec in topology.sites.items() if spec.http is not None}
        self.tokens, self.token_file = client_tokens(config)
        secret = fleet_secret(config)
        signer = PeerSigner(self.site, secret)
        self.verifier = PeerVerifier(secret, topology.sites, self.site)
        self.peers = PeerClient(self.site, peers, signer, self._peer_call_failed)
        self.files = FileStore(config.data_dir / "files", config.max_upload)
        self._session: ClientSession | None = None
        stager = Stager(
            self.executor.job_dir,
            self.peers,
            owner_for=self.executor.owner_for,
            allow_private=config.allow_private_sources,
            max_bytes=config.max_download,
            ssl=lambda: self._tls_client,
            file_systems=topology.sites[self.site].file_systems,
            store=self.files,
            outputs=config.data_dir / "staged-out",
            downloads=config.data_dir / "downloads",
        )
        self._state_changed = asyncio.Event()
        self.driver = Driver(
            config,
            self.forecaster,
            self.journal,
            self.executor,
            self.peers,
            stager,
            self.tasks,
            self._state_changed,
        )
        self.metrics = self.driver.metrics
        self.journal.observe = self.metrics.journal_committed
        self.broker = self.driver.broker
        self.agent = self.driver.agent
        self.view = self.driver.view
        self.heartbeat = HeartbeatLoop(
            self.site,
            topology.neighbours(self.site),
            self.peers,
            config.heartbeat or HeartbeatPolicy(),
            view=self.view,
            own_state=self.driver.site_state,
            on_liveness=self.driver.liveness,
            is_lost=lambda site: site in self.driver.lost,
            tasks=self.tasks,
        )
        self.readers = Readers(config.read_budget)
        self.client_api = ClientApi(
            self.driver,
            self.peers,
            lambda: self.url,
            self.health,
            config.retention,
            jobs_run_as=self.identities,
            readers=self.readers,
        )
        self.drain = DrainControl(self.driver, config.data_dir / "draining")
        self.mover = Mover(self.driver)  # running jobs move by checkpoint (gbroker migrate)
        self.sessions = Sessions(self.tokens)
        self.dashboard = Dashboard(
            self.site,
            self.peers.peers,  # every site's URL, ours too once serving
            [(a, b) for a, b in topology.neighbourhood.edges()],
            {name: spec.cores for name, spec in topology.sites.items()},
            self.sessions,
            lambda: self._session,
            self.broker.candidates,
            lambda job_id: getattr(self.driver.jobs.get(job_id), "submitter", None),
            secure=self._tls_server is not None,
        )
        self.driver.decided = self.dashboard.record
        self.driver.busy_changed = self.dashboard.utilization.observe
        health = self.broker.health
        if health is not None:
            self.metrics.watch_site_health(
                lambda: {
                    site: record.excluded_until
                    for site, record in health.records(time.time()).items()
                    if record.excluded_until is not None
                }
            )
        self._runner: web.AppRunner | None = None
        self._registered: Path | None = None
        self.stop_jobs_on_exit = config.stop_jobs_on_exit  # `serve` sets it on SIGUSR1
        self.mqtt_joined = False
        self.dcsmon = DcsMon(
            local_sampler(self.driver.site_state), config.dcsmon_period, self._state_changed
        )
        # DCSMon's CPU sensor: the site's CPU availability, forecast, in every state it reports
        # (capped at the topology's cpu_share, where a site's jobs are capped).
        share = getattr(topology.sites[self.site], "cpu_share", None) or 1.0
        period = config.dcsmon_period or 1.0
        self.cpu = CpuSensor(period, share=share, changed=self._state_changed)
        self.driver.cpu = self.cpu.reported
        self.metrics.watch_cpu(self.site, self.driver.site_state, self.view)
        self.netmon: NetMonAgent | None = None
        if config.netmon:
            self.netmon = NetMonAgent(
                self.site,
                topology.neighbours(self.site),
                peers,
                self.forecaster,
                sizes=config.netmon_sizes,
                period=config.netmon_period,
                sign=self.peers.headers,
            )
        # The forecaster knows our outgoing links (our agent feeds it directly, so the echo of
        # our own table is skipped) and our neighbours' (their tables, over MQTT); any other
        # link is forecast from the default bandwidth (netmon.table).
        self.tables = TableFeed(self.forecaster, ignore=(self.site,) if config.netmon else ())

    def _uids(self, config: DaemonConfig) -> UidAllocator | None:
        """The allocator of users' own uids: a root broker's, unless ``run_as`` names the one
        account every unmapped user's jobs share."""
        if os.geteuid() != 0 or config.run_as is not None:
            return None
        return UidAllocator(
            host_database(),
            self.site,
            config.uid_range,
            owner=str(config.data_dir.resolve()),
            legacy=config.data_dir / "uids.sqlite",  # an older release's, of this site alone
        )

    def _backend(self, config: DaemonConfig) -> Backend:
        """What runs this site's jobs: its own processes, or its cluster's batch system."""
        jobs_dir = config.jobs_dir or config.data_dir / "jobs"
        batch = {"slurm": "Slurm", "gridengine": "Grid Engine"}.get(config.manager)
        if batch is not None and config.malleability is not None:
            raise InvalidInput(
                "malleability", f"none at a {batch} site (its jobs keep their size)", "a policy"
            )
        if batch is not None and config.sd_policy is not None:
            raise InvalidInput(
                "sd_policy", f"none at a {batch} site (its jobs keep their size)", "SD-Policy"
            )
        if config.manager == "gridengine":
            if not config.cell_environment:
                raise InvalidInput(
                    "cell_environment", "the cell's SGE_ROOT... (manager gridengine)", None
                )
            return GridEngineBackend(
                jobs_dir,
                site=self.site,
                environment=config.cell_environment,
                run_as=config.run_as,
                allow_root=config.allow_root,
                accounts=config.accounts,
                default_limits=config.job_limits,
            )
        if config.manager == "slurm":
            if config.slurm_conf is None:
                raise InvalidInput("slurm_conf", "the cluster's slurm.conf (manager slurm)", None)
            return SlurmBackend(
                jobs_dir,
                site=self.site,
                slurm_conf=config.slurm_conf,
                run_as=config.run_as,
                allow_root=config.allow_root,
                accounts=config.accounts,
                default_limits=config.job_limits,
            )
        if config.manager != "local":
            raise InvalidInput("manager", f"one of {', '.join(MANAGERS)}", config.manager)
        return Executor(
            jobs_dir,
            site=self.site,
            site_cores=config.topology.sites[self.site].cores,
            hosts=config.topology.properties()[self.site].hosts,
            run_as=config.run_as,
            allow_root=config.allow_root,
            accounts=config.accounts,
            uids=self._uids(config),
            default_limits=config.job_limits,
            confine=config.job_cgroups,
            cpu_share=config.topology.sites[self.site].cpu_share,
        )

    def _peer_call_failed(self, site: str, path: str) -> None:
        self.metrics.peer_call_failed(site, path)

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> BrokerDaemon:
        # Others may pass through the data directory (a job's own directory is inside) but not
        # list it; the journal and the file store are the broker's alone.
        data_dir = self.config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        data_dir.chmod(0o711)
        # So is the job root: a job's user passes through to its own directory, but nobody else
        # lists the jobs there (their ids), nor reads the launchers' log.
        self.executor.root.mkdir(exist_ok=True)
        self.executor.root.chmod(0o711)
        self.files.root.mkdir(mode=0o700, exist_ok=True)
        self.files.root.chmod(0o700)
        await self.journal.__aenter__()
        await self.readers.__aenter__()
        self._session = ClientSession(
            timeout=ClientTimeout(total=30), connector=TCPConnector(ssl=self._tls_client or True)
        )
        self.peers.session = self._session
        own = self.peers.peers.get(self.site)
        names = [URL(own).host or ""] if own else []
        middleware = guard(self.tokens, self.verifier, names, self.sessions.user)
        app = web.Application(client_max_size=1 << 20, middlewares=[middleware])
        app.add_routes(self._routes())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = self.config.port
        if port == 0 and own:
            port = int(own.rsplit(":", 1)[1].rstrip("/"))
        self.drain.load()  # a site drained before its restart still is
        await recover(self.driver)  # before serving: claims and reports must find the jobs
        await self.mover.recover()
        await self.client_api.arrays.__aenter__()
        http_site = web.TCPSite(self._runner, self.config.host, port, ssl_context=self._tls_server)
        await http_site.start()
        bound = self._runner.addresses[0]
        scheme = "https" if self._tls_server is not None else "http"
        self.url = own or f"{scheme}://{_reachable(bound[0])}:{bound[1]}"
        self.peers.peers[self.site] = self.url
        self._registered = runtime.register(self.url, self.site, self.token_file)
        history = keep_history(self.journal, self.config.retention, self.driver.forget)
        self.tasks.spawn(history, "retention")
        self.tasks.spawn(self.drain.hand_back(), "drain")
        if self.config.migrate_running is not None:  # Dynamite's decider, every interval
            self.tasks.spawn(self.mover.decide_every(self.config.migrate_running), "decider")
        # Arrays a killed broker left half submitted are completed (gbroker.daemon.arrays).
        self.tasks.spawn(self.client_api.arrays.resume(), "arrays")
        self.tasks.spawn(self.cpu.run(), "cpu")
        if self.netmon is not None:
            self.tasks.spawn(self.netmon.run(self._session), "netmon")
        if self.config.mqtt_url is not None:
            self.tasks.spawn(self._mqtt(self.config.mqtt_url), "mqtt")
        if self.config.heartbeat is not None:
            self.tasks.spawn(self.heartbeat.run(), "heartbeat")
        if self.config.neighbour_grace is not None:
            self.tasks.spawn(self._assume_unheard(self.config.neighbour_grace), "grace")
        return self

    async def _assume_unheard(self, grace: float) -> None:
        await asyncio.sleep(grace)
        unheard = self.driver.assume_unheard()
        if unheard:
            log.info("%s: never heard from %s: taken as idle", self.site, ", ".join(unheard))

    def _mqtt_liveness(self, site: str, online: bool) -> None:
        self.heartbeat.mqtt_said(site, online)
        self.driver.liveness(site, online)

    async def _mqtt(self, url: str) -> None:
        """Keep the MQTT link up: join, feed the view and publish; on any loss, rejoin.

        A broker whose MQTT link is down keeps serving; its view stays fresh through the
        heartbeats' answers (:mod:`gbroker.daemon.heartbeat`); it never dies of it.
        Cancellation (shutdown) closes the link cleanly, which says offline.

        Rejoining is meant to take a few seconds once the MQTT broker is back:

        - attempts follow each other at most ``_REJOIN_MAX`` s apart (exponential from
          ``_REJOIN_MIN``, with jitter so that a fleet does not reconnect in lock step);
        - a join waits ``_JOIN_TIMEOUT`` s for each acknowledgement, doubling after each join
          that timed out (a slow MQTT broker) up to ``_JOIN_TIMEOUT_MAX``. aiomqtt does not
          fail a pending subscribe or publish when the connection drops: it waits for its
          timeout, so with 15 s joins and backoff up to 10 s a join that met a dying MQTT
          broker cost up to 25 s.
        """
        neighbours = self.config.topology.neighbours(self.site)
        backoff = _REJOIN_MIN
        join_timeout = _JOIN_TIMEOUT
        while True:
            try:
                link = SiteLink(
                    url,
                    self.site,
                    neighbours,
                    timeout=join_timeout,
                    username=self.config.mqtt_username,
                    password=self.config.mqtt_password,
                    tls_context=self._tls_client,
                )
                async with link:
                    backoff, join_timeout = _REJOIN_MIN, _JOIN_TIMEOUT
                    self.mqtt_joined = True
                    async with asyncio.TaskGroup() as tasks:
                        feed = link.feed(self.view, self.tables, self._mqtt_liveness)
                        tasks.create_task(feed, name="mqtt-feed")
                        if self.config.dcsmon:  # publishes our state on every (re)join
                            publish = self.dcsmon.publish_states(link)
                            tasks.create_task(publish, name="dcsmon-publish")
                        if self.netmon is not None:  # and our latest NetMon table
                            tables = self.netmon.publish_tables(link)
                            tasks.create_task(tables, name="netmon-publish")
            except* (LinkError, OSError, aiomqtt.MqttError) as group:  # joining, or later
                if not self.mqtt_joined and "timed out" in str(group.exceptions[0]):
                    join_timeout = min(2 * join_timeout, _JOIN_TIMEOUT_MAX)
                log.warning(
                    "%s: MQTT link %s: %s; rejoining in %.1f s",
                    self.site,
                    url,
                    group.exceptions[0],
                    backoff,
                )
            finally:
                if self.mqtt_joined:  # MQTT speaks for no one now: heartbeats over HTTP
                    self.heartbeat.link_lost()
                self.mqtt_joined = False
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, _REJOIN_MAX)

    async def __aexit__(self, *exc: object) -> None:
        if self._registered is not None:
            self._registered.unlink(missing_ok=True)
        await self.tasks.cancel_all()
        await self.readers.__aexit__()
        self.driver.close()
        await self.executor.aclose(detach=not self.stop_jobs_on_exit)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await self.journal.aclose()

    # -- HTTP ------------------------------------------------------------------------------------

    def _routes(self) -> list[web.RouteDef]:
        return [
            *self.client_api.routes(),
            *self.drain.routes(),
            *self.mover.routes(),
            *self.dashboard.routes(),
            *self.files.routes(),
            web.post(PROBE_PATH, probe_endpoint(self.config.max_probe)),
            *peer_routes(
                {**self.driver.peer_handlers, PING_PATH: self.heartbeat.answer},
                self.config.topology.sites,
            ),
            web.get("/api/v1/health", self._health),
        ]

    def health(self) -> dict[str, Any]:
        """Whether each part that serves jobs works: the journal writer, the MQTT link, the
        executor. ``ok`` only if all do."""
        parts: dict[str, dict[str, Any]] = {
            "journal": self.journal.health(),
            "executor": self._backend_health(),
        }

        if self.config.mqtt_url is not None:
            parts["mqtt"] = {"ok": self.mqtt_joined, "url": self.config.mqtt_url}
        ok = all(p["ok"] for p in parts.values())
        # Not a part that fails: a reader that dies is replaced (gbroker.daemon.bounded).
        readers = {"pids": self.readers.pids, "budget_seconds": self.readers.budget.seconds}
        return {"site": self.site, "ok": ok, **parts, "readers": readers}

    def _backend_health(self) -> dict[str, Any]:
        backend = self.executor
        part: dict[str, Any] = {
            "ok": not backend.closed,
            "manager": backend.name,
            "running": len(backend.running()),
            "confinement": backend.confinement,
            "run_as": self.identities,
        }
        part.update(backend.health())
        return part

    async def _health(self, request: web.Request) -> web.Response:
        report = self.health()
        return web.json_response(report, status=200 if report["ok"] else 503)
