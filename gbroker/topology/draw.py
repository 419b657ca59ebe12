"""Drawing a neighbourhood graph to a PNG (``gbroker topology show --png``; matplotlib)."""

from __future__ import annotations

import math
import os

import networkx as nx  # type: ignore[import-untyped]

from gbroker.core.names import count
from gbroker.topology.graphs import TORUS
from gbroker.topology.model import Topology, neighbourhood_form

# --- drawing ------------------------------------------------------------------------------------


def _layout(topology: Topology) -> tuple[dict[str, tuple[float, float]], bool]:
    """Site positions, and whether they are a grid: a torus row by row, else a circle."""
    form = neighbourhood_form(topology)
    if form is not None and (match := TORUS.fullmatch(form)):
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
            site: f"{site}\n{count(spec.cores, 'core')}" for site, spec in topology.sites.items()
        }
        nx.draw_networkx_labels(graph, pos, labels=labels, ax=ax, font_size=8)
    sets = ", ".join(f"{d} at {s}" for d, s in topology.data.items())
    heading = title or (
        f"{topology.name}: {count(n, 'site')}, {count(topology.total_cores, 'core')}"
    )
    ax.set_title(heading + (f"\ndata: {sets}" if sets else ""), fontsize=10)
    ax.margins(0.15)
    fig.savefig(os.fspath(png_path), format="png")
