"""The NWS-style forecaster ensemble (netmon.ensemble): members, the choice, the combination."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.errors import InvalidInput
from netmon.ensemble import MEMBERS, EnsembleForecaster, Series, make_forecaster, members_in_use
from netmon.forecast import PiecewiseLinearForecaster
from netmon.table import TableFeed, table_from


def test_each_member_predicts_as_computed_by_hand() -> None:
    series = Series()
    for value in (1.0, 2.0, 3.0, 10.0):
        series.observe(value)
    predicted = dict(zip(MEMBERS, series.predictions(), strict=True))
    assert predicted["last"] == 10.0
    assert predicted["mean"] == 4.0
    assert predicted["mean5"] == predicted["mean10"] == predicted["mean20"] == 4.0
    assert predicted["median5"] == 2.5
    # exp 0.1: 1 -> 1.1 -> 1.29 -> 2.161
    assert predicted["exp0.1"] == pytest.approx(2.161)
    s = 1.0
    for value in (2.0, 3.0, 10.0):
        s += 0.8 * (value - s)
    assert predicted["exp0.8"] == pytest.approx(s)


def test_sliding_windows_forget_what_left_them() -> None:
    series = Series()
    for value in [100.0] * 5 + [1.0] * 5:
        series.observe(value)
    predicted = dict(zip(MEMBERS, series.predictions(), strict=True))
    assert predicted["mean5"] == predicted["median5"] == 1.0
    assert predicted["mean10"] == 50.5
    assert predicted["mean"] == 50.5


def test_the_member_with_the_lowest_recent_error_forecasts() -> None:
    """1, 3, 1, 3, 1, by hand: mean absolute errors of the four scored predictions are last 2,
    mean 1.333, median5 1.5, exp0.1 1.0955, exp0.3 1.2685, exp0.5 1.4375, exp0.8 1.736."""
    series = Series()
    for value in (1.0, 3.0, 1.0, 3.0, 1.0):
        series.observe(value)
    records = dict(zip(MEMBERS, series.records(), strict=True))
    assert records["last"] == pytest.approx(2.0)
    assert records["mean"] == pytest.approx(4 / 3)
    assert records["median5"] == pytest.approx(1.5)
    assert records["exp0.1"] == pytest.approx(1.0955)
    assert records["exp0.3"] == pytest.approx(1.2685)
    assert records["exp0.5"] == pytest.approx(1.4375)
    assert records["exp0.8"] == pytest.approx(1.736)
    assert series.best() == "exp0.1"
    assert series.forecast() == pytest.approx(1.362 + 0.1 * (1 - 1.362))


def test_ties_go_to_the_last_value_and_one_measurement_is_its_own_forecast() -> None:
    series = Series()
    series.observe(2.0)
    assert series.best() == "last"
    assert series.forecast() == 2.0
    for _ in range(3):
        series.observe(2.0)
    assert series.best() == "last"


def test_only_the_window_s_errors_count() -> None:
    """With a window of 2, an old error of the last-value member is forgotten."""
    series = Series(window=2)
    for value in (1.0, 9.0, 9.0, 9.0):  # last: errors 8, 0, 0 -> window [0, 0]
        series.observe(value)
    assert dict(zip(MEMBERS, series.records(), strict=True))["last"] == 0.0
    cumulative = Series(window=None)
    for value in (1.0, 9.0, 9.0, 9.0):
        cumulative.observe(value)
    assert dict(zip(MEMBERS, cumulative.records(), strict=True))["last"] == pytest.approx(8 / 3)


def test_after_a_step_the_ensemble_follows_at_once() -> None:
    """A link that drops 4x: every member missed the step by as much, so the tie goes to the
    last value, which is right from the next forecast on."""
    series = Series()
    for _ in range(30):
        series.observe(1.0)
    series.observe(4.0)
    assert series.forecast() == 4.0


@given(
    steady=st.floats(0.01, 100.0),
    factor=st.floats(0.1, 10.0),
    noise=st.lists(st.floats(-0.05, 0.05), min_size=40, max_size=40),
)
def test_a_step_is_followed_within_a_window_and_forecasts_stay_positive(
    steady: float, factor: float, noise: list[float]
) -> None:
    series = Series(window=10)
    for n in range(20):
        series.observe(steady * (1 + noise[n]))
    new = steady * factor
    took = None
    for n in range(20, 40):
        series.observe(new * (1 + noise[n]))
        forecast = series.forecast()
        assert math.isfinite(forecast)
        assert forecast > 0
        if took is None and abs(forecast - new) <= 0.15 * new:
            took = n - 19
    assert took is not None
    assert took <= 10


@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=300))
def test_memory_stays_bounded(values: list[float]) -> None:
    series = Series(window=7)
    for value in values:
        series.observe(value)
    assert len(series._recent) <= 20
    assert all(len(errors) <= 7 for errors in series._errors)
    assert math.isfinite(series.forecast())


def test_bad_values_and_windows_are_refused() -> None:
    with pytest.raises(InvalidInput):
        Series(window=0)
    series = Series()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InvalidInput):
            series.observe(bad)
    with pytest.raises(InvalidInput):
        Series().forecast()


def test_the_forecaster_interpolates_per_size_forecasts_as_the_table_does() -> None:
    ensemble = EnsembleForecaster(default_bandwidth=1e6)
    table = PiecewiseLinearForecaster(default_bandwidth=1e6)
    for seconds in (1.0, 1.0, 1.0):
        for forecaster in (ensemble, table):
            forecaster.observe("a", "b", 1_000_000, seconds)
            forecaster.observe("a", "b", 8_000_000, 5 * seconds)
    for size in (500_000, 1_000_000, 4_500_000, 8_000_000, 100_000_000):
        assert ensemble.forecast("a", "b", size) == pytest.approx(table.forecast("a", "b", size))
    assert ensemble.forecast("a", "a", 10) == 0.0
    assert ensemble.forecast("b", "a", 2_000_000) == 2.0  # never measured: default bandwidth
    assert members_in_use(ensemble, [("a", "b")]) == {**dict.fromkeys(MEMBERS, 0), "last": 2}


def test_published_tables_are_adopted_as_they_are() -> None:
    publisher = EnsembleForecaster()
    for seconds in (1.0, 3.0, 1.0, 3.0, 1.0):
        publisher.observe("a", "b", 1 << 20, seconds)
    published = table_from(publisher, "a", ["b"], 100.0)
    receiver = make_forecaster("ensemble", 1e6)
    assert TableFeed(receiver).apply(published)
    assert receiver.forecast("a", "b", 1 << 20) == pytest.approx(
        publisher.forecast("a", "b", 1 << 20)
    )
    with pytest.raises(InvalidInput):
        make_forecaster("oracle", 1e6)
