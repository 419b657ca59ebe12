"""Acting on a running fleet's members: ``status`` of each process and broker, ``kill`` and
``restart`` of a site or of the fleet's MQTT broker, ``shape`` and ``partition`` of a namespace
site's link, ``set_serve_option`` (every broker restarted with one option changed; what
``gbroker chaos`` uses)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from gbroker.errors import InvalidInput
from gbroker.fleet import batch, containers, netns
from gbroker.fleet.members import (
    FLEET_FILE,
    RECORD_LOCK,
    broker_health_report,
    fleet_token,
    is_alive,
    load,
    mqtt_member,
    namespaces_of,
    signal_member,
    site_member,
    start_detached,
    wait_gone,
    wait_http,
    wait_port,
)
from gbroker.security.tls import client_context

__all__ = [
    "kill",
    "kill_mqtt",
    "partition",
    "restart",
    "restart_mqtt",
    "set_serve_option",
    "shape",
    "status",
]


def status(directory: str | Path) -> list[dict[str, Any]]:
    """One row per member: name, pid, url, whether the process lives and (brokers) answers
    healthy, and if it answers otherwise, what is not ok (``not_ok``: parts or an HTTP status);
    a broker's ``manager``, and a batch site's system under its manager's name (``slurm``,
    ``gridengine``: where it is, ``setting``; whether each of its ``daemons`` runs, and whether
    all do, ``up``; a Slurm cluster's ``conf``)."""
    record = load(directory)
    token = fleet_token(record)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    rows = []
    if record.get("mqtt"):
        m = record["mqtt"]
        rows.append(
            {
                "name": "mqtt",
                "pid": m["pid"],
                "url": m["url"],
                "alive": is_alive(m["pid"]),
                "answers": None,
            }
        )
    systems = {site: (manager, system) for manager, site, system in batch.systems(record)}
    for m in record["sites"].values():
        system = systems.get(m["name"])
        health = broker_health_report(m["url"], token, context)
        executor = (health[2] if health is not None else {}).get("executor")
        rows.append(
            {
                "name": m["name"],
                "pid": m["pid"],
                "url": m["url"],
                "alive": is_alive(m["pid"]),
                "answers": health is not None and health[:2] == (True, []),
                "not_ok": None if health is None else health[1],
                # How its jobs are confined and their default limits, as the broker says.
                "jobs": (
                    {
                        key: executor.get(key)
                        for key in (
                            "manager",
                            "run_as",
                            "uid_per_user",
                            "confinement",
                            "cgroups",
                            "limits",
                            "shares",
                        )
                    }
                    if isinstance(executor, dict)
                    else None
                ),
                "manager": m.get("manager", "local"),
                **({} if system is None else {system[0]: _system_status(*system)}),
            }
        )
    return rows


def _system_status(manager: str, system: batch.BatchSystem) -> dict[str, Any]:
    """A batch site's system in ``status``: where it is, whether each daemon runs."""
    shown = batch.status(system)
    if manager == "slurm":
        shown["conf"] = system.record()["conf"]
    return shown


def kill(directory: str | Path, site: str) -> int:
    """SIGKILL one broker (no clean shutdown: its MQTT last-will fires)."""
    member = site_member(load(directory), site)
    signal_member(member, signal.SIGKILL)
    return int(member["pid"])


def restart(directory: str | Path, site: str, timeout: float = 30.0) -> int:
    """Start a site's broker again (killing it first if it still runs); returns the new pid."""
    with RECORD_LOCK:
        record = load(directory)
        member = site_member(record, site)
        _restart_member(directory, record, member, timeout)
        return int(member["pid"])


def _restart_member(
    directory: str | Path, record: dict[str, Any], member: dict[str, Any], timeout: float
) -> None:
    if is_alive(member["pid"]):
        signal_member(member, signal.SIGKILL)
        wait_gone([member["pid"]], 10.0)
    if member.get("container") is None:
        member["pid"] = start_detached(
            member["command"], Path(member["log"]), member.get("environment")
        )
    else:
        member["pid"] = containers.start(
            member["container"], member["command"], member["inside_log"], timeout
        )
    try:
        if member.get("container") is not None and member["name"] != "mqtt":
            wait_http(member["url"], member["pid"], timeout)
        else:
            wait_port(
                member.get("wait_url", member["url"]),
                member["pid"],
                timeout,
                owned=member.get("container") is None,
            )
    finally:  # even if it failed to listen, fleet.json names the process that runs
        (Path(directory) / FLEET_FILE).write_text(json.dumps(record, indent=2))


def kill_mqtt(directory: str | Path) -> int:
    """SIGKILL the MQTT broker the fleet runs; returns its pid."""
    member = mqtt_member(load(directory))
    signal_member(member, signal.SIGKILL)
    return int(member["pid"])


def restart_mqtt(directory: str | Path, timeout: float = 30.0) -> int:
    """Start the fleet's MQTT broker again, on the same port; returns the new pid."""
    with RECORD_LOCK:
        record = load(directory)
        member = mqtt_member(record)
        _restart_member(directory, record, member, timeout)
        return int(member["pid"])


def shape(directory: str | Path, site: str, uplink: float | None, downlink: float | None) -> None:
    """Shape a site's access link in a namespace or container fleet: bytes/s out of it and into
    it (None: unshaped). The topology file keeps what the fleet started with."""
    record = load(directory)
    member = site_member(record, site)
    if member.get("container") is not None:
        containers.shape(member["container"], uplink, downlink)
        return
    netns.shape(namespaces_of(record), site, uplink, downlink)


def partition(directory: str | Path, site: str, cut: bool) -> None:
    """Cut a site of a namespace or container fleet off from everyone (``cut``), or end that."""
    record = load(directory)
    member = site_member(record, site)
    if member.get("container") is not None:
        network = record["docker"]["network"]
        (containers.cut if cut else containers.heal)(member["container"], network)
        return
    spaces = namespaces_of(record)
    (netns.cut if cut else netns.heal)(spaces, site)


def set_serve_option(
    directory: str | Path, option: str, value: str, timeout: float = 30.0
) -> list[str]:
    """Give every broker's ``serve`` command ``option value`` (replacing the option's value if
    it had one), restart the brokers whose command changed, and return their names."""
    if not option.startswith("--"):
        raise InvalidInput("option", "a serve option such as --algorithm", option)
    changed = []
    with RECORD_LOCK:
        record = load(directory)
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


# -- draining ------------------------------------------------------------------------------------
