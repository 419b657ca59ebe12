"""Generators of the usual neighbourhoods: full, ring, 2D torus, hypercube, circulant, random
regular (seeded). Sites are named ``s0`` .. ``s{H-1}`` (the torus ``r{row}c{col}``); every arc
goes both ways."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx  # type: ignore[import-untyped]

from gbroker.errors import InvalidInput
from gbroker.topology.checks import cores_of, is_int, positive
from gbroker.topology.graphs import (
    circulant_graph,
    directed,
    full_graph,
    hypercube_graph,
    ring_graph,
    torus_graph,
)
from gbroker.topology.model import DEFAULT_LINK, LinkSpec, SiteSpec, Topology

# --- generators ---------------------------------------------------------------------------------


def _per_site(field: str, value: object, n: int) -> list[object]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n:
            raise InvalidInput(field, f"one value per site ({n})", len(value))
        return list(value)
    return [value] * n


def _count(field: str, value: object, minimum: int) -> int:
    if not is_int(value) or value < minimum:
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
            cores_of(f"cores[{k}]" if isinstance(cores, Sequence) else "cores", per_core[k]),
            positive(
                f"speed[{k}]" if isinstance(speed, Sequence) else "speed", per_speed[k], "a speed"
            ),
        )
        for k, site in enumerate(names)
    ]
    return Topology(
        sites,
        directed(graph, names),
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
        full_graph(n),
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
        ring_graph(n),
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
        torus_graph(rows, cols),
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
        hypercube_graph(dim),
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
        circulant_graph(n, offsets),
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
