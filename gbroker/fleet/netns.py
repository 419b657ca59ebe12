"""Network-namespace fleets: a namespace, an address and a shaped link per site.

Theory of operation. A fleet on loopback gives every link the same memory copy; a fleet in
network namespaces gives each site its own network stack, address and access link, so NetMon,
F(j)'s transfer term and partitions meet a real (if virtual) network. :func:`create` builds, with
iproute2's ``ip`` and ``tc`` (the tools an operator knows and can inspect the result with):

- a Linux bridge ``<prefix>br`` in the host's namespace with the address ``.1`` of a free
  private /24 (:func:`plan`): the host, and so the user's CLI, reaches every site directly;
- per member (each site, and the MQTT broker), a namespace ``<prefix>-<name>`` with loopback up,
  and a veth pair: ``eth0`` inside with the member's address and a default route through the
  bridge, and ``<prefix>v<n>`` on the bridge;
- per site, token-bucket shaping (``tbf``; this kernel has no netem) in both directions of its
  access link, as the topology gives them: ``uplink`` on ``eth0``'s egress (what leaves the
  site), ``downlink`` on the bridge port's egress (what enters it). :func:`shape` changes both at
  run time; :func:`cut` and :func:`heal` take the bridge port down and up (a partition: the site
  hears nobody and nobody hears it, and its processes keep running);
- if the host has iptables (Docker leaves ``FORWARD DROP`` behind, which also filters bridged
  traffic when ``br_netfilter`` is loaded), one ``FORWARD ACCEPT`` rule for traffic within the
  bridge, tagged with the fleet's prefix.

Processes run in a member's namespace through ``nsenter --net`` (:func:`exec_prefix`), which
enters the namespace and execs the command in place: the recorded pid is the process itself.
Not ``ip netns exec``: it also gives the process a mount namespace with a fresh ``/sys``, which
hides the host's cgroup hierarchies below it, so a site's broker found no cgroups and ran its
jobs without a cgroup each (no cpuset, memory or process limit, no ``cpu_share``).

:func:`destroy` undoes everything :func:`create` made, whatever state it is in: it kills every
process still in the fleet's namespaces (a job outliving its broker would otherwise keep a
namespace alive unseen), deletes the namespaces (which deletes their veths), the bridge and the
rule, and reports what it killed. All of it needs root (CAP_NET_ADMIN): :func:`check_host` says
so plainly first.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gbroker.errors import GBrokerError

__all__ = [
    "MAX_SITES",
    "Member",
    "NetnsError",
    "NetnsFleet",
    "check_host",
    "create",
    "cut",
    "destroy",
    "exec_prefix",
    "heal",
    "plan",
    "shape",
    "tbf_command",
]

NETNS_DIR = "/run/netns"
"""Where ``ip netns add`` leaves its named namespaces (what ``nsenter --net`` enters)."""
_BASE = ipaddress.ip_network("10.213.0.0/16")  # fleets take /24s of it
_FIRST_SITE = 10  # .1 the bridge, .2 the MQTT broker, .10 on the sites
MAX_SITES = 240


class NetnsError(GBrokerError):
    """A namespace fleet cannot be built or managed here."""


@dataclass(frozen=True, slots=True)
class Member:
    """One namespace: a site or the MQTT broker."""

    name: str
    netns: str
    address: str
    port: str  # the veth end on the bridge
    uplink: float | None = None  # bytes/s leaving the member (None: not shaped)
    downlink: float | None = None  # bytes/s entering it


@dataclass(frozen=True, slots=True)
class NetnsFleet:
    """What :func:`create` builds and :func:`destroy` removes (recorded in ``fleet.json``)."""

    prefix: str
    subnet: str
    bridge: str
    gateway: str
    members: dict[str, Member] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetnsFleet:
        members = {name: Member(**m) for name, m in data["members"].items()}
        return cls(data["prefix"], data["subnet"], data["bridge"], data["gateway"], members)


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def check_host() -> None:
    """Raise :class:`NetnsError` unless this host can build namespace fleets."""
    if os.geteuid() != 0:
        raise NetnsError(
            "a fleet in network namespaces needs root (CAP_NET_ADMIN to make namespaces, "
            "veths and a bridge): run it as root, or use --runtime local"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            raise NetnsError(f"{tool} (iproute2) is not installed: apt-get install iproute2")
    if shutil.which("nsenter") is None:
        raise NetnsError("nsenter (util-linux) is not installed: apt-get install util-linux")


def _taken_subnets() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The networks of this host's IPv4 addresses (a new fleet's /24 must overlap none)."""
    out = _run("ip", "-j", "-4", "addr", "show").stdout
    return [
        ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
        for link in json.loads(out or "[]")
        for info in link.get("addr_info", [])
    ]


def plan(
    sites: Sequence[tuple[str, float | None, float | None]], *, prefix: str | None = None
) -> NetnsFleet:
    """A fleet for ``sites`` (name, uplink, downlink in bytes/s) and an MQTT broker, on a free
    /24 of 10.213.0.0/16 and with a fresh 6-character prefix (names stay under IFNAMSIZ)."""
    if len(sites) > MAX_SITES:
        raise NetnsError(f"a namespace fleet holds at most {MAX_SITES} sites, not {len(sites)}")
    prefix = prefix or "gb" + secrets.token_hex(2)
    taken = _taken_subnets()
    free = [net for net in _BASE.subnets(new_prefix=24) if not any(net.overlaps(t) for t in taken)]
    if not free:
        raise NetnsError(f"no free /24 left in {_BASE} for another namespace fleet")
    subnet = free[secrets.randbelow(len(free))]
    hosts = list(subnet.hosts())
    members = {"mqtt": Member("mqtt", f"{prefix}-mqtt", str(hosts[1]), f"{prefix}v0")}
    for n, (name, uplink, downlink) in enumerate(sites, start=1):
        address = str(hosts[_FIRST_SITE - 1 + n - 1])
        members[name] = Member(name, f"{prefix}-{name}", address, f"{prefix}v{n}", uplink, downlink)
    return NetnsFleet(prefix, str(subnet), f"{prefix}br", str(hosts[0]), members)


def exec_prefix(member: Member) -> list[str]:
    """The command prefix that runs a program in ``member``'s network namespace (only: it sees
    the host's file systems, ``/sys/fs/cgroup`` included)."""
    return ["nsenter", f"--net={NETNS_DIR}/{member.netns}", "--"]


def tbf_command(device: str, rate: float) -> list[str]:
    """The ``tc`` command that shapes ``device``'s egress at ``rate`` bytes/s (replacing any)."""
    bits = max(int(rate * 8), 8000)
    burst = max(int(rate / 100), 32 * 1024)  # 10 ms of traffic, at least 32 KiB (> a GSO burst)
    return ["tc", "qdisc", "replace", "dev", device, "root", "tbf",
            "rate", f"{bits}bit", "burst", str(burst), "latency", "100ms"]  # fmt: skip


def _tbf(device: str, rate: float, netns: str | None = None) -> None:
    """Token-bucket shaping of ``device``'s egress at ``rate`` bytes/s (replaces any)."""
    command = tbf_command(device, rate)
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    _run(*command)


def create(fleet: NetnsFleet) -> None:
    """Build ``fleet`` (module docstring); on any failure undo what was built and raise."""
    check_host()
    prefix_len = ipaddress.ip_network(fleet.subnet).prefixlen
    try:
        _run("ip", "link", "add", fleet.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{fleet.gateway}/{prefix_len}", "dev", fleet.bridge)
        _run("ip", "link", "set", fleet.bridge, "up")
        for member in fleet.members.values():
            _run("ip", "netns", "add", member.netns)
            inside = f"{member.port}i"
            _run("ip", "link", "add", member.port, "type", "veth", "peer", "name", inside)
            _run("ip", "link", "set", inside, "netns", member.netns)
            _run("ip", "link", "set", member.port, "master", fleet.bridge, "up")
            ns = ["ip", "netns", "exec", member.netns]
            _run(*ns, "ip", "link", "set", inside, "name", "eth0")
            _run(*ns, "ip", "addr", "add", f"{member.address}/{prefix_len}", "dev", "eth0")
            _run(*ns, "ip", "link", "set", "eth0", "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            _run(*ns, "ip", "route", "add", "default", "via", fleet.gateway)
            shape(fleet, member.name, member.uplink, member.downlink)
        if shutil.which("iptables"):
            _run(*_forward_rule("-I", fleet))
    except BaseException:
        destroy(fleet)
        raise


def _forward_rule(action: str, fleet: NetnsFleet) -> list[str]:
    return [
        "iptables", action, "FORWARD", "-i", fleet.bridge, "-o", fleet.bridge,
        "-m", "comment", "--comment", f"gbroker {fleet.prefix}", "-j", "ACCEPT",
    ]  # fmt: skip


def shape(fleet: NetnsFleet, name: str, uplink: float | None, downlink: float | None) -> None:
    """Shape ``name``'s access link: ``uplink`` bytes/s out of it, ``downlink`` into it (None:
    unshaped, any shaping removed)."""
    member = _member(fleet, name)
    for rate, device, netns in ((uplink, "eth0", member.netns), (downlink, member.port, None)):
        if rate is not None:
            if not rate > 0:
                raise NetnsError(f"a link rate is bytes/s > 0, not {rate}")
            _tbf(device, rate, netns)
        else:
            command = ["tc", "qdisc", "del", "dev", device, "root"]
            if netns is not None:
                command = ["ip", "netns", "exec", netns, *command]
            _run(*command, check=False)  # nothing to delete is fine


def cut(fleet: NetnsFleet, name: str) -> None:
    """Partition ``name`` from everyone: its bridge port goes down."""
    _run("ip", "link", "set", _member(fleet, name).port, "down")


def heal(fleet: NetnsFleet, name: str) -> None:
    """End ``name``'s partition."""
    _run("ip", "link", "set", _member(fleet, name).port, "up")


def _member(fleet: NetnsFleet, name: str) -> Member:
    try:
        return fleet.members[name]
    except KeyError:
        raise NetnsError(f"no member {name!r} in this fleet ({', '.join(fleet.members)})") from None


def _pids(netns: str) -> list[int]:
    done = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def destroy(fleet: NetnsFleet, grace: float = 5.0) -> dict[str, int]:
    """Remove everything of ``fleet`` that exists; returns, per namespace, how many processes
    were still in it (and were killed: SIGTERM, then SIGKILL after ``grace`` s)."""
    existing = set(_run("ip", "netns", "list", check=False).stdout.split())
    left = {m.netns: _pids(m.netns) for m in fleet.members.values() if m.netns in existing}
    left = {ns: pids for ns, pids in left.items() if pids}
    _kill_all(left.values(), grace)
    for member in fleet.members.values():
        if member.netns in existing:
            _run("ip", "netns", "del", member.netns, check=False)
        _run("ip", "link", "del", member.port, check=False)  # if it was never moved
    _run("ip", "link", "del", fleet.bridge, check=False)
    if shutil.which("iptables"):
        while _run(*_forward_rule("-D", fleet), check=False).returncode == 0:
            pass  # every copy of the rule
    return {ns: len(pids) for ns, pids in left.items()}


def _kill_all(groups: Iterable[list[int]], grace: float) -> None:
    pids = [pid for group in groups for pid in group]
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + (grace if signum == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _exists(pid)]
            time.sleep(0.05)
        if not pids:
            return


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
