"""``fleet up`` of processes and network namespaces: an MQTT broker, then a broker per site, each
detached with its log in the fleet directory; ``up`` returns once every broker is healthy and has
heard its neighbours (containers: :func:`gbroker.fleet.containers.up_docker`)."""

from __future__ import annotations

import json
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gbroker.client import fleetdir
from gbroker.client.fleetdir import TLS_DIR
from gbroker.errors import InvalidInput
from gbroker.fleet import netns
from gbroker.fleet.containers import up_docker
from gbroker.fleet.files import mqtt_command, write_fleet_files
from gbroker.fleet.members import (
    DEFAULT_IMAGE,
    FLEET_FILE,
    MQTT_BROKERS,
    MQTT_PORT,
    RUNTIMES,
    SITE_PORT,
    FleetError,
    broker_health,
    gbroker_command,
    signal_group,
    start_detached,
    wait_port,
    write_brokers,
)
from gbroker.fleet.ports import free_port
from gbroker.mqtt.accounts import write_auth_files
from gbroker.security.auth import Tokens, bearer
from gbroker.security.tls import client_context, fleet_certificates
from gbroker.topology import load_topology

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
    broker and 1883 for MQTT, and the topology's access links shaped: :mod:`gbroker.fleet.netns`) or
    ``docker`` (a container per member from ``image``: :mod:`gbroker.fleet.containers`).

    ``mqtt`` is the MQTT broker: ``amqtt`` (the default, also for None) or ``mosquitto`` for one
    the fleet runs with access control, else the ``mqtt://`` URL of an external one. With
    ``tls``, the brokers serve HTTPS and the embedded amqtt broker mqtts (see the module docs).

    ``timeout`` bounds the whole start of a local or netns fleet, from its first step: every
    member must listen within it (else up fails, and stops what it started), and up returns once
    every broker is ready (:func:`_wait_ready`), or when it runs out.
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
        return up_docker(source, directory, kind, serve_args, timeout, image)
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

    topology, topology_file, secret_file, token_file = write_fleet_files(
        source, directory, endpoint
    )
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

    began = time.monotonic()  # one bound for all of up, from here (docs/DEPLOY.md)
    try:
        if spaces is not None:
            netns.create(spaces)
        if auth is not None:
            host = "127.0.0.1" if spaces is None else spaces.members["mqtt"].address
            port = free_port() if spaces is None else MQTT_PORT
            mqtt_url = f"{'mqtts' if tls else 'mqtt'}://{host}:{port}"
            command = [*mqtt_command(kind, port, directory, auth, host), *mqtt_tls]
            command = inside("mqtt", command)
            log = directory / "mqtt.log"
            pid = start_detached(command, log)
            started.append(pid)
            wait_port(mqtt_url, pid, timeout, since=began)
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
            command = gbroker_command(
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
            pid = start_detached(command, log)
            started.append(pid)
            record["sites"][spec.name] = {
                "name": spec.name,
                "pid": pid,
                "url": spec.http,
                "command": command,
                "log": str(log),
            }
        for member in record["sites"].values():
            wait_port(member["url"], member["pid"], timeout, since=began)
        context = client_context(Path(record["tls"]["ca"])) if tls else None
        _wait_ready(record, Tokens.load(token_file).first_token(), context, began + timeout)
    except BaseException:
        for pid in started:
            signal_group(pid, signal.SIGKILL)
        if spaces is not None:
            netns.destroy(spaces)
            (directory / FLEET_FILE).unlink(missing_ok=True)
        raise
    (directory / FLEET_FILE).write_text(json.dumps(record, indent=2))
    write_brokers(directory, record)
    if remember:
        fleetdir.remember_default(str(directory))
    return record
