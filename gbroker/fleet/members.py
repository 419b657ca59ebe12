"""A fleet's record and its member processes: ``fleet.json`` read and written, processes started,
signalled, watched, and their brokers asked whether they are healthy. What every other module of
:mod:`gbroker.fleet` stands on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from gbroker.client import fleetdir
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.fleet import netns
from gbroker.security.auth import Tokens, bearer

__all__ = [
    "DEFAULT_IMAGE",
    "FLEET_FILE",
    "IN_IMAGE",
    "MQTT_BROKERS",
    "MQTT_PORT",
    "RECORD_LOCK",
    "RUNTIMES",
    "SITE_PORT",
    "FleetError",
    "broker_health",
    "broker_health_report",
    "client_token",
    "fleet_token",
    "gbroker_command",
    "is_alive",
    "load",
    "mqtt_member",
    "namespaces_of",
    "shared_directory",
    "signal_group",
    "signal_member",
    "site_alive",
    "site_member",
    "start_detached",
    "wait_gone",
    "wait_http",
    "wait_port",
    "write_brokers",
]

FLEET_FILE = "fleet.json"
JOBS_ROOT_FILE = "jobs-root"
"""In a fleet directory: where its sites' job directories are, when not under it
(:func:`gbroker.fleet.launch.reachable_jobs_root`)."""


RUNTIMES = ("local", "netns", "docker")
"""Where a fleet's members run (see :func:`up`)."""


SITE_PORT = 8700  # a site's broker in its own namespace or container


DEFAULT_IMAGE = "gbroker:local"  # gbroker.fleet.image.DEFAULT_TAG


IN_IMAGE = ("/opt/gbroker/bin/python", "-m", "gbroker")  # argv as `docker top` shows it


MQTT_PORT = 1883


MQTT_BROKERS = ("amqtt", "mosquitto")
"""The MQTT brokers a fleet can run itself."""


class FleetError(GBrokerError):
    """A fleet could not be started or managed."""


# Restarts rewrite fleet.json (read, change a pid, write): one at a time within a process.
RECORD_LOCK = threading.Lock()


def start_detached(
    command: list[str], log: Path, environment: Mapping[str, str] | None = None
) -> int:
    """Start ``command`` in a session of its own, its output appended to ``log``; with
    ``environment``, these variables over this process's own (a Grid Engine site's broker gets
    its cell's: whatever restarts a member gives it the ``environment`` fleet.json records)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=None if not environment else {**os.environ, **environment},
        )
    return proc.pid


def shared_directory(prefix: str) -> Path:
    """A new directory (named ``prefix`` and a few random letters) under the system's temporary
    directory, mode 0711: where what a site's batch system and its jobs' accounts must reach
    lives, as on the file system a cluster's nodes share (a Slurm cluster's slurm.conf, sockets
    and job directories; a Grid Engine cell and its job directories), wherever the fleet's own
    directory is (a user's 0700 home, say). Its path is short (Unix socket paths must stay
    under 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    directory.chmod(0o711)
    return directory


def is_alive(pid: int) -> bool:
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


def wait_port(
    url: str, pid: int, timeout: float, since: float | None = None, owned: bool = False
) -> None:
    """Wait until ``url``'s port accepts connections, at most ``timeout`` s from ``since`` (a
    ``time.monotonic()`` value: several waits may share one bound), else from now.

    With ``owned`` (``pid`` is the member itself, or what runs it, on this host), only a
    listening socket of ``pid`` or of a process it started counts: a port is chosen before its
    server binds it (:mod:`gbroker.fleet.ports`), and where another process took it meanwhile
    the member fails with "address already in use" while the port answers for the other one.
    """
    host, port = url.rsplit("//", 1)[1].rstrip("/").rsplit(":", 1)
    deadline = (time.monotonic() if since is None else since) + timeout
    while True:
        with socket.socket() as s:
            listening = s.connect_ex((host.strip("[]"), int(port))) == 0
        if listening and (not owned or _listens(pid, int(port)) is not False):
            return
        if not is_alive(pid):
            raise FleetError(f"process {pid} for {url} exited during start-up")
        if time.monotonic() >= deadline:
            raise FleetError(f"{url} did not start listening within {timeout:g} s")
        time.sleep(0.05)


def _listens(pid: int, port: int) -> bool | None:
    """Whether ``pid`` or one of its descendants has a socket listening on TCP ``port`` in its
    own network namespace (a netns member's is not in ours, so not psutil's
    ``net_connections``, which reads our ``/proc/net``); None where that cannot be read
    (another user's process)."""
    try:
        family = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return None
    for member in family:
        try:
            inodes = _listening_inodes(member, port)
            if inodes and any(_socket_inode(member, fd) in inodes for fd in _fds(member)):
                return True
        except FileNotFoundError:  # it ended meanwhile
            continue
        except PermissionError:
            return None
    return False


def _listening_inodes(pid: int, port: int) -> set[str]:
    """The inodes of the TCP sockets listening on ``port`` in ``pid``'s network namespace."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    # local_address is ADDR:PORT in hex; state 0A is LISTEN; inode is field 9.
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except FileNotFoundError:
            if table == "tcp":
                raise
    return inodes


def _fds(pid: int) -> list[str]:
    return os.listdir(f"/proc/{pid}/fd")


def _socket_inode(pid: int, fd: str) -> str | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile
        return None
    return target[8:-1] if target.startswith("socket:[") else None


def wait_http(url: str, pid: int, timeout: float) -> None:
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
        if not is_alive(pid):
            raise FleetError(f"process {pid} for {url} exited during start-up")
        time.sleep(0.05)
    raise FleetError(f"{url} did not answer HTTP within {timeout:g} s")


def gbroker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gbroker", *args]


def write_brokers(directory: Path, record: dict[str, Any]) -> None:
    """``brokers``: each site's URL, a line each, what clients read at start (no JSON)."""
    lines = [f"{name} {member['url']}" for name, member in record["sites"].items()]
    text = "# SITE URL of each broker of this fleet (written by gbroker fleet up)\n"
    (directory / fleetdir.BROKERS_FILE).write_text(text + "\n".join(lines) + "\n")


def load(directory: str | Path) -> dict[str, Any]:
    """What ``fleet.json`` records: the members' pids, URLs and command lines (see
    :func:`gbroker.fleet.launch.up`)."""
    path = Path(directory) / FLEET_FILE
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"no fleet in {directory} (no {FLEET_FILE}): run fleet up") from None
    except json.JSONDecodeError as exc:
        raise FleetError(f"{path}: not a fleet file ({exc})") from exc
    return record


def signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)  # each member leads its own session


def signal_member(member: dict[str, Any], signum: signal.Signals) -> None:
    """Signal a member's process: its process group, or, in a container, the process alone
    (by its host pid: what it started, its jobs, stay in the container)."""
    if member.get("container") is None:
        signal_group(member["pid"], signum)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(member["pid"], signum)


def broker_health(
    url: str, token: str | None, context: ssl.SSLContext | None = None
) -> tuple[bool, list[str]] | None:
    """A broker's ``/api/v1/health``: whether it is ok and, if not, the parts that are not (or
    the HTTP status, for an answer that names none); None if it gave no answer within 2 s."""
    answer = broker_health_report(url, token, context)
    return None if answer is None else answer[:2]


def broker_health_report(
    url: str, token: str | None, context: ssl.SSLContext | None = None
) -> tuple[bool, list[str], dict[str, Any]] | None:
    """:func:`broker_health`, with the report itself (empty if it sent none)."""
    request = urllib.request.Request(f"{url}/api/v1/health", headers=bearer(token or ""))
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            try:
                report = json.loads(response.read(1 << 20))
            except ValueError:
                report = {}
            return True, [], report if isinstance(report, dict) else {}
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
        return False, parts or [f"HTTP {exc.code}"], report if isinstance(report, dict) else {}
    except (urllib.error.URLError, OSError):
        return None


def fleet_token(record: dict[str, Any]) -> str | None:
    try:
        return Tokens.load(Path(record["tokens"])).first_token()
    except (KeyError, OSError, InvalidInput):
        return None


def site_member(record: dict[str, Any], site: str) -> dict[str, Any]:
    try:
        member: dict[str, Any] = record["sites"][site]
    except KeyError:
        raise InvalidInput("site", f"one of {', '.join(record['sites'])}", site) from None
    return member


def site_alive(directory: str | Path, site: str) -> tuple[bool, int]:
    """Whether a site's broker process runs, and its pid (the last one started)."""
    member = site_member(load(directory), site)
    return is_alive(member["pid"]), int(member["pid"])


def client_token(directory: str | Path) -> str | None:
    """The fleet's (admin) client token."""
    return fleet_token(load(directory))


def mqtt_member(record: dict[str, Any]) -> dict[str, Any]:
    member: dict[str, Any] | None = record.get("mqtt")
    if member is None:
        raise FleetError(f"the fleet uses an external MQTT broker ({record.get('mqtt_url')})")
    return member


def namespaces_of(record: dict[str, Any]) -> netns.NetnsFleet:
    if not record.get("netns"):
        runtime = record.get("runtime", "local")
        raise FleetError(
            f"links can be shaped or cut in a netns or docker fleet only (this one: {runtime})"
        )
    return netns.NetnsFleet.from_dict(record["netns"])


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if is_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if is_alive(p)]
    return left
