"""A job's malleability declaration (``<gbroker:Malleability>``, JSON/YAML ``malleability``) as
its readers and writers share it: its attributes and fields, the declaration made from checked
values, and written back as JSON/YAML data."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, NoReturn

from gbroker.core.malleable import Malleability, SizeRule
from gbroker.errors import InvalidInput

__all__ = [
    "MALLEABILITY_ATTRIBUTES",
    "MALLEABILITY_FIELDS",
    "malleability_from",
    "malleability_to_mapping",
]


MALLEABILITY_ATTRIBUTES = {
    "sizes": "sizes",
    "initiative": "initiative",
    "obligation": "obligation",
    "deadline": "deadline",
    "reconfigurationcost": "reconfiguration_cost",
    "evolving": "evolving",
    "initial": "initial",
}
"""``<gbroker:Malleability>``'s attributes (matched without case) and the fields they set."""


MALLEABILITY_FIELDS = (
    "sizes",
    "initiative",
    "obligation",
    "deadline",
    "reconfiguration_cost",
    "evolving",
    "initial",
)
"""The keys of a malleability declaration, in JSON/YAML (XML: attributes, in camel case)."""


_DEFAULT_MALLEABILITY = Malleability()


def malleability_from(
    values: dict[str, Any], fail: Callable[[str, str, object], NoReturn], path: str
) -> Malleability:
    """A :class:`Malleability` from checked values; its own errors name ``path.field``."""
    try:
        if "sizes" in values:
            values["sizes"] = SizeRule.parse(values["sizes"])
        return Malleability(**values)
    except InvalidInput as exc:
        field_ = exc.field.removeprefix("malleability.")
        fail(f"{path}.{field_}", exc.expected, exc.found)


def malleability_to_mapping(declared: Malleability) -> dict[str, Any]:
    """The declaration's values that differ from the defaults, as JSON/YAML data."""
    out: dict[str, Any] = {}
    for name in MALLEABILITY_FIELDS:
        value = getattr(declared, name)
        if value == getattr(_DEFAULT_MALLEABILITY, name):
            continue
        out[name] = str(value) if isinstance(value, StrEnum | SizeRule) else value
    return out
