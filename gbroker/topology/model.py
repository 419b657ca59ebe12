"""A topology as data: sites, links, the neighbourhood graph and where data sets live.

:class:`Topology` is pure and immutable, validated on construction (see :mod:`gbroker.topology`);
the neighbourhood graphs over positions that the generators and the YAML loader share are here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import networkx as nx  # type: ignore[import-untyped]

from gbroker.core.requirements import FileSystemSpec, SiteProperties
from gbroker.errors import InvalidInput
from gbroker.topology.checks import (
    cores_of,
    endpoint,
    name_of,
    non_negative,
    optional_bandwidth,
    positive,
    share_of,
)
from gbroker.topology.graphs import (
    circulant_graph,
    directed,
    hypercube_graph,
    named_graph,
    ring_graph,
    torus_graph,
)

# --- value checks, shared by the dataclasses and the YAML loader --------------------------------

MANAGERS = ("local", "slurm", "gridengine")
"""How a site runs its jobs: ``local`` (the broker's own launchers, the default), ``slurm``
(the site's Slurm cluster: a local fleet starts one per such site, gbroker.fleet.slurm) or
``gridengine`` (the site's Grid Engine cell: a local fleet starts one per such site,
gbroker.fleet.gridengine)."""

_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True, slots=True)
class SlurmSpec:
    """A ``manager: slurm`` site's cluster, beyond its cores and nodes (which are the site's
    ``cores`` and ``nodes``: each node declares cores / nodes CPUs).

    Attributes:
        partition: the cluster's one partition, where the site's jobs go (default ``batch``).
    """

    partition: str = "batch"

    def __post_init__(self) -> None:
        if not isinstance(self.partition, str) or not _PARTITION.fullmatch(self.partition):
            raise InvalidInput(
                "slurm.partition",
                "a partition name: 1 to 64 letters, digits, '_', '.' or '-'",
                self.partition,
            )


@dataclass(frozen=True, slots=True)
class SiteSpec:
    """A site (cluster) j: its n_j cores, relative speed, access links and endpoints.

    Attributes:
        name: unique site name.
        cores: n_j, the site's cores (elementary machines), >= 1.
        speed: relative CPU speed > 0; a job's run time at this site is its run time / speed.
        uplink: bandwidth of the site's outgoing access link in bytes/s; None: the default link's.
        downlink: bandwidth of the site's incoming access link in bytes/s; None: the default's.
        http: the broker's HTTP endpoint in a real fleet, e.g. ``http://127.0.0.1:8701``.
        mqtt: the MQTT broker the site publishes to, e.g. ``mqtt://127.0.0.1:1883``.
        operating_system, operating_system_version, cpu_architecture, nodes, cores_per_node,
        memory_per_core, memory_per_node, disk, cpu_speed, exclusive, file_systems: what the
            site offers jobs beyond cores (:class:`~gbroker.core.requirements.SiteProperties`;
            None: not declared).
        manager: how the site runs its jobs, one of :data:`MANAGERS` (default ``local``).
        slurm: a ``slurm`` site's cluster settings (:class:`SlurmSpec`; the defaults if None);
            only for a ``slurm`` site.
        hosts: the host names of the site's nodes, one per node (jobs' candidate hosts may name
            them); empty: the site is one host, named as the site.
        cpu_share: the share of each of its cores a job's CPU time is capped at, 0 < share <= 1
            (default 1: uncapped); a ``local`` site's broker caps it with the job's cgroup, which
            is how the sites of one test machine differ in CPU.
    """

    name: str
    cores: int
    speed: float = 1.0
    uplink: float | None = None
    downlink: float | None = None
    http: str | None = None
    mqtt: str | None = None
    operating_system: str | None = None
    operating_system_version: str | None = None
    cpu_architecture: str | None = None
    nodes: int | None = None
    cores_per_node: int | None = None
    memory_per_core: int | None = None
    memory_per_node: int | None = None
    disk: int | None = None
    cpu_speed: float | None = None
    exclusive: bool = False
    file_systems: tuple[FileSystemSpec, ...] = ()
    manager: str = "local"
    slurm: SlurmSpec | None = None
    hosts: tuple[str, ...] = ()
    cpu_share: float = 1.0

    def __post_init__(self) -> None:
        name_of("site.name", self.name)
        where = f"site[{self.name}]"
        if self.manager not in MANAGERS:
            raise InvalidInput(f"{where}.manager", f"one of {', '.join(MANAGERS)}", self.manager)
        if self.manager == "slurm" and self.slurm is None:
            object.__setattr__(self, "slurm", SlurmSpec())
        if self.manager != "slurm" and self.slurm is not None:
            raise InvalidInput(
                f"{where}.slurm",
                f"slurm settings only on a site with manager: slurm (this one's: {self.manager})",
            )
        cores_of(f"{where}.cores", self.cores)
        object.__setattr__(self, "speed", positive(f"{where}.speed", self.speed, "a speed"))
        object.__setattr__(self, "cpu_share", share_of(f"{where}.cpu_share", self.cpu_share))
        if self.cpu_share != 1.0 and self.manager != "local":
            raise InvalidInput(
                f"{where}.cpu_share",
                f"a cpu_share only on a site with manager: local (this one's: {self.manager})",
                self.cpu_share,
            )
        for attr in ("uplink", "downlink"):
            value = optional_bandwidth(f"{where}.{attr}", getattr(self, attr))
            object.__setattr__(self, attr, value)
        for attr in ("http", "mqtt"):
            endpoint(f"{where}.{attr}", getattr(self, attr))
        object.__setattr__(self, "file_systems", tuple(self.file_systems))
        object.__setattr__(self, "hosts", tuple(self.hosts))
        self.properties()  # the declared properties must agree with each other and the cores

    def properties(self, network_bandwidth: float | None = None) -> SiteProperties:
        """What the site offers jobs beyond cores; ``network_bandwidth`` in bits/s."""
        try:
            return SiteProperties(
                cores=self.cores,
                operating_system=self.operating_system,
                operating_system_version=self.operating_system_version,
                cpu_architecture=self.cpu_architecture,
                nodes=self.nodes,
                cores_per_node=self.cores_per_node,
                memory_per_core=self.memory_per_core,
                memory_per_node=self.memory_per_node,
                disk=self.disk,
                cpu_speed=self.cpu_speed,
                network_bandwidth=network_bandwidth,
                exclusive=self.exclusive,
                file_systems=self.file_systems,
                hosts=self.hosts,
            )
        except InvalidInput as exc:
            raise InvalidInput(f"site[{self.name}].{exc.field}", exc.expected, exc.found) from exc


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A network path: ``bandwidth`` in bytes/s (> 0) and one-way ``latency`` in seconds (>= 0)."""

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        bandwidth = positive("link.bandwidth", self.bandwidth, "a bandwidth in bytes/s")
        latency = non_negative("link.latency", self.latency, "a latency in seconds")
        object.__setattr__(self, "bandwidth", bandwidth)
        object.__setattr__(self, "latency", latency)

    def transfer_time(self, size: float) -> float:
        """Seconds to move ``size`` bytes over this path alone: latency + size / bandwidth."""
        return self.latency + size / self.bandwidth


#: Gigabit Ethernet: 125e6 bytes/s, 0.5 ms.
DEFAULT_LINK = LinkSpec(bandwidth=125e6, latency=0.0005)


# --- the topology -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False, eq=False, repr=False)
class Topology:
    """Sites, the neighbourhood graph over them, links and data sets; immutable and validated.

    ``sites`` keeps the given order; ``neighbourhood`` is a frozen ``networkx.DiGraph`` whose nodes
    are the site names in that order; ``links`` holds only the explicit directed pair links
    (:meth:`link` falls back to ``default_link``); ``data`` maps a data set name to its site.

    Args:
        sites: the sites in order (a sequence of :class:`SiteSpec`, or a mapping name -> spec).
        neighbourhood: a networkx graph over the site names (an undirected one gives arcs both
            ways), an iterable of (i, j) arcs, or a named form for the sites in order:
            ``"full"``, ``"ring"``, ``"torus RxC"``, ``"hypercube"``, ``"circulant a,b"``.
    """

    name: str
    description: str
    sites: Mapping[str, SiteSpec]
    neighbourhood: nx.DiGraph
    links: Mapping[tuple[str, str], LinkSpec]
    default_link: LinkSpec
    data: Mapping[str, str]

    def __init__(
        self,
        sites: Iterable[SiteSpec] | Mapping[str, SiteSpec],
        neighbourhood: nx.Graph | Iterable[tuple[str, str]] | str = (),
        *,
        name: str = "topology",
        description: str = "",
        links: Mapping[tuple[str, str], LinkSpec] | None = None,
        default_link: LinkSpec = DEFAULT_LINK,
        data: Mapping[str, str] | None = None,
    ) -> None:
        site_list = _site_list(sites)
        names = [site.name for site in site_list]
        if isinstance(neighbourhood, str):
            graph = directed(named_graph("neighbourhood", neighbourhood, len(names)), names)
        elif isinstance(neighbourhood, nx.Graph):
            graph = nx.DiGraph(neighbourhood)
        else:
            graph = nx.DiGraph()
            try:
                graph.add_edges_from(neighbourhood)
            except (TypeError, ValueError, nx.NetworkXError) as exc:
                raise InvalidInput(
                    "neighbourhood", "a graph, (i, j) arcs or a named form", neighbourhood
                ) from exc
        # Nodes in site order first, so iteration over the graph follows the sites.
        ordered = nx.DiGraph()
        ordered.add_nodes_from(names)
        ordered.add_nodes_from(graph.nodes)
        ordered.add_edges_from(graph.edges)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "sites", MappingProxyType({s.name: s for s in site_list}))
        object.__setattr__(self, "neighbourhood", nx.freeze(ordered))
        object.__setattr__(self, "links", MappingProxyType(dict(links or {})))
        object.__setattr__(self, "default_link", default_link)
        object.__setattr__(self, "data", MappingProxyType(dict(data or {})))
        self.validate()

    def validate(self) -> None:
        """Check every invariant; raise :class:`InvalidInput` naming the first broken one.

        Runs on construction; a Topology that exists is valid.
        """
        name_of("topology.name", self.name)
        if not isinstance(self.description, str):
            raise InvalidInput("topology.description", "a string", self.description)
        if not self.sites:
            raise InvalidInput("sites", "at least one site", [])
        for key, site in self.sites.items():
            if not isinstance(site, SiteSpec) or site.name != key:
                raise InvalidInput(f"sites[{key}]", f"a SiteSpec named {key!r}", site)
        if not isinstance(self.default_link, LinkSpec):
            raise InvalidInput("default_link", "a LinkSpec", self.default_link)
        self._validate_neighbourhood()
        for pair, link in self.links.items():
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise InvalidInput("links", "keys that are (from, to) pairs of sites", pair)
            a, b = pair
            where = f"links[{a} -> {b}]"
            self._require_site(where, a)
            self._require_site(where, b)
            if a == b:
                raise InvalidInput(where, "two different sites", a)
            if not isinstance(link, LinkSpec):
                raise InvalidInput(where, "a LinkSpec", link)
        for data_set, holder in self.data.items():
            name_of("data", data_set)
            self._require_site(f"data[{data_set}]", holder)

    def _require_site(self, field: str, site: object) -> None:
        if not isinstance(site, str) or site not in self.sites:
            raise InvalidInput(field, "a site of the topology", site)

    def _validate_neighbourhood(self) -> None:
        graph = self.neighbourhood
        for node in graph.nodes:
            if node not in self.sites:
                raise InvalidInput(f"neighbourhood[{node}]", "a site of the topology", node)
        for a, b in graph.edges:
            if a == b:
                raise InvalidInput(
                    f"neighbourhood[{a} -> {b}]",
                    "an arc between two different sites (a broker always considers its own site)",
                    a,
                )
        if len(self.sites) > 1 and not nx.is_weakly_connected(graph):
            order = {site: k for k, site in enumerate(self.sites)}
            components = sorted(
                (sorted(c, key=order.__getitem__) for c in nx.weakly_connected_components(graph)),
                key=lambda c: order[c[0]],
            )
            shown = "; ".join(_short_list(c) for c in components[:4])
            if len(components) > 4:
                shown += f"; and {len(components) - 4} more"
            raise InvalidInput(
                "neighbourhood",
                f"a weakly connected graph, but {components[1][0]!r} cannot be reached from "
                f"{components[0][0]!r}: {len(components)} components: {shown}",
            )

    # --- queries ----------------------------------------------------------------------------

    @property
    def site_names(self) -> tuple[str, ...]:
        """The site names in order."""
        return tuple(self.sites)

    @property
    def total_cores(self) -> int:
        """N, the sum of n_j over all sites."""
        return sum(site.cores for site in self.sites.values())

    def site(self, name: str) -> SiteSpec:
        """The site called ``name``."""
        self._require_site("site", name)
        return self.sites[name]

    def neighbours(self, site: str) -> list[str]:
        """L(i): the sites broker ``site`` may send jobs to, sorted by name, never itself."""
        self._require_site("site", site)
        return sorted(self.neighbourhood.successors(site))

    def link(self, a: str, b: str) -> LinkSpec:
        """The path from site ``a`` to site ``b``: the explicit pair link, else the default.

        Moving data within one site costs nothing; callers handle ``a == b`` themselves.
        """
        self._require_site("link.from", a)
        self._require_site("link.to", b)
        return self.links.get((a, b), self.default_link)

    def uplink(self, site: str) -> float:
        """Bandwidth (bytes/s) of ``site``'s outgoing access link."""
        up = self.site(site).uplink
        return self.default_link.bandwidth if up is None else up

    def downlink(self, site: str) -> float:
        """Bandwidth (bytes/s) of ``site``'s incoming access link."""
        down = self.site(site).downlink
        return self.default_link.bandwidth if down is None else down

    def properties(self) -> dict[str, SiteProperties]:
        """Each site's :class:`~gbroker.core.requirements.SiteProperties`, its network
        bandwidth (bits/s) that of the slower of its access links."""
        return {
            name: spec.properties(8 * min(self.uplink(name), self.downlink(name)))
            for name, spec in self.sites.items()
        }

    def data_site(self, name: str) -> str:
        """h_l: the site that holds data set ``name``."""
        try:
            return self.data[name]
        except KeyError:
            known = ", ".join(sorted(self.data)) or "none"
            raise InvalidInput(
                "data set", f"one of the topology's data sets ({known})", name
            ) from None

    # --- value semantics --------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (
            self.name == other.name
            and self.description == other.description
            and list(self.sites.items()) == list(other.sites.items())
            and set(self.neighbourhood.edges) == set(other.neighbourhood.edges)
            and dict(self.links) == dict(other.links)
            and self.default_link == other.default_link
            and dict(self.data) == dict(other.data)
        )

    def __repr__(self) -> str:
        return (
            f"Topology(name={self.name!r}, sites={len(self.sites)}, cores={self.total_cores}, "
            f"arcs={self.neighbourhood.number_of_edges()})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Mapping proxies do not pickle: rebuild from plain values (also serves copy/deepcopy).
        return (
            _rebuild,
            (
                list(self.sites.values()),
                list(self.neighbourhood.edges),
                self.name,
                self.description,
                dict(self.links),
                self.default_link,
                dict(self.data),
            ),
        )


def _rebuild(
    sites: list[SiteSpec],
    arcs: list[tuple[str, str]],
    name: str,
    description: str,
    links: dict[tuple[str, str], LinkSpec],
    default_link: LinkSpec,
    data: dict[str, str],
) -> Topology:
    return Topology(
        sites,
        arcs,
        name=name,
        description=description,
        links=links,
        default_link=default_link,
        data=data,
    )


def _site_list(sites: Iterable[SiteSpec] | Mapping[str, SiteSpec]) -> list[SiteSpec]:
    """The sites in order, each a SiteSpec under a name no earlier site has."""
    if isinstance(sites, Mapping):
        for key, site in sites.items():
            if not isinstance(site, SiteSpec) or site.name != key:
                raise InvalidInput(f"sites[{key}]", f"a SiteSpec named {key!r}", site)
        site_list = list(sites.values())
    else:
        site_list = list(sites)
    if not site_list:
        raise InvalidInput("sites", "at least one site", [])
    seen: set[str] = set()
    for i, site in enumerate(site_list):
        if not isinstance(site, SiteSpec):
            raise InvalidInput(f"sites[{i}]", "a SiteSpec", site)
        if site.name in seen:
            raise InvalidInput(f"sites[{i}].name", "a name no earlier site has", site.name)
        seen.add(site.name)
    return site_list


def _short_list(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names)} sites)"
    return "{" + shown + "}"


# --- neighbourhood graphs over positions 0..H-1 (undirected; networkx builds them) --------------


def neighbourhood_form(topology: Topology) -> str | None:
    """The named form (``full``, ``ring``, ``hypercube``, ``torus RxC``, ``circulant a,b``) that
    reproduces ``topology``'s neighbourhood over its sites in order, or None if none does."""
    names = topology.site_names
    graph = topology.neighbourhood
    n = len(names)
    arcs = set(graph.edges)
    if len(arcs) == n * (n - 1):  # a simple digraph without loops with every arc: complete
        return "full"
    candidates: list[tuple[str, nx.Graph]] = [("ring", ring_graph(n))]
    dim = n.bit_length() - 1
    if 2**dim == n:
        candidates.append(("hypercube", hypercube_graph(dim)))
    candidates.extend(
        (f"torus {rows}x{n // rows}", torus_graph(rows, n // rows))
        for rows in range(2, n)
        if n % rows == 0 and n // rows >= 2
    )
    position = {site: k for k, site in enumerate(names)}
    offsets = sorted({min(k, n - k) for k in (position[j] for j in graph.successors(names[0]))})
    if offsets:
        candidates.append((f"circulant {','.join(map(str, offsets))}", circulant_graph(n, offsets)))
    for form, candidate in candidates:
        if 2 * candidate.number_of_edges() == len(arcs) and set(
            directed(candidate, names).edges
        ) == (arcs):
            return form
    return None
