"""The shapes of a description's values that its checks, readers and writers share: whole
numbers and numbers as JSON/YAML gives them (a bool is neither), numbers as JSDL writes them,
environment variable names."""

from __future__ import annotations

import re

__all__ = ["ENV_NAME", "format_number", "is_int", "is_number"]

# Names of environment variables a job may set.
ENV_NAME = re.compile(r"[^=\s]+")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_number(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))
