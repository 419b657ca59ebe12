"""``fleet up`` of processes and network namespaces: an MQTT broker, then a broker per site, each
detached with its log in the fleet directory; ``up`` returns once every broker is healthy and has
heard its neighbours (containers: :func:`gbroker.fleet.containers.up_docker`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import ssl
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gbroker.client import fleetdir
from gbroker.client.fleetdir import TLS_DIR
from gbroker.errors import InvalidInput
from gbroker.fleet import batch, netns
from gbroker.fleet.containers import up_docker
from gbroker.fleet.files import mqtt_command, site_uid_range, write_fleet_files
from gbroker.fleet.members import (
    DEFAULT_IMAGE,
    FLEET_FILE,
    JOBS_ROOT_FILE,
    MQTT_BROKERS,
    MQTT_PORT,
    RUNTIMES,
    SITE_PORT,
    FleetError,
    broker_health,
    gbroker_command,
    is_alive,
    shared_directory,
    signal_group,
    start_detached,
    wait_port,
    write_brokers,
)
from gbroker.fleet.ports import free_port
from gbroker.mqtt.accounts import AuthFiles, write_auth_files
from gbroker.security.auth import Tokens, bearer
from gbroker.security.tls import client_context, fleet_certificates
from gbroker.topology import Topology, load_topology

__all__ = [
    "up",
]


def _wait_ready(
    record: dict[str, Any], token: str, context: ssl.SSLContext | None, deadline: float
) -> None:
    """Wait (until ``deadline``, a ``time.monotonic()`` value) until every broker is healthy
    (``/api/v1/health``: its journal, its executor and its MQTT link, which may join after the
    broker answers HTTP) and has heard from each of its neighbours (over MQTT, or a heartbeat):
    until then a broker takes none of them as a candidate, and a job only a neighbour can run
    would be refused. Past ``deadline``, up goes on (a neighbour may be slow; it is taken in
    once heard), and ``fleet status`` says which part of a broker is not ok."""
    waiting = dict(record["sites"])
    while waiting and time.monotonic() < deadline:
        for name, member in list(waiting.items()):
            if broker_health(member["url"], token, context) != (True, []):
                if not is_alive(member["pid"]):  # it listened, then stopped: never a fleet
                    raise FleetError(f"the broker of {name} exited: see {member['log']}")
                continue
            request = urllib.request.Request(f"{member['url']}/api/v1/info", headers=bearer(token))
            try:
                with urllib.request.urlopen(request, timeout=2, context=context) as response:
                    info = json.loads(response.read())
            except (urllib.error.URLError, OSError, ValueError):
                continue
            if all(n.get("status") != "unheard" for n in info.get("neighbours", ())):
                del waiting[name]
        if waiting:
            time.sleep(0.05)


def up(
    topology_path: str | Path,
    directory: str | Path,
    mqtt: str | None = None,
    serve_args: tuple[str, ...] = (),
    timeout: float = 30.0,
    tls: bool = False,
    runtime: str = "local",
    image: str = DEFAULT_IMAGE,
    remember: bool = False,
) -> dict[str, Any]:
    """Start a fleet; returns what ``fleet.json`` records. With ``remember`` (what ``gbroker
    fleet up`` does), it becomes the user's default fleet (:mod:`gbroker.client.fleetdir`).

    ``runtime`` is where the members run: ``local`` (processes on loopback, random ports) or
    ``netns`` (each in its own network namespace, with its own address, port 8700 for a site's
    broker and 1883 for MQTT, and the topology's access links shaped: :mod:`gbroker.fleet.netns`)
    or ``docker`` (a container per member from ``image``: :mod:`gbroker.fleet.containers`).

    ``mqtt`` is the MQTT broker: ``amqtt`` (the default, also for None) or ``mosquitto`` for one
    the fleet runs with access control, else the ``mqtt://`` URL of an external one. With
    ``tls``, the brokers serve HTTPS and the embedded amqtt broker mqtts (see the module docs).

    ``timeout`` bounds the whole start of a local or netns fleet, from its first step: every
    member must listen within it (else up fails, and stops what it started), and up returns once
    every broker is ready (:func:`_wait_ready`), or when it runs out.
    """
    kind = "amqtt" if mqtt is None else mqtt
    _check_choices(kind, tls, runtime)
    directory = Path(directory)
    if (directory / FLEET_FILE).exists():
        raise FleetError(f"{directory} already holds a fleet: run fleet down first")
    source = load_topology(topology_path)
    batch.check(source, runtime)
    if runtime == "docker":
        if kind not in MQTT_BROKERS:
            raise InvalidInput("mqtt", "amqtt or mosquitto (run in the fleet's network)", kind)
        return up_docker(source, directory, kind, serve_args, timeout, image)
    launch = _Launch(source, Path(topology_path), directory, runtime == "netns", tls, kind)
    began = time.monotonic()  # one bound for all of up, from here (docs/DEPLOY.md)
    try:
        launch.start(serve_args, began, timeout)
    except BaseException:
        launch.undo()
        raise
    (directory / FLEET_FILE).write_text(json.dumps(launch.record, indent=2))
    write_brokers(directory, launch.record)
    if remember:
        fleetdir.remember_default(str(directory))
    return launch.record


def reachable_jobs_root(directory: Path) -> Path | None:
    """Where the sites of a fleet in ``directory`` keep their job directories, if not under it:
    jobs run as other accounts (a uid per user, ``nobody``), which must reach their directory
    by its absolute path (an MPI job's ``mpiexec`` changes into it, a script opens files by
    ``$GBROKER_JOB_DIR``); a fleet in a 0700 home (``/root``) is out of their reach, so its job
    directories go to a directory of their own under the temporary directory (mode 0711,
    :func:`~gbroker.fleet.members.shared_directory`; each job's own is 0700 and its account's),
    made once and reused by the next ``up`` of the directory (its
    kept jobs are there), removed by ``down``; each site's ``DATA_DIR/jobs`` links to its part.
    None: the fleet directory is reachable."""
    pointer = directory / JOBS_ROOT_FILE
    with contextlib.suppress(OSError):
        kept = Path(pointer.read_text().strip())
        if kept.is_dir():
            return kept
    if all(
        parent.stat().st_mode & stat.S_IXOTH
        for parent in (directory.resolve(), *directory.resolve().parents)
    ):
        return None
    root = shared_directory("gbroker-jobs-")
    pointer.write_text(f"{root}\n")
    return root


def _check_choices(kind: str, tls: bool, runtime: str) -> None:
    if kind not in MQTT_BROKERS and "://" not in kind:
        raise InvalidInput("mqtt", f"one of {', '.join(MQTT_BROKERS)} or an mqtt:// URL", kind)
    if tls and kind == "mosquitto":
        raise InvalidInput("mqtt", "amqtt or an mqtts:// URL with --tls (mosquitto: no TLS yet)")
    if runtime not in RUNTIMES:
        raise InvalidInput("runtime", f"one of {', '.join(RUNTIMES)}", runtime)
    if runtime != "local" and tls:
        raise InvalidInput("tls", f"a local fleet for --tls ({runtime}: not yet)", runtime)


class _Launch:
    """A local or namespace fleet on its way up: where each member runs, what it is given, what
    has started (so that a failed or interrupted up stops all of it), and what ``fleet.json``
    will record.

    Made, it has written what members read (the fleet's files, the MQTT accounts, the TLS
    certificates; a namespace fleet's plan too, so that even its failure can be torn down);
    :meth:`start` then starts the MQTT broker and a broker per site and waits for them."""

    def __init__(
        self,
        source: Topology,
        source_path: Path,
        directory: Path,
        namespaces: bool,
        tls: bool,
        kind: str,
    ) -> None:
        self.directory = directory
        self.kind = kind  # amqtt or mosquitto, run by the fleet; else an external broker's URL
        self.tls = tls
        self.spaces: netns.NetnsFleet | None = None
        if namespaces:
            netns.check_host()
            default = source.default_link.bandwidth  # a site without its own access link's
            self.spaces = netns.plan(
                [
                    (s.name, s.uplink or default, s.downlink or default)
                    for s in source.sites.values()
                ]
            )
        directory.mkdir(parents=True, exist_ok=True)
        self.files = write_fleet_files(source, directory, self._endpoint)
        self.record: dict[str, Any] = {
            "runtime": "netns" if namespaces else "local",
            "source_topology": str(source_path.resolve()),
            "topology": str(self.files.topology_file),
            "tokens": str(self.files.token_file),
            "mqtt": None,
            "sites": {},
        }
        if self.spaces is not None:
            self.record["netns"] = self.spaces.as_dict()
            # Written before anything is built: a failed or interrupted up can still be undone.
            (directory / FLEET_FILE).write_text(json.dumps(self.record, indent=2))
        self.auth: AuthFiles | None = None
        if kind in MQTT_BROKERS:
            self.auth = write_auth_files(directory / "mqtt", self.files.topology.sites)
            self.record["mqtt_auth"] = str(self.auth.directory)
        self.certificates: dict[str, tuple[str, ...]] = {}  # each member's TLS arguments
        if tls:
            self._issue_certificates()
        self.started: list[int] = []
        self.systems: dict[str, batch.BatchSystem] = {}  # each batch site's, once it runs
        self.jobs_root = reachable_jobs_root(directory)
        if self.jobs_root is not None:
            self.record["jobs_root"] = str(self.jobs_root)

    def _endpoint(self, site: str) -> str:
        scheme = "https" if self.tls else "http"
        if self.spaces is None:
            return f"{scheme}://127.0.0.1:{free_port()}"
        return f"{scheme}://{self.spaces.members[site].address}:{SITE_PORT}"

    def _issue_certificates(self) -> None:
        """The fleet CA and a certificate per member (:func:`fleet_certificates`)."""
        sites = self.files.topology.sites.values()
        endpoints = {f"site-{s.name}": [s.http or ""] for s in sites}
        endpoints["mqtt"] = ["mqtts://127.0.0.1"]
        issued = fleet_certificates(self.directory / TLS_DIR, endpoints)
        ca = str(issued["mqtt"].ca)
        for name, files in issued.items():
            member = "mqtt" if name == "mqtt" else name.removeprefix("site-")
            own = ("--tls-cert", str(files.cert), "--tls-key", str(files.key))
            self.certificates[member] = own if member == "mqtt" else (*own, "--tls-ca", ca)
        self.record["tls"] = {"ca": ca}

    def start(self, serve_args: tuple[str, ...], began: float, timeout: float) -> None:
        """Start the MQTT broker (unless external) and a broker per site; return once every
        broker is ready, or ``timeout`` s after ``began``. Raises if one does not start."""
        if self.spaces is not None:
            netns.create(self.spaces)
        batch.start(self.files.topology, self.directory, began + timeout, self.systems)
        self.record.update(batch.records(self.files.topology, self.systems))
        mqtt_url = self.kind if self.auth is None else self._start_mqtt(began, timeout)
        self.record["mqtt_url"] = mqtt_url
        for spec in self.files.topology.sites.values():
            assert spec.http is not None
            command = self._serve(spec.name, mqtt_url, serve_args)
            system = self.systems.get(spec.name)
            environment = {} if system is None else system.environment()
            member = self._start(spec.name, command, spec.http, environment)
            member["manager"] = spec.manager
            self.record["sites"][spec.name] = member
        for member in self.record["sites"].values():
            wait_port(member["url"], member["pid"], timeout, since=began, owned=True)
        context = client_context(Path(self.record["tls"]["ca"])) if self.tls else None
        token = Tokens.load(self.files.token_file).first_token()
        _wait_ready(self.record, token, context, began + timeout)

    def _start_mqtt(self, began: float, timeout: float) -> str:
        assert self.auth is not None
        host = "127.0.0.1" if self.spaces is None else self.spaces.members["mqtt"].address
        port = free_port() if self.spaces is None else MQTT_PORT
        url = f"{'mqtts' if self.tls else 'mqtt'}://{host}:{port}"
        command = [
            *mqtt_command(self.kind, port, self.directory, self.auth, host),
            *self.certificates.get("mqtt", ()),
        ]
        member = self._start("mqtt", command, url)
        wait_port(url, member["pid"], timeout, since=began, owned=True)
        self.record["mqtt"] = {**member, "kind": self.kind}
        return url

    def _serve(self, site: str, mqtt_url: str, serve_args: tuple[str, ...]) -> list[str]:
        """Site ``site``'s broker: ``gbroker serve`` with everything it reads from files."""
        credentials = (
            ("--mqtt-password-file", str(self.auth.password_file(site))) if self.auth else ()
        )
        address = () if self.spaces is None else ("--host", self.spaces.members[site].address)
        system = self.systems.get(site)
        manager = () if system is None else system.serve_args()
        if system is None and self.jobs_root is not None:
            manager = ("--jobs-dir", str(self.jobs_root / site))
            # Where an operator looks for them (and did before): DATA_DIR/jobs, a link.
            link = self.directory / site / "jobs"
            if not link.is_symlink() and not link.exists():
                link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                link.symlink_to(self.jobs_root / site)
        return gbroker_command(
            "serve",
            *("--site", site),
            *("--topology", str(self.files.topology_file)),
            *("--data-dir", str(self.directory / site)),
            *("--mqtt", mqtt_url),
            *credentials,
            *("--secret-file", str(self.files.secret_file)),
            *("--token-file", str(self.files.token_file)),
            *("--uid-range", site_uid_range(list(self.files.topology.sites).index(site))),
            *self.certificates.get(site, ()),
            *address,
            *manager,
            *serve_args,
        )

    def _start(
        self, name: str, command: list[str], url: str, environment: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Start member ``name`` (in its namespace, if it has one), detached, its log in the
        fleet directory, with ``environment`` over up's own; what ``fleet.json`` records of it
        (the environment too: a restart gives it the same)."""
        if self.spaces is not None:
            command = [*netns.exec_prefix(self.spaces.members[name]), *command]
        log = self.directory / f"{name}.log"
        pid = start_detached(command, log, environment)
        self.started.append(pid)
        member = {"name": name, "pid": pid, "url": url, "command": command, "log": str(log)}
        return {**member, "environment": environment} if environment else member

    def undo(self) -> None:
        """Stop what was started (the sites' batch systems after the brokers), and take the
        namespaces down."""
        for pid in self.started:
            signal_group(pid, signal.SIGKILL)
        for system in self.systems.values():
            system.stop(grace=5.0, cancel=True)
        if self.jobs_root is not None:
            shutil.rmtree(self.jobs_root, ignore_errors=True)
            (self.directory / JOBS_ROOT_FILE).unlink(missing_ok=True)
        if self.spaces is not None:
            netns.destroy(self.spaces)
            (self.directory / FLEET_FILE).unlink(missing_ok=True)
