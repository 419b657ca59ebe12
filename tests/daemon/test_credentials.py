"""Secrets compared as bytes (gbroker.daemon.credentials)."""

from __future__ import annotations

import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.daemon.credentials import same_secret


def test_the_landed_comparison_raised_on_non_ascii() -> None:
    # What server.py's guard does today: a TypeError, hence a 500 for one header.
    with pytest.raises(TypeError):
        hmac.compare_digest("sécret", "secret")


@pytest.mark.parametrize(
    ("presented", "expected", "same"),
    [
        ("secret", "secret", True),
        ("sécret", "secret", False),
        ("sécret", "sécret", True),  # a configured non-ASCII secret works too
        ("", "secret", False),
        (None, "secret", False),
        ("secret\udcff", "secret", False),  # a lone surrogate cannot be encoded
        ("Bearer t", "Bearer t", True),
    ],
)
def test_secrets_are_compared_as_utf8_bytes(
    presented: str | None, expected: str, same: bool
) -> None:
    assert same_secret(presented, expected) is same


@given(st.text(), st.text())
def test_any_header_is_a_match_or_not_never_an_error(presented: str, expected: str) -> None:
    assert same_secret(presented, expected) is (presented == expected)
