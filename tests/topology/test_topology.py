"""Topologies: generators, validation, the YAML format, the shipped files and the CLI."""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import networkx as nx  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.errors import InvalidInput
from gbroker.topology import (
    DEFAULT_LINK,
    LinkSpec,
    SiteSpec,
    SlurmSpec,
    Topology,
    circulant,
    draw_topology,
    dumps,
    full,
    hypercube,
    load_topology,
    loads,
    neighbourhood_form,
    random_regular,
    ring,
    save_topology,
    torus,
)
from tests import harness

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def out_degrees(t: Topology) -> set[int]:
    return {degree for _, degree in t.neighbourhood.out_degree()}


def assert_well_formed(t: Topology) -> None:
    """Symmetric arcs, no self-loops, connected: what every generator promises."""
    graph = t.neighbourhood
    assert list(graph.nodes) == list(t.sites)
    assert not list(nx.selfloop_edges(graph))
    assert all(graph.has_edge(b, a) for a, b in graph.edges)
    assert len(t.sites) == 1 or nx.is_strongly_connected(graph)


def sites(*cores: int) -> list[SiteSpec]:
    return [SiteSpec(f"s{k}", c) for k, c in enumerate(cores)]


# --- generators ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_full_graph_has_every_arc(n: int) -> None:
    t = full(n, cores=4)
    assert t.site_names == tuple(f"s{k}" for k in range(n))
    assert t.neighbourhood.number_of_edges() == n * (n - 1)
    assert out_degrees(t) == {n - 1}
    assert t.total_cores == 4 * n
    assert_well_formed(t)


@pytest.mark.parametrize(("rows", "cols"), [(3, 3), (4, 4), (3, 5), (6, 4)])
def test_torus_sites_have_four_wrap_around_neighbours(rows: int, cols: int) -> None:
    t = torus(rows, cols, cores=32)
    assert len(t.sites) == rows * cols
    assert out_degrees(t) == {4}
    assert_well_formed(t)


def test_torus_names_and_neighbours() -> None:
    t = torus(4, 4, cores=32)
    assert t.site_names[:5] == ("r0c0", "r0c1", "r0c2", "r0c3", "r1c0")
    assert t.neighbours("r0c0") == ["r0c1", "r0c3", "r1c0", "r3c0"]
    assert t.neighbours("r2c1") == ["r1c1", "r2c0", "r2c2", "r3c1"]


@pytest.mark.parametrize(
    ("rows", "cols", "degree"), [(1, 1, 0), (1, 2, 1), (2, 2, 2), (2, 3, 3), (1, 5, 2), (2, 5, 3)]
)
def test_degenerate_torus_sides_give_no_duplicate_arcs_or_self_loops(
    rows: int, cols: int, degree: int
) -> None:
    t = torus(rows, cols, cores=1)
    assert out_degrees(t) == {degree}
    assert_well_formed(t)


@pytest.mark.parametrize(("n", "degree"), [(1, 0), (2, 1), (3, 2), (10, 2)])
def test_ring(n: int, degree: int) -> None:
    t = ring(n, cores=2)
    assert len(t.sites) == n
    assert out_degrees(t) == {degree}
    assert_well_formed(t)
    if n >= 3:
        assert t.neighbours("s0") == ["s1", f"s{n - 1}"]


@pytest.mark.parametrize("dim", [0, 1, 2, 3, 5])
def test_hypercube_joins_sites_one_bit_apart(dim: int) -> None:
    t = hypercube(dim, cores=8)
    assert len(t.sites) == 2**dim
    assert out_degrees(t) == {dim}
    assert_well_formed(t)
    for a, b in t.neighbourhood.edges:
        assert bin(int(a[1:]) ^ int(b[1:])).count("1") == 1


@pytest.mark.parametrize("n", [5, 6, 9, 16])
def test_d2_circulant_has_degree_four(n: int) -> None:
    t = circulant(n, cores=4)
    assert out_degrees(t) == {4}
    assert t.neighbours("s0") == sorted(["s1", "s2", f"s{n - 1}", f"s{n - 2}"])
    assert_well_formed(t)


def test_circulant_collapses_repeated_offsets_and_rejects_a_disconnected_one() -> None:
    assert out_degrees(circulant(4, (1, 2), cores=1)) == {3}  # 2 and 4 - 2 are one neighbour
    assert out_degrees(circulant(3, (1, 3), cores=1)) == {2}  # offset 3 = 0 mod 3: no self-loop
    with pytest.raises(InvalidInput, match="weakly connected") as err:
        circulant(6, (2,), cores=1)
    assert err.value.field == "neighbourhood"
    assert "{s0, s2, s4}; {s1, s3, s5}" in str(err.value)
    with pytest.raises(InvalidInput, match="offsets"):
        circulant(6, (), cores=1)
    with pytest.raises(InvalidInput, match="offsets"):
        circulant(6, (0,), cores=1)


@pytest.mark.parametrize(("n", "degree"), [(10, 3), (12, 2), (20, 4), (2, 1), (1, 0)])
def test_random_regular_is_regular_connected_and_seeded(n: int, degree: int) -> None:
    t = random_regular(n, degree, seed=7, cores=16)
    assert len(t.sites) == n
    assert out_degrees(t) == {degree}
    assert_well_formed(t)
    assert random_regular(n, degree, seed=7, cores=16) == t


def test_random_regular_redraws_a_disconnected_graph_with_derived_seeds() -> None:
    # Find a seed whose first draw (networkx's own) is disconnected: 2-regular graphs often are.
    seed = next(
        s for s in range(1000) if not nx.is_connected(nx.random_regular_graph(2, 12, seed=s))
    )
    with pytest.raises(InvalidInput, match="within 1 attempts"):
        random_regular(12, 2, seed, cores=1, attempts=1)
    t = random_regular(12, 2, seed, cores=1)
    assert out_degrees(t) == {2}
    assert_well_formed(t)


@pytest.mark.parametrize(
    ("n", "degree", "match"),
    [(6, 6, "less than"), (7, 3, "even"), (6, 1, ">= 2"), (6, -1, "degree")],
)
def test_random_regular_rejects_impossible_degrees(n: int, degree: int, match: str) -> None:
    with pytest.raises(InvalidInput, match=match) as err:
        random_regular(n, degree, 0, cores=1)
    assert err.value.field == "degree"


def test_generators_take_cores_and_speed_per_site() -> None:
    t = ring(3, cores=[4, 8, 16], speed=[1.0, 2.0, 0.5])
    assert [s.cores for s in t.sites.values()] == [4, 8, 16]
    assert [s.speed for s in t.sites.values()] == [1.0, 2.0, 0.5]
    assert torus(2, 2, cores=8, speed=1.5).sites["r1c1"].speed == 1.5
    with pytest.raises(InvalidInput, match=r"cores: expected one value per site \(3\), got 2"):
        ring(3, cores=[4, 8])
    with pytest.raises(InvalidInput) as err:
        ring(3, cores=[4, 0, 8])
    assert err.value.field == "cores[1]"
    with pytest.raises(InvalidInput) as err:
        full(2, cores=1, speed=0)
    assert err.value.field == "speed"


@pytest.mark.parametrize(
    "make",
    [
        lambda: full(0, cores=1),
        lambda: ring(-1, cores=1),
        lambda: torus(0, 3, cores=1),
        lambda: hypercube(-1, cores=1),
        lambda: full(2, cores=0),
    ],
)
def test_generators_reject_bad_sizes(make: Callable[[], Topology]) -> None:
    with pytest.raises(InvalidInput):
        make()


def test_generated_names_and_descriptions() -> None:
    assert torus(4, 4, cores=32).name == "torus-4x4"
    assert torus(4, 4, cores=32).description == "2D torus 4x4, 32 cores per site"
    assert full(3, cores=1, name="mine", description="").description == ""
    assert full(3, cores=1, name="mine").name == "mine"
    link = LinkSpec(12.5e6, 0.001)
    assert full(3, cores=1, default_link=link, data={"d": "s2"}).data_site("d") == "s2"


# --- the Topology value -------------------------------------------------------------------------


def test_helpers() -> None:
    t = Topology(
        [
            SiteSpec("a", 4, uplink=1e6),
            SiteSpec("b", 8, speed=2.0, downlink=2e6),
            SiteSpec("c", 2),
        ],
        [("a", "b"), ("b", "a"), ("b", "c"), ("c", "a")],
        name="abc",
        links={("a", "b"): LinkSpec(5e6, 0.01)},
        default_link=LinkSpec(1e7, 0.002),
        data={"inputs": "c"},
    )
    assert t.site_names == ("a", "b", "c")
    assert t.total_cores == 14
    assert t.neighbours("b") == ["a", "c"]
    assert t.neighbours("c") == ["a"]
    assert t.link("a", "b") == LinkSpec(5e6, 0.01)
    assert t.link("b", "a") == LinkSpec(1e7, 0.002)  # links are directed
    assert t.link("a", "b").transfer_time(5e6) == pytest.approx(1.01)
    assert (t.uplink("a"), t.downlink("a")) == (1e6, 1e7)
    assert (t.uplink("b"), t.downlink("b")) == (1e7, 2e6)
    assert t.data_site("inputs") == "c"
    assert t.site("b").speed == 2.0
    assert repr(t) == "Topology(name='abc', sites=3, cores=14, arcs=4)"
    with pytest.raises(InvalidInput, match="inputs"):
        t.data_site("nope")
    for query in (t.neighbours, t.uplink, t.downlink, t.site):
        with pytest.raises(InvalidInput, match="a site of the topology"):
            query("zz")
    with pytest.raises(InvalidInput):
        t.link("a", "zz")


def test_default_link_is_gigabit_ethernet() -> None:
    assert LinkSpec(bandwidth=125e6, latency=0.0005) == DEFAULT_LINK
    assert Topology(sites(1)).default_link == DEFAULT_LINK


def test_constructor_accepts_graphs_arc_lists_named_forms_and_site_mappings() -> None:
    by_arcs = Topology(sites(1, 2, 3), [("s0", "s1"), ("s1", "s0"), ("s1", "s2"), ("s2", "s1")])
    undirected = Topology(sites(1, 2, 3), nx.path_graph(["s0", "s1", "s2"]))
    assert by_arcs == undirected
    assert Topology(sites(1, 2, 3), "full") == Topology(
        sites(1, 2, 3), nx.complete_graph(["s0", "s1", "s2"])
    )
    assert Topology({s.name: s for s in sites(1, 2)}, "ring") == Topology(sites(1, 2), "full")
    assert Topology(sites(1, 2, 3, 4, 5, 6), "torus 2x3").neighbours("s0") == ["s1", "s2", "s3"]


def test_topology_is_immutable_picklable_and_compared_by_value() -> None:
    t = torus(3, 3, cores=4, data={"d": "r1c1"})
    with pytest.raises(AttributeError):
        t.name = "other"  # type: ignore[misc]
    with pytest.raises(nx.NetworkXError):
        t.neighbourhood.add_edge("r0c0", "r1c1")
    with pytest.raises(TypeError):
        t.sites["x"] = SiteSpec("x", 1)  # type: ignore[index]
    assert pickle.loads(pickle.dumps(t)) == t
    assert copy.deepcopy(t) == t
    assert t != torus(3, 3, cores=5)
    assert t != torus(3, 3, cores=4)  # no data set
    assert t != full(9, cores=4)


def test_sitespec_normalises_numbers_and_validates_itself() -> None:
    site = SiteSpec("x", 2, speed=2, uplink=10)
    assert isinstance(site.speed, float)
    assert isinstance(site.uplink, float)
    assert LinkSpec(1).latency == 0.0


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: SiteSpec("", 1), "site.name"),
        (lambda: SiteSpec("x", 0), "site[x].cores"),
        (lambda: SiteSpec("x", True), "site[x].cores"),
        (lambda: SiteSpec("x", 2.0), "site[x].cores"),  # type: ignore[arg-type]
        (lambda: SiteSpec("x", 1, speed=0), "site[x].speed"),
        (lambda: SiteSpec("x", 1, speed=float("inf")), "site[x].speed"),
        (lambda: SiteSpec("x", 1, uplink=0), "site[x].uplink"),
        (lambda: SiteSpec("x", 1, downlink=-5), "site[x].downlink"),
        (lambda: SiteSpec("x", 1, http=""), "site[x].http"),
        (lambda: LinkSpec(0), "link.bandwidth"),
        (lambda: LinkSpec(-1e6), "link.bandwidth"),
        (lambda: LinkSpec(float("nan")), "link.bandwidth"),
        (lambda: LinkSpec(1e6, -0.1), "link.latency"),
        (lambda: LinkSpec(1e6, float("inf")), "link.latency"),
    ],
)
def test_bad_site_and_link_values(make: Callable[[], object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        make()
    assert err.value.field == field


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (lambda: Topology([]), "sites", "at least one site"),
        (lambda: Topology([SiteSpec("a", 1), SiteSpec("a", 2)]), "sites[1].name", "earlier"),
        (lambda: Topology(sites(1, 2), [("s0", "zz")]), "neighbourhood[zz]", "a site of"),
        (
            lambda: Topology(sites(1, 2), [("s0", "s0"), ("s0", "s1")]),
            "neighbourhood[s0 -> s0]",
            "between two different sites",
        ),
        (lambda: Topology(sites(1, 2)), "neighbourhood", "'s1' cannot be reached from 's0'"),
        (
            lambda: Topology(sites(1, 2, 3, 4), [("s0", "s1"), ("s2", "s3")]),
            "neighbourhood",
            "2 components: {s0, s1}; {s2, s3}",
        ),
        (
            lambda: Topology(sites(1, 2), "full", links={("s0", "zz"): DEFAULT_LINK}),
            "links[s0 -> zz]",
            "a site of",
        ),
        (
            lambda: Topology(sites(1, 2), "full", links={("s0", "s0"): DEFAULT_LINK}),
            "links[s0 -> s0]",
            "two different sites",
        ),
        (lambda: Topology(sites(1, 2), "full", data={"d": "zz"}), "data[d]", "a site of"),
        (lambda: Topology(sites(1, 2), "full", name=""), "topology.name", "non-empty"),
        (lambda: Topology(sites(1, 2), "torus 2x2"), "neighbourhood", "R x C = 2"),
        (lambda: Topology(sites(1, 2, 3), "hypercube"), "neighbourhood", "power of two"),
        (lambda: Topology(sites(1, 2), "star"), "neighbourhood", "full, ring"),
        (lambda: Topology(sites(1, 2), ["s0s1"]), "neighbourhood", "(i, j) arcs"),
        (lambda: Topology(sites(1, 2), 5), "neighbourhood", "(i, j) arcs"),
    ],
)
def test_every_validation_error_names_its_field(
    make: Callable[[], Topology], field: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)) as err:
        make()
    assert err.value.field == field


def test_a_one_way_but_weakly_connected_graph_is_valid() -> None:
    t = Topology(sites(1, 2, 3), [("s0", "s1"), ("s2", "s1")])
    assert t.neighbours("s1") == []
    assert neighbourhood_form(t) is None


# --- named forms and YAML -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "form"),
    [
        (full(1, cores=1), "full"),
        (full(5, cores=1), "full"),
        (ring(6, cores=1), "ring"),
        (torus(1, 6, cores=1), "ring"),
        (hypercube(3, cores=1), "hypercube"),
        (torus(4, 4, cores=1), "torus 4x4"),
        (torus(2, 3, cores=1), "torus 2x3"),
        (circulant(10, (1, 3), cores=1), "circulant 1,3"),
    ],
)
def test_neighbourhood_form_names_the_graph(t: Topology, form: str) -> None:
    assert neighbourhood_form(t) == form
    assert f"neighbourhood: {form}\n" in dumps(t)


GENERATED = [
    full(4, cores=8),
    ring(5, cores=[1, 2, 3, 4, 5]),
    torus(3, 4, cores=16, speed=2.0),
    torus(2, 2, cores=1),
    hypercube(3, cores=2),
    circulant(9, cores=4),
    random_regular(10, 3, seed=3, cores=8),
]


@pytest.mark.parametrize("t", GENERATED, ids=lambda t: t.name)
def test_yaml_round_trip_of_generated_topologies(t: Topology) -> None:
    assert loads(dumps(t)) == t


def test_yaml_round_trip_with_an_explicit_map_links_endpoints_and_data(tmp_path: Path) -> None:
    t = Topology(
        [
            SiteSpec("Xeon80", 32, uplink=12.5e6, downlink=25e6, http="http://127.0.0.1:8701"),
            SiteSpec("L4001", 16, speed=1.25, mqtt="mqtt://127.0.0.1:1883"),
            SiteSpec("P4-18", 18, speed=0.5),
        ],
        [("Xeon80", "L4001"), ("L4001", "P4-18"), ("P4-18", "Xeon80"), ("Xeon80", "P4-18")],
        name="odd: name",
        description="one-way arcs; a # that is not a comment",
        links={
            ("Xeon80", "L4001"): LinkSpec(125e6, 0.0005),
            ("L4001", "Xeon80"): LinkSpec(125e6, 0.0005),
            ("P4-18", "L4001"): LinkSpec(1e6, 0.02),
        },
        default_link=LinkSpec(12.5e6, 0.001),
        data={"spec-mpi2007": "Xeon80", "other": "P4-18"},
    )
    text = dumps(t)
    assert "neighbourhood:\n  Xeon80: [L4001, P4-18]\n" in text
    assert "symmetric: true" in text
    assert loads(text) == t
    path = tmp_path / "t.yaml"
    save_topology(t, path)
    assert load_topology(path) == t
    stream = io.StringIO()
    save_topology(t, stream)
    assert loads(stream.getvalue()) == t


def test_yaml_defaults_and_numbers() -> None:
    t = loads(
        "sites:\n"
        "  - {name: a, cores: 4, uplink: 12.5e6}\n"
        "  - {name: b, cores: 2, speed: 2}\n"
        "neighbourhood: {a: [b], b: [a]}\n"
        "defaults: {bandwidth: 1e9, latency: 1e-3}\n"
        "links: [{from: a, to: b, latency: 0.5}]\n",
        default_name="fallback",
    )
    assert t.name == "fallback"
    assert t.description == ""
    assert t.default_link == LinkSpec(1e9, 0.001)
    assert t.uplink("a") == 12.5e6
    assert t.sites["b"].speed == 2.0
    assert t.link("a", "b") == LinkSpec(1e9, 0.5)  # bandwidth inherited from the defaults
    assert t.link("b", "a") == LinkSpec(1e9, 0.001)


def test_named_forms_in_files_follow_site_order() -> None:
    base = "sites: [" + ", ".join(f"{{name: n{k}, cores: 1}}" for k in range(8)) + "]\n"
    assert loads(base + "neighbourhood: ring").neighbours("n0") == ["n1", "n7"]
    assert loads(base + "neighbourhood: hypercube").neighbours("n0") == ["n1", "n2", "n4"]
    assert loads(base + "neighbourhood: torus 2 x 4").neighbours("n5") == ["n1", "n4", "n6"]
    assert loads(base + "neighbourhood: circulant 1, 2").neighbours("n0") == [
        "n1",
        "n2",
        "n6",
        "n7",
    ]
    assert loads(base + "neighbourhood: Full").neighbourhood.number_of_edges() == 56


BAD_FILES = [
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 2}, {name: c, cores: x}]\n"
        "neighbourhood: full",
        "sites[2].cores: expected an integer >= 1, got 'x'",
    ),
    (
        "sites: [{name: a}]\nneighbourhood: full",
        "sites[0].cores: expected an integer >= 1, but it is missing",
    ),
    ("sites: [{name: a, cores: 0}]\nneighbourhood: full", "sites[0].cores"),
    (
        "sites: [{cores: 1}]\nneighbourhood: full",
        "sites[0].name: expected a site name, but it is missing",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: a, cores: 1}]\nneighbourhood: full",
        "sites[1].name: expected a name no earlier site has, got 'a'",
    ),
    (
        "sites: [{name: a, cores: 1, core: 2}]\nneighbourhood: full",
        "sites[0].core: expected one of",
    ),
    ("sites: [{name: a, cores: 1, speed: -1}]\nneighbourhood: full", "sites[0].speed"),
    ("sites: [{name: a, cores: 1, uplink: fast}]\nneighbourhood: full", "sites[0].uplink"),
    ("sites: []\nneighbourhood: full", "sites: expected a non-empty list"),
    ("neighbourhood: full", "sites: expected a list of sites, but it is missing"),
    ("sites: [{name: a, cores: 1}]", "neighbourhood: expected full, ring"),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: {a: [zz]}",
        "neighbourhood.a[0]: expected a site of the topology, got 'zz'",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: {zz: [a]}",
        "neighbourhood.zz: expected a site of the topology",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: {a: [a, b]}",
        "neighbourhood.a[0]: expected a site other than a itself",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: {a: []}",
        "neighbourhood: expected a weakly connected graph, but 'b' cannot be reached from 'a'",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: torus 2x3",
        "neighbourhood: expected 'torus RxC'",
    ),
    (
        "sites: [{name: a, cores: 1}]\nneighbourhood: full\nlinks: [{from: a, to: zz}]",
        "links[0].to: expected a site of the topology, got 'zz'",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: full\n"
        "links: [{from: a, to: b, bandwidth: 0}]",
        "links[0].bandwidth: expected a bandwidth",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: full\n"
        "links: [{from: a, to: b, latency: -1}]",
        "links[0].latency",
    ),
    (
        "sites: [{name: a, cores: 1}, {name: b, cores: 1}]\nneighbourhood: full\n"
        "links: [{from: a, to: b, symmetric: true}, {from: b, to: a}]",
        "links[1]: expected one entry per directed pair, but b -> a is also in links[0]",
    ),
    (
        "sites: [{name: a, cores: 1}]\nneighbourhood: full\ndefaults: {bandwidth: -5}",
        "defaults.bandwidth",
    ),
    (
        "sites: [{name: a, cores: 1}]\nneighbourhood: full\ndata: {spec: zz}",
        "data.spec: expected a site of the topology, got 'zz'",
    ),
    ("sites: [{name: a, cores: 1}]\nneighbourhood: full\ncolour: red", "colour: expected one of"),
    (
        "sites: [{name: a, cores: 1, manager: pbs}]\nneighbourhood: full",
        "sites[0].manager: expected one of local, slurm, gridengine, got 'pbs'",
    ),
    (
        "sites: [{name: a, cores: 1, slurm: {partition: main}}]\nneighbourhood: full",
        "sites[0].slurm: expected slurm settings only on a site with manager: slurm (this one's: "
        "local)",
    ),
    (
        "sites: [{name: a, cores: 1, manager: slurm, slurm: {partition: 'a b'}}]\n"
        "neighbourhood: full",
        "sites[0].slurm.partition: expected a partition name: 1 to 64 letters, digits, '_', '.' "
        "or '-', got 'a b'",
    ),
    (
        "sites: [{name: a, cores: 1, manager: slurm, slurm: {nodes: 2}}]\nneighbourhood: full",
        "sites[0].slurm.nodes: expected one of the keys partition, got 'nodes'",
    ),
    (
        "sites: [{name: a, cores: 1, manager: slurm, slurm: main}]\nneighbourhood: full",
        "sites[0].slurm: expected a mapping with keys partition, got 'main'",
    ),
    (
        "sites: [{name: a, cores: 4, manager: slurm, nodes: 3}]\nneighbourhood: full",
        "sites[0].nodes: expected a divisor of the site's cores (4), got 3",
    ),
    (
        "sites: [{name: a, cores: 1, cpu_share: 0}]\nneighbourhood: full",
        "sites[0].cpu_share: expected a share of each core, 0 < share <= 1, got 0",
    ),
    (
        "sites: [{name: a, cores: 1, cpu_share: 1.5}]\nneighbourhood: full",
        "sites[0].cpu_share: expected a share of each core, 0 < share <= 1, got 1.5",
    ),
    (
        "sites: [{name: a, cores: 1, cpu_share: half}]\nneighbourhood: full",
        "sites[0].cpu_share: expected a share of each core, 0 < share <= 1, got 'half'",
    ),
    (
        "sites: [{name: a, cores: 1, manager: gridengine, cpu_share: 0.5}]\nneighbourhood: full",
        "sites[0].cpu_share: expected a cpu_share only on a site with manager: local (this one's: "
        "gridengine), got 0.5",
    ),
    ("- just a list", "document: expected a mapping"),
    ("sites: [{name: a, cores: 1}\nneighbourhood: full", "t.yaml:2:1: expected valid YAML"),
    ("sites: x: y", "t.yaml:1:9: expected valid YAML (mapping values are not allowed here)"),
]


def test_a_site_says_how_it_runs_jobs_and_the_file_keeps_it() -> None:
    t = loads(
        "sites:\n"
        "  - {name: a, cores: 4}\n"
        "  - {name: b, cores: 4, nodes: 2, manager: slurm}\n"
        "  - {name: c, cores: 2, manager: slurm, slurm: {partition: main}}\n"
        "  - {name: d, cores: 2, manager: gridengine}\n"
        "neighbourhood: full\n"
    )
    assert [s.manager for s in t.sites.values()] == ["local", "slurm", "slurm", "gridengine"]
    assert t.sites["d"].slurm is None
    assert t.sites["a"].slurm is None
    assert t.sites["b"].slurm == SlurmSpec(partition="batch")
    assert t.sites["c"].slurm == SlurmSpec(partition="main")
    assert loads(dumps(t)) == t
    with pytest.raises(
        InvalidInput, match=r"site\[x\]\.manager: expected one of local, slurm, gridengine"
    ):
        SiteSpec("x", 1, manager="sge")
    with pytest.raises(InvalidInput, match=r"slurm settings only on a site with manager: slurm"):
        SiteSpec("x", 1, manager="gridengine", slurm=SlurmSpec())


def test_a_site_says_its_cpu_share_and_the_file_keeps_it() -> None:
    t = loads(
        "sites:\n"
        "  - {name: a, cores: 4, cpu_share: 0.25}\n"
        "  - {name: b, cores: 4}\n"
        "neighbourhood: full\n"
    )
    assert [s.cpu_share for s in t.sites.values()] == [0.25, 1.0]
    assert "cpu_share: 0.25" in dumps(t)
    assert dumps(t).count("cpu_share") == 1  # the default is not written
    assert loads(dumps(t)) == t
    with pytest.raises(InvalidInput, match=r"site\[x\]\.cpu_share: expected a share of each core"):
        SiteSpec("x", 1, cpu_share=-0.5)


def test_the_slurm_topology_is_three_slurm_sites_in_a_full_graph() -> None:
    t = load_topology(TOPOLOGIES / "slurm-3.yaml")
    assert {s.name: s.manager for s in t.sites.values()} == dict.fromkeys(
        ("alpha", "beta", "gamma"), "slurm"
    )
    assert neighbourhood_form(t) == "full"


def test_the_grid_engine_topology_is_two_grid_engine_sites_of_one_host_each() -> None:
    t = load_topology(TOPOLOGIES / "gridengine-2.yaml")
    assert {s.name: s.manager for s in t.sites.values()} == {
        "oak": "gridengine",
        "elm": "gridengine",
    }
    assert [s.properties().node_count for s in t.sites.values()] == [1, 1]
    assert neighbourhood_form(t) == "full"


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_file_errors_name_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput) as err:
        load_topology(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


def test_a_file_that_is_not_utf8_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(InvalidInput, match="UTF-8"):
        load_topology(path)
    with pytest.raises(FileNotFoundError):
        load_topology(tmp_path / "missing.yaml")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abs:{}[], -\n0123456789.enamecorsighbuhdfl", max_size=120))
def test_loads_raises_only_invalid_input(text: str) -> None:
    with contextlib.suppress(InvalidInput):
        loads(text)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 40)
    | st.floats(allow_nan=True)
    | st.sampled_from(["a", "b", "", "full", "torus 1x2", "s0", "12.5e6"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["a", "b", "name", "cores", "from", "to"]), inner, max_size=3
        )
    ),
    max_leaves=8,
)
_site = st.dictionaries(
    st.sampled_from(["name", "cores", "speed", "uplink", "downlink", "http", "mqtt"]),
    _values,
    max_size=7,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"sites": st.lists(_site, max_size=3) | _values},
        optional={
            "name": _values,
            "defaults": st.dictionaries(st.sampled_from(["bandwidth", "latency"]), _values),
            "neighbourhood": _values,
            "links": st.lists(
                st.dictionaries(
                    st.sampled_from(["from", "to", "bandwidth", "latency", "symmetric"]), _values
                ),
                max_size=3,
            )
            | _values,
            "data": _values,
        },
    )
)
def test_any_structured_document_is_a_topology_or_invalid_input(
    document: dict[str, object],
) -> None:
    with contextlib.suppress(InvalidInput):
        t = loads(yaml.safe_dump(document))
        assert loads(dumps(t)) == t


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 8), cols=st.integers(1, 8))
def test_any_torus_is_connected_without_self_loops(rows: int, cols: int) -> None:
    t = torus(rows, cols, cores=1)
    assert_well_formed(t)
    degree = (2 if rows >= 3 else rows - 1) + (2 if cols >= 3 else cols - 1)
    assert out_degrees(t) == {degree}
    assert loads(dumps(t)) == t


# --- the shipped files --------------------------------------------------------------------------


def test_the_shipped_files_are_all_here() -> None:
    assert {p.name for p in SHIPPED} >= {
        "paper-6.yaml",
        "paper-6-torus.yaml",
        "das3-5.yaml",
        "torus-4x4.yaml",
        "full-8.yaml",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_file_loads_validates_and_round_trips(path: Path) -> None:
    t = load_topology(path)
    assert t.name == path.stem
    t.validate()
    assert loads(dumps(t)) == t


def test_paper_testbed() -> None:
    t = load_topology(TOPOLOGIES / "paper-6.yaml")
    assert [(s.name, s.cores) for s in t.sites.values()] == [
        ("L4001", 16),
        ("Opteron24", 24),
        ("Xeon24", 24),
        ("P4-18", 18),
        ("Xeon80", 32),
        ("Core16", 16),
    ]
    assert len(t.sites) == 6
    assert t.total_cores == 130
    assert t.site_names[4] == "Xeon80"  # segment 5
    assert t.data_site("spec-mpi2007") == "Xeon80"
    assert neighbourhood_form(t) == "full"
    assert t.default_link == LinkSpec(125e6, 0.001)  # Gigabit Ethernet, as in the paper
    assert {t.uplink(s) for s in t.sites} == {t.downlink(s) for s in t.sites} == {125e6}
    assert t.sites["Xeon80"].http == "http://127.0.0.1:8705"
    torus6 = load_topology(TOPOLOGIES / "paper-6-torus.yaml")
    assert dict(torus6.sites) == dict(t.sites)
    assert torus6.data == t.data
    assert neighbourhood_form(torus6) == "torus 2x3"
    assert out_degrees(torus6) == {3}
    assert torus6.neighbours("Xeon80") == ["Core16", "Opteron24", "P4-18"]


def test_das3() -> None:
    t = load_topology(TOPOLOGIES / "das3-5.yaml")
    cores = {name: s.cores for name, s in t.sites.items()}
    assert cores == {
        "Vrije": 170,
        "Amsterdam": 82,
        "Delft": 136,
        "MultimediaN": 92,
        "Leiden": 64,
    }
    assert t.total_cores == 2 * 272
    assert neighbourhood_form(t) == "full"


def test_example_tori_and_full_graphs() -> None:
    t44 = load_topology(TOPOLOGIES / "torus-4x4.yaml")
    assert (len(t44.sites), t44.total_cores, out_degrees(t44)) == (16, 512, {4})
    assert t44 == torus(4, 4, cores=32, description=t44.description)
    f8 = load_topology(TOPOLOGIES / "full-8.yaml")
    assert (len(f8.sites), f8.total_cores, out_degrees(f8)) == (8, 128, {7})


# --- drawing and the command line ---------------------------------------------------------------


def test_draw_topology_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for k, t in enumerate(
        [torus(3, 3, cores=4), Topology(sites(1, 2, 3), [("s0", "s1"), ("s2", "s1")])]
    ):
        out = tmp_path / f"t{k}.png"
        draw_topology(t, out)
        assert out.read_bytes().startswith(PNG_MAGIC)


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    """``gbroker topology ARGS``."""
    return harness.gbroker("topology", *args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["torus", "4x4", "--cores", "32"], torus(4, 4, cores=32)),
        (["full", "8", "--cores", "16", "--name", "f"], full(8, cores=16, name="f")),
        (["ring", "5", "--cores", "1,2,3,4,5"], ring(5, cores=[1, 2, 3, 4, 5])),
        (["hypercube", "3", "--cores", "4", "--speed", "1.5"], hypercube(3, cores=4, speed=1.5)),
        (["circulant", "7", "--offsets", "1,3", "--cores", "2"], circulant(7, (1, 3), cores=2)),
        (
            ["random-regular", "10", "--degree", "3", "--seed", "5", "--cores", "8"],
            random_regular(10, 3, 5, cores=8),
        ),
        (
            ["full", "3", "--cores", "1", "--bandwidth", "12.5e6", "--latency", "0.001"],
            full(3, cores=1, default_link=LinkSpec(12.5e6, 0.001)),
        ),
    ],
)
def test_cli_generators_print_yaml(args: list[str], expected: Topology) -> None:
    done = gbroker(*args)
    assert done.returncode == 0, done.stderr
    assert loads(done.stdout) == expected


def test_cli_show_prints_a_summary_and_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "paper.png"
    done = gbroker("show", str(TOPOLOGIES / "paper-6-torus.yaml"), "--png", str(png))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "paper-6-torus: 6 sites, 130 cores" in out
    assert "torus 2x3: 18 arcs, out-degree 3, diameter 2" in out
    assert "125 MB/s, latency 1 ms" in out
    assert "spec-mpi2007 at Xeon80" in out
    assert "Xeon80        32      1  125 MB/s" in out
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_cli_show_of_a_one_way_graph(tmp_path: Path) -> None:
    path = tmp_path / "oneway.yaml"
    save_topology(Topology(sites(1, 2, 3), [("s0", "s1"), ("s2", "s1")]), path)
    done = gbroker("show", str(path))
    assert done.returncode == 0, done.stderr
    assert "explicit: 2 arcs, out-degree 0..1, diameter inf" in done.stdout


def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sites: [{name: a, cores: x}]\nneighbourhood: full\n")
    for done, message in [
        (gbroker("show", str(bad)), f"{bad}: sites[0].cores: expected an integer >= 1, got 'x'"),
        (gbroker("show", str(tmp_path / "none.yaml")), "cannot read"),
        (gbroker("circulant", "6", "--offsets", "2", "--cores", "1"), "weakly connected"),
        (gbroker("torus", "4by4", "--cores", "1"), "expected ROWSxCOLS"),
        (gbroker("full", "3"), "--cores"),
    ]:
        assert done.returncode == 2
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    assert gbroker("show", str(bad)).stderr.count("\n") == 1


def test_yaml_anchors_and_aliases_are_refused() -> None:
    # A topology never needs them, and a few hundred bytes of aliases expand to gigabytes.
    text = "sites: &s [{name: a, cores: 1}]\nneighbourhood: full\nextra: [*s, *s, *s]\n"
    with pytest.raises(InvalidInput) as caught:
        loads(text, source="t.yaml")
    assert caught.value.field == "t.yaml:1:8"
    assert caught.value.expected == "YAML without anchors or aliases"


def test_deeply_nested_yaml_is_an_error_not_a_crash() -> None:
    with pytest.raises(InvalidInput, match="YAML nested less deeply"):
        loads("sites: " + "[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("name", ["a.b", "a/b", "s+", "#", "", " s0", "é", "x" * 65, 7])
def test_site_names_from_yaml_are_tokens_for_topics_and_job_ids(name: object) -> None:
    text = yaml.safe_dump({"sites": [{"name": name, "cores": 1}], "neighbourhood": "full"})
    with pytest.raises(InvalidInput) as caught:
        loads(text)
    assert caught.value.field == "sites[0].name"
    assert caught.value.expected.startswith("a site name: letters, digits")


@pytest.mark.parametrize("value", ["2020-13-45", "!!timestamp x", "1" + "0" * 5000])
def test_values_pyyaml_chokes_on_are_invalid_input(value: str) -> None:
    with pytest.raises(InvalidInput, match="valid YAML"):
        loads(f"name: {value}\nsites: [{{name: a, cores: 1}}]\nneighbourhood: full\n")


# ---------------------------------------------------------------------------------------------
# What sites offer jobs beyond cores (matched against JSDL requirements)

PROPERTIES = """
name: props
sites:
  - name: a
    cores: 8
    os: LINUX
    os_version: "6.1"
    arch: x86_64
    nodes: 2
    memory_per_node: 16GiB
    memory_per_core: 2GiB
    disk: 100GB
    cpu_speed: 2.4e9
    exclusive: true
    file_systems:
      - {name: SCRATCH, mount: /scratch/a, type: temporary, free: 1TiB}
      - {name: HOME, mount: /home/a}
  - {name: b, cores: 4, downlink: 1.25e6}
neighbourhood: full
"""


def test_site_properties_load_round_trip_and_feed_the_core() -> None:
    from gbroker.core.requirements import FileSystemSpec, SiteProperties

    t = loads(PROPERTIES)
    a = t.site("a")
    assert (a.operating_system, a.operating_system_version, a.cpu_architecture) == (
        "LINUX",
        "6.1",
        "x86_64",
    )
    assert (a.memory_per_node, a.memory_per_core, a.disk) == (16 << 30, 2 << 30, 100 * 10**9)
    assert a.file_systems == (
        FileSystemSpec("SCRATCH", "/scratch/a", "temporary", 1 << 40),
        FileSystemSpec("HOME", "/home/a"),
    )
    props = t.properties()
    assert props["a"].cores_per_node == 4  # 8 cores on 2 nodes
    assert props["a"].network_bandwidth == 8 * t.default_link.bandwidth  # bits/s
    assert props["b"] == SiteProperties(cores=4, network_bandwidth=8 * 1.25e6)
    assert loads(dumps(t)) == t


def test_site_hosts_load_round_trip_and_name_the_nodes() -> None:
    t = loads("sites:\n  - {name: a, cores: 8, hosts: [a01, a02]}\n  - {name: b, cores: 2}\n"
              "neighbourhood: full\n")  # fmt: skip
    assert t.site("a").hosts == ("a01", "a02")
    props = t.properties()
    assert (props["a"].nodes, props["a"].cores_per_node, props["a"].hosts) == (2, 4, ("a01", "a02"))
    assert props["b"].host_names("b") == ("b",)
    assert "hosts: [a01, a02]" in dumps(t)
    assert loads(dumps(t)) == t


@pytest.mark.parametrize(
    ("site", "field", "expected"),
    [
        ("{name: a, cores: 8, nodes: 3}", "sites[0].nodes", "a divisor of the site's cores (8)"),
        ("{name: a, cores: 8, hosts: a01}", "sites[0].hosts", "a list of host names"),
        (
            "{name: a, cores: 8, nodes: 4, hosts: [x, y]}",
            "sites[0].hosts",
            "one host name per node",
        ),
        ("{name: a, cores: 2, hosts: [x, 'a/b']}", "sites[0].hosts", "host names: letters"),
        (
            "{name: a, cores: 8, nodes: 2, cores_per_node: 2}",
            "sites[0].nodes",
            "nodes x cores_per_node equal to the site's cores (8)",
        ),
        ("{name: a, cores: 2, memory_per_node: lots}", "sites[0].memory_per_node", "a size"),
        ("{name: a, cores: 2, exclusive: yes please}", "sites[0].exclusive", "true or false"),
        ("{name: a, cores: 2, os: ''}", "sites[0].os", "a non-empty string"),
        (
            "{name: a, cores: 2, file_systems: [{name: X, mount: rel}]}",
            "sites[0].file_systems[0].mount",
            "an absolute path",
        ),
        (
            "{name: a, cores: 2, file_systems: [{name: X, mount: /x, type: ramdisk}]}",
            "sites[0].file_systems[0].type",
            "one of normal, spool, temporary, swap",
        ),
        (
            "{name: a, cores: 2, file_systems: [{mount: /x}]}",
            "sites[0].file_systems[0].name",
            "a file system name",
        ),
        (
            "{name: a, cores: 2, file_systems: [{name: X, mount: /x, size: 1}]}",
            "sites[0].file_systems[0].size",
            "one of the keys",
        ),
    ],
)
def test_bad_site_properties_name_the_field(site: str, field: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        loads(f"sites: [{site}]\nneighbourhood: full\n")
    assert caught.value.field == field
    assert caught.value.expected.startswith(expected)


def test_the_header_of_a_topology_file_counts_in_the_singular() -> None:
    one = Topology([SiteSpec("a", 1)], "full", name="one")
    assert dumps(one).startswith("# GBroker topology: 1 site, 1 core.")
    assert dumps(full(2, cores=1)).startswith("# GBroker topology: 2 sites, 2 cores.")
