"""Neighbourhood graphs over positions 0..H-1 (undirected; networkx builds them), their named forms
(``full``, ``ring``, ``torus RxC``, ``hypercube``, ``circulant a,b``), and how a graph on
positions becomes the directed neighbourhood of named sites (the form a topology's
neighbourhood has, if any, is :func:`gbroker.topology.model.neighbourhood_form`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import networkx as nx  # type: ignore[import-untyped]

from gbroker.errors import InvalidInput


def full_graph(n: int) -> nx.Graph:
    return nx.complete_graph(n)


def ring_graph(n: int) -> nx.Graph:
    graph = nx.cycle_graph(n)
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))  # cycle_graph(1) is a self-loop
    return graph


def torus_graph(rows: int, cols: int) -> nx.Graph:
    # networkx adds a wrap-around edge only along a dimension of length > 2, so 1xN, 2xN and
    # 2x2 come out without duplicate arcs or self-loops.
    grid = nx.grid_2d_graph(rows, cols, periodic=True)
    return nx.relabel_nodes(grid, {(r, c): r * cols + c for r, c in grid.nodes})


def hypercube_graph(dim: int) -> nx.Graph:
    cube = nx.hypercube_graph(dim)  # nodes are bit tuples, but plain 0 and 1 when dim = 1

    def index(node: int | tuple[int, ...]) -> int:
        return node if isinstance(node, int) else sum(bit << k for k, bit in enumerate(node))

    graph = nx.relabel_nodes(cube, {node: index(node) for node in cube.nodes})
    graph.add_nodes_from(range(2**dim))  # hypercube_graph(0) has no node at all
    return graph


def circulant_graph(n: int, offsets: Sequence[int]) -> nx.Graph:
    graph = nx.circulant_graph(n, offsets)
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))  # offsets that are multiples of n
    return graph


def directed(graph: nx.Graph, names: Sequence[str]) -> nx.DiGraph:
    """Arcs both ways between named sites for an undirected graph over positions."""
    directed = nx.DiGraph()
    directed.add_nodes_from(names)
    directed.add_edges_from((names[a], names[b]) for a, b in graph.edges)
    directed.add_edges_from((names[b], names[a]) for a, b in graph.edges)
    return directed


FORMS = "full, ring, torus RxC, hypercube, circulant a,b,... or a map site: [neighbours]"


TORUS = re.compile(r"torus\s+(\d+)\s*[x×]\s*(\d+)")


CIRCULANT = re.compile(r"circulant\s+(\d+(?:\s*,\s*\d+)*)")


def named_graph(field: str, form: str, n: int) -> nx.Graph:
    """The undirected graph over positions 0..n-1 that a named form describes."""
    text = " ".join(form.strip().lower().split())
    if text in ("full", "complete"):
        return full_graph(n)
    if text == "ring":
        return ring_graph(n)
    if text == "hypercube":
        dim = n.bit_length() - 1
        if 2**dim != n:
            raise InvalidInput(field, f"a power of two sites for a hypercube, not {n}", form)
        return hypercube_graph(dim)
    if match := TORUS.fullmatch(text):
        rows, cols = int(match[1]), int(match[2])
        if rows < 1 or cols < 1 or rows * cols != n:
            raise InvalidInput(field, f"'torus RxC' with R, C >= 1 and R x C = {n} sites", form)
        return torus_graph(rows, cols)
    if match := CIRCULANT.fullmatch(text):
        offsets = [int(k) for k in match[1].split(",")]
        if min(offsets) < 1:
            raise InvalidInput(field, "circulant offsets >= 1", form)
        return circulant_graph(n, offsets)
    raise InvalidInput(field, FORMS, form)
