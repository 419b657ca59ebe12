"""Errors stay small: what InvalidInput keeps and prints of a bad value."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gbroker.errors import SNIPPET_CHARS, InvalidInput, Shown, shown


@pytest.mark.parametrize("value", [None, 0, -3, 2.5, True, "short", b"raw", ["A=1"], {"k": (1, 2)}])
def test_small_values_are_kept_as_they_are(value: object) -> None:
    assert shown(value) is value
    if value is not None:
        assert InvalidInput("f", "x", value).found is value


def test_a_long_string_is_quoted_in_part_with_its_length() -> None:
    err = InvalidInput("f", "a name", "x" * 1_000_000)
    assert isinstance(err.found, Shown)
    assert str(err).startswith("f: expected a name, got 'xxx")
    assert "..." in str(err)
    assert str(err).endswith("' (str of length 1000000)")
    assert len(str(err)) < 200


def test_a_shared_structure_with_an_astronomical_repr_is_shown_quickly() -> None:
    value: list[Any] = ["lol"] * 9
    for _ in range(60):  # 9**60 leaves, a few hundred objects
        value = [value] * 9
    began = time.perf_counter()
    message = str(InvalidInput("f", "a list of strings", value))
    assert time.perf_counter() - began < 0.1
    assert len(message) < 200
    assert message.endswith("(list of length 9)")


def test_an_integer_too_long_to_print_is_shown_by_its_size() -> None:
    err = InvalidInput("count", "an integer from 1 to 10", 10**100_000)
    assert str(err) == "count: expected an integer from 1 to 10, got <int of 332193 bits>"


def test_a_value_whose_repr_raises_is_still_an_invalid_input() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert str(InvalidInput("f", "x", Hostile())).startswith("f: expected x, got <Hostile")


def test_field_and_expected_are_clipped() -> None:
    err = InvalidInput("k" * 10_000, "e" * 10_000, "v")
    assert len(err.field) == 200
    assert len(err.expected) == 1000
    assert len(str(err)) < 1300


def test_a_shown_value_passes_through_unchanged() -> None:
    first = InvalidInput("a", "x", "y" * 1000)
    again = InvalidInput("b.a", first.expected, first.found)
    assert again.found == first.found
    assert str(again).endswith(str(first).split(", got ", 1)[1])


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner),
    max_leaves=200,
)


# Slow generation of these large values on a loaded CI machine is no failure of the code.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_any_value_gives_a_bounded_message(value: object) -> None:
    message = str(InvalidInput("f", "x", value))
    assert len(message) <= len("f: expected x, got ") + SNIPPET_CHARS + 40
