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
D2 circulant is offsets 1, 2) and :func:`random_regular` (seeded). All arcs go both ways.

A site also declares what it offers jobs beyond cores (matched by
:mod:`gbroker.core.requirements`; :meth:`Topology.properties`) and how it runs them
(``manager``, :data:`MANAGERS`: local processes, a Slurm cluster or a Grid Engine cell). The
YAML format (:func:`load_topology`, :func:`save_topology`, :func:`loads`, :func:`dumps`) is read
with the safe loader of :mod:`gbroker.untrusted.safeyaml` (no anchors or aliases; YAML 1.2
floats such as ``12.5e6``), and an unknown key is an error. The format, every key and what is
checked: topologies/README.md.

May import: :mod:`gbroker.core`, :mod:`gbroker.untrusted` (its safe YAML loader),
:mod:`gbroker.errors` and libraries; nothing above.
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
