"""The AppLeS planner (gbroker.core.apples): hand-computed plans, the filters, the model language,
and the invariants (the partition sums to the units; the plan is the least predicted candidate;
the rounding is the best integer partition)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.apples import (
    MODEL_KEYS,
    PerformanceModel,
    Resource,
    blocked,
    communication,
    evaluate,
    parse_model,
    partition,
    plan,
)
from gbroker.errors import InvalidInput

FAST = (1e12, 0.0)


def no_links(a: str, b: str) -> tuple[float, float]:
    return FAST


def model(**fields: object) -> PerformanceModel:
    return parse_model({"units": 100, "compute": 0.01, **fields})


# --- planning, by hand ---------------------------------------------------------------------------


def test_two_equal_machines_split_evenly() -> None:
    got = plan(model(iterations=10), [Resource("A", 1, 1.0), Resource("B", 1, 1.0)], no_links)
    assert (got.sites, got.units, got.cores) == (("A", "B"), (50, 50), (1, 1))
    assert got.predicted == pytest.approx(10 * 50 * 0.01)
    assert got.locus == "A"
    # both sets weighed: A alone (100 units), then A and B
    assert [(c.sites, c.units) for c in got.candidates] == [
        (("A",), (100,)),
        (("A", "B"), (50, 50)),
    ]
    assert got.candidates[0].predicted == pytest.approx(10 * 100 * 0.01)


def test_a_machine_twice_as_available_gets_twice_the_rows() -> None:
    got = plan(model(units=90), [Resource("B", 1, 0.5), Resource("A", 1, 1.0)], no_links)
    # a_A = 0.01, a_B = 0.02: T = 90 / (100 + 50) = 0.6; the locus is the faster A
    assert (got.sites, got.units) == (("A", "B"), (60, 30))
    assert got.predicted == pytest.approx(0.6)


def test_speed_and_cores_count_like_availability() -> None:
    m = model(units=90, cores=2)
    got = plan(m, [Resource("A", 2, 1.0, speed=2.0), Resource("B", 4, 1.0)], no_links)
    # a_A = 0.01 / (2 * 2) = 0.0025, a_B = 0.005: 60 and 30 rows, 60 * 0.0025 = 0.15 s
    assert (got.sites, got.units, got.cores) == (("A", "B"), (60, 30), (2, 2))
    assert got.predicted == pytest.approx(0.15)


def slow_c(a: str, b: str) -> tuple[float, float]:
    """A and B on a fast LAN (1 GB/s, 1 ms), C behind a 1 MB/s link."""
    return (1e9, 1e-3) if {a, b} == {"A", "B"} else (1e6, 0.0)


THREE = [Resource("A", 1, 1.0), Resource("B", 1, 1.0), Resource("C", 1, 1.0)]


def test_a_slow_link_makes_selection_drop_a_machine() -> None:
    m = model(exchange=3e5, iterations=10)
    got = plan(m, THREE, slow_c)
    # A, B: comm 0.3 ms + 1 ms each; T = (100 + 2 * 0.13) / 200 = 0.5013 per iteration
    assert (got.sites, got.units) == (("A", "B"), (50, 50))
    assert got.predicted == pytest.approx(10 * (0.5 + 0.0013))
    whole = got.candidates[-1]
    # A, B, C: comm (0.0013, 0.3013, 0.3), T = 160.26 / 300 = 0.5342: floors 53, 23, 23 and the
    # last row to C (0.54 s against 0.5413 at A or B)
    assert (whole.sites, whole.units) == (("A", "B", "C"), (53, 23, 24))
    assert whole.predicted == pytest.approx(10 * 0.54)
    # without selection the planner must use them all
    every = plan(m, THREE, slow_c, select=False)
    assert (every.sites, every.units) == (("A", "B", "C"), (53, 23, 24))
    assert len(every.candidates) == 1
    assert every.predicted > got.predicted


def test_the_distance_puts_near_machines_next_to_each_other() -> None:
    m = model(exchange=3e5)
    # the caller lists C between A and B; the chain from A goes to B (fast link) and then C
    got = plan(m, [THREE[0], THREE[2], THREE[1]], slow_c, select=False)
    assert got.sites == ("A", "B", "C")
    assert plan(m, THREE, slow_c, locus="C", select=False).sites[0] == "C"


def test_a_negative_area_is_filtered_with_its_reason() -> None:
    def far(a: str, b: str) -> tuple[float, float]:
        return FAST if {a, b} == {"A", "B"} else (1e6, 0.0)

    m = model(units=10, exchange=1e6)  # one second to C and back; a rank computes 0.01 s a row
    with pytest.raises(InvalidInput) as caught:
        plan(m, THREE, far, select=False)
    assert caught.value.field == "model"
    assert "B (rank 1) would need a negative area" in str(caught.value)
    got = plan(m, THREE, far)
    assert got.sites == ("A", "B")
    assert got.candidates[-1].reason is not None
    assert got.candidates[-1].predicted is None


def test_a_rank_rounded_to_no_unit_is_filtered() -> None:
    m = model(units=10, exchange=1e6)
    # A fast (a = 0.001), C slow (a = 0.1), 1 s of exchange each: u_C = 0.099, rounded to 0
    resources = [Resource("A", 1, 1.0, speed=10.0), Resource("C", 1, 1.0, speed=0.1)]
    candidate = evaluate(m, resources, lambda a, b: (1e6, 0.0))
    assert candidate.reason == "C (rank 1) would need a zero area: no unit left for it once rounded"
    assert plan(m, resources, lambda a, b: (1e6, 0.0)).sites == ("A",)


def test_the_memory_filter() -> None:
    m = model(memory=1.0)
    resources = [Resource("A", 1, 1.0), Resource("B", 1, 1.0, memory=40.0)]
    got = plan(m, resources, no_links)
    assert (got.sites, got.units) == (("A",), (100,))
    filtered = got.candidates[1]
    assert filtered.sites == ("A", "B")
    assert filtered.reason == "B: 50 units need 50 bytes of memory; it offers 40"
    assert filtered.predicted is None
    with pytest.raises(InvalidInput, match="50 units need 50 bytes of memory"):
        plan(m, resources, no_links, select=False)


def test_too_few_idle_cores_is_filtered() -> None:
    got = plan(model(cores=4), [Resource("A", 4, 1.0), Resource("B", 2, 1.0)], no_links)
    assert got.sites == ("A",)
    assert got.candidates[1].reason == "B offers 2 idle cores; a component needs 4"


def test_ring_gives_every_rank_two_neighbours() -> None:
    m = model(exchange=1e6, topology="ring")
    assert communication(m, ["A", "B", "C"], lambda a, b: (1e6, 0.5)) == [3.0, 3.0, 3.0]
    strip = model(exchange=1e6)
    assert communication(strip, ["A", "B", "C"], lambda a, b: (1e6, 0.5)) == [1.5, 3.0, 1.5]
    assert communication(strip, ["A"], lambda a, b: (1e6, 0.5)) == [0.0]


def test_blocked_is_equal_strips() -> None:
    assert blocked(model(units=10), 4) == [3, 3, 2, 2]


def test_bad_plans_are_refused_by_name() -> None:
    m = model()
    with pytest.raises(InvalidInput, match=r"^locus: expected one of the resources' sites"):
        plan(m, THREE, no_links, locus="Z")
    with pytest.raises(InvalidInput, match=r"^resources: expected each site once"):
        plan(m, [THREE[0], THREE[0]], no_links)
    with pytest.raises(InvalidInput, match=r"^resources: expected at least one"):
        plan(m, [], no_links)
    with pytest.raises(InvalidInput, match=r"^link A->B.bandwidth: expected bytes per second > 0"):
        plan(model(exchange=1.0), THREE[:2], lambda a, b: (0.0, 0.0))
    with pytest.raises(InvalidInput, match=r"^resource 'A'.cpu: expected a CPU availability"):
        Resource("A", 1, 0.0)
    with pytest.raises(InvalidInput, match=r"^resource 'A'.cores: expected an integer >= 0"):
        Resource("A", True, 1.0)


# --- the model language --------------------------------------------------------------------------


def test_a_whole_model_round_trips() -> None:
    data = {
        "units": 2000,
        "compute": 1e-3,
        "exchange": 16000,
        "memory": 32000,
        "iterations": 100,
        "cores": 2,
        "topology": "ring",
    }
    m = parse_model(data)
    assert m.as_dict() == data
    assert list(m.as_dict()) == list(MODEL_KEYS)
    assert parse_model(m.as_dict()) == m
    assert parse_model({"units": 1, "compute": 1}) == PerformanceModel(1, 1.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"compute": 1.0}, "model.units: expected a value (it is required)"),
        ({"units": 10}, "model.compute: expected a value (it is required)"),
        (
            {"units": 0, "compute": 1.0},
            "model.units: expected an integer from 1 to 1099511627776, got 0",
        ),
        (
            {"units": 2.5, "compute": 1.0},
            "model.units: expected an integer from 1 to 1099511627776, got 2.5",
        ),
        (
            {"units": True, "compute": 1.0},
            "model.units: expected an integer from 1 to 1099511627776, got True",
        ),
        (
            {"units": 10, "compute": "1e-3"},
            "model.compute: expected a number of core-seconds, got '1e-3'",
        ),
        (
            {"units": 10, "compute": 0},
            "model.compute: expected a finite number of core-seconds > 0, at most 1e+06, got 0",
        ),
        (
            {"units": 10, "compute": 1, "exchange": -1},
            "model.exchange: expected a finite number of bytes >= 0, at most 1.09951e+12, got -1",
        ),
        (
            {"units": 10, "compute": 1, "memory": math.inf},
            "model.memory: expected a finite number of bytes >= 0, at most 1.1259e+15, got inf",
        ),
        (
            {"units": 10, "compute": 1, "iterations": 0},
            "model.iterations: expected an integer from 1 to 1000000000, got 0",
        ),
        (
            {"units": 10, "compute": 1, "cores": "2"},
            "model.cores: expected an integer from 1 to 1048576",
        ),
        (
            {"units": 10, "compute": 1e308, "iterations": 10**18},
            "model.compute: expected a finite number of core-seconds > 0, at most 1e+06, "
            "got 1e+308",
        ),
        (
            {"units": 10, "compute": 1, "topology": "mesh"},
            "model.topology: expected one of strip, ring, got 'mesh'",
        ),
        (
            {"units": 10, "compute": 1, "topology": 3},
            "model.topology: expected one of strip, ring, got 3",
        ),
        (
            {"units": 10, "compute": 1, "rows": 5, "flops": 1},
            "model.flops: expected one of the model's keys (units, compute, exchange, memory,"
            " iterations, cores, topology); unknown: flops, rows",
        ),
        ({1: 2}, "model: expected keys that are strings, got 1"),
    ],
)
def test_every_bad_field_is_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_model(data)
    assert str(caught.value).startswith(message)


def test_a_model_that_is_no_mapping() -> None:
    with pytest.raises(InvalidInput, match=r"^model: expected a mapping of units, compute"):
        parse_model([1, 2])  # type: ignore[arg-type]


# --- invariants ----------------------------------------------------------------------------------

resources_st = st.lists(
    st.builds(
        Resource,
        site=st.sampled_from("ABCDEFGH"),
        cores=st.integers(0, 4),
        cpu=st.floats(0.05, 1.0),
        speed=st.floats(0.1, 4.0),
        memory=st.one_of(st.none(), st.floats(0.0, 1e4)),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda r: r.site,
)
models_st = st.builds(
    PerformanceModel,
    units=st.integers(1, 500),
    compute=st.floats(1e-4, 1.0),
    exchange=st.floats(0.0, 1e6),
    memory=st.floats(0.0, 100.0),
    iterations=st.integers(1, 50),
    cores=st.integers(1, 3),
    topology=st.sampled_from(["strip", "ring"]),
)


def link_of(bandwidths: list[float]) -> object:
    def link(a: str, b: str) -> tuple[float, float]:
        k = (ord(min(a, b)) * 7 + ord(max(a, b))) % len(bandwidths)
        return bandwidths[k], 1e-3 * k

    return link


@settings(max_examples=200, deadline=None)
@given(
    models_st, resources_st, st.lists(st.floats(1e4, 1e9), min_size=1, max_size=5), st.booleans()
)
def test_the_plan_is_the_least_predicted_feasible_candidate(
    m: PerformanceModel, resources: list[Resource], bandwidths: list[float], select: bool
) -> None:
    link = link_of(bandwidths)
    failed: InvalidInput | None = None
    try:
        got = plan(m, resources, link, select=select)  # type: ignore[arg-type]
    except InvalidInput as e:
        failed = e
    if failed is not None:
        assert failed.field == "model"
        assert "none fits" in str(failed)
        return
    assert sum(got.units) == m.units
    assert all(u >= 1 for u in got.units)
    assert len(got.sites) == len(got.units) == len(got.cores)
    assert set(got.sites) <= {r.site for r in resources}
    assert got.sites[0] == got.locus
    feasible = [c for c in got.candidates if c.predicted is not None]
    assert got.predicted == min(c.predicted for c in feasible if c.predicted is not None)
    for c in feasible:
        assert sum(c.units) == m.units
    if select:
        assert len(got.candidates) == len(resources)  # every prefix weighed
        assert [len(c.sites) for c in got.candidates] == list(range(1, len(resources) + 1))
    else:
        assert len(got.sites) == len(resources)
        assert len(got.candidates) == 1


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 14),
    st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 2.0)), min_size=1, max_size=3),
)
def test_the_rounding_is_the_best_integer_partition(
    units: int, ranks: list[tuple[float, float]]
) -> None:
    m = PerformanceModel(units, 1.0)
    unit_times = [a for a, _ in ranks]
    comm = [c for _, c in ranks]
    got, failed = partition(m, unit_times, comm)
    if failed is not None:
        return
    assert sum(got) == units

    def worst(parts: tuple[int, ...] | list[int]) -> float:
        return max(u * a + c for u, a, c in zip(parts, unit_times, comm, strict=True))

    best = min(
        worst(parts)
        for parts in itertools.product(range(units + 1), repeat=len(ranks))
        if sum(parts) == units
    )
    assert worst(got) <= best * (1 + 1e-9) + 1e-12
