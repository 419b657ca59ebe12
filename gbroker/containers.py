"""Container fleets: one Docker container per site and one for MQTT (issue 11).

Theory of operation. A container fleet (``gbroker fleet up --runtime docker``, :mod:`gbroker.fleet`)
has, all named after a fresh prefix ``gbXXXX``:

- a user-defined bridge network ``<prefix>-net``: its embedded DNS lets every member reach the
  others by container name, so the fleet's topology names ``http://<prefix>-<site>:8700`` and
  ``mqtt://<prefix>-mqtt:1883``;
- a container per member from the GBroker image (:mod:`gbroker.image`), which idles under tini;
  the member's process (a broker, the MQTT broker) is started inside it with ``docker exec``
  (:func:`start`), writing its log to the fleet directory's ``logs/`` (bind-mounted). So
  :func:`gbroker.fleet.kill` SIGKILLs that process only, by its host pid (a container's processes
  are the host's too): the container and the jobs running in it live on, and a restarted broker
  adopts them, as on a real host. Killing a whole container would take its jobs with it;
- per site, ``CAP_SYS_PTRACE`` (a restarted broker reads its jobs' ``/proc/PID/environ`` to
  recognise them, and they run as nobody), a volume ``<prefix>-<site>`` for its journal and
  data, and its broker's port 8700 published on 127.0.0.1 only (a free host port chosen at
  ``up`` and kept across partitions: the fleet record's URL, for the user's CLI);
  only the files a member needs are mounted, read-only: the topology, the fleet secret and the
  client tokens, and the site's own MQTT password (the MQTT container gets the hashed ones);
- per site, tbf shaping of its access link (``--cap-add NET_ADMIN``): the uplink on the
  container's ``eth0`` egress, the downlink on its host-side veth (found by ``eth0``'s
  ``iflink``), as :mod:`gbroker.netns` does for namespaces; :func:`cut` and :func:`heal`
  disconnect a site from the network and connect it back (a partition).

:func:`remove` takes containers, network and volumes away and says how many processes were
still running in each container (its jobs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from gbroker import netns
from gbroker.errors import GBrokerError
from gbroker.ports import free_port

__all__ = [
    "ContainerError",
    "check",
    "cut",
    "heal",
    "host_port",
    "ip_address",
    "remove",
    "run",
    "shape",
    "start",
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
        raise ContainerError("docker is not installed: run scripts/ensure_docker.sh (as root)")
    if _docker("info", check=False).returncode != 0:
        raise ContainerError("no Docker daemon answers: run scripts/ensure_docker.sh (as root)")
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
