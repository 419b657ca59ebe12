"""``gbroker topology``: generate, check and draw topologies (sites, links, neighbourhoods)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gbroker.cli.argtypes import (
    float_list,
    int_list,
    non_negative_float,
    non_negative_int,
    offsets,
    positive_float,
    positive_int,
    shape,
)
from gbroker.cli.show import count

if TYPE_CHECKING:
    from gbroker.topology import Topology


def _rate(bytes_per_second: float) -> str:
    return f"{bytes_per_second / 1e6:g} MB/s"


def _fleet_endpoints(path: str) -> tuple[str, dict[str, str]] | None:
    """The fleet found (:mod:`gbroker.client.fleetdir`) if it runs the topology file ``path``: its
    directory and its sites' URLs (a fleet picks its own ports, whatever the file says)."""
    import os

    from gbroker.client import fleetdir

    try:
        directory = fleetdir.find()
        record = fleetdir.read(directory)
    except fleetdir.NoFleet:
        return None
    if record.get("source_topology") != os.path.realpath(path):
        return None
    sites: Any = record.get("sites") or {}
    return directory, {name: str(member["url"]) for name, member in sites.items()}


def _topology_summary(
    topology: Topology, fleet: tuple[str, dict[str, str]] | None = None
) -> list[str]:
    import networkx as nx  # type: ignore[import-untyped]

    from gbroker.topology import neighbourhood_form

    graph = topology.neighbourhood
    degrees = [degree for _, degree in graph.out_degree()]
    low, high = min(degrees), max(degrees)
    if len(topology.sites) == 1:
        diameter = "0"
    elif not nx.is_strongly_connected(graph):
        diameter = "inf (some broker cannot reach every site)"
    elif len(topology.sites) > 500:
        diameter = "not computed (over 500 sites)"
    else:
        diameter = str(nx.diameter(graph))
    form = neighbourhood_form(topology) or "explicit"
    default = topology.default_link
    rows = [
        (
            "topology",
            f"{topology.name}: {count(len(topology.sites), 'site')}, "
            f"{count(topology.total_cores, 'core')}",
        ),
        ("description", topology.description or "-"),
        (
            "neighbourhood",
            f"{form}: {count(graph.number_of_edges(), 'arc')}, out-degree "
            + (f"{low}" if low == high else f"{low}..{high}")
            + f", diameter {diameter}",
        ),
        ("default link", f"{_rate(default.bandwidth)}, latency {default.latency * 1e3:g} ms"),
    ]
    links = [
        f"{a} -> {b} {_rate(link.bandwidth)}, {link.latency * 1e3:g} ms"
        for (a, b), link in topology.links.items()
    ]
    shown = "; ".join(links[:8]) + (f"; and {len(links) - 8} more" if len(links) > 8 else "")
    rows.append(("links", f"{len(links)}: {shown}" if links else "none (all use the default)"))
    sets = ", ".join(f"{name} at {site}" for name, site in topology.data.items())
    rows.append(("data sets", sets or "none"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    table = [("site", "cores", "speed", "uplink", "downlink", "endpoints")]
    for site in topology.sites.values():
        endpoints = " ".join(e for e in (site.http, site.mqtt) if e) or "-"
        if fleet is not None and site.name in fleet[1]:
            endpoints = f"{fleet[1][site.name]} (the running fleet's)"
        table.append(
            (
                site.name,
                str(site.cores),
                f"{site.speed:g}",
                _rate(topology.uplink(site.name)),
                _rate(topology.downlink(site.name)),
                endpoints,
            )
        )
    widths = [max(len(row[k]) for row in table) for k in range(5)]
    lines.append("")
    for row in table:
        name, cores, speed, up, down, endpoints = row
        lines.append(
            f"{name:<{widths[0]}}  {cores:>{widths[1]}}  {speed:>{widths[2]}}  "
            f"{up:>{widths[3]}}  {down:>{widths[4]}}  {endpoints}"
        )
    return lines


def _generate_topology(args: argparse.Namespace) -> Topology:
    from gbroker import topology as topo

    options: dict[str, Any] = {
        "cores": args.cores,
        "speed": args.speed,
        "name": args.name,
        "description": args.description,
        "default_link": topo.LinkSpec(
            topo.DEFAULT_LINK.bandwidth if args.bandwidth is None else args.bandwidth,
            topo.DEFAULT_LINK.latency if args.latency is None else args.latency,
        ),
    }
    kind = args.kind
    if kind == "torus":
        return topo.torus(*args.shape, **options)
    if kind == "full":
        return topo.full(args.n, **options)
    if kind == "ring":
        return topo.ring(args.n, **options)
    if kind == "hypercube":
        return topo.hypercube(args.dim, **options)
    if kind == "circulant":
        return topo.circulant(args.n, args.offsets, **options)
    return topo.random_regular(args.n, args.degree, args.seed, **options)


def _cmd_topology(args: argparse.Namespace) -> int:
    from gbroker.topology import draw_topology, dumps, load_topology

    if args.kind != "show":
        sys.stdout.write(dumps(_generate_topology(args)))
        return 0
    try:
        topology = load_topology(args.file)
    except OSError as exc:
        print(f"gbroker topology: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    fleet = _fleet_endpoints(args.file)
    print("\n".join(_topology_summary(topology, fleet)))
    if fleet is not None:
        print(f"\nthe fleet in {fleet[0]} runs this topology on the endpoints shown")
    if args.png:
        try:
            draw_topology(topology, args.png)
        except ImportError:
            print(
                "gbroker topology: --png needs matplotlib: pip install 'gbroker[plot]'",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(
                f"gbroker topology: cannot write {args.png}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        print(f"\ndrawing written to {args.png}")
    return 0


def add_parsers(sub: Any) -> None:
    tp = sub.add_parser(
        "topology",
        help="generate or inspect topology files",
        description="Generate a topology (printed as YAML; redirect it to a file) or validate "
        "and summarise a topology file. The format is in topologies/README.md.",
    )
    kinds = tp.add_subparsers(dest="kind", required=True, metavar="KIND")
    generators = {
        "torus": "2D torus of ROWSxCOLS sites named r{row}c{col}",
        "full": "N sites s0.. with every arc (complete graph)",
        "ring": "N sites s0.. in a ring",
        "hypercube": "2**DIM sites s{i}, adjacent when i differs in one bit",
        "circulant": "N sites s0.., s_k joined to s_(k ± offset mod N)",
        "random-regular": "a connected random DEGREE-regular graph on N sites, seeded",
    }
    for kind, what in generators.items():
        gp = kinds.add_parser(kind, help=what, description=f"Print as YAML: {what}.")
        if kind == "torus":
            gp.add_argument("shape", type=shape, metavar="ROWSxCOLS", help="e.g. 4x4")
        elif kind == "hypercube":
            gp.add_argument("dim", type=non_negative_int, metavar="DIM")
        else:
            gp.add_argument("n", type=positive_int, metavar="N", help="number of sites")
        if kind == "circulant":
            gp.add_argument(
                "--offsets", type=offsets, default=[1, 2], help="comma-separated (default: 1,2)"
            )
        if kind == "random-regular":
            gp.add_argument("--degree", type=non_negative_int, required=True)
            gp.add_argument("--seed", type=non_negative_int, default=0, help="default: 0")
        gp.add_argument(
            "--cores", type=int_list, required=True, help="cores per site, or one per site: 8,16"
        )
        gp.add_argument(
            "--speed", type=float_list, default=1.0, help="relative speed (default: 1.0)"
        )
        gp.add_argument("--name", help="topology name (default: from the kind and size)")
        gp.add_argument("--description", help="free text (default: what was generated)")
        gp.add_argument(
            "--bandwidth",
            type=positive_float,
            help="default link bandwidth, bytes/s (default: 125e6)",
        )
        gp.add_argument(
            "--latency",
            type=non_negative_float,
            help="default link latency, seconds (default: 0.0005)",
        )
        gp.set_defaults(run=_cmd_topology)
    sp = kinds.add_parser(
        "show",
        help="validate a topology file and print a summary",
        description="Validate a topology file and print its sites, arcs, out-degrees, "
        "diameter, links and data sets.",
    )
    sp.add_argument("file", help="topology YAML file")
    sp.add_argument("--png", metavar="OUT", help="also draw the neighbourhood graph to OUT")
    sp.set_defaults(run=_cmd_topology)
