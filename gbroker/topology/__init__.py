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
``hosts: [a01, a02]`` names the nodes, one name each (alone, it gives ``nodes``): jobs' candidate
hosts may name them (``a01``, ``a/a0*``); a site without hosts is one host named as the site.

A site says how it runs its jobs with ``manager`` (:data:`MANAGERS`): ``local`` (the default: the
broker's own processes), ``slurm`` (a Slurm cluster of the site's cores and nodes, which a
local fleet starts for it: :mod:`gbroker.fleet.slurm`), with optional ``slurm: {partition:
NAME}`` (:class:`SlurmSpec`; default ``batch``), or ``gridengine`` (a Grid Engine cell whose one
host offers the site's cores as slots, which a local fleet starts for it:
:mod:`gbroker.fleet.gridengine`).

Only ``name`` and ``cores`` are required per site; a name is letters, digits, ``-`` and ``_``
(:data:`gbroker.core.names.SITE_NAME`: it goes into MQTT topics and job ids); ``speed`` (relative
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
(:mod:`gbroker.jobs.safeyaml`).

May import: :mod:`gbroker.core`, :mod:`gbroker.jobs` (its safe YAML loader), :mod:`gbroker.errors`
and libraries.
"""

from gbroker.topology.draw import draw_topology
from gbroker.topology.files import dumps, load_topology, loads, save_topology
from gbroker.topology.generate import circulant, full, hypercube, random_regular, ring, torus
from gbroker.topology.model import (
    DEFAULT_LINK,
    MANAGERS,
    LinkSpec,
    SiteSpec,
    SlurmSpec,
    Topology,
    neighbourhood_form,
)

__all__ = [
    "DEFAULT_LINK",
    "MANAGERS",
    "LinkSpec",
    "SiteSpec",
    "SlurmSpec",
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
