"""What a job needs of a site beyond cores, what each site offers, and whether they match.

Theory of operation. The thesis's feasible set S(i) = {j in L(i) ∪ {i} : n_j >= r} looks at
cores only. Jobs written for real grids ask for more (JSDL's Resources): an operating system, a
CPU architecture, memory per node and in all, disk, exclusive use of nodes, a number of nodes,
cores per node, CPU speed, network bandwidth and named file systems. A job carries these as
:class:`Requirements`; every site declares what it offers as :class:`SiteProperties` (in the
topology). :func:`unmet` says which requirement a site fails, so S(i) becomes

    S(i) = {j in L(i) ∪ {i} : n_j >= r and unmet(requirements, j) is empty}

and both drivers (the daemon and the simulator) get the same answer from the same code.

The matching rules are chosen to be what an operator expects: a property a site does not
declare cannot be promised (a site that declares no nodes is one node of all its cores);
capacities are *at least* requirements on the job's lower bound; totals compare with what a job
of r cores gets at the site; names compare without regard to case. Candidate hosts are shell
patterns naming sites, or hosts of sites (``SITE/HOST``); :func:`candidate_hosts_at` says which
hosts of a site, what a back-end restricts the job to there. :func:`closest_unmet` picks, among
sites none of which fits, the one that fails least and names its first failure: what a 400
tells the user, with that site's value. Every rule, property by property: docs/JSDL.md,
"Requirements matched to sites" and "Candidate hosts".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase

from gbroker.core.names import count
from gbroker.errors import InvalidInput

__all__ = [
    "FILE_SYSTEM_TYPES",
    "FileSystemNeed",
    "FileSystemSpec",
    "Need",
    "Requirements",
    "SiteProperties",
    "Unmet",
    "candidate_hosts_at",
    "closest_unmet",
    "format_bytes",
    "known_names",
    "unmet",
]

#: JSDL's FileSystemTypeEnumeration.
FILE_SYSTEM_TYPES = ("normal", "spool", "temporary", "swap")

# JSDL spells 32-bit x86 two ways.
_ARCH_ALIASES = {"x86_32": "x86"}

# A host's name as DNS and batch systems write it: no '/' (it splits SITE/HOST), no pattern.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class Need(StrEnum):
    """Each requirement, by the name errors and ``gbroker explain`` use for it."""

    CORES = "cores"
    OPERATING_SYSTEM = "operating_system"
    OPERATING_SYSTEM_VERSION = "operating_system_version"
    CPU_ARCHITECTURE = "cpu_architecture"
    EXCLUSIVE_EXECUTION = "exclusive_execution"
    CPU_SPEED = "individual_cpu_speed"
    NETWORK_BANDWIDTH = "individual_network_bandwidth"
    CORES_PER_NODE = "individual_cpu_count"
    NODES = "total_resource_count"
    INDIVIDUAL_MEMORY = "individual_physical_memory"
    TOTAL_MEMORY = "total_physical_memory"
    INDIVIDUAL_DISK = "individual_disk_space"
    TOTAL_DISK = "total_disk_space"
    FILE_SYSTEM = "file_system"
    CANDIDATE_HOSTS = "candidate_hosts"


def format_bytes(count: float) -> str:
    """``count`` bytes for a person: ``512 MiB``, ``1.5 GiB``, ``100 bytes``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            value = count / size
            text = f"{value:.0f}" if value >= 100 or value.is_integer() else f"{value:.3g}"
            return f"{text} {unit}"
    return f"{count:.0f} bytes"


def _hz(value: float) -> str:
    for unit, size in (("GHz", 1e9), ("MHz", 1e6), ("kHz", 1e3)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value:.4g} Hz"


def _bits(value: float) -> str:
    for unit, size in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value:.4g} bit/s"


def _name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise InvalidInput(field, "a non-empty name of at most 255 characters", value)
    return value.strip()


def _optional_name(field: str, value: object) -> str | None:
    return None if value is None else _name(field, value)


def _count(field: str, value: object, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(field, f"an integer >= {minimum}", value)
    return value


def _amount(field: str, value: object, what: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidInput(field, f"{what} >= 0", value)
    return value


def _same_arch(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return _ARCH_ALIASES.get(a, a) == _ARCH_ALIASES.get(b, b)


@dataclass(frozen=True, slots=True)
class FileSystemSpec:
    """A file system a site offers jobs: its name, JSDL type, where it is mounted there, and
    its free space in bytes (None: not declared)."""

    name: str
    mount: str
    type: str = "normal"
    free: int | None = None

    def __post_init__(self) -> None:
        _name("file_system.name", self.name)
        where = f"file_system[{self.name}]"
        if not isinstance(self.mount, str) or not self.mount.startswith("/"):
            raise InvalidInput(f"{where}.mount", "an absolute path", self.mount)
        if self.type not in FILE_SYSTEM_TYPES:
            raise InvalidInput(f"{where}.type", f"one of {', '.join(FILE_SYSTEM_TYPES)}", self.type)
        _count(f"{where}.free", self.free, 0)


@dataclass(frozen=True, slots=True)
class SiteProperties:
    """What a site offers beyond its cores (see the module docstring for each rule).

    ``cores`` is n_j; ``nodes`` and ``cores_per_node`` default to one node of all of them.
    Memory and disk are in bytes, ``cpu_speed`` in Hz, ``network_bandwidth`` in bits/s; None
    means the site does not declare it.
    """

    cores: int = 1
    operating_system: str | None = None
    operating_system_version: str | None = None
    cpu_architecture: str | None = None
    nodes: int | None = None
    cores_per_node: int | None = None
    memory_per_core: int | None = None
    memory_per_node: int | None = None
    disk: int | None = None
    cpu_speed: float | None = None
    network_bandwidth: float | None = None
    exclusive: bool = False
    file_systems: tuple[FileSystemSpec, ...] = ()
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _count("cores", self.cores)
        hosts = self._checked_hosts()
        if hosts and self.nodes is None and self.cores_per_node is None:
            object.__setattr__(self, "nodes", len(hosts))  # one host per node
        for key in ("operating_system", "operating_system_version", "cpu_architecture"):
            object.__setattr__(self, key, _optional_name(key, getattr(self, key)))
        for key in ("nodes", "cores_per_node"):
            _count(key, getattr(self, key))
        for key in ("memory_per_core", "memory_per_node", "disk"):
            _count(key, getattr(self, key), 0)
        _amount("cpu_speed", self.cpu_speed, "Hz")
        _amount("network_bandwidth", self.network_bandwidth, "bits/s")
        if not isinstance(self.exclusive, bool):
            raise InvalidInput("exclusive", "true or false", self.exclusive)
        nodes, per_node = self.nodes, self.cores_per_node
        if nodes is not None and per_node is not None and nodes * per_node != self.cores:
            raise InvalidInput(
                "nodes",
                f"nodes x cores_per_node equal to the site's cores ({self.cores})",
                f"{nodes} x {per_node}",
            )
        if nodes is not None and per_node is None:
            if self.cores % nodes:
                raise InvalidInput("nodes", f"a divisor of the site's cores ({self.cores})", nodes)
            object.__setattr__(self, "cores_per_node", self.cores // nodes)
        elif per_node is not None and nodes is None:
            if self.cores % per_node:
                raise InvalidInput(
                    "cores_per_node", f"a divisor of the site's cores ({self.cores})", per_node
                )
            object.__setattr__(self, "nodes", self.cores // per_node)
        if hosts and self.nodes != len(hosts):
            raise InvalidInput("hosts", f"one host name per node ({self.nodes})", len(hosts))
        systems = tuple(self.file_systems)
        names = [fs.name for fs in systems]
        for fs in systems:
            if not isinstance(fs, FileSystemSpec):
                raise InvalidInput("file_systems", "FileSystemSpec entries", fs)
            if names.count(fs.name) > 1:
                raise InvalidInput("file_systems", "each file system name once", fs.name)
        object.__setattr__(self, "file_systems", systems)

    def _checked_hosts(self) -> tuple[str, ...]:
        hosts = tuple(self.hosts)
        seen: set[str] = set()
        for host in hosts:
            if not isinstance(host, str) or _HOST_NAME.fullmatch(host) is None:
                raise InvalidInput(
                    "hosts",
                    "host names: letters, digits, '.', '-' or '_', starting with a letter or "
                    "digit, at most 255 characters",
                    host,
                )
            if host.lower() in seen:
                raise InvalidInput("hosts", "each host name once", host)
            seen.add(host.lower())
        object.__setattr__(self, "hosts", hosts)
        return hosts

    def host_names(self, site: str) -> tuple[str, ...]:
        """The site's hosts: those it declares, else one named as the site."""
        return self.hosts or (site,)

    @property
    def node_count(self) -> int:
        return self.nodes if self.nodes is not None else 1

    @property
    def node_cores(self) -> int:
        return self.cores_per_node if self.cores_per_node is not None else self.cores

    def file_system(self, name: str) -> FileSystemSpec | None:
        return next((fs for fs in self.file_systems if fs.name == name), None)

    def node_memory(self) -> int | None:
        """Physical memory of one node: declared, else per core x cores per node."""
        if self.memory_per_node is not None:
            return self.memory_per_node
        if self.memory_per_core is not None:
            return self.memory_per_core * self.node_cores
        return None

    def memory_for(self, rank: int) -> int | None:
        """The physical memory a job of ``rank`` cores gets here in all."""
        if self.memory_per_core is not None:
            return self.memory_per_core * rank
        if self.memory_per_node is not None:
            return self.memory_per_node * self.nodes_for(rank)
        return None

    def nodes_for(self, rank: int) -> int:
        """The nodes ``rank`` cores span at least."""
        return max(1, -(-rank // self.node_cores))


@dataclass(frozen=True, slots=True)
class FileSystemNeed:
    """A file system a job needs: by name; its type, mount point and disk space if given."""

    name: str
    type: str | None = None
    mount_point: str | None = None
    disk: int | None = None

    def __post_init__(self) -> None:
        _name("file_system.name", self.name)
        if self.type is not None and self.type not in FILE_SYSTEM_TYPES:
            raise InvalidInput(
                f"file_system[{self.name}].type",
                f"one of {', '.join(FILE_SYSTEM_TYPES)}",
                self.type,
            )
        _count(f"file_system[{self.name}].disk", self.disk, 0)


@dataclass(frozen=True, slots=True)
class Requirements:
    """What a job needs of a site besides its cores (lower bounds of JSDL's ranges)."""

    operating_system: str | None = None
    operating_system_version: str | None = None
    cpu_architecture: str | None = None
    exclusive_execution: bool = False
    cpu_speed: float | None = None
    network_bandwidth: float | None = None
    cores_per_node: int | None = None
    nodes: int | None = None
    individual_memory: int | None = None
    total_memory: int | None = None
    individual_disk: int | None = None
    total_disk: int | None = None
    file_systems: tuple[FileSystemNeed, ...] = ()
    candidate_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("operating_system", "operating_system_version", "cpu_architecture"):
            object.__setattr__(self, key, _optional_name(key, getattr(self, key)))
        hosts = tuple(self.candidate_hosts)
        for host in hosts:
            _name("candidate_hosts", host)
        object.__setattr__(self, "candidate_hosts", hosts)
        if not isinstance(self.exclusive_execution, bool):
            raise InvalidInput("exclusive_execution", "true or false", self.exclusive_execution)
        _amount("cpu_speed", self.cpu_speed, "Hz")
        _amount("network_bandwidth", self.network_bandwidth, "bits/s")
        for key in ("cores_per_node", "nodes"):
            _count(key, getattr(self, key))
        for key in ("individual_memory", "total_memory", "individual_disk", "total_disk"):
            _count(key, getattr(self, key), 0)
        object.__setattr__(self, "file_systems", tuple(self.file_systems))

    @property
    def empty(self) -> bool:
        """Whether it asks for nothing (every site matches)."""
        return self == _NOTHING

    def memory_at(self, props: SiteProperties, cores: int) -> int | None:
        """The memory the job asked for in all when it runs on ``cores`` cores of a site of
        ``props`` (its memory limit there): TotalPhysicalMemory, else IndividualPhysicalMemory
        on each node it spans; None if it asked for none."""
        if self.total_memory:
            return self.total_memory
        if self.individual_memory:
            return self.individual_memory * props.nodes_for(cores)
        return None


_NOTHING = Requirements()


@dataclass(frozen=True, slots=True)
class Unmet:
    """Why ``site`` does not fit: which requirement, what the job wants, what the site has."""

    site: str
    need: Need
    wanted: str
    has: str
    shortfall: float = 1.0  # how far off: a capacity's missing fraction, 1 a mismatch, 2 unknown

    def __str__(self) -> str:
        return f"{self.need}: the job needs {self.wanted}; site {self.site} has {self.has}"


def _lacks(
    site: str, need: Need, wanted: str, has: object, what: str, shortfall: float = 1.0
) -> Unmet:
    if has is None:
        return Unmet(site, need, wanted, f"no declared {what}", 2.0)
    return Unmet(site, need, wanted, str(has), shortfall)


def _short(wanted: float, has: float | None) -> float:
    return 2.0 if has is None else (wanted - has) / wanted if wanted > 0 else 0.0


def unmet(
    requirements: Requirements | None, site: str, props: SiteProperties, rank: int = 1
) -> list[Unmet]:
    """Every requirement ``site`` fails for a job of ``rank`` cores, in a fixed order (empty:
    it fits). Cores first (n_j >= r), then the order of :class:`Need`."""
    out: list[Unmet] = []
    if props.cores < rank:
        out.append(
            Unmet(
                site,
                Need.CORES,
                count(rank, "core"),
                count(props.cores, "core"),
                _short(rank, props.cores),
            )
        )
    req = requirements
    if req is None or req.empty:
        return out
    if req.operating_system is not None:
        have = props.operating_system
        if have is None or have.lower() != req.operating_system.lower():
            out.append(
                _lacks(site, Need.OPERATING_SYSTEM, req.operating_system, have, "operating system")
            )
    if req.operating_system_version is not None:
        have = props.operating_system_version
        if have != req.operating_system_version:
            out.append(
                _lacks(
                    site,
                    Need.OPERATING_SYSTEM_VERSION,
                    f"version {req.operating_system_version}",
                    None if have is None else f"version {have}",
                    "operating system version",
                )
            )
    if req.cpu_architecture is not None:
        have = props.cpu_architecture
        if have is None or not _same_arch(have, req.cpu_architecture):
            out.append(
                _lacks(site, Need.CPU_ARCHITECTURE, req.cpu_architecture, have, "architecture")
            )
    if req.exclusive_execution and not props.exclusive:
        out.append(
            Unmet(site, Need.EXCLUSIVE_EXECUTION, "exclusive use of its nodes", "no exclusive use")
        )
    if req.cpu_speed is not None and not (
        props.cpu_speed is not None and props.cpu_speed >= req.cpu_speed
    ):
        has = None if props.cpu_speed is None else _hz(props.cpu_speed)
        out.append(
            _lacks(
                site,
                Need.CPU_SPEED,
                f">= {_hz(req.cpu_speed)}",
                has,
                "CPU speed",
                _short(req.cpu_speed, props.cpu_speed),
            )
        )
    if req.network_bandwidth is not None and not (
        props.network_bandwidth is not None and props.network_bandwidth >= req.network_bandwidth
    ):
        has = None if props.network_bandwidth is None else _bits(props.network_bandwidth)
        out.append(
            _lacks(
                site,
                Need.NETWORK_BANDWIDTH,
                f">= {_bits(req.network_bandwidth)}",
                has,
                "network bandwidth",
                _short(req.network_bandwidth, props.network_bandwidth),
            )
        )
    if req.cores_per_node is not None and props.node_cores < req.cores_per_node:
        out.append(
            Unmet(
                site,
                Need.CORES_PER_NODE,
                f">= {count(req.cores_per_node, 'core')} per node",
                f"{count(props.node_cores, 'core')} per node",
            )
        )
    if req.nodes is not None and props.node_count < req.nodes:
        out.append(Unmet(site, Need.NODES, f">= {req.nodes} nodes", f"{props.node_count} nodes"))
    out.extend(_memory_and_disk(req, site, props, rank))
    for need in req.file_systems:
        failure = _file_system(need, site, props)
        if failure is not None:
            out.append(failure)
    if req.candidate_hosts:
        failure = _candidate_hosts(req, site, props, rank)
        if failure is not None:
            out.append(failure)
    return out


def candidate_hosts_at(
    patterns: Iterable[str], site: str, props: SiteProperties
) -> tuple[str, ...] | None:
    """The hosts of ``site`` that candidate host ``patterns`` let a job use, in the site's
    order (all of them when one names the site); None when none names the site or a host of
    it (the module docstring has the rule)."""
    name = site.lower()
    hosts = props.host_names(site)
    named: set[str] = set()
    for pattern in patterns:
        pattern = pattern.lower()
        site_part, slash, host_part = pattern.partition("/")
        if slash:
            if fnmatchcase(name, site_part):
                named.update(h for h in hosts if fnmatchcase(h.lower(), host_part))
        elif fnmatchcase(name, pattern):
            return hosts
        else:
            named.update(h for h in hosts if fnmatchcase(h.lower(), pattern))
    if not named:
        return None
    return tuple(h for h in hosts if h in named)


def _listed(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _candidate_hosts(
    req: Requirements, site: str, props: SiteProperties, rank: int
) -> Unmet | None:
    allowed = candidate_hosts_at(req.candidate_hosts, site, props)
    if allowed is None:
        wanted = f"the name {' or '.join(req.candidate_hosts)}"
        has = f"the name {site}"
        if props.hosts:
            has += f" and hosts {_listed(props.hosts)}"
        return Unmet(site, Need.CANDIDATE_HOSTS, wanted, has)
    if len(allowed) == len(props.host_names(site)):
        return None  # the whole site
    cores = len(allowed) * props.node_cores
    nodes = req.nodes or 0
    if rank <= cores and nodes <= len(allowed):
        return None
    wanted = f"{count(rank, 'core')}" + (f" on {nodes} nodes" if nodes else "")
    has = f"{count(cores, 'core')} on its hosts {_listed(allowed)}"
    return Unmet(site, Need.CANDIDATE_HOSTS, wanted, has, _short(rank, cores))


def known_names(sites: Mapping[str, SiteProperties], most: int = 24) -> str:
    """The names candidate hosts can match in ``sites``: each site, and each declared host as
    ``SITE/HOST``; at most ``most`` of them, then how many more."""
    names: list[str] = []
    for site, props in sites.items():
        names.append(site)
        names.extend(f"{site}/{host}" for host in props.hosts)
    return _listed(names, most)


def _memory_and_disk(
    req: Requirements, site: str, props: SiteProperties, rank: int
) -> Iterable[Unmet]:
    checks: tuple[tuple[Need, int | None, int | None, str], ...] = (
        (Need.INDIVIDUAL_MEMORY, req.individual_memory, props.node_memory(), "memory per node"),
        (
            Need.TOTAL_MEMORY,
            req.total_memory,
            props.memory_for(rank),
            f"memory for {count(rank, 'core')}",
        ),
        (Need.INDIVIDUAL_DISK, req.individual_disk, props.disk, "disk per node"),
        (
            Need.TOTAL_DISK,
            req.total_disk,
            None if props.disk is None else props.disk * props.nodes_for(rank),
            f"disk for {count(rank, 'core')}",
        ),
    )
    for need, wanted, has, what in checks:
        if wanted is not None and (has is None or has < wanted):
            shown = None if has is None else f"{format_bytes(has)} {what}"
            yield _lacks(
                site, need, f">= {format_bytes(wanted)} {what}", shown, what, _short(wanted, has)
            )


def _file_system(need: FileSystemNeed, site: str, props: SiteProperties) -> Unmet | None:
    fs = props.file_system(need.name)
    wanted = f"a file system {need.name}"
    if fs is None:
        names = ", ".join(f.name for f in props.file_systems) or "none"
        return Unmet(site, Need.FILE_SYSTEM, wanted, f"file systems: {names}")
    if need.type is not None and fs.type != need.type:
        return Unmet(site, Need.FILE_SYSTEM, f"{wanted} of type {need.type}", f"type {fs.type}")
    if need.mount_point is not None and fs.mount != need.mount_point:
        return Unmet(
            site,
            Need.FILE_SYSTEM,
            f"{wanted} mounted at {need.mount_point}",
            f"it mounted at {fs.mount}",
        )
    if need.disk is not None and (fs.free is None or fs.free < need.disk):
        has = "no declared free space" if fs.free is None else f"{format_bytes(fs.free)} free"
        return Unmet(
            site,
            Need.FILE_SYSTEM,
            f"{wanted} with >= {format_bytes(need.disk)} free",
            has,
            _short(need.disk, fs.free),
        )
    return None


def closest_unmet(
    requirements: Requirements | None, rank: int, sites: Mapping[str, SiteProperties]
) -> Unmet | None:
    """None if some site of ``sites`` fits; else the first failure of the closest site (fewest
    failures; then least shortfall; then site order)."""
    if not sites:
        raise InvalidInput("sites", "at least one site", {})
    best: tuple[int, float, int, list[Unmet]] | None = None
    for order, (name, props) in enumerate(sites.items()):
        failures = unmet(requirements, name, props, rank)
        if not failures:
            return None
        key = (len(failures), sum(u.shortfall for u in failures), order, failures)
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else best[3][0]
