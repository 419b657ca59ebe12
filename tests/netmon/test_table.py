"""NetMon forecast tables (netmon.table): validation, extraction, and how a broker takes them in."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gbroker.errors import InvalidInput
from netmon.forecast import PiecewiseLinearForecaster
from netmon.table import ForecastTable, LinkPoints, TableFeed, table_from

MiB = 1 << 20


def test_link_points_hold_sizes_and_seconds() -> None:
    points = LinkPoints((MiB, 8 * MiB), (0.01, 0.07))
    assert points.sizes == (MiB, 8 * MiB)
    assert points.seconds == (0.01, 0.07)


@pytest.mark.parametrize(
    ("sizes", "seconds", "field", "expected"),
    [
        ((), (), "sizes", "a non-empty list"),
        ((1, 2), (0.1,), "seconds", "one time per size (2 numbers)"),
        ((0,), (0.1,), "sizes[0]", "a size in bytes > 0"),
        ((5, 5), (0.1, 0.2), "sizes[1]", "a size in bytes > 5 (sizes strictly increase)"),
        ((5, 3), (0.1, 0.2), "sizes[1]", "> 5"),
        ((True,), (0.1,), "sizes[0]", "a size in bytes"),
        ((1.5,), (0.1,), "sizes[0]", "a size in bytes"),
        ((1, 2), (0.1, -0.1), "seconds[1]", "a finite number of seconds >= 0"),
        ((1,), (math.inf,), "seconds[0]", "finite"),
        ((1,), (math.nan,), "seconds[0]", "finite"),
        ((1,), ("0.1",), "seconds[0]", "finite"),
    ],
)
def test_bad_link_points_name_the_field(
    sizes: tuple[Any, ...], seconds: tuple[Any, ...], field: str, expected: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        LinkPoints(sizes, seconds)
    assert info.value.field == field
    assert expected in info.value.expected


def test_a_table_is_read_only_and_checks_its_links() -> None:
    links = {"b": LinkPoints((1,), (0.5,))}
    table = ForecastTable("a", 10.0, links)
    links["c"] = LinkPoints((1,), (0.5,))
    assert list(table.links) == ["b"]  # copied
    with pytest.raises(TypeError):
        table.links["c"] = LinkPoints((1,), (0.5,))  # type: ignore[index]
    with pytest.raises(InvalidInput, match=r"links\[a\]: expected a site other than 'a'"):
        ForecastTable("a", 10.0, {"a": LinkPoints((1,), (0.5,))})
    with pytest.raises(InvalidInput, match="measured_at"):
        ForecastTable("a", math.nan, {})
    with pytest.raises(InvalidInput, match="site"):
        ForecastTable("", 1.0, {})


def test_table_from_takes_the_sites_measured_links_only() -> None:
    forecaster = PiecewiseLinearForecaster(100e6)
    forecaster.observe("a", "b", 8 * MiB, 0.08)
    forecaster.observe("a", "b", MiB, 0.02)
    forecaster.observe("b", "a", MiB, 0.5)  # another site's link
    forecaster.observe("a", "z", MiB, 0.5)  # not among the targets asked for
    table = table_from(forecaster, "a", ["c", "b"], 42.0)
    assert table.site == "a"
    assert table.measured_at == 42.0
    assert dict(table.links) == {"b": LinkPoints((MiB, 8 * MiB), (0.02, 0.08))}


def test_table_feed_makes_the_forecaster_answer_from_the_table() -> None:
    forecaster = PiecewiseLinearForecaster(100e6)
    feed = TableFeed(forecaster)
    default = forecaster.forecast("b", "a", 2 * MiB)
    assert default == pytest.approx(2 * MiB / 100e6)
    table = ForecastTable("b", 5.0, {"a": LinkPoints((MiB, 3 * MiB), (1.0, 2.0))})
    assert feed.apply(table)
    assert feed.measured_at("b") == 5.0
    assert forecaster.forecast("b", "a", 2 * MiB) == pytest.approx(1.5)  # interpolated
    assert forecaster.forecast("a", "b", 2 * MiB) == default  # the other direction: unknown


def test_table_feed_keeps_the_newest_table_per_site() -> None:
    forecaster = PiecewiseLinearForecaster(100e6)
    feed = TableFeed(forecaster)
    newer = ForecastTable("b", 9.0, {"a": LinkPoints((MiB,), (0.3,))})
    older = ForecastTable("b", 8.0, {"a": LinkPoints((MiB,), (7.0,))})
    assert feed.apply(newer)
    assert not feed.apply(older)
    assert not feed.apply(newer)  # a retained message delivered again
    assert forecaster.forecast("b", "a", MiB) == pytest.approx(0.3)
    # Another site's tables are independent of b's.
    assert feed.apply(ForecastTable("c", 1.0, {"a": LinkPoints((MiB,), (0.9,))}))
    assert forecaster.forecast("c", "a", MiB) == pytest.approx(0.9)


def test_table_feed_ignores_the_sites_it_is_told_to() -> None:
    forecaster = PiecewiseLinearForecaster(100e6)
    feed = TableFeed(forecaster, ignore=["a"])
    assert not feed.apply(ForecastTable("a", 1.0, {"b": LinkPoints((MiB,), (5.0,))}))
    assert forecaster.table("a", "b") is None
    assert feed.measured_at("a") is None
