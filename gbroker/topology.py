"""Topologies: a fleet's sites, the links between them, the neighbourhood graph and its data sets.

Theory of operation. A :class:`Topology` is pure, immutable data that the core, the simulator and
the daemons all read: the sites S = {1..H} with their n_j cores (:class:`SiteSpec`), the directed
neighbourhood graph G(S, E) whose arc (i, j) lets broker i send jobs to j (ARCHITECTURE §2), the
network (a default :class:`LinkSpec`, explicit links for directed pairs that differ from it and
each site's access-link bandwidths) and the site that holds each named data set. It validates
itself on construction and names the offending field, so no half-valid topology ever exists: the
neighbourhood has no self-loops (a broker always considers its own site) and, with more than one
site, is weakly connected (otherwise some sites could never share work). Everything that touches
files (YAML, PNG) sits at the bottom of this module; nothing above it does I/O.

Generators build the usual neighbourhoods with networkx: :func:`full` (complete digraph),
:func:`ring`, :func:`torus` (2D, wrap-around), :func:`hypercube`, :func:`circulant` (the thesis's
D2 circulant is offsets 1, 2) and :func:`random_regular` (seeded). All arcs go both ways. Sites
are named ``s0`` .. ``s{H-1}``, except the torus's ``r{row}c{col}`` (row-major), and
the hypercube's ``s{i}`` are adjacent exactly when their indices differ in one bit.

The YAML format (:func:`load_topology`, :func:`save_topology`, :func:`loads`, :func:`dumps`)::

    name: paper-6                  # optional; default: the file name without its suffix
    description: free text         # optional
    defaults: {bandwidth: 12.5e6, latency: 0.001}   # optional; the default link (B/s, s)
    sites:                         # required, in order; names are unique
      - {name: Xeon80, cores: 32, speed: 1.0, uplink: 12.5e6, downlink: 12.5e6,
         http: "http://127.0.0.1:8705", mqtt: "mqtt://127.0.0.1:1883"}
    neighbourhood: full            # required: full | ring | torus 2x3 | hypercube | circulant 1,2
    # neighbourhood: {Xeon80: [L4001, Core16], L4001: [Xeon80], Core16: []}   # directed arcs
    links:                         # optional; directed unless symmetric: true
      - {from: Xeon80, to: L4001, bandwidth: 125e6, latency: 0.0005, symmetric: true}
    data: {spec-mpi2007: Xeon80}   # optional; data set name -> the site that holds it

A site may also declare what it offers jobs beyond cores, which jobs' requirements are matched
against (:mod:`gbroker.core.requirements`; :meth:`Topology.properties`)::

      - {name: a, cores: 8, os: LINUX, os_version: "6.1", arch: x86_64, nodes: 2,
         memory_per_node: 16GiB, memory_per_core: 2GiB, disk: 100GB, cpu_speed: 2.4e9,
         exclusive: true,
         file_systems: [{name: SCRATCH, mount: /scratch/a, type: temporary, free: 1TiB}]}

Sizes are bytes, or text with a unit (``2GiB``, ``100GB``); ``cpu_speed`` is in Hz; ``nodes``
and ``cores_per_node`` must divide ``cores`` (either gives the other; neither: one node).

Only ``name`` and ``cores`` are required per site; a name is letters, digits, ``-`` and ``_``
(:data:`gbroker.names.SITE_NAME`: it goes into MQTT topics and job ids); ``speed`` (relative
CPU speed: a job's run time at the site is its run time divided by the speed) defaults to 1.0,
``uplink``/``downlink`` to the default bandwidth. A link entry may omit ``bandwidth`` or
``latency`` to inherit the default.
A named neighbourhood applies to the sites in file order: ``ring`` links each site to the next
(and the last to the first), ``torus RxC`` lays the sites out row by row on R x C = H places,
``hypercube`` joins sites whose positions (0-based) differ in one bit (H a power of two), and
``circulant a,b`` joins position p to p ± a and p ± b (mod H). The explicit map lists each
site's out-neighbours. Unknown keys are errors (a typo must not pass silently). Numbers may be
written ``12.5e6``: the loader is PyYAML's safe loader extended to read YAML 1.2 floats, which
plain YAML 1.1 would take for strings, and refusing anchors and aliases
(:mod:`gbroker.safeyaml`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO, TypeGuard

import networkx as nx  # type: ignore[import-untyped]
import yaml

from gbroker import safeyaml
from gbroker.core.requirements import FileSystemSpec, SiteProperties
from gbroker.errors import InvalidInput, Shown
from gbroker.names import check_site_name
from gbroker.safeyaml import AliasRefused, NoAliasLoader

__all__ = [
    "DEFAULT_LINK",
    "LinkSpec",
    "SiteSpec",
    "Topology",
    "circulant",
    "draw_topology",
    "dumps",
    "full",
    "hypercube",
    "load_topology",
    "loads",
    "neighbourhood_form",
    "random_regular",
    "ring",
    "save_topology",
    "torus",
]


# --- value checks, shared by the dataclasses and the YAML loader --------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(field: str, value: object, what: str) -> float:
    if not _is_number(value) or not (math.isfinite(value) and value > 0):
        raise InvalidInput(field, f"{what} > 0", value)
    return float(value)


def _non_negative(field: str, value: object, what: str) -> float:
    if not _is_number(value) or not (math.isfinite(value) and value >= 0):
        raise InvalidInput(field, f"{what} >= 0", value)
    return float(value)


def _name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "a non-empty string", value)
    return value


def _endpoint(field: str, value: object) -> str | None:
    if value is None:
        return None
    return _name(field, value)


def _cores(field: str, value: object) -> int:
    if not _is_int(value) or value < 1:
        raise InvalidInput(field, "an integer >= 1", value)
    return value


def _optional_bandwidth(field: str, value: object) -> float | None:
    return None if value is None else _positive(field, value, "a bandwidth in bytes/s")


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

    def __post_init__(self) -> None:
        _name("site.name", self.name)
        where = f"site[{self.name}]"
        _cores(f"{where}.cores", self.cores)
        object.__setattr__(self, "speed", _positive(f"{where}.speed", self.speed, "a speed"))
        for attr in ("uplink", "downlink"):
            value = _optional_bandwidth(f"{where}.{attr}", getattr(self, attr))
            object.__setattr__(self, attr, value)
        for attr in ("http", "mqtt"):
            _endpoint(f"{where}.{attr}", getattr(self, attr))
        object.__setattr__(self, "file_systems", tuple(self.file_systems))
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
            )
        except InvalidInput as exc:
            raise InvalidInput(f"site[{self.name}].{exc.field}", exc.expected, exc.found) from exc


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A network path: ``bandwidth`` in bytes/s (> 0) and one-way ``latency`` in seconds (>= 0)."""

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        bandwidth = _positive("link.bandwidth", self.bandwidth, "a bandwidth in bytes/s")
        latency = _non_negative("link.latency", self.latency, "a latency in seconds")
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
            graph = _directed(_named_graph("neighbourhood", neighbourhood, len(names)), names)
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
        _name("topology.name", self.name)
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
            _name("data", data_set)
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


def _full_graph(n: int) -> nx.Graph:
    return nx.complete_graph(n)


def _ring_graph(n: int) -> nx.Graph:
    graph = nx.cycle_graph(n)
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))  # cycle_graph(1) is a self-loop
    return graph


def _torus_graph(rows: int, cols: int) -> nx.Graph:
    # networkx adds a wrap-around edge only along a dimension of length > 2, so 1xN, 2xN and
    # 2x2 come out without duplicate arcs or self-loops.
    grid = nx.grid_2d_graph(rows, cols, periodic=True)
    return nx.relabel_nodes(grid, {(r, c): r * cols + c for r, c in grid.nodes})


def _hypercube_graph(dim: int) -> nx.Graph:
    cube = nx.hypercube_graph(dim)  # nodes are bit tuples, but plain 0 and 1 when dim = 1

    def index(node: int | tuple[int, ...]) -> int:
        return node if isinstance(node, int) else sum(bit << k for k, bit in enumerate(node))

    graph = nx.relabel_nodes(cube, {node: index(node) for node in cube.nodes})
    graph.add_nodes_from(range(2**dim))  # hypercube_graph(0) has no node at all
    return graph


def _circulant_graph(n: int, offsets: Sequence[int]) -> nx.Graph:
    graph = nx.circulant_graph(n, offsets)
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))  # offsets that are multiples of n
    return graph


def _directed(graph: nx.Graph, names: Sequence[str]) -> nx.DiGraph:
    """Arcs both ways between named sites for an undirected graph over positions."""
    directed = nx.DiGraph()
    directed.add_nodes_from(names)
    directed.add_edges_from((names[a], names[b]) for a, b in graph.edges)
    directed.add_edges_from((names[b], names[a]) for a, b in graph.edges)
    return directed


_FORMS = "full, ring, torus RxC, hypercube, circulant a,b,... or a map site: [neighbours]"
_TORUS = re.compile(r"torus\s+(\d+)\s*[x×]\s*(\d+)")
_CIRCULANT = re.compile(r"circulant\s+(\d+(?:\s*,\s*\d+)*)")


def _named_graph(field: str, form: str, n: int) -> nx.Graph:
    """The undirected graph over positions 0..n-1 that a named form describes."""
    text = " ".join(form.strip().lower().split())
    if text in ("full", "complete"):
        return _full_graph(n)
    if text == "ring":
        return _ring_graph(n)
    if text == "hypercube":
        dim = n.bit_length() - 1
        if 2**dim != n:
            raise InvalidInput(field, f"a power of two sites for a hypercube, not {n}", form)
        return _hypercube_graph(dim)
    if match := _TORUS.fullmatch(text):
        rows, cols = int(match[1]), int(match[2])
        if rows < 1 or cols < 1 or rows * cols != n:
            raise InvalidInput(field, f"'torus RxC' with R, C >= 1 and R x C = {n} sites", form)
        return _torus_graph(rows, cols)
    if match := _CIRCULANT.fullmatch(text):
        offsets = [int(k) for k in match[1].split(",")]
        if min(offsets) < 1:
            raise InvalidInput(field, "circulant offsets >= 1", form)
        return _circulant_graph(n, offsets)
    raise InvalidInput(field, _FORMS, form)


def neighbourhood_form(topology: Topology) -> str | None:
    """The named form (``full``, ``ring``, ``hypercube``, ``torus RxC``, ``circulant a,b``) that
    reproduces ``topology``'s neighbourhood over its sites in order, or None if none does."""
    names = topology.site_names
    graph = topology.neighbourhood
    n = len(names)
    arcs = set(graph.edges)
    if len(arcs) == n * (n - 1):  # a simple digraph without loops with every arc: complete
        return "full"
    candidates: list[tuple[str, nx.Graph]] = [("ring", _ring_graph(n))]
    dim = n.bit_length() - 1
    if 2**dim == n:
        candidates.append(("hypercube", _hypercube_graph(dim)))
    candidates.extend(
        (f"torus {rows}x{n // rows}", _torus_graph(rows, n // rows))
        for rows in range(2, n)
        if n % rows == 0 and n // rows >= 2
    )
    position = {site: k for k, site in enumerate(names)}
    offsets = sorted({min(k, n - k) for k in (position[j] for j in graph.successors(names[0]))})
    if offsets:
        candidates.append(
            (f"circulant {','.join(map(str, offsets))}", _circulant_graph(n, offsets))
        )
    for form, candidate in candidates:
        if 2 * candidate.number_of_edges() == len(arcs) and set(
            _directed(candidate, names).edges
        ) == (arcs):
            return form
    return None


# --- generators ---------------------------------------------------------------------------------


def _per_site(field: str, value: object, n: int) -> list[object]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n:
            raise InvalidInput(field, f"one value per site ({n})", len(value))
        return list(value)
    return [value] * n


def _count(field: str, value: object, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise InvalidInput(field, f"an integer >= {minimum}", value)
    return value


def _generated(
    graph: nx.Graph,
    names: Sequence[str],
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float],
    name: str,
    description: str,
    default_link: LinkSpec,
    data: Mapping[str, str] | None,
) -> Topology:
    n = len(names)
    per_core = _per_site("cores", cores, n)
    per_speed = _per_site("speed", speed, n)
    sites = [
        SiteSpec(
            site,
            _cores(f"cores[{k}]" if isinstance(cores, Sequence) else "cores", per_core[k]),
            _positive(
                f"speed[{k}]" if isinstance(speed, Sequence) else "speed", per_speed[k], "a speed"
            ),
        )
        for k, site in enumerate(names)
    ]
    return Topology(
        sites,
        _directed(graph, names),
        name=name,
        description=description,
        default_link=default_link,
        data=data,
    )


def _describe(given: str | None, shape: str, cores: int | Sequence[int]) -> str:
    """The caller's description, else one saying what was generated."""
    if given is not None:
        return given
    if isinstance(cores, Sequence):
        return f"{shape}, {sum(cores)} cores"
    return f"{shape}, {cores} cores per site"


def full(
    n: int,
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
) -> Topology:
    """``n`` sites ``s0``.. with every arc: each broker sees all others (out-degree n - 1)."""
    _count("n", n, 1)
    return _generated(
        _full_graph(n),
        [f"s{k}" for k in range(n)],
        cores=cores,
        speed=speed,
        name=name or f"full-{n}",
        description=_describe(description, f"full graph on {n} sites", cores),
        default_link=default_link,
        data=data,
    )


def ring(
    n: int,
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
) -> Topology:
    """``n`` sites ``s0``.. in a cycle, arcs both ways (out-degree 2 for n >= 3)."""
    _count("n", n, 1)
    return _generated(
        _ring_graph(n),
        [f"s{k}" for k in range(n)],
        cores=cores,
        speed=speed,
        name=name or f"ring-{n}",
        description=_describe(description, f"ring of {n} sites", cores),
        default_link=default_link,
        data=data,
    )


def torus(
    rows: int,
    cols: int,
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
) -> Topology:
    """A 2D torus of ``rows`` x ``cols`` sites named ``r{row}c{col}`` (row-major order).

    Each site's neighbours are its wrap-around grid neighbours: out-degree 4 when both sides are
    >= 3. A side of 2 gives one neighbour along it (the wrap would repeat it), a side of 1 none.
    """
    _count("rows", rows, 1)
    _count("cols", cols, 1)
    return _generated(
        _torus_graph(rows, cols),
        [f"r{r}c{c}" for r in range(rows) for c in range(cols)],
        cores=cores,
        speed=speed,
        name=name or f"torus-{rows}x{cols}",
        description=_describe(description, f"2D torus {rows}x{cols}", cores),
        default_link=default_link,
        data=data,
    )


def hypercube(
    dim: int,
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
) -> Topology:
    """A ``dim``-cube: 2**dim sites ``s{i}``, adjacent when the i differ in one bit (degree dim)."""
    _count("dim", dim, 0)
    return _generated(
        _hypercube_graph(dim),
        [f"s{k}" for k in range(2**dim)],
        cores=cores,
        speed=speed,
        name=name or f"hypercube-{dim}",
        description=_describe(description, f"{dim}-dimensional hypercube", cores),
        default_link=default_link,
        data=data,
    )


def circulant(
    n: int,
    offsets: Sequence[int] = (1, 2),
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
) -> Topology:
    """Sites ``s0``.. with s_k joined to s_(k ± o mod n) for each offset o.

    The default offsets (1, 2) are the thesis's D2 circulant: out-degree 4 for n >= 5.
    Offsets that leave the graph disconnected (e.g. only 2 with n even) are an error.
    """
    _count("n", n, 1)
    if isinstance(offsets, str) or not offsets:
        raise InvalidInput("offsets", "one or more integers >= 1", offsets)
    for offset in offsets:
        _count("offsets", offset, 1)
    shown = ",".join(map(str, offsets))
    return _generated(
        _circulant_graph(n, offsets),
        [f"s{k}" for k in range(n)],
        cores=cores,
        speed=speed,
        name=name or f"circulant-{n}-{'-'.join(map(str, offsets))}",
        description=_describe(description, f"circulant C{n}({shown})", cores),
        default_link=default_link,
        data=data,
    )


def _derived_seed(seed: int, attempt: int) -> int:
    # Attempt 0 is networkx's own graph for ``seed``; later attempts spread over 64 bits.
    return seed if attempt == 0 else (seed + attempt * 0x9E3779B97F4A7C15) % 2**64


def random_regular(
    n: int,
    degree: int,
    seed: int,
    *,
    cores: int | Sequence[int],
    speed: float | Sequence[float] = 1.0,
    name: str | None = None,
    description: str | None = None,
    default_link: LinkSpec = DEFAULT_LINK,
    data: Mapping[str, str] | None = None,
    attempts: int = 100,
) -> Topology:
    """A connected random ``degree``-regular graph on ``n`` sites ``s0``.., seeded.

    networkx draws the graph; a disconnected draw is redrawn with a seed derived from ``seed``
    (the same sequence every time), at most ``attempts`` times in all.
    """
    _count("n", n, 1)
    _count("degree", degree, 0)
    _count("seed", seed, 0)
    _count("attempts", attempts, 1)
    if degree >= n and n > 1:
        raise InvalidInput("degree", f"less than the number of sites ({n})", degree)
    if n * degree % 2:
        raise InvalidInput(
            "degree", f"an even degree, as n = {n} is odd (n x degree must be even)", degree
        )
    if n > 2 and degree < 2:
        raise InvalidInput("degree", f">= 2 for a connected graph on {n} sites", degree)
    for attempt in range(attempts):
        graph = nx.random_regular_graph(degree, n, seed=_derived_seed(seed, attempt))
        if n == 1 or nx.is_connected(graph):
            return _generated(
                graph,
                [f"s{k}" for k in range(n)],
                cores=cores,
                speed=speed,
                name=name or f"random-regular-{n}-d{degree}-s{seed}",
                description=_describe(
                    description, f"random {degree}-regular graph on {n} sites (seed {seed})", cores
                ),
                default_link=default_link,
                data=data,
            )
    raise InvalidInput(
        "degree",
        f"a degree that gives a connected graph on {n} sites within {attempts} attempts",
        degree,
    )


# --- YAML ---------------------------------------------------------------------------------------


class _Loader(NoAliasLoader):
    """PyYAML's safe loader without anchors and aliases (:mod:`gbroker.safeyaml`), also reading
    YAML 1.2 floats such as ``12.5e6`` and ``1e-3``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_TOP_KEYS = ("name", "description", "defaults", "sites", "neighbourhood", "links", "data")
_SITE_KEYS = (
    "name",
    "cores",
    "speed",
    "uplink",
    "downlink",
    "http",
    "mqtt",
    "os",
    "os_version",
    "arch",
    "nodes",
    "cores_per_node",
    "memory_per_core",
    "memory_per_node",
    "disk",
    "cpu_speed",
    "exclusive",
    "file_systems",
)
# YAML key -> SiteSpec attribute, where they differ.
_SITE_ATTRS = {
    "os": "operating_system",
    "os_version": "operating_system_version",
    "arch": "cpu_architecture",
}
_SIZE_KEYS = ("memory_per_core", "memory_per_node", "disk")
_FS_KEYS = ("name", "mount", "type", "free")
_LINK_KEYS = ("bandwidth", "latency")
_PAIR_KEYS = ("from", "to", "bandwidth", "latency", "symmetric")


def _mapping(field: str, value: object, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(field, f"a mapping with keys {', '.join(keys)}", value)
    for key in value:
        if key not in keys:
            raise InvalidInput(f"{field}.{key}", f"one of the keys {', '.join(keys)}", key)
    return value


def _required(field: str, mapping: Mapping[str, Any], key: str, expected: str) -> object:
    if key not in mapping:
        raise InvalidInput(f"{field}.{key}" if field else key, f"{expected}, but it is missing")
    return mapping[key]


def _link_from(field: str, raw: Mapping[str, Any], default: LinkSpec) -> LinkSpec:
    bandwidth = _positive(
        f"{field}.bandwidth", raw.get("bandwidth", default.bandwidth), "a bandwidth in bytes/s"
    )
    latency = _non_negative(
        f"{field}.latency", raw.get("latency", default.latency), "a latency in seconds"
    )
    return LinkSpec(bandwidth, latency)


_SIZE_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGTP]i?B|B)?\s*")
_SIZE_UNITS = {"B": 1, **{f"{p}B": 1000 ** (k + 1) for k, p in enumerate("kMGTP")}}
_SIZE_UNITS |= {f"{p}iB": 1024 ** (k + 1) for k, p in enumerate("KMGTP")}
_SIZE_UNITS["KB"] = 1000


def _bytes(field: str, value: object) -> int:
    """A size: whole bytes, or text with a unit (``2GiB``, ``100GB``, ``512 MiB``)."""
    expected = "a size: bytes, or text such as 2GiB, 512MiB or 100GB"
    if _is_int(value) and value >= 0:
        return value
    match = _SIZE_TEXT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidInput(field, expected, value)
    size = float(match[1]) * _SIZE_UNITS[match[2] or "B"]
    if not size < 2**63 or size != int(size):
        raise InvalidInput(field, "a whole number of bytes", value)
    return int(size)


def _file_systems_from(field: str, raw: object) -> tuple[FileSystemSpec, ...]:
    if not isinstance(raw, list):
        raise InvalidInput(field, "a list of {name, mount, type, free}", raw)
    out = []
    for i, entry in enumerate(raw):
        here = f"{field}[{i}]"
        fs = _mapping(here, entry, _FS_KEYS)
        free = fs.get("free")
        try:
            out.append(
                FileSystemSpec(
                    name=_name(f"{here}.name", _required(here, fs, "name", "a file system name")),
                    mount=_name(f"{here}.mount", _required(here, fs, "mount", "an absolute path")),
                    type=fs.get("type", "normal"),
                    free=None if free is None else _bytes(f"{here}.free", free),
                )
            )
        except InvalidInput as exc:
            if exc.field.startswith(here):
                raise
            raise InvalidInput(
                f"{here}.{exc.field.rsplit('.', 1)[-1]}", exc.expected, exc.found
            ) from exc
    return tuple(out)


def _site_from(field: str, raw: object) -> SiteSpec:
    site = _mapping(field, raw, _SITE_KEYS)
    extra: dict[str, Any] = {}
    for key in ("os", "os_version", "arch"):
        if site.get(key) is not None:
            extra[_SITE_ATTRS[key]] = _name(f"{field}.{key}", str(site[key]))
    for key in ("nodes", "cores_per_node"):
        if site.get(key) is not None:
            extra[key] = _cores(f"{field}.{key}", site[key])
    for key in _SIZE_KEYS:
        if site.get(key) is not None:
            extra[key] = _bytes(f"{field}.{key}", site[key])
    if site.get("cpu_speed") is not None:
        extra["cpu_speed"] = _positive(f"{field}.cpu_speed", site["cpu_speed"], "a speed in Hz")
    if "exclusive" in site:
        if not isinstance(site["exclusive"], bool):
            raise InvalidInput(f"{field}.exclusive", "true or false", site["exclusive"])
        extra["exclusive"] = site["exclusive"]
    if site.get("file_systems") is not None:
        extra["file_systems"] = _file_systems_from(f"{field}.file_systems", site["file_systems"])
    name = check_site_name(_required(field, site, "name", "a site name"), field=f"{field}.name")
    try:
        return SiteSpec(
            name=name,
            cores=_cores(f"{field}.cores", _required(field, site, "cores", "an integer >= 1")),
            speed=_positive(f"{field}.speed", site.get("speed", 1.0), "a speed"),
            uplink=_optional_bandwidth(f"{field}.uplink", site.get("uplink")),
            downlink=_optional_bandwidth(f"{field}.downlink", site.get("downlink")),
            http=_endpoint(f"{field}.http", site.get("http")),
            mqtt=_endpoint(f"{field}.mqtt", site.get("mqtt")),
            **extra,
        )
    except InvalidInput as exc:
        prefix = f"site[{name}]."
        if not exc.field.startswith(prefix):
            raise
        key = exc.field[len(prefix) :]
        key = {v: k for k, v in _SITE_ATTRS.items()}.get(key, key)
        raise InvalidInput(f"{field}.{key}", exc.expected, exc.found) from exc


def _neighbourhood_from(raw: object, names: Sequence[str]) -> nx.DiGraph:
    if isinstance(raw, str):
        return _directed(_named_graph("neighbourhood", raw, len(names)), names)
    if not isinstance(raw, dict):
        raise InvalidInput("neighbourhood", _FORMS, raw)
    known = set(names)
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    for site, targets in raw.items():
        if site not in known:
            raise InvalidInput(f"neighbourhood.{site}", "a site of the topology", site)
        if targets is None:
            continue
        if not isinstance(targets, list):
            raise InvalidInput(f"neighbourhood.{site}", "a list of site names", targets)
        for k, target in enumerate(targets):
            field = f"neighbourhood.{site}[{k}]"
            if not isinstance(target, str) or target not in known:
                raise InvalidInput(field, "a site of the topology", target)
            if target == site:
                raise InvalidInput(field, f"a site other than {site} itself", target)
            graph.add_edge(site, target)
    return graph


def _links_from(
    raw: object, names: Sequence[str], default: LinkSpec
) -> dict[tuple[str, str], LinkSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InvalidInput("links", "a list of {from, to, bandwidth, latency, symmetric}", raw)
    known = set(names)
    links: dict[tuple[str, str], LinkSpec] = {}
    origin: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(raw):
        field = f"links[{i}]"
        pair = _mapping(field, entry, _PAIR_KEYS)
        ends = []
        for side in ("from", "to"):
            end = _required(field, pair, side, "a site name")
            if not isinstance(end, str) or end not in known:
                raise InvalidInput(f"{field}.{side}", "a site of the topology", end)
            ends.append(end)
        a, b = ends
        if a == b:
            raise InvalidInput(f"{field}.to", "a site other than 'from'", b)
        symmetric = pair.get("symmetric", False)
        if not isinstance(symmetric, bool):
            raise InvalidInput(f"{field}.symmetric", "true or false", symmetric)
        link = _link_from(field, pair, default)
        for key in [(a, b), (b, a)] if symmetric else [(a, b)]:
            if key in links:
                raise InvalidInput(
                    field,
                    f"one entry per directed pair, but {key[0]} -> {key[1]} is also in "
                    f"links[{origin[key]}]",
                )
            links[key], origin[key] = link, i
    return links


def _data_from(raw: object, names: set[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput("data", "a mapping data set name -> site", raw)
    data: dict[str, str] = {}
    for data_set, site in raw.items():
        _name("data", data_set)
        if not isinstance(site, str) or site not in names:
            raise InvalidInput(f"data.{data_set}", "a site of the topology", site)
        data[data_set] = site
    return data


def _from_document(document: object, default_name: str) -> Topology:
    doc = _mapping("document", document, _TOP_KEYS)
    name = _name("name", doc.get("name", default_name))
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput("description", "a string", description)
    default = _link_from(
        "defaults", _mapping("defaults", doc.get("defaults", {}), _LINK_KEYS), DEFAULT_LINK
    )
    raw_sites = _required("", doc, "sites", "a list of sites")
    if not isinstance(raw_sites, list) or not raw_sites:
        raise InvalidInput("sites", "a non-empty list of sites", raw_sites)
    sites = [_site_from(f"sites[{i}]", raw) for i, raw in enumerate(raw_sites)]
    names = [site.name for site in sites]
    seen: set[str] = set()
    for i, site_name in enumerate(names):
        if site_name in seen:
            raise InvalidInput(f"sites[{i}].name", "a name no earlier site has", site_name)
        seen.add(site_name)
    neighbourhood = _neighbourhood_from(_required("", doc, "neighbourhood", _FORMS), names)
    return Topology(
        sites,
        neighbourhood,
        name=name,
        description=description,
        links=_links_from(doc.get("links"), names, default),
        default_link=default,
        data=_data_from(doc.get("data"), seen),
    )


def loads(text: str, *, source: str | None = None, default_name: str = "topology") -> Topology:
    """Parse a topology from YAML ``text``; errors name ``source`` (if given) and the field."""
    prefix = f"{source}: " if source else ""
    try:
        document = safeyaml.load(text, _Loader)  # builds only plain data, refuses aliases
    except AliasRefused as exc:
        mark = exc.problem_mark
        where = f"{source or '<string>'}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise InvalidInput(
            where or "<string>", "YAML without anchors or aliases", Shown(exc.problem or "")
        ) from exc
    except RecursionError as exc:
        raise InvalidInput(source or "<string>", "YAML nested less deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source or '<string>'}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidInput(where or "<string>", f"valid YAML ({problem})") from exc
    try:
        return _from_document(document, default_name)
    except InvalidInput as exc:
        if not prefix:
            raise
        raise InvalidInput(prefix + exc.field, exc.expected, exc.found) from exc


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read and validate a topology file; errors name the file and the field.

    Raises:
        OSError: the file cannot be read.
        InvalidInput: it is not UTF-8 YAML describing a valid topology.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(str(path), f"UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return loads(text, source=str(path), default_name=path.stem)


def _document(topology: Topology) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": topology.name}
    if topology.description:
        doc["description"] = topology.description
    doc["defaults"] = {
        "bandwidth": topology.default_link.bandwidth,
        "latency": topology.default_link.latency,
    }
    sites = []
    for site in topology.sites.values():
        entry: dict[str, Any] = {"name": site.name, "cores": site.cores}
        if site.speed != 1.0:
            entry["speed"] = site.speed
        for key in ("uplink", "downlink", "http", "mqtt"):
            if (value := getattr(site, key)) is not None:
                entry[key] = value
        for key in _SITE_KEYS[7:]:
            value = getattr(site, _SITE_ATTRS.get(key, key))
            if key == "file_systems":
                if value:
                    entry[key] = [
                        {"name": fs.name, "mount": fs.mount, "type": fs.type}
                        | ({} if fs.free is None else {"free": fs.free})
                        for fs in value
                    ]
            elif key == "exclusive":
                if value:
                    entry[key] = True
            elif value is not None:
                entry[key] = value
        sites.append(entry)
    doc["sites"] = sites
    form = neighbourhood_form(topology)
    doc["neighbourhood"] = form or {
        site: list(topology.neighbourhood.successors(site)) for site in topology.sites
    }
    links = []
    written: set[tuple[str, str]] = set()
    for (a, b), link in topology.links.items():
        if (a, b) in written:
            continue
        entry = {"from": a, "to": b, "bandwidth": link.bandwidth, "latency": link.latency}
        if topology.links.get((b, a)) == link:
            entry["symmetric"] = True
            written.add((b, a))
        written.add((a, b))
        links.append(entry)
    if links:
        doc["links"] = links
    if topology.data:
        doc["data"] = dict(topology.data)
    return doc


def dumps(topology: Topology) -> str:
    """The topology as YAML that :func:`loads` reads back to an equal topology."""
    header = (
        f"# GBroker topology: {len(topology.sites)} sites, {topology.total_cores} cores. "
        "Format: topologies/README.md\n"
    )
    body = yaml.safe_dump(
        _document(topology),
        sort_keys=False,
        default_flow_style=None,
        allow_unicode=True,
        width=100,
    )
    return header + body


def save_topology(topology: Topology, target: str | os.PathLike[str] | TextIO) -> None:
    """Write the topology as YAML to a path or an open text stream."""
    text = dumps(topology)
    if isinstance(target, str | os.PathLike):
        Path(target).write_text(text, encoding="utf-8")
    else:
        target.write(text)


# --- drawing ------------------------------------------------------------------------------------


def _layout(topology: Topology) -> tuple[dict[str, tuple[float, float]], bool]:
    """Site positions, and whether they are a grid: a torus row by row, else a circle."""
    form = neighbourhood_form(topology)
    if form is not None and (match := _TORUS.fullmatch(form)):
        cols = int(match[2])
        grid = {site: (float(k % cols), -float(k // cols)) for k, site in enumerate(topology.sites)}
        return grid, True
    circle = nx.circular_layout(topology.site_names)
    return {site: (float(x), float(y)) for site, (x, y) in circle.items()}, False


def draw_topology(
    topology: Topology, png_path: str | os.PathLike[str], *, title: str | None = None
) -> None:
    """Draw the neighbourhood graph to a PNG: sites labelled with their cores, data sites shaded.

    A torus is laid out as its grid, with the wrap-around arcs curved; any other graph on a
    circle. Arcs present both ways are drawn as plain lines, one-way arcs as arrows. Needs
    matplotlib (the ``plot`` extra); it renders on an Agg canvas and never touches pyplot's
    global state.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    graph = topology.neighbourhood
    n = len(topology.sites)
    pos, grid = _layout(topology)
    side = min(4.0 + 1.2 * math.sqrt(n), 30.0)
    fig = Figure(figsize=(side, side), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    node_size = 1600 if n <= 64 else 200

    def is_wrap(a: str, b: str) -> bool:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        return grid and abs(xa - xb) + abs(ya - yb) > 1

    both = [(a, b) for a, b in graph.edges if graph.has_edge(b, a) and a < b]
    one_way = [(a, b) for a, b in graph.edges if not graph.has_edge(b, a)]
    for edges, arrowstyle, colour in ((both, "-", "#888888"), (one_way, "-|>", "#444444")):
        for wrap, rad in ((False, 0.0), (True, 0.35)):
            chosen = [(a, b) for a, b in edges if is_wrap(a, b) == wrap]
            if chosen:
                nx.draw_networkx_edges(
                    graph,
                    pos,
                    edgelist=chosen,
                    ax=ax,
                    arrows=True,
                    arrowstyle=arrowstyle,
                    arrowsize=14,
                    connectionstyle=f"arc3,rad={rad}",
                    node_size=node_size,
                    edge_color=colour,
                )
    holders = set(topology.data.values())
    nx.draw_networkx_nodes(
        graph,
        pos,
        ax=ax,
        node_size=node_size,
        node_color=["#f4b860" if site in holders else "#9cc3e6" for site in graph.nodes],
        edgecolors="#333333",
    )
    if n <= 64:
        labels = {
            site: f"{site}\n{spec.cores} core{'' if spec.cores == 1 else 's'}"
            for site, spec in topology.sites.items()
        }
        nx.draw_networkx_labels(graph, pos, labels=labels, ax=ax, font_size=8)
    sets = ", ".join(f"{d} at {s}" for d, s in topology.data.items())
    heading = title or f"{topology.name}: {n} sites, {topology.total_cores} cores"
    ax.set_title(heading + (f"\ndata: {sets}" if sets else ""), fontsize=10)
    ax.margins(0.15)
    fig.savefig(os.fspath(png_path), format="png")
