"""Versioned MessagePack messages between brokers (ARCHITECTURE §5).

Theory of operation. Every message is one MessagePack map: an envelope ``{"v": 1, "kind": ...}``
plus the fields of its kind. A schema per kind lists the fields it requires and the type of each.
Decoding is strict about what it needs and lenient about the rest, so that sites running
different releases can talk to each other:

- a field the schema does not know is ignored (a newer peer may send more);
- a required field that is missing or of the wrong type is rejected, naming the field and what
  was expected;
- a version other than :data:`WIRE_VERSION` is rejected (a breaking change bumps ``v``);
- anything that is not a MessagePack map, or is larger than :data:`MAX_MESSAGE_BYTES`, is
  rejected before it is looked at.

Every rejection is a :class:`WireError`, an :class:`~gbroker.errors.InvalidInput`: the bytes came
from a peer, so it is the peer's fault, and a receiver logs it and drops the message. Nothing a
peer sends can make :func:`decode` raise anything else.

Two kinds exist: ``site-state`` (a DCSMon report, :func:`encode_site_state`) and
``netmon-table`` (a NetMon forecast table, :func:`encode_netmon_table`). A table's ``links`` is a
map from each measured target site to ``{"sizes": [bytes, ...], "seconds": [s, ...]}``; its
entries are checked one by one, and an error names the entry, e.g.
``netmon-table.links[b].sizes[1]``.

The ``alive`` topic carries no MessagePack: its payload is the plain string ``online`` or
``offline`` (:func:`encode_alive`, :func:`decode_alive`), which is what an MQTT last-will holds
and what an operator reads with ``mosquitto_sub``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from gbroker.core.model import Observation, SiteState
from gbroker.errors import InvalidInput, Shown, shown
from netmon.table import ForecastTable, LinkPoints

__all__ = [
    "MAX_MESSAGE_BYTES",
    "NETMON_TABLE",
    "OFFLINE",
    "ONLINE",
    "SCHEMAS",
    "SITE_STATE",
    "WIRE_VERSION",
    "FieldSpec",
    "WireError",
    "decode",
    "decode_alive",
    "decode_netmon_table",
    "decode_site_state",
    "encode",
    "encode_alive",
    "encode_netmon_table",
    "encode_site_state",
]

WIRE_VERSION: Final = 1
"""The version this code speaks; carried in every message as ``v``."""

MAX_MESSAGE_BYTES: Final = 64 * 1024
"""The largest message accepted or produced, in bytes."""

SITE_STATE: Final = "site-state"
"""The kind of a DCSMon report: a site's (n_j, c_j, q_j, s_j) and when it was sampled."""

NETMON_TABLE: Final = "netmon-table"
"""The kind of a NetMon report: a site's measured outgoing links (sizes, smoothed seconds)."""

ONLINE: Final = b"online"
OFFLINE: Final = b"offline"

_VERSION_FIELD: Final = "v"
_KIND_FIELD: Final = "kind"


class WireError(InvalidInput):
    """A message from a peer that cannot be read: which field, what was expected, what came."""


_NIL: Final = Shown("nil")


def _shown(value: object) -> object:
    """What an error shows of ``value``: ``nil`` for a MessagePack nil (None means "no value" to
    :class:`InvalidInput`); InvalidInput bounds everything else (:func:`gbroker.errors.shown`)."""
    return _NIL if value is None else value


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a message kind: a check on its value and the words for what it expects."""

    expected: str
    accepts: Callable[[object], bool]


def _is_name(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _is_count(value: object) -> bool:
    # bool is an int in Python, never on the wire.
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_NAME = FieldSpec("a non-empty string", _is_name)
_COUNT = FieldSpec("an integer >= 0", _is_count)
_TIME = FieldSpec("a finite number (seconds)", _is_time)
_LINKS = FieldSpec(
    "a map of target site -> {sizes, seconds}", lambda value: isinstance(value, dict)
)

SCHEMAS: Final[Mapping[str, Mapping[str, FieldSpec]]] = {
    SITE_STATE: {
        "site": _NAME,
        "total_cores": _COUNT,
        "free_cores": _COUNT,
        "queued": _COUNT,
        "running": _COUNT,
        "observed_at": _TIME,
    },
    NETMON_TABLE: {
        "site": _NAME,
        "measured_at": _TIME,
        "links": _LINKS,
    },
}
"""The required fields of each message kind, in the order they are written."""


def _schema(kind: str) -> Mapping[str, FieldSpec]:
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise WireError("kind", f"one of {sorted(SCHEMAS)}", _shown(kind))
    return schema


def _checked(
    kind: str, schema: Mapping[str, FieldSpec], fields: Mapping[Any, Any]
) -> dict[str, Any]:
    """The schema's fields of ``fields``, each checked; unknown fields are left out."""
    checked: dict[str, Any] = {}
    for name, spec in schema.items():
        if name not in fields:
            raise WireError(f"{kind}.{name}", f"{spec.expected} (required field is missing)")
        value = fields[name]
        if not spec.accepts(value):
            raise WireError(f"{kind}.{name}", spec.expected, _shown(value))
        checked[name] = value
    return checked


def encode(kind: str, fields: Mapping[str, Any]) -> bytes:
    """A message of ``kind`` carrying ``fields``, checked against the kind's schema.

    Fields that the schema does not name are sent too (a newer sender may add some; older
    receivers ignore them). Raises :class:`WireError` if a required field is missing or of the
    wrong type, or if the message would exceed :data:`MAX_MESSAGE_BYTES`.
    """
    schema = _schema(kind)
    _checked(kind, schema, fields)
    for name in (_VERSION_FIELD, _KIND_FIELD):
        if name in fields:
            raise WireError(f"{kind}.{name}", "no such field (the envelope sets it)", name)
    message = {_VERSION_FIELD: WIRE_VERSION, _KIND_FIELD: kind, **fields}
    try:
        data = msgpack.packb(message, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(kind, "fields that MessagePack can carry", Shown(str(exc))) from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(kind, f"at most {MAX_MESSAGE_BYTES} bytes encoded", Shown(f"{len(data)}"))
    return bytes(data)


def decode(data: bytes | bytearray | memoryview, kind: str) -> dict[str, Any]:
    """The fields of a message of ``kind``: exactly the schema's fields, each checked.

    Raises :class:`WireError` (and nothing else) for anything a peer may send that is not such a
    message: oversized, not MessagePack, not a map, an unsupported version, another kind, a
    missing or mistyped field.
    """
    schema = _schema(kind)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(kind, "bytes", Shown(f"<{type(data).__name__}>"))
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(kind, f"at most {MAX_MESSAGE_BYTES} bytes", Shown(f"{len(data)} bytes"))
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers msgpack's ExtraData, FormatError, StackError and bad UTF-8.
        raise WireError(kind, "a MessagePack message", Shown(f"<{exc}>")) from exc
    if not isinstance(message, dict):
        raise WireError(kind, "a MessagePack map", _shown(message))
    if _VERSION_FIELD not in message:
        raise WireError(f"{kind}.{_VERSION_FIELD}", "the protocol version (field is missing)")
    version = message[_VERSION_FIELD]
    if not _is_count(version) or version != WIRE_VERSION:
        raise WireError(f"{kind}.{_VERSION_FIELD}", f"version {WIRE_VERSION}", _shown(version))
    found_kind = message.get(_KIND_FIELD)
    if found_kind != kind:
        raise WireError(f"{kind}.{_KIND_FIELD}", repr(kind), _shown(found_kind))
    return _checked(kind, schema, message)


def encode_site_state(site: str, observation: Observation) -> bytes:
    """A ``site-state`` message: ``site``'s state as sampled at ``observation.observed_at``."""
    state = observation.state
    return encode(
        SITE_STATE,
        {
            "site": site,
            "total_cores": state.total_cores,
            "free_cores": state.free_cores,
            "queued": state.queued,
            "running": state.running,
            "observed_at": observation.observed_at,
        },
    )


def decode_site_state(data: bytes | bytearray | memoryview) -> tuple[str, Observation]:
    """The site and observation in a ``site-state`` message; a :class:`WireError` if invalid.

    Beyond the types, the state itself must be consistent (e.g. free_cores <= total_cores).
    """
    fields = decode(data, SITE_STATE)
    try:
        state = SiteState(
            total_cores=fields["total_cores"],
            free_cores=fields["free_cores"],
            queued=fields["queued"],
            running=fields["running"],
        )
    except InvalidInput as exc:
        # SiteState names its fields "site.<name>"; say which message they came in.
        name = exc.field.removeprefix("site.")
        raise WireError(f"{SITE_STATE}.{name}", exc.expected, exc.found) from exc
    return fields["site"], Observation(state, float(fields["observed_at"]))


def encode_alive(online: bool) -> bytes:
    """The payload of a site's ``alive`` topic."""
    return ONLINE if online else OFFLINE


def decode_alive(data: bytes | bytearray | memoryview) -> bool:
    """True for ``online``, False for ``offline``; a :class:`WireError` for anything else."""
    payload = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else None
    if payload == ONLINE:
        return True
    if payload == OFFLINE:
        return False
    raise WireError(
        "alive", "'online' or 'offline'", _shown(payload if payload is not None else data)
    )


def encode_netmon_table(table: ForecastTable) -> bytes:
    """A ``netmon-table`` message: ``table.site``'s measured links as of ``table.measured_at``."""
    links = {
        target: {"sizes": list(points.sizes), "seconds": list(points.seconds)}
        for target, points in table.links.items()
    }
    return encode(
        NETMON_TABLE, {"site": table.site, "measured_at": table.measured_at, "links": links}
    )


def _link_points(target: object, entry: object) -> LinkPoints:
    """One entry of a table's ``links``, checked; a :class:`WireError` names what is wrong."""
    where = f"{NETMON_TABLE}.links[{shown(target)}]"
    if not isinstance(target, str) or not target:
        raise WireError(f"{NETMON_TABLE}.links", "non-empty site names as keys", _shown(target))
    if not isinstance(entry, dict):
        raise WireError(where, "a map with sizes and seconds", _shown(entry))
    lists: dict[str, tuple[Any, ...]] = {}
    for name, expected in (("sizes", "a list of sizes in bytes"), ("seconds", "a list of seconds")):
        if name not in entry:
            raise WireError(f"{where}.{name}", f"{expected} (required field is missing)")
        if not isinstance(entry[name], list):
            raise WireError(f"{where}.{name}", expected, _shown(entry[name]))
        lists[name] = tuple(entry[name])
    try:
        return LinkPoints(lists["sizes"], lists["seconds"])
    except InvalidInput as exc:
        raise WireError(f"{where}.{exc.field}", exc.expected, _shown(exc.found)) from exc


def decode_netmon_table(data: bytes | bytearray | memoryview) -> ForecastTable:
    """The table in a ``netmon-table`` message; a :class:`WireError` if anything is invalid.

    Beyond the types, each link must be consistent: as many times as sizes, sizes strictly
    increasing, times finite and >= 0, and no link from the site to itself.
    """
    fields = decode(data, NETMON_TABLE)
    site = fields["site"]
    links = {target: _link_points(target, entry) for target, entry in fields["links"].items()}
    if site in links:
        raise WireError(f"{NETMON_TABLE}.links[{shown(site)}]", "a site other than the table's")
    return ForecastTable(site, float(fields["measured_at"]), links)
