"""Fleets: one broker per site, plus an MQTT broker (§9), as processes, in network namespaces
or in containers.

Theory of operation. ``up`` gives every site of a topology an endpoint and writes the topology
with those endpoints into the fleet directory, so that every broker knows its peers' URLs: a
free loopback port (``runtime="local"``), its namespace's address and port 8700 (``"netns"``,
:mod:`gbroker.netns`: its access link shaped as the topology says), or its container's name and
port 8700 (``"docker"``, :mod:`gbroker.containers`: the host reaches it on a port published on
127.0.0.1). What follows holds for every runtime; the runtime modules say what differs. It
starts an MQTT broker process, the embedded amqtt one (``gbroker mqtt-serve``) or a mosquitto,
unless an external one is named, then one ``gbroker serve`` process per site.

The MQTT broker the fleet runs refuses anonymous clients and confines each site to its own
topics (:mod:`gbroker.daemon.mqtt`, "Access control"): ``up`` writes the fleet directory's
``mqtt/`` (0700) with one password file per site (``mqtt/<site>.password``, 0600), the hashed
passwords and the ACL for the MQTT broker, and gives each ``serve`` its password file
(``--mqtt-password-file``; the user is the site). A standalone monitor of a site is given the
same file. An external MQTT broker (``--mqtt URL``) is the operator's to secure; the fleet then
passes no credentials. All of them are detached into their own
sessions, with their logs in the fleet directory. It waits until every broker answers HTTP, and
records the pids and URLs in ``fleet.json``. The other commands read that file:
- ``status`` probes each process and each broker's HTTP API;
- ``kill`` sends SIGKILL to one site (its MQTT last-will then tells the neighbours);
- ``restart`` starts it again with the same arguments and the same data directory, so it
  resumes from its journal;
- ``kill_mqtt`` and ``restart_mqtt`` do the same to the MQTT broker the fleet runs, and
  ``set_serve_option`` restarts every broker with one option of ``serve`` changed (what
  ``gbroker chaos`` uses, :mod:`gbroker.chaos`);
- ``down`` sends SIGTERM to everything and then SIGKILL to stragglers;
- ``drain`` asks one site to take no new work, hand its queued jobs back to their owners and let
  its running jobs finish, and waits (with progress) until it says it is drained; ``undrain``
  lifts that (:mod:`gbroker.daemon.drain`). Both also work against any broker's URL with an
  admin token, without a fleet directory.

With ``tls``, ``up`` makes the fleet CA and a certificate per site (and for the embedded MQTT
broker) in ``<dir>/tls`` (:mod:`gbroker.tls`; an existing CA is kept), writes ``https://``
endpoints into the topology and starts every member with its certificate, its key and the CA;
the embedded MQTT broker then speaks ``mqtts://``. Clients verify with ``<dir>/tls/ca.crt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gbroker import containers, fleetdir, netns
from gbroker.auth import Tokens, bearer, write_private
from gbroker.daemon.mqtt import AuthFiles, mosquitto_config, write_auth_files
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.ports import free_port
from gbroker.tls import TLS_DIR, client_context, fleet_certificates
from gbroker.topology import Topology, load_topology, save_topology

__all__ = [
    "MQTT_BROKERS",
    "Down",
    "DrainTarget",
    "FleetError",
    "client_token",
    "down",
    "drain",
    "drain_left",
    "drain_target",
    "kill",
    "kill_mqtt",
    "load",
    "partition",
    "restart",
    "restart_mqtt",
    "set_serve_option",
    "shape",
    "status",
    "up",
]

FLEET_FILE = "fleet.json"
RUNTIMES = ("local", "netns", "docker")
"""Where a fleet's members run (see :func:`up`)."""
SITE_PORT = 8700  # a site's broker in its own namespace or container
DEFAULT_IMAGE = "gbroker:local"  # gbroker.image.DEFAULT_TAG
_IN_IMAGE = ("/opt/gbroker/bin/python", "-m", "gbroker")  # argv as `docker top` shows it
MQTT_PORT = 1883
MQTT_BROKERS = ("amqtt", "mosquitto")
"""The MQTT brokers a fleet can run itself."""


class FleetError(GBrokerError):
    """A fleet could not be started or managed."""


# Restarts rewrite fleet.json (read, change a pid, write): one at a time within a process.
_RECORD_LOCK = threading.Lock()


def _start(command: list[str], log: Path) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists": look at the state of each of its threads. A killed process's
    # main thread turns zombie before the others have exited, and until the last has, its
    # files (a broker's listening socket) are still open: it is alive until every thread is Z.
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue  # that thread is gone
    return False


def _wait_port(url: str, pid: int, timeout: float) -> None:
    host, port = url.rsplit("//", 1)[1].rstrip("/").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host.strip("[]"), int(port))) == 0:
                return
        if not _alive(pid):
            raise FleetError(f"process {pid} for {url} exited during start-up")
        time.sleep(0.05)
    raise FleetError(f"{url} did not start listening within {timeout:g} s")


def _wait_http(url: str, pid: int, timeout: float) -> None:
    """Wait until ``url`` answers HTTP (any status: a 401 is an answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError):
            pass
        if not _alive(pid):
            raise FleetError(f"process {pid} for {url} exited during start-up")
        time.sleep(0.05)
    raise FleetError(f"{url} did not answer HTTP within {timeout:g} s")


def _wait_ready(
    record: dict[str, Any], token: str, context: ssl.SSLContext | None, timeout: float
) -> None:
    """Wait (at most ``timeout`` s) until every broker is healthy (``/api/v1/health``: its
    journal, its executor and its MQTT link, which may join after the broker answers HTTP) and
    has heard from each of its neighbours (over MQTT, or a heartbeat): until then a broker takes
    none of them as a candidate, and a job only a neighbour can run would be refused. Past
    ``timeout``, up goes on (a neighbour may be slow; it is taken in once heard), and ``fleet
    status`` says which part of a broker is not ok."""
    deadline = time.monotonic() + timeout
    waiting = dict(record["sites"])
    while waiting and time.monotonic() < deadline:
        for name, member in list(waiting.items()):
            if _health(member["url"], token, context) != (True, []):
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


def _gbroker(*args: str) -> list[str]:
    return [sys.executable, "-m", "gbroker", *args]


def _find_mosquitto() -> str:
    """The mosquitto binary; Debian installs it in /usr/sbin, often not on a user's PATH."""
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise FleetError("mosquitto is not installed: run scripts/ensure_mosquitto.sh")
    return found


def _mqtt_command(
    kind: str, port: int, directory: Path, auth: AuthFiles, host: str = "127.0.0.1"
) -> list[str]:
    """The command line of the fleet's MQTT broker; it reads every credential from files."""
    if kind == "amqtt":
        return _gbroker(
            "mqtt-serve",
            "--host",
            host,
            "--port",
            str(port),
            "--password-file",
            str(auth.amqtt_passwords),
            "--acl-file",
            str(auth.acl),
        )
    config = directory / "mosquitto.conf"
    config.write_text(mosquitto_config(port, auth, host))
    return [_find_mosquitto(), "-c", str(config.resolve())]


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
    fleet up`` does), it becomes the user's default fleet (:mod:`gbroker.fleetdir`).

    ``runtime`` is where the members run: ``local`` (processes on loopback, random ports) or
    ``netns`` (each in its own network namespace, with its own address, port 8700 for a site's
    broker and 1883 for MQTT, and the topology's access links shaped: :mod:`gbroker.netns`) or
    ``docker`` (a container per member from ``image``: :mod:`gbroker.containers`).

    ``mqtt`` is the MQTT broker: ``amqtt`` (the default, also for None) or ``mosquitto`` for one
    the fleet runs with access control, else the ``mqtt://`` URL of an external one. With
    ``tls``, the brokers serve HTTPS and the embedded amqtt broker mqtts (see the module docs).
    """
    kind = mqtt_url = "amqtt" if mqtt is None else mqtt
    if kind not in MQTT_BROKERS and "://" not in kind:
        raise InvalidInput("mqtt", f"one of {', '.join(MQTT_BROKERS)} or an mqtt:// URL", mqtt)
    if tls and kind == "mosquitto":
        raise InvalidInput("mqtt", "amqtt or an mqtts:// URL with --tls (mosquitto: no TLS yet)")
    if runtime not in RUNTIMES:
        raise InvalidInput("runtime", f"one of {', '.join(RUNTIMES)}", runtime)
    if runtime != "local" and tls:
        raise InvalidInput("tls", f"a local fleet for --tls ({runtime}: not yet)", runtime)
    directory = Path(directory)
    if (directory / FLEET_FILE).exists():
        raise FleetError(f"{directory} already holds a fleet: run fleet down first")
    source = load_topology(topology_path)
    if runtime == "docker":
        if kind not in MQTT_BROKERS:
            raise InvalidInput("mqtt", "amqtt or mosquitto (run in the fleet's network)", kind)
        return _up_docker(source, directory, kind, serve_args, timeout, image)
    spaces: netns.NetnsFleet | None = None
    if runtime == "netns":
        netns.check_host()
        default = source.default_link.bandwidth  # a site without its own access link's
        spaces = netns.plan(
            [(s.name, s.uplink or default, s.downlink or default) for s in source.sites.values()]
        )
    directory.mkdir(parents=True, exist_ok=True)
    scheme = "https" if tls else "http"

    def endpoint(name: str) -> str:
        if spaces is None:
            return f"{scheme}://127.0.0.1:{free_port()}"
        return f"{scheme}://{spaces.members[name].address}:{SITE_PORT}"

    topology, topology_file, secret_file, token_file = _fleet_files(source, directory, endpoint)
    record: dict[str, Any] = {
        "runtime": runtime,
        "source_topology": str(Path(topology_path).resolve()),
        "topology": str(topology_file),
        "tokens": str(token_file),
        "mqtt": None,
        "sites": {},
    }
    if spaces is not None:
        record["netns"] = spaces.as_dict()
        # Written before anything is built: a failed or interrupted up can still be torn down.
        (directory / FLEET_FILE).write_text(json.dumps(record, indent=2))
    auth = None
    if kind in MQTT_BROKERS:
        auth = write_auth_files(directory / "mqtt", topology.sites)
        record["mqtt_auth"] = str(auth.directory)
    mqtt_tls: tuple[str, ...] = ()
    site_tls: dict[str, tuple[str, ...]] = {name: () for name in topology.sites}
    if tls:
        endpoints = {f"site-{s.name}": [s.http or ""] for s in topology.sites.values()}
        endpoints["mqtt"] = ["mqtts://127.0.0.1"]
        issued = fleet_certificates(directory / TLS_DIR, endpoints)
        ca = str(issued["mqtt"].ca)
        mqtt_tls = ("--tls-cert", str(issued["mqtt"].cert), "--tls-key", str(issued["mqtt"].key))
        for name in site_tls:
            own = issued[f"site-{name}"]
            site_tls[name] = ("--tls-cert", str(own.cert), "--tls-key", str(own.key))
            site_tls[name] += ("--tls-ca", ca)
        record["tls"] = {"ca": ca}
    started: list[int] = []

    def inside(name: str, command: list[str]) -> list[str]:
        return command if spaces is None else [*netns.exec_prefix(spaces.members[name]), *command]

    try:
        if spaces is not None:
            netns.create(spaces)
        if auth is not None:
            host = "127.0.0.1" if spaces is None else spaces.members["mqtt"].address
            port = free_port() if spaces is None else MQTT_PORT
            mqtt_url = f"{'mqtts' if tls else 'mqtt'}://{host}:{port}"
            command = [*_mqtt_command(kind, port, directory, auth, host), *mqtt_tls]
            command = inside("mqtt", command)
            log = directory / "mqtt.log"
            pid = _start(command, log)
            started.append(pid)
            _wait_port(mqtt_url, pid, timeout)
            record["mqtt"] = {
                "name": "mqtt",
                "kind": kind,
                "pid": pid,
                "url": mqtt_url,
                "command": command,
                "log": str(log),
            }
        record["mqtt_url"] = mqtt_url
        for spec in topology.sites.values():
            assert spec.http is not None
            credentials = (
                ("--mqtt-password-file", str(auth.password_file(spec.name))) if auth else ()
            )
            command = _gbroker(
                "serve",
                "--site",
                spec.name,
                "--topology",
                str(topology_file),
                "--data-dir",
                str(directory / spec.name),
                "--mqtt",
                mqtt_url,
                *credentials,
                "--secret-file",
                str(secret_file),
                "--token-file",
                str(token_file),
                *site_tls[spec.name],
                *(() if spaces is None else ("--host", spaces.members[spec.name].address)),
                *serve_args,
            )
            command = inside(spec.name, command)
            log = directory / f"{spec.name}.log"
            pid = _start(command, log)
            started.append(pid)
            record["sites"][spec.name] = {
                "name": spec.name,
                "pid": pid,
                "url": spec.http,
                "command": command,
                "log": str(log),
            }
        for member in record["sites"].values():
            _wait_port(member["url"], member["pid"], timeout)
        context = client_context(Path(record["tls"]["ca"])) if tls else None
        _wait_ready(record, Tokens.load(token_file).first_token(), context, min(timeout, 10.0))
    except BaseException:
        for pid in started:
            _signal(pid, signal.SIGKILL)
        if spaces is not None:
            netns.destroy(spaces)
            (directory / FLEET_FILE).unlink(missing_ok=True)
        raise
    (directory / FLEET_FILE).write_text(json.dumps(record, indent=2))
    _write_brokers(directory, record)
    if remember:
        fleetdir.remember_default(str(directory))
    return record


def _write_brokers(directory: Path, record: dict[str, Any]) -> None:
    """``brokers``: each site's URL, a line each, what clients read at start (no JSON)."""
    lines = [f"{name} {member['url']}" for name, member in record["sites"].items()]
    text = "# SITE URL of each broker of this fleet (written by gbroker fleet up)\n"
    (directory / fleetdir.BROKERS_FILE).write_text(text + "\n".join(lines) + "\n")


def _up_docker(
    source: Topology,
    directory: Path,
    kind: str,
    serve_args: tuple[str, ...],
    timeout: float,
    image: str,
) -> dict[str, Any]:
    """:func:`up` with a container per member (:mod:`gbroker.containers`)."""
    containers.check(image)
    from gbroker.image import image_sources, source_hash

    held, here = image_sources(image), source_hash()
    if held != here:  # a fleet from an old image runs old code: say so, do not refuse
        logging.getLogger("gbroker.fleet").warning(
            "image %s holds GBroker sources %s, not these (%s): run `gbroker image build`",
            image,
            held or "of unknown origin",
            here,
        )
    prefix = "gb" + secrets.token_hex(2)
    network = f"{prefix}-net"
    directory.mkdir(parents=True, exist_ok=True)
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    # Shared with every site at the same path, for what jobs must leave outside their
    # containers (gbroker chaos: the jobs' own log of their runs).
    runs = (directory / "runs").resolve()
    runs.mkdir(exist_ok=True)
    runs.chmod(0o755)
    _, topology_file, secret_file, token_file = _fleet_files(
        source, directory, lambda site: f"http://{prefix}-{site}:{SITE_PORT}"
    )
    auth = write_auth_files(directory / "mqtt", source.sites)
    inner = AuthFiles(Path("/fleet/mqtt"), auth.sites)  # the same files, as mounted
    mqtt_url = f"mqtt://{prefix}-mqtt:{MQTT_PORT}"
    names = {"mqtt": f"{prefix}-mqtt", **{site: f"{prefix}-{site}" for site in source.sites}}
    record: dict[str, Any] = {
        "runtime": "docker",
        "topology": str(topology_file),
        "tokens": str(token_file),
        "mqtt_auth": str(auth.directory),
        "mqtt_url": mqtt_url,
        "mqtt": None,
        "sites": {},
        "docker": {
            "prefix": prefix,
            "network": network,
            "image": image,
            "containers": list(names.values()),
            "volumes": [f"{prefix}-{site}" for site in source.sites],
            "runs": str(runs),
        },
    }
    # Written first: a failed or interrupted up can still be torn down.
    (directory / FLEET_FILE).write_text(json.dumps(record, indent=2))
    try:
        subprocess.run(["docker", "network", "create", network], capture_output=True, check=True)
        if kind == "amqtt":
            command = [*_IN_IMAGE, "mqtt-serve", "--host", "0.0.0.0", "--port", str(MQTT_PORT),
                       "--password-file", str(inner.amqtt_passwords),
                       "--acl-file", str(inner.acl)]  # fmt: skip
        else:
            (auth.directory / "mosquitto.conf").write_text(
                mosquitto_config(MQTT_PORT, inner, "0.0.0.0")
            )
            command = ["mosquitto", "-c", str(inner.directory / "mosquitto.conf")]
        containers.run(names["mqtt"], network, image,
                       [(auth.directory, "/fleet/mqtt", True), (logs, "/logs", False)])  # fmt: skip
        record["mqtt"] = _docker_member("mqtt", names["mqtt"], command, logs, timeout)
        record["mqtt"]["kind"] = kind
        address = containers.ip_address(names["mqtt"], network)
        record["mqtt"]["url"] = mqtt_url
        record["mqtt"]["wait_url"] = f"mqtt://{address}:{MQTT_PORT}"  # from the host
        _wait_port(record["mqtt"]["wait_url"], record["mqtt"]["pid"], timeout)
        default = source.default_link.bandwidth
        for spec in source.sites.values():
            name = names[spec.name]
            mounts: list[tuple[Path | str, str, bool]] = [
                (topology_file, "/fleet/topology.yaml", True),
                (secret_file, "/fleet/secret", True),
                (token_file, "/fleet/tokens", True),
                (auth.password_file(spec.name), "/fleet/mqtt.password", True),
                (logs, "/logs", False),
                (runs, str(runs), False),
                (f"{prefix}-{spec.name}", "/data", False),
            ]
            containers.run(
                name, network, image, mounts, publish=SITE_PORT, net_admin=True, site=True
            )
            containers.shape(name, spec.uplink or default, spec.downlink or default)
            command = [*_IN_IMAGE, "serve", "--site", spec.name, "--topology",
                       "/fleet/topology.yaml", "--data-dir", "/data", "--host", "0.0.0.0",
                       "--mqtt", mqtt_url, "--mqtt-password-file", "/fleet/mqtt.password",
                       "--secret-file", "/fleet/secret", "--token-file", "/fleet/tokens",
                       *serve_args]  # fmt: skip
            member = _docker_member(spec.name, name, command, logs, timeout)
            member["url"] = f"http://127.0.0.1:{containers.host_port(name, SITE_PORT)}"
            record["sites"][spec.name] = member
        for member in record["sites"].values():
            # docker-proxy takes connections on the published port before the broker listens
            # behind it: wait for an HTTP answer, not for the port.
            _wait_http(member["url"], member["pid"], timeout)
    except BaseException:
        docker = record["docker"]
        containers.remove(docker["containers"], docker["network"], docker["volumes"])
        (directory / FLEET_FILE).unlink(missing_ok=True)
        raise
    (directory / FLEET_FILE).write_text(json.dumps(record, indent=2))
    return record


def compose(
    topology_path: str | Path,
    directory: str | Path,
    mqtt: str = "amqtt",
    image: str = DEFAULT_IMAGE,
    first_port: int = 8701,
    serve_args: tuple[str, ...] = (),
) -> Path:
    """Write ``directory/docker-compose.yml`` for the topology's sites, with everything it
    mounts beside it (topology, fleet secret, client tokens, MQTT credentials): ``docker-compose
    up -d`` there runs the layout of ``up(runtime="docker")`` under Compose's control, with two
    differences: a site's broker is its container's process (stopping it stops the container
    and its jobs), and links are not shaped (Compose cannot run tc).
    Site i's broker is published on 127.0.0.1:``first_port + i``. Returns the file's path."""
    if mqtt not in MQTT_BROKERS:
        raise InvalidInput("mqtt", f"one of {', '.join(MQTT_BROKERS)}", mqtt)
    directory = Path(directory)
    target = directory / "docker-compose.yml"
    if target.exists():
        raise FleetError(f"{target} exists: remove it (and its fleet) first")
    source = load_topology(topology_path)
    directory.mkdir(parents=True, exist_ok=True)
    _fleet_files(source, directory, lambda site: f"http://{site.lower()}:{SITE_PORT}")
    auth = write_auth_files(directory / "mqtt", source.sites)
    inner = AuthFiles(Path("/fleet/mqtt"), auth.sites)
    if mqtt == "amqtt":
        broker_command = [*_IN_IMAGE, "mqtt-serve", "--host", "0.0.0.0", "--port", str(MQTT_PORT),
                          "--password-file", str(inner.amqtt_passwords),
                          "--acl-file", str(inner.acl)]  # fmt: skip
    else:
        (auth.directory / "mosquitto.conf").write_text(
            mosquitto_config(MQTT_PORT, inner, "0.0.0.0")
        )
        broker_command = ["mosquitto", "-c", str(inner.directory / "mosquitto.conf")]
    services: dict[str, Any] = {
        "mqtt": {
            "image": image,
            "command": broker_command,
            "volumes": ["./mqtt:/fleet/mqtt:ro"],
            "networks": ["fleet"],
        }
    }
    for n, spec in enumerate(source.sites.values()):
        service = spec.name.lower()
        services[service] = {
            "image": image,
            "hostname": service,
            "command": [
                *_IN_IMAGE,
                "serve",
                "--site",
                spec.name,
                "--topology",
                "/fleet/topology.yaml",
                "--data-dir",
                "/data",
                "--host",
                "0.0.0.0",
                "--mqtt",
                f"mqtt://mqtt:{MQTT_PORT}",
                "--mqtt-password-file",
                "/fleet/mqtt.password",
                "--secret-file",
                "/fleet/secret",
                "--token-file",
                "/fleet/tokens",
                *serve_args,
            ],
            "depends_on": ["mqtt"],
            "ports": [f"127.0.0.1:{first_port + n}:{SITE_PORT}"],
            "volumes": [
                "./topology.yaml:/fleet/topology.yaml:ro",
                "./secret:/fleet/secret:ro",
                "./tokens:/fleet/tokens:ro",
                f"./mqtt/{spec.name}.password:/fleet/mqtt.password:ro",
                f"{service}-data:/data",
            ],
            "cap_add": ["NET_ADMIN", "SYS_PTRACE"],
            "networks": ["fleet"],
        }
    document = {
        "version": "2.4",
        "services": services,
        "networks": {"fleet": {}},
        "volumes": {f"{spec.name.lower()}-data": {} for spec in source.sites.values()},
    }
    header = (
        f"# Written by `gbroker fleet compose` for topology {source.name or topology_path}.\n"
        f"# Run: docker-compose up -d   (image {image}: `gbroker image build`)\n"
        f"# Clients: GBROKER_TOKEN_FILE={directory.resolve()}/tokens, brokers on 127.0.0.1:"
        f"{first_port}..{first_port + len(source.sites) - 1}\n"
    )
    target.write_text(header + json.dumps(document, indent=2) + "\n")
    return target


def _docker_member(
    name: str, container: str, command: list[str], logs: Path, timeout: float
) -> dict[str, Any]:
    inside_log = f"/logs/{name}.log"
    pid = containers.start(container, command, inside_log, timeout)
    return {
        "name": name,
        "pid": pid,
        "container": container,
        "command": command,
        "inside_log": inside_log,
        "log": str(logs / f"{name}.log"),
    }


def _fleet_files(
    source: Topology, directory: Path, endpoint: Callable[[str], str]
) -> tuple[Topology, Path, Path, Path]:
    """Write the fleet's topology (with each site's ``endpoint``), secret and client tokens."""
    # Each site as declared (its properties too), with the fleet's endpoint. Its jobs run on
    # this host (a process, a namespace or a container of its kernel): an operating system or
    # architecture the topology leaves out is this host's, so that JSDL asking for them (most
    # real documents do) finds the sites that indeed offer them.
    system, machine = _host_platform()
    sites = [
        dataclasses.replace(
            s,
            http=endpoint(s.name),
            mqtt=None,
            operating_system=s.operating_system or system,
            cpu_architecture=s.cpu_architecture or machine,
        )
        for s in source.sites.values()
    ]
    topology = Topology(
        sites,
        source.neighbourhood,
        name=source.name,
        description=source.description,
        links=source.links,
        default_link=source.default_link,
        data=source.data,
    )
    topology_file = directory / "topology.yaml"
    save_topology(topology, topology_file)
    secret_file = directory / "secret"  # peers of this fleet sign with it, never send it
    write_private(secret_file, secrets.token_hex(32))
    token_file = directory / "tokens"  # the fleet's client tokens: one admin token to begin
    if not token_file.exists():  # a fleet brought up again here keeps its users' tokens
        Tokens.create(token_file)
    return topology, topology_file, secret_file, token_file


_JSDL_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "i686": "x86_32", "i386": "x86_32",
                       "aarch64": "arm", "armv7l": "arm", "ppc64le": "powerpc", "ppc64": "powerpc",
                       "sparc64": "sparc", "mips": "mips", "ia64": "ia64"}  # fmt: skip
"""``platform.machine()`` to JSDL's CPUArchitectureName (GFD.56, §6.1.7)."""


def _host_platform() -> tuple[str | None, str | None]:
    """This host's JSDL OperatingSystemName and CPUArchitectureName (None: not one JSDL names)."""
    system = {"Linux": "LINUX", "Darwin": "MACOS", "FreeBSD": "FreeBSD"}.get(platform.system())
    return system, _JSDL_ARCHITECTURES.get(platform.machine().lower())


def _load(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / FLEET_FILE
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"no fleet in {directory} (no {FLEET_FILE}): run fleet up") from None
    except json.JSONDecodeError as exc:
        raise FleetError(f"{path}: not a fleet file ({exc})") from exc
    return record


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)  # each member leads its own session


def _signal_member(member: dict[str, Any], signum: signal.Signals) -> None:
    """Signal a member's process: its process group, or, in a container, the process alone
    (by its host pid: what it started, its jobs, stay in the container)."""
    if member.get("container") is None:
        _signal(member["pid"], signum)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(member["pid"], signum)


def _health(
    url: str, token: str | None, context: ssl.SSLContext | None = None
) -> tuple[bool, list[str]] | None:
    """A broker's ``/api/v1/health``: whether it is ok and, if not, the parts that are not (or
    the HTTP status, for an answer that names none); None if it gave no answer within 2 s."""
    request = urllib.request.Request(f"{url}/api/v1/health", headers=bearer(token or ""))
    try:
        with urllib.request.urlopen(request, timeout=2, context=context):
            return True, []
    except urllib.error.HTTPError as exc:  # an answer: 503 from an unhealthy broker, 401, ...
        try:
            report = json.loads(exc.read())
        except (OSError, ValueError):
            report = None
        parts = (
            sorted(k for k, v in report.items() if isinstance(v, dict) and v.get("ok") is False)
            if isinstance(report, dict)
            else []
        )
        return False, parts or [f"HTTP {exc.code}"]
    except (urllib.error.URLError, OSError):
        return None


def _fleet_token(record: dict[str, Any]) -> str | None:
    try:
        return Tokens.load(Path(record["tokens"])).first_token()
    except (KeyError, OSError, InvalidInput):
        return None


def status(directory: str | Path) -> list[dict[str, Any]]:
    """One row per member: name, pid, url, whether the process lives and (brokers) answers
    healthy, and if it answers otherwise, what is not ok (``not_ok``: parts or an HTTP status)."""
    record = _load(directory)
    token = _fleet_token(record)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    rows = []
    if record.get("mqtt"):
        m = record["mqtt"]
        rows.append(
            {
                "name": "mqtt",
                "pid": m["pid"],
                "url": m["url"],
                "alive": _alive(m["pid"]),
                "answers": None,
            }
        )
    for m in record["sites"].values():
        health = _health(m["url"], token, context)
        rows.append(
            {
                "name": m["name"],
                "pid": m["pid"],
                "url": m["url"],
                "alive": _alive(m["pid"]),
                "answers": health == (True, []),
                "not_ok": None if health is None else health[1],
            }
        )
    return rows


def _site(record: dict[str, Any], site: str) -> dict[str, Any]:
    try:
        member: dict[str, Any] = record["sites"][site]
    except KeyError:
        raise InvalidInput("site", f"one of {', '.join(record['sites'])}", site) from None
    return member


def site_alive(directory: str | Path, site: str) -> tuple[bool, int]:
    """Whether a site's broker process runs, and its pid (the last one started)."""
    member = _site(_load(directory), site)
    return _alive(member["pid"]), int(member["pid"])


def kill(directory: str | Path, site: str) -> int:
    """SIGKILL one broker (no clean shutdown: its MQTT last-will fires)."""
    member = _site(_load(directory), site)
    _signal_member(member, signal.SIGKILL)
    return int(member["pid"])


def restart(directory: str | Path, site: str, timeout: float = 30.0) -> int:
    """Start a site's broker again (killing it first if it still runs); returns the new pid."""
    with _RECORD_LOCK:
        record = _load(directory)
        member = _site(record, site)
        _restart_member(directory, record, member, timeout)
        return int(member["pid"])


def _restart_member(
    directory: str | Path, record: dict[str, Any], member: dict[str, Any], timeout: float
) -> None:
    if _alive(member["pid"]):
        _signal_member(member, signal.SIGKILL)
        _wait_gone([member["pid"]], 10.0)
    if member.get("container") is None:
        member["pid"] = _start(member["command"], Path(member["log"]))
    else:
        member["pid"] = containers.start(
            member["container"], member["command"], member["inside_log"], timeout
        )
    try:
        if member.get("container") is not None and member["name"] != "mqtt":
            _wait_http(member["url"], member["pid"], timeout)
        else:
            _wait_port(member.get("wait_url", member["url"]), member["pid"], timeout)
    finally:  # even if it failed to listen, fleet.json names the process that runs
        (Path(directory) / FLEET_FILE).write_text(json.dumps(record, indent=2))


def load(directory: str | Path) -> dict[str, Any]:
    """What ``fleet.json`` records: the members' pids, URLs and command lines (see :func:`up`)."""
    return _load(directory)


def client_token(directory: str | Path) -> str | None:
    """The fleet's (admin) client token."""
    return _fleet_token(_load(directory))


def _mqtt_member(record: dict[str, Any]) -> dict[str, Any]:
    member: dict[str, Any] | None = record.get("mqtt")
    if member is None:
        raise FleetError(f"the fleet uses an external MQTT broker ({record.get('mqtt_url')})")
    return member


def kill_mqtt(directory: str | Path) -> int:
    """SIGKILL the MQTT broker the fleet runs; returns its pid."""
    member = _mqtt_member(_load(directory))
    _signal_member(member, signal.SIGKILL)
    return int(member["pid"])


def restart_mqtt(directory: str | Path, timeout: float = 30.0) -> int:
    """Start the fleet's MQTT broker again, on the same port; returns the new pid."""
    with _RECORD_LOCK:
        record = _load(directory)
        member = _mqtt_member(record)
        _restart_member(directory, record, member, timeout)
        return int(member["pid"])


def shape(directory: str | Path, site: str, uplink: float | None, downlink: float | None) -> None:
    """Shape a site's access link in a namespace or container fleet: bytes/s out of it and into
    it (None: unshaped). The topology file keeps what the fleet started with."""
    record = _load(directory)
    member = _site(record, site)
    if member.get("container") is not None:
        containers.shape(member["container"], uplink, downlink)
        return
    netns.shape(_spaces(record), site, uplink, downlink)


def partition(directory: str | Path, site: str, cut: bool) -> None:
    """Cut a site of a namespace or container fleet off from everyone (``cut``), or end that."""
    record = _load(directory)
    member = _site(record, site)
    if member.get("container") is not None:
        network = record["docker"]["network"]
        (containers.cut if cut else containers.heal)(member["container"], network)
        return
    spaces = _spaces(record)
    (netns.cut if cut else netns.heal)(spaces, site)


def _spaces(record: dict[str, Any]) -> netns.NetnsFleet:
    if not record.get("netns"):
        runtime = record.get("runtime", "local")
        raise FleetError(
            f"links can be shaped or cut in a netns or docker fleet only (this one: {runtime})"
        )
    return netns.NetnsFleet.from_dict(record["netns"])


def set_serve_option(
    directory: str | Path, option: str, value: str, timeout: float = 30.0
) -> list[str]:
    """Give every broker's ``serve`` command ``option value`` (replacing the option's value if
    it had one), restart the brokers whose command changed, and return their names."""
    if not option.startswith("--"):
        raise InvalidInput("option", "a serve option such as --algorithm", option)
    changed = []
    with _RECORD_LOCK:
        record = _load(directory)
        for member in record["sites"].values():
            command: list[str] = member["command"]
            if option in command:
                at = command.index(option) + 1
                if command[at] == value:
                    continue
                command[at] = value
            else:
                command += [option, value]
            _restart_member(directory, record, member, timeout)
            changed.append(str(member["name"]))
    return changed


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


class Down:
    """What :func:`down` did: running jobs stopped (or left) per site, processes killed per
    namespace or container (their jobs)."""

    def __init__(self) -> None:
        self.stopped: dict[str, int] = {}
        self.left: dict[str, int] = {}
        self.killed: dict[str, int] = {}
        self.unanswered: list[str] = []  # sites whose broker did not say how many jobs ran


def _running_jobs(url: str, token: str | None, context: ssl.SSLContext | None) -> int | None:
    """How many jobs the broker at ``url`` runs now (its health report), None if it does not
    answer."""
    request = urllib.request.Request(f"{url}/api/v1/health", headers=bearer(token or ""))
    try:
        with urllib.request.urlopen(request, timeout=3, context=context) as response:
            report = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503: a part fails; the report is still there
        try:
            report = json.loads(exc.read())
        except ValueError:
            return None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    running = report.get("executor", {}).get("running") if isinstance(report, dict) else None
    return running if isinstance(running, int) else None


def _job_processes(directory: Path) -> dict[str, set[int]]:
    """The process groups of jobs still running from the fleet's data directories, by site:
    each job's leader carries its directory in its environment (``GBROKER_JOB_DIR``)."""
    root = os.fsencode(str(directory.resolve())) + b"/"
    found: dict[str, set[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            group = os.getpgid(int(entry))
        except OSError:  # gone, or not ours to read
            continue
        for variable in environ:
            if variable.startswith(b"GBROKER_JOB_DIR=" + root) and group == int(entry):
                site = variable[len(b"GBROKER_JOB_DIR=") + len(root) :].split(b"/", 1)[0]
                found.setdefault(os.fsdecode(site), set()).add(group)
    return found


def down(directory: str | Path, grace: float = 10.0, keep_jobs: bool = False) -> Down:
    """Stop every member: SIGUSR1 to each broker (it stops its running jobs, then itself), or
    SIGTERM with ``keep_jobs`` (its jobs run on, for a restarted broker to adopt); SIGKILL to
    whatever is left after ``grace`` seconds. A namespace fleet's namespaces, links and bridge
    go too, and a container fleet's containers, with every process still in them. Jobs whose
    broker was not running (killed) are found by their directories, and stopped too."""
    record = _load(directory)
    done = Down()
    token = _fleet_token(record)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    brokers = list(record["sites"].values())
    for member in brokers:
        if not _alive(member["pid"]):
            continue
        running = _running_jobs(member["url"], token, context)
        if running is None:
            done.unanswered.append(member["name"])
        elif running:
            (done.left if keep_jobs else done.stopped)[member["name"]] = running
    stop = signal.SIGTERM if keep_jobs else signal.SIGUSR1
    for member in brokers:
        _signal_member(member, stop)
    left = set(_wait_gone([m["pid"] for m in brokers], grace))
    for member in brokers:
        if member["pid"] in left:
            _signal_member(member, signal.SIGKILL)
    if record.get("mqtt"):
        member = record["mqtt"]
        _signal_member(member, signal.SIGTERM)
        if _wait_gone([member["pid"]], grace):
            _signal_member(member, signal.SIGKILL)
    # Jobs of brokers that were not running (killed, crashed) are orphans now: stop them too.
    orphans = _job_processes(Path(directory)) if record.get("runtime", "local") == "local" else {}
    for site, groups in orphans.items():
        if keep_jobs:
            done.left[site] = done.left.get(site, 0) + len(groups)
            continue
        for group in groups:
            _signal(group, signal.SIGTERM)
        if _wait_gone(list(groups), grace):
            for group in groups:
                _signal(group, signal.SIGKILL)
        done.stopped[site] = done.stopped.get(site, 0) + len(groups)
    if record.get("netns"):
        done.killed = netns.destroy(netns.NetnsFleet.from_dict(record["netns"]))
    if record.get("docker"):
        docker = record["docker"]
        done.killed = containers.remove(docker["containers"], docker["network"], docker["volumes"])
    (Path(directory) / FLEET_FILE).unlink()
    (Path(directory) / fleetdir.BROKERS_FILE).unlink(missing_ok=True)
    fleetdir.forget_default(str(directory))
    return done


# -- draining ------------------------------------------------------------------------------------

DRAIN_PATH = "/api/v1/drain"  # gbroker.daemon.drain.DRAIN_PATH, without importing the daemon


class DrainTarget:
    """Where a site's broker answers, with what token and CA: from a fleet or given."""

    def __init__(
        self, site: str | None, url: str, token: str | None, context: ssl.SSLContext | None
    ) -> None:
        self.site = site
        self.url = url.rstrip("/")
        self.token = token
        self.context = context

    def call(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``GET`` the site's drain progress, or ``POST`` ``body`` to change it."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**bearer(self.token or ""), "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + DRAIN_PATH, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
                answer: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                reason = exc.reason
            raise FleetError(f"{self.url}: {exc.code}: {reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FleetError(f"{self.url} is unreachable: {reason}") from None
        if self.site is not None and answer.get("site") != self.site:
            raise InvalidInput("site", f"the site of {self.url} ({answer.get('site')})", self.site)
        return answer


def drain_target(
    directory: str | Path | None,
    site: str | None,
    url: str | None = None,
    token: str | None = None,
    ca: str | Path | None = None,
) -> DrainTarget:
    """The broker of ``site`` in the fleet in ``directory`` (its admin token and CA from there),
    or the broker at ``url`` with ``token``; then ``site``, if given, must be its site."""
    if url is not None:
        context = client_context(Path(ca)) if ca is not None and url.startswith("https:") else None
        return DrainTarget(site, url, token, context)
    if directory is None or site is None:
        raise InvalidInput("site", "a site of a fleet directory, or a broker URL")
    record = _load(directory)
    member = _site(record, site)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    return DrainTarget(site, member["url"], token or _fleet_token(record), context)


def drain(
    target: DrainTarget,
    on: bool = True,
    wait: bool = True,
    timeout: float = 3600.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    poll: float = 0.5,
) -> dict[str, Any]:
    """Drain the target's site (``on``) or lift its drain; returns its last progress report.

    With ``wait`` (draining only), polls until the site reports ``drained``, calling
    ``progress`` with each report that differs from the one before; raises FleetError if it is
    not drained within ``timeout`` seconds (the drain stays on).
    """
    report = target.call({"drain": on})
    if not (on and wait):
        return report
    deadline = time.monotonic() + timeout
    shown: dict[str, Any] | None = None
    while not report["drained"]:
        counts = {k: report.get(k) for k in _LEFT}
        if progress is not None and counts != shown:
            progress(report)
            shown = counts
        if time.monotonic() >= deadline:
            left = drain_left(report)
            raise FleetError(f"{report['site']} not drained after {timeout:g} s: {left}")
        time.sleep(poll)
        report = target.call()
        if not report["draining"]:
            raise FleetError(f"{report['site']}: the drain was lifted meanwhile")
    return report


_LEFT = ("staging", "queued", "claiming", "running", "reporting")


def drain_left(report: dict[str, Any]) -> str:
    """What a drain report says is still at the site, e.g. ``2 queued, 1 running``."""
    left = [f"{report[k]} {k}" for k in _LEFT if report.get(k)]
    return ", ".join(left) or "nothing left"
