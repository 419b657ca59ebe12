"""Container fleets: one Docker container per site and one for MQTT.

Theory of operation. A container fleet (``gbroker fleet up --runtime docker``, :mod:`gbroker.fleet`)
has, all named after a fresh prefix ``gbXXXX``:

- a user-defined bridge network ``<prefix>-net``: its embedded DNS lets every member reach the
  others by container name, so the fleet's topology names ``http://<prefix>-<site>:8700`` and
  ``mqtt://<prefix>-mqtt:1883``;
- a container per member from the GBroker image (:mod:`gbroker.fleet.image`), which idles under
  tini; the member's process (a broker, the MQTT broker) is started inside it with ``docker exec``
  (:func:`start`), writing its log to the fleet directory's ``logs/`` (bind-mounted). So
  :func:`gbroker.fleet.control.kill` SIGKILLs that process only, by its host pid (a container's
  processes are the host's too): the container and the jobs running in it live on, and a restarted
  broker adopts them, as on a real host. Killing a whole container would take its jobs with it;
- per site, ``CAP_SYS_PTRACE`` (a restarted broker reads its jobs' ``/proc/PID/environ`` to
  recognise them, and they run as nobody), a volume ``<prefix>-<site>`` for its journal and
  data, and its broker's port 8700 published on 127.0.0.1 only (a free host port chosen at
  ``up`` and kept across partitions: the fleet record's URL, for the user's CLI);
  only the files a member needs are mounted, read-only: the topology, the fleet secret and the
  client tokens, and the site's own MQTT password (the MQTT container gets the hashed ones);
- per site, tbf shaping of its access link (``--cap-add NET_ADMIN``): the uplink on the
  container's ``eth0`` egress, the downlink on its host-side veth (found by ``eth0``'s
  ``iflink``), as :mod:`gbroker.fleet.netns` does for namespaces; :func:`cut` and :func:`heal`
  disconnect a site from the network and connect it back (a partition).

:func:`remove` takes containers, network and volumes away and says how many processes were
still running in each container (its jobs).
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gbroker.errors import GBrokerError, InvalidInput
from gbroker.fleet import containers, netns
from gbroker.fleet.files import site_uid_range, write_fleet_files
from gbroker.fleet.members import (
    DEFAULT_IMAGE,
    FLEET_FILE,
    IN_IMAGE,
    MQTT_BROKERS,
    MQTT_PORT,
    SITE_PORT,
    FleetError,
    wait_http,
    wait_port,
)
from gbroker.fleet.ports import free_port
from gbroker.mqtt.accounts import AuthFiles, mosquitto_config, write_auth_files
from gbroker.topology import Topology, load_topology

__all__ = [
    "ContainerError",
    "check",
    "compose",
    "cut",
    "heal",
    "host_port",
    "ip_address",
    "remove",
    "run",
    "shape",
    "start",
    "up_docker",
]


class ContainerError(GBrokerError):
    """A container fleet cannot be built or managed here."""


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ContainerError(f"docker {' '.join(args[:3])} ...: {reason[-1] if reason else '?'}")
    return done


def check(image: str) -> None:
    """Raise :class:`ContainerError` unless docker answers and ``image`` exists."""
    if shutil.which("docker") is None:
        raise ContainerError(
            "docker is not installed: run scripts/setup/ensure_docker.sh (as root)"
        )
    if _docker("info", check=False).returncode != 0:
        raise ContainerError(
            "no Docker daemon answers: run scripts/setup/ensure_docker.sh (as root)"
        )
    if _docker("image", "inspect", image, check=False).returncode != 0:
        raise ContainerError(f"no image {image}: build it with `gbroker image build`")


def run(
    name: str,
    network: str,
    image: str,
    mounts: Sequence[tuple[Path | str, str, bool]],
    *,
    publish: int | None = None,
    net_admin: bool = False,
    site: bool = False,
) -> None:
    """Start an idle container ``name`` on ``network`` (mounts: source, target, read-only)."""
    args = ["run", "-d", "--pull", "never", "--name", name, "--hostname", name,
            "--network", network, "--label", "org.gbroker.fleet=1"]  # fmt: skip
    for source, target, read_only in mounts:
        args += ["-v", f"{source}:{target}{':ro' if read_only else ''}"]
    if publish is not None:
        # A fixed host port: a container that leaves its network and joins it again (a
        # partition) is published anew, and on a port left to Docker it would be another one.
        args += ["-p", f"127.0.0.1:{free_port()}:{publish}"]
    if net_admin:
        args += ["--cap-add", "NET_ADMIN"]
    if site:
        # A restarted broker recognises its running jobs by /proc/PID/environ; the jobs run as
        # nobody, and reading another user's environ takes CAP_SYS_PTRACE, which Docker drops.
        args += ["--cap-add", "SYS_PTRACE"]
    _docker(*args, image)


def start(container: str, command: Sequence[str], log: str, timeout: float = 10.0) -> int:
    """Run ``command`` in ``container``, detached, appending to ``log`` (a path inside it);
    returns its pid on the host."""
    quoted = " ".join(_quote(part) for part in command)
    _docker("exec", "-d", container, "sh", "-c", f"exec {quoted} >> {_quote(log)} 2>&1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        top = _docker("top", container, "-ww", "-eo", "pid,args", check=False).stdout.splitlines()[
            1:
        ]
        for line in top:
            pid, _, args = line.strip().partition(" ")
            if args.strip() == " ".join(command):  # the shell has exec'd it
                return int(pid)
        time.sleep(0.05)
    raise ContainerError(f"{container}: {command[0]} did not start within {timeout:g} s")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def host_port(container: str, port: int) -> int:
    """The 127.0.0.1 port that ``container``'s ``port`` is published on."""
    out = _docker("port", container, f"{port}/tcp").stdout.split()
    return int(out[0].rsplit(":", 1)[1])


def ip_address(container: str, network: str) -> str:
    """``container``'s address on ``network`` (the host reaches it directly)."""
    data = json.loads(_docker("inspect", container).stdout)[0]
    return str(data["NetworkSettings"]["Networks"][network]["IPAddress"])


def _host_veth(container: str) -> str:
    index = _docker("exec", container, "cat", "/sys/class/net/eth0/iflink").stdout.strip()
    done = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        number, name = line.split(":", 2)[:2]
        if number.strip() == index:
            return name.strip().split("@", 1)[0]
    raise ContainerError(f"{container}: no host interface with index {index}")


def shape(container: str, uplink: float | None, downlink: float | None) -> None:
    """tbf on ``container``'s link: ``uplink`` bytes/s out of it, ``downlink`` into it."""
    for rate, device, inside in ((uplink, "eth0", True), (downlink, _host_veth(container), False)):
        prefix = ["docker", "exec", container] if inside else []
        if rate is None:
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", device, "root"],
                           capture_output=True, check=False)  # fmt: skip
            continue
        if not rate > 0:
            raise ContainerError(f"a link rate is bytes/s > 0, not {rate}")
        command = [*prefix, *netns.tbf_command(device, rate)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ContainerError(f"{container}: shaping {device}: {done.stderr.strip()}")


def cut(container: str, network: str) -> None:
    """Partition ``container`` from everyone: off the network."""
    _docker("network", "disconnect", network, container)


def heal(container: str, network: str) -> None:
    """Connect ``container`` back (by name: the others resolve it again)."""
    _docker("network", "connect", "--alias", container, network, container)


def _processes(container: str) -> int:
    """Processes in ``container`` besides its idle PID 1 (tini) and its ``sleep``."""
    done = _docker("top", container, "-ww", "-eo", "pid,args", check=False)
    if done.returncode != 0:
        return 0
    rows = [line for line in done.stdout.splitlines()[1:] if line.strip()]
    return sum(1 for r in rows if not r.split(None, 1)[1].startswith(("tini ", "sleep infinity")))


def remove(
    containers: Iterable[str], network: str | None, volumes: Iterable[str] = ()
) -> dict[str, int]:
    """Remove the containers (with what runs in them), the network and the volumes; returns,
    per container, how many processes were still running in it."""
    left = {}
    for container in containers:
        count = _processes(container)
        if count:
            left[container] = count
        _docker("rm", "-f", "-v", container, check=False)
    if network is not None:
        _docker("network", "rm", network, check=False)
    for volume in volumes:
        _docker("volume", "rm", "-f", volume, check=False)
    return left


def up_docker(
    source: Topology,
    directory: Path,
    kind: str,
    serve_args: tuple[str, ...],
    timeout: float,
    image: str,
) -> dict[str, Any]:
    """:func:`up` with a container per member (:mod:`gbroker.fleet.containers`)."""
    containers.check(image)
    from gbroker.fleet.image import image_sources, source_hash

    held, here = image_sources(image), source_hash()
    if held != here:  # a fleet from an old image runs old code: say so, do not refuse
        logging.getLogger("gbroker.fleet.control").warning(
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
    files = write_fleet_files(source, directory, lambda site: f"http://{prefix}-{site}:{SITE_PORT}")
    auth = write_auth_files(directory / "mqtt", source.sites)
    inner = AuthFiles(Path("/fleet/mqtt"), auth.sites)  # the same files, as mounted
    mqtt_url = f"mqtt://{prefix}-mqtt:{MQTT_PORT}"
    names = {"mqtt": f"{prefix}-mqtt", **{site: f"{prefix}-{site}" for site in source.sites}}
    record: dict[str, Any] = {
        "runtime": "docker",
        "topology": str(files.topology_file),
        "tokens": str(files.token_file),
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
            command = [*IN_IMAGE, "mqtt-serve", "--host", "0.0.0.0", "--port", str(MQTT_PORT),
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
        wait_port(record["mqtt"]["wait_url"], record["mqtt"]["pid"], timeout)
        default = source.default_link.bandwidth
        for index, spec in enumerate(source.sites.values()):
            name = names[spec.name]
            mounts: list[tuple[Path | str, str, bool]] = [
                (files.topology_file, "/fleet/topology.yaml", True),
                (files.secret_file, "/fleet/secret", True),
                (files.token_file, "/fleet/tokens", True),
                (auth.password_file(spec.name), "/fleet/mqtt.password", True),
                (logs, "/logs", False),
                (runs, str(runs), False),
                (f"{prefix}-{spec.name}", "/data", False),
            ]
            containers.run(
                name, network, image, mounts, publish=SITE_PORT, net_admin=True, site=True
            )
            containers.shape(name, spec.uplink or default, spec.downlink or default)
            command = [*IN_IMAGE, "serve", "--site", spec.name, "--topology",
                       "/fleet/topology.yaml", "--data-dir", "/data", "--host", "0.0.0.0",
                       "--mqtt", mqtt_url, "--mqtt-password-file", "/fleet/mqtt.password",
                       "--secret-file", "/fleet/secret", "--token-file", "/fleet/tokens",
                       "--uid-range", site_uid_range(index), *serve_args]  # fmt: skip
            member = _docker_member(spec.name, name, command, logs, timeout)
            member["url"] = f"http://127.0.0.1:{containers.host_port(name, SITE_PORT)}"
            record["sites"][spec.name] = member
        for member in record["sites"].values():
            # docker-proxy takes connections on the published port before the broker listens
            # behind it: wait for an HTTP answer, not for the port.
            wait_http(member["url"], member["pid"], timeout)
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
    write_fleet_files(source, directory, lambda site: f"http://{site.lower()}:{SITE_PORT}")
    auth = write_auth_files(directory / "mqtt", source.sites)
    inner = AuthFiles(Path("/fleet/mqtt"), auth.sites)
    if mqtt == "amqtt":
        broker_command = [*IN_IMAGE, "mqtt-serve", "--host", "0.0.0.0", "--port", str(MQTT_PORT),
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
                *IN_IMAGE,
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
                "--uid-range",
                site_uid_range(n),
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
