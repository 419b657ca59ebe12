"""What a fleet directory is given before any member starts: the topology with each site's
endpoint, the fleet secret peers sign with, the client tokens, and the command line of the MQTT
broker the fleet runs."""

from __future__ import annotations

import dataclasses
import platform
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gbroker.fleet.members import FleetError, gbroker_command
from gbroker.mqtt.accounts import AuthFiles, mosquitto_config
from gbroker.security.auth import Tokens, write_private
from gbroker.topology import Topology, save_topology

__all__ = [
    "FleetFiles",
    "mqtt_command",
    "site_uid_range",
    "write_fleet_files",
]


def _find_mosquitto() -> str:
    """The mosquitto binary; Debian installs it in /usr/sbin, often not on a user's PATH."""
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise FleetError("mosquitto is not installed: run scripts/setup/ensure_mosquitto.sh")
    return found


def mqtt_command(
    kind: str, port: int, directory: Path, auth: AuthFiles, host: str = "127.0.0.1"
) -> list[str]:
    """The command line of the fleet's MQTT broker; it reads every credential from files."""
    if kind == "amqtt":
        return gbroker_command(
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


@dataclass(frozen=True, slots=True)
class FleetFiles:
    """What every broker of a fleet is given: the topology (with the fleet's endpoints), the
    fleet secret its peers sign with, and the client tokens."""

    topology: Topology
    topology_file: Path
    secret_file: Path
    token_file: Path


def write_fleet_files(
    source: Topology, directory: Path, endpoint: Callable[[str], str]
) -> FleetFiles:
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
    return FleetFiles(topology, topology_file, secret_file, token_file)


_UID_BASE, _UID_SPAN = 0x70000000, 0x10000  # gbroker.site.identity.DEFAULT_RANGE, SITE_SPAN


def site_uid_range(index: int) -> str:
    """The ``--uid-range`` of a fleet's site number ``index``: a slice of 65536 uids of its
    own in the brokers' default range, so that users of two sites on one host never meet in
    one uid (:mod:`gbroker.site.identity`)."""
    first = _UID_BASE + index * _UID_SPAN
    return f"{first}-{first + _UID_SPAN - 1}"


_JSDL_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "i686": "x86_32", "i386": "x86_32",
                       "aarch64": "arm", "armv7l": "arm", "ppc64le": "powerpc", "ppc64": "powerpc",
                       "sparc64": "sparc", "mips": "mips", "ia64": "ia64"}  # fmt: skip
"""``platform.machine()`` to JSDL's CPUArchitectureName (GFD.56, §6.1.7)."""


def _host_platform() -> tuple[str | None, str | None]:
    """This host's JSDL OperatingSystemName and CPUArchitectureName (None: not one JSDL names)."""
    system = {"Linux": "LINUX", "Darwin": "MACOS", "FreeBSD": "FreeBSD"}.get(platform.system())
    return system, _JSDL_ARCHITECTURES.get(platform.machine().lower())
