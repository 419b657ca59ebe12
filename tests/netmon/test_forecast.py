from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.errors import InvalidInput
from netmon.forecast import PiecewiseLinearForecaster

MB = 1_000_000


def measured() -> PiecewiseLinearForecaster:
    f = PiecewiseLinearForecaster(default_bandwidth=10 * MB)
    f.observe("xeon80", "l4001", 100 * MB, 2.0)
    f.observe("xeon80", "l4001", 1000 * MB, 11.0)
    return f


def test_interpolates_between_test_sizes() -> None:
    f = measured()
    assert f("xeon80", "l4001", 100 * MB) == pytest.approx(2.0)
    assert f("xeon80", "l4001", 550 * MB) == pytest.approx(6.5)


def test_below_the_smallest_size_runs_from_the_origin() -> None:
    assert measured().forecast("xeon80", "l4001", 50 * MB) == pytest.approx(1.0)


def test_beyond_the_largest_size_extends_the_last_segment() -> None:
    assert measured().forecast("xeon80", "l4001", 2000 * MB) == pytest.approx(21.0)
    single = PiecewiseLinearForecaster()
    single.observe("a", "b", 10 * MB, 1.0)
    assert single.forecast("a", "b", 30 * MB) == pytest.approx(3.0)


def test_unmeasured_links_use_the_default_bandwidth_and_local_is_free() -> None:
    f = measured()
    assert f("l4001", "xeon80", 100 * MB) == pytest.approx(10.0)  # links are directed
    assert f("xeon80", "xeon80", 10**12) == 0.0
    assert f("xeon80", "l4001", 0) == 0.0


def test_smoothing_keeps_one_point_per_size() -> None:
    f = PiecewiseLinearForecaster(alpha=0.5)
    f.observe("a", "b", MB, 4.0)
    f.observe("a", "b", MB, 2.0)
    table = f.table("a", "b")
    assert table is not None
    assert table.sizes == [MB]
    assert table.seconds == [pytest.approx(3.0)]


def test_bad_parameters_and_samples_are_rejected() -> None:
    with pytest.raises(InvalidInput, match="default_bandwidth"):
        PiecewiseLinearForecaster(default_bandwidth=0)
    with pytest.raises(InvalidInput, match="alpha"):
        PiecewiseLinearForecaster(alpha=0)
    with pytest.raises(InvalidInput, match="size"):
        measured().observe("a", "b", 0, 1.0)
    with pytest.raises(InvalidInput, match="seconds"):
        measured().observe("a", "b", 1, float("nan"))


samples = st.lists(st.tuples(st.integers(1, 10**9), st.floats(0.001, 1e4)), min_size=1, max_size=12)


@given(samples, st.integers(0, 10**10))
def test_forecast_is_finite_and_within_the_table_between_points(
    points: list[tuple[int, float]], size: int
) -> None:
    f = PiecewiseLinearForecaster()
    for s, t in points:
        f.observe("a", "b", s, t)
    table = f.table("a", "b")
    assert table is not None
    value = f("a", "b", size)
    assert value >= 0
    assert value < float("inf")
    if table.sizes[0] <= size <= table.sizes[-1]:
        assert min(table.seconds) - 1e-9 <= value <= max(table.seconds) + 1e-9


def test_default_forecasts_stay_exact_before_and_after_the_first_measurement() -> None:
    f = PiecewiseLinearForecaster(default_bandwidth=3 * MB)
    before = f("a", "b", 7 * MB)
    assert before == 7 * MB / (3 * MB)
    f.observe("a", "c", MB, 10.0)  # one measured link: the others keep the default
    assert f("a", "b", 7 * MB) == before
    assert f("a", "c", MB) == 10.0
    assert f("a", "a", 7 * MB) == 0.0
