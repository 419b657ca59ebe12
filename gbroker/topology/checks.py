"""Checks of a topology's values, shared by its dataclasses, its generators and its YAML loader:
each returns the value or raises :class:`~gbroker.errors.InvalidInput` naming the field."""

from __future__ import annotations

import math
from typing import TypeGuard

from gbroker.errors import InvalidInput


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def positive(field: str, value: object, what: str) -> float:
    if not is_number(value) or not (math.isfinite(value) and value > 0):
        raise InvalidInput(field, f"{what} > 0", value)
    return float(value)


def non_negative(field: str, value: object, what: str) -> float:
    if not is_number(value) or not (math.isfinite(value) and value >= 0):
        raise InvalidInput(field, f"{what} >= 0", value)
    return float(value)


def share_of(field: str, value: object) -> float:
    """A share of a core: 0 < share <= 1."""
    if not is_number(value) or not (math.isfinite(value) and 0 < value <= 1):
        raise InvalidInput(field, "a share of each core, 0 < share <= 1", value)
    return float(value)


def name_of(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "a non-empty string", value)
    return value


def endpoint(field: str, value: object) -> str | None:
    if value is None:
        return None
    return name_of(field, value)


def cores_of(field: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise InvalidInput(field, "an integer >= 1", value)
    return value


def optional_bandwidth(field: str, value: object) -> float | None:
    return None if value is None else positive(field, value, "a bandwidth in bytes/s")
