"""What a moved job used before, and what is left of its limits (gbroker.core.limits)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.limits import MAX_SECONDS, NOTHING, Used, cpu_left, in_all, wall_left
from gbroker.errors import InvalidInput


def test_what_each_site_used_adds_up_move_after_move() -> None:
    used = NOTHING.then(4.0, 1.5).then(3.5, 2.25).then(2.0, 0.25)
    assert used == Used(wall=9.5, cpu=4.0, moves=3)
    assert Used(0.0, 0.0, 0) == NOTHING


def test_the_wall_time_left_is_the_limit_less_what_was_used_and_never_below_nothing() -> None:
    assert wall_left(20.0, Used(12.5, 0.0, 2)) == 7.5
    assert wall_left(20.0, NOTHING) == 20.0
    assert wall_left(20.0, Used(20.0, 0.0, 3)) == 0.0
    assert wall_left(20.0, Used(25.0, 0.0, 3)) == 0.0  # used up: nothing, not minus 5
    assert wall_left(None, Used(25.0, 0.0, 3)) is None  # no limit, none left to count


def test_the_cpu_time_left_is_whole_seconds_rounded_up_and_nothing_once_used_up() -> None:
    assert cpu_left(10, NOTHING) == 10
    assert cpu_left(10, Used(0.0, 6.0, 2)) == 4
    assert cpu_left(10, Used(0.0, 6.2, 2)) == 4  # 3.8 s left: RLIMIT_CPU counts whole seconds
    assert cpu_left(10, Used(0.0, 9.9, 2)) == 1
    assert cpu_left(10, Used(0.0, 10.0, 2)) == 0
    assert cpu_left(10, Used(0.0, 12.5, 2)) == 0
    assert cpu_left(None, Used(0.0, 12.5, 2)) is None


@given(
    limit=st.integers(1, 10**6),
    legs=st.lists(st.tuples(st.floats(0, 1e5), st.floats(0, 1e5)), max_size=8),
)
def test_a_moved_job_never_gets_less_than_is_left_nor_a_second_more(
    limit: int, legs: list[tuple[float, float]]
) -> None:
    used = NOTHING
    for wall, cpu in legs:
        used = used.then(wall, cpu)
    assert used.moves == len(legs)
    left = limit - used.cpu
    rlimit = cpu_left(limit, used)
    assert rlimit is not None
    if left <= 0:
        assert rlimit == 0
    else:
        assert left <= rlimit < left + 1
    assert wall_left(float(limit), used) == max(0.0, limit - used.wall)


def test_a_used_travels_as_a_map_and_comes_back_the_same() -> None:
    used = Used(12.345, 6.5, 2)
    assert used.as_mapping() == {"wall": 12.345, "cpu": 6.5, "moves": 2}
    assert Used.from_mapping(used.as_mapping()) == used
    assert Used.from_mapping({"wall": 1, "cpu": 0, "moves": 1}) == Used(1.0, 0.0, 1)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ([1, 2, 3], "used"),
        ({"wall": 1.0, "cpu": 1.0}, "used"),
        ({"wall": 1.0, "cpu": 1.0, "moves": 1, "more": 0}, "used"),
        ({"wall": -1.0, "cpu": 1.0, "moves": 1}, "used.wall"),
        ({"wall": math.nan, "cpu": 1.0, "moves": 1}, "used.wall"),
        ({"wall": 1.0, "cpu": math.inf, "moves": 1}, "used.cpu"),
        ({"wall": 1.0, "cpu": MAX_SECONDS * 2, "moves": 1}, "used.cpu"),
        ({"wall": 1.0, "cpu": "1", "moves": 1}, "used.cpu"),
        ({"wall": True, "cpu": 1.0, "moves": 1}, "used.wall"),
        ({"wall": 1.0, "cpu": 1.0, "moves": -1}, "used.moves"),
        ({"wall": 1.0, "cpu": 1.0, "moves": 1.0}, "used.moves"),
        ({"wall": 1.0, "cpu": 1.0, "moves": 2**31}, "used.moves"),
    ],
)
def test_a_bad_used_is_refused_naming_its_field(value: object, field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Used.from_mapping(value)
    assert refused.value.field == field


def test_one_sites_run_is_checked_too() -> None:
    with pytest.raises(InvalidInput, match=r"ran\.wall"):
        NOTHING.then(-0.5, 1.0)
    with pytest.raises(InvalidInput, match=r"ran\.cpu"):
        NOTHING.then(1.0, math.nan)


def test_what_was_used_is_said_in_all_with_the_moves() -> None:
    assert in_all(12.34, 7.7, 3) == "20.0 s used, over 3 moves"
    assert in_all(4.0, 0.0, 1) == "4.0 s used, over 1 move"
