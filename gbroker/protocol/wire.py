"""Versioned MessagePack messages between brokers (ARCHITECTURE §5).

Theory of operation. Every message is one MessagePack map: an envelope ``{"v": 1, "kind": ...}``
plus the fields of its kind. A schema per kind lists the fields it requires and the type of each.
Decoding is strict about what it needs and lenient about the rest, so that sites running
different releases can talk to each other:

- a field the schema does not know is ignored (a newer peer may send more);
- a required field that is missing or of the wrong type is rejected, naming the field and what
  was expected (``netmon-table.links[b].sizes[1]``);
- a version other than :data:`WIRE_VERSION` is rejected (a breaking change bumps ``v``);
- anything that is not a MessagePack map, or is larger than :data:`MAX_MESSAGE_BYTES`, is
  rejected before it is looked at.

Every rejection is a :class:`WireError`, an :class:`~gbroker.errors.InvalidInput`: the bytes came
from a peer, so it is the peer's fault, and a receiver logs it and drops the message. Nothing a
peer sends can make :func:`decode` raise anything else.

The same holds for the MQTT kinds (``site-state``, ``netmon-table``) and for the peer API's
messages and answers (:data:`PEER_SCHEMAS`, :data:`PEER_REPLY_SCHEMAS`), which :func:`decode_peer`
also holds to the topology (every site named is one of it, an ``accept`` comes from the job's
owner). Each kind and its fields: docs/DESIGN.md, "Messages between brokers".
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from gbroker.core.limits import MAX_SECONDS as MAX_USED_SECONDS
from gbroker.core.limits import Used
from gbroker.core.model import Observation, SiteState
from gbroker.core.names import JOB_ID, SITE_NAME, job_owner
from gbroker.errors import InvalidInput, Shown, shown
from gbroker.jobs.description import MAX_CORES
from gbroker.jobs.mapping import from_mapping
from netmon.table import ForecastTable, LinkPoints

__all__ = [
    "ACCEPT",
    "CLAIM",
    "EXIT_CODES",
    "KILL",
    "MAX_ERROR_CHARS",
    "MAX_LEASE_SECONDS",
    "MAX_MESSAGE_BYTES",
    "MAX_TIMESTAMP",
    "NETMON_TABLE",
    "OFFLINE",
    "ONLINE",
    "PEER_REPLY_SCHEMAS",
    "PEER_SCHEMAS",
    "PING",
    "REPORT",
    "REPORT_KINDS",
    "SCHEMAS",
    "SITE_STATE",
    "WIRE_VERSION",
    "WITHDRAW",
    "FieldSpec",
    "WireError",
    "decode",
    "decode_alive",
    "decode_netmon_table",
    "decode_peer",
    "decode_peer_reply",
    "decode_site_state",
    "encode",
    "encode_alive",
    "encode_netmon_table",
    "encode_peer",
    "encode_peer_reply",
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
    required: bool = True


def _is_name(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _is_count(value: object) -> bool:
    # bool is an int in Python, never on the wire.
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_fraction(value: object) -> bool:
    """A fraction of a core: 0 < value <= 1 (NaN and infinities fail the comparison)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


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
        # Absent in reports from brokers that predate draining: not draining.
        "draining": FieldSpec(
            "true or false", lambda value: isinstance(value, bool), required=False
        ),
        # Absent when nothing is shrinkable (and from brokers that predate malleability).
        "shrinkable": FieldSpec("an integer >= 0", _is_count, required=False),
        # SD-Policy's mates' cores, for a job that may share; absent when there are none (and
        # from brokers that predate it).
        "shareable": FieldSpec("an integer >= 0", _is_count, required=False),
        # The forecast CPU availability (netmon.cpu); absent when not measured (and from
        # brokers that predate it).
        "cpu": FieldSpec("a fraction of a core, 0 < cpu <= 1", _is_fraction, required=False),
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
            if not spec.required:
                continue
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
    return _pack(kind, {_VERSION_FIELD: WIRE_VERSION, _KIND_FIELD: kind, **fields})


def _pack(kind: str, message: Mapping[str, Any]) -> bytes:
    try:
        data = msgpack.packb(message, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(kind, "fields that MessagePack can carry", Shown(str(exc))) from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(kind, f"at most {MAX_MESSAGE_BYTES} bytes encoded", Shown(f"{len(data)}"))
    return bytes(data)


def _unpack_map(data: object, kind: str) -> dict[Any, Any]:
    """One MessagePack map from a peer, checked for size and shape only."""
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
    return message


def decode(data: bytes | bytearray | memoryview, kind: str) -> dict[str, Any]:
    """The fields of a message of ``kind``: exactly the schema's fields, each checked.

    Raises :class:`WireError` (and nothing else) for anything a peer may send that is not such a
    message: oversized, not MessagePack, not a map, an unsupported version, another kind, a
    missing or mistyped field.
    """
    schema = _schema(kind)
    message = _unpack_map(data, kind)
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
    fields: dict[str, Any] = {
        "site": site,
        "total_cores": state.total_cores,
        "free_cores": state.free_cores,
        "queued": state.queued,
        "running": state.running,
        "observed_at": observation.observed_at,
    }
    if state.draining:  # only then: a site that is not draining sends what it always did
        fields["draining"] = True
    if state.shrinkable:
        fields["shrinkable"] = state.shrinkable
    if state.shareable:
        fields["shareable"] = state.shareable
    if state.cpu is not None:
        fields["cpu"] = state.cpu
    return encode(SITE_STATE, fields)


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
            draining=fields.get("draining", False),
            shrinkable=fields.get("shrinkable", 0),
            shareable=fields.get("shareable", 0),
            cpu=fields.get("cpu"),
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


# --- the peer API (/peer/v1/<kind>) -----------------------------------------------------------

ACCEPT: Final = "accept"
WITHDRAW: Final = "withdraw"
CLAIM: Final = "claim"
REPORT: Final = "report"
KILL: Final = "kill"
PING: Final = "ping"
"""A heartbeat (:mod:`gbroker.core.liveness`): no fields; the answer may carry the site's
state as a ``site-state`` message, so DCSMon's view stays fresh while MQTT is down."""
MIGRATE: Final = "migrate"
"""The owner asks the site that runs a job to move it, running, to another site (``to``)."""
MOVING: Final = "moving"
"""The site a job moves from tells its owner that the job is frozen and its checkpoint
bundle ready (``bundle``, ``size``); asked again until the owner's ``verdict`` is ``release``
(it runs at the target now) or ``resume`` (the move was abandoned)."""
REPORT_KINDS: Final = (
    "queued",
    "started",
    "finished",
    "withdrawable",
    "resized",
    "movable",
    "unmoved",
    "unrestored",
)
"""``withdrawable``: a draining site hands a job waiting there back to its owner.
``movable``: a draining site asks the owner to move a job running there (``gbroker fleet drain
--migrate``). ``unmoved``: the site a job runs at could not checkpoint it (``error``); it runs on
there. ``unrestored``: the target of a move could not restore it (``error``); it never ran
there."""
MOVE_VERDICTS: Final = ("wait", "release", "resume")
"""The owner's answers to ``moving``."""
SHA256_HEX = re.compile(r"[0-9a-f]{64}")

MAX_LEASE_SECONDS: Final = 7 * 86_400.0
"""The longest lease an owner may grant (seconds)."""
MAX_TIMESTAMP: Final = float(2**33)
"""The latest time a peer may name (seconds since the epoch; the year 2242)."""
MAX_ERROR_CHARS: Final = 8192
"""The longest error text a report may carry."""
EXIT_CODES: Final = range(-(2**31), 2**31)
"""Exit codes a report may carry: a C int (negative: killed by that signal)."""


def _is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def _is_site(value: object) -> bool:
    return isinstance(value, str) and SITE_NAME.fullmatch(value) is not None


def _is_timestamp(value: object) -> bool:
    return _is_time(value) and 0 <= value <= MAX_TIMESTAMP  # type: ignore[operator]


def _is_lease(value: object) -> bool:
    return _is_time(value) and 0 < value <= MAX_LEASE_SECONDS  # type: ignore[operator]


def _is_exit_code(value: object) -> bool:
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and value in EXIT_CODES
    )


def _is_error_text(value: object) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= MAX_ERROR_CHARS)


_JOB_ID = FieldSpec("a job id <site>.<digits>", _is_job_id)
MAX_USER_CHARS: Final = 256


def _is_user(value: object) -> bool:
    return value is None or (
        isinstance(value, str)
        and 0 < len(value) <= MAX_USER_CHARS
        and all(33 <= ord(c) < 127 for c in value)
    )


_SITE = FieldSpec("a site name (letters, digits, '-', '_'; at most 64)", _is_site)
MAX_RANKS: Final = 256
"""The most components of a co-allocated job a rank table lists."""


def _is_endpoint(value: object) -> bool:
    if not isinstance(value, dict) or set(value) != {"host", "port"}:
        return False
    host, port = value["host"], value["port"]
    return (
        isinstance(host, str)
        and 0 < len(host) <= 253
        and all(c.isalnum() or c in ".-:" for c in host)
        and isinstance(port, int)
        and not isinstance(port, bool)
        and 0 < port < 65536
    )


_RANK_KEYS = {"rank", "site", "host", "port", "cores"}


def _is_rank_table(value: object) -> bool:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_RANKS:
        return False
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or not _RANK_KEYS <= set(entry) <= _RANK_KEYS | {"units"}:
            return False
        endpoint = {"host": entry["host"], "port": entry["port"]}
        if entry["rank"] != i or not _is_site(entry["site"]) or not _is_endpoint(endpoint):
            return False
        for key in ("cores", "units"):
            n = entry.get(key, 1)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                return False
    return True


_ENDPOINT = FieldSpec("{host, port}: where a component listens", _is_endpoint, required=False)
_RANKS = FieldSpec(
    f"a rank table: up to {MAX_RANKS} entries {{rank, site, host, port, cores[, units]}}",
    _is_rank_table,
    required=False,
)
_BOOL = FieldSpec("true or false", lambda value: isinstance(value, bool))
MAX_BUNDLE_BYTES: Final = 1 << 40
"""The largest checkpoint bundle a move may carry (1 TiB)."""
_BUNDLE = FieldSpec(
    "the sha256 of a checkpoint bundle (64 lowercase hex digits)",
    lambda value: isinstance(value, str) and SHA256_HEX.fullmatch(value) is not None,
    required=False,
)
_BUNDLE_SIZE = FieldSpec(
    f"bytes, an integer in [0, {MAX_BUNDLE_BYTES}]",
    lambda value: type(value) is int and 0 <= value <= MAX_BUNDLE_BYTES,
    required=False,
)


def _is_used(value: object) -> bool:
    try:
        Used.from_mapping(value)
    except InvalidInput:
        return False
    return True


_USED = FieldSpec(
    f"what a moved job used before: {{wall, cpu: seconds in [0, {MAX_USED_SECONDS:g}], "
    "moves: an integer >= 0}",
    _is_used,
    required=False,
)

PEER_SCHEMAS: Final[Mapping[str, Mapping[str, FieldSpec]]] = {
    ACCEPT: {
        "id": _JOB_ID,
        "owner": _SITE,
        "replica": _BOOL,
        "lease": FieldSpec(f"seconds in (0, {MAX_LEASE_SECONDS:g}]", _is_lease),
        "description": FieldSpec(
            "a job description (a map)", lambda value: isinstance(value, dict)
        ),
        # Who submitted it: the site runs it as that user's account (gbroker.site.identity).
        "submitter": FieldSpec(
            f"nil or a user name (1-{MAX_USER_CHARS} printable characters, no spaces)",
            _is_user,
            required=False,
        ),
        # A running job moving here: restore it from the bundle of its checkpoint, which the
        # site it moves from serves (/peer/v1/bundle/<id>), instead of starting it.
        "restore_from": FieldSpec(_SITE.expected, _is_site, required=False),
        "bundle": _BUNDLE,
        "bundle_size": _BUNDLE_SIZE,
        # What it used at the sites it ran at before: it gets what is left of its limits.
        "used": _USED,
    },
    WITHDRAW: {"id": _JOB_ID},
    # A co-allocated job's component claims with where it will listen and its cores.
    CLAIM: {
        "id": _JOB_ID,
        "site": _SITE,
        "endpoint": _ENDPOINT,
        "cores": FieldSpec("an integer >= 1", lambda v: _is_count(v) and v != 0, required=False),
    },
    REPORT: {
        "id": _JOB_ID,
        "site": _SITE,
        "kind": FieldSpec(" or ".join(REPORT_KINDS), lambda value: value in REPORT_KINDS),
        "at": FieldSpec(f"a time in [0, {MAX_TIMESTAMP:g}] (seconds)", _is_timestamp),
        # A finished report may repeat when the job started (the supervisor's record), so an
        # owner that never heard the start still knows it.
        "started_at": FieldSpec(
            f"a time in [0, {MAX_TIMESTAMP:g}] (seconds)", _is_timestamp, required=False
        ),
        "ok": FieldSpec("true or false", lambda value: isinstance(value, bool), required=False),
        "exit_code": FieldSpec(
            f"nil or an integer in [{EXIT_CODES.start}, {EXIT_CODES.stop})",
            _is_exit_code,
            required=False,
        ),
        "error": FieldSpec(
            f"nil or text of at most {MAX_ERROR_CHARS} characters", _is_error_text, required=False
        ),
        # The cores a job started on (started) or holds now (resized: a malleable job).
        "cores": FieldSpec(
            f"cores, an integer in [1, {MAX_CORES}]",
            lambda value: type(value) is int and 1 <= value <= MAX_CORES,
            required=False,
        ),
    },
    KILL: {"id": _JOB_ID},
    PING: {},
    MIGRATE: {"id": _JOB_ID, "to": _SITE},
    MOVING: {
        "id": _JOB_ID,
        "site": _SITE,
        "to": _SITE,
        "bundle": dataclasses.replace(_BUNDLE, required=True),
        "bundle_size": dataclasses.replace(_BUNDLE_SIZE, required=True),
        # What the job used until it was frozen, here and at the sites it ran at before (absent
        # from brokers that predate it: nothing).
        "used": _USED,
    },
}
"""The fields of each peer message; the route is ``/peer/v1/<kind>``."""

PEER_REPLY_SCHEMAS: Final[Mapping[str, Mapping[str, FieldSpec]]] = {
    ACCEPT: {"ok": _BOOL},
    WITHDRAW: {"withdrawn": _BOOL},
    CLAIM: {
        "granted": _BOOL,
        "wait": FieldSpec(_BOOL.expected, _BOOL.accepts, required=False),
        "requeue": FieldSpec(_BOOL.expected, _BOOL.accepts, required=False),
        "ranks": _RANKS,
        "key": FieldSpec(
            "a co-allocated job's key: 64 hex digits",
            lambda v: (
                isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
            ),
            required=False,
        ),
    },
    REPORT: {"ok": _BOOL},
    KILL: {"ok": _BOOL},
    MIGRATE: {"ok": _BOOL},
    MOVING: {
        "verdict": FieldSpec(" or ".join(MOVE_VERDICTS), lambda value: value in MOVE_VERDICTS)
    },
    PING: {
        "ok": _BOOL,
        "state": FieldSpec(
            "a site-state message (at most 1024 bytes)",
            lambda value: isinstance(value, bytes) and len(value) <= 1024,
            required=False,
        ),
    },
}
"""The fields of the answer to each peer message."""


def _peer_schema(kind: object, schemas: Mapping[str, Mapping[str, FieldSpec]]) -> str:
    if not isinstance(kind, str) or kind not in schemas:
        raise WireError("peer message", f"one of {', '.join(schemas)}", _shown(kind))
    return kind


def _peer_version(kind: str, message: Mapping[Any, Any]) -> None:
    """A peer message may carry the version ``v``; if it does, it must be ours."""
    if _VERSION_FIELD in message and (
        not _is_count(message[_VERSION_FIELD]) or message[_VERSION_FIELD] != WIRE_VERSION
    ):
        raise WireError(
            f"{kind}.{_VERSION_FIELD}", f"version {WIRE_VERSION}", _shown(message[_VERSION_FIELD])
        )


def _known(field: str, site: str, known_sites: Collection[str]) -> None:
    if site not in known_sites:
        raise WireError(field, "a site of the topology", site)


def decode_peer(
    kind: str, data: bytes | bytearray | memoryview, known_sites: Collection[str]
) -> dict[str, Any]:
    """The fields of a peer message of ``kind`` (``accept``, ``withdraw``, ``claim``,
    ``report``, ``kill``, ``ping``): exactly its schema's fields that are present, each checked.

    Beyond the types and ranges of :data:`PEER_SCHEMAS`: every site named (``owner``, ``site``
    and the owner part of ``id``) is one of ``known_sites``; an ``accept`` comes from the job's
    owner (``owner`` is the site in ``id``) and its ``description`` is a valid job description;
    a ``finished`` report says whether the job succeeded (``ok``). The version ``v`` is
    optional, and checked when present.

    Raises :class:`WireError` (and nothing else) for anything else a peer may send.
    """
    kind = _peer_schema(kind, PEER_SCHEMAS)
    message = _unpack_map(data, kind)
    _peer_version(kind, message)
    fields = _checked(kind, PEER_SCHEMAS[kind], message)
    if kind == PING:
        return fields
    owner = job_owner(fields["id"])
    _known(f"{kind}.id", owner, known_sites)
    for name in ("owner", "site", "to", "restore_from"):
        if name in fields:
            _known(f"{kind}.{name}", fields[name], known_sites)
    if kind == ACCEPT:
        if fields["owner"] != owner:
            raise WireError(
                f"{kind}.owner", f"the owner of {fields['id']} ({owner})", fields["owner"]
            )
        try:
            from_mapping(fields["description"], document="")
        except InvalidInput as exc:
            where = exc.field.removeprefix(": ")
            raise WireError(f"{kind}.description.{where}", exc.expected, exc.found) from exc
    if kind == REPORT and fields["kind"] == "finished" and "ok" not in fields:
        raise WireError(f"{kind}.ok", "true or false for a finished job (field is missing)")
    if kind == ACCEPT and ("restore_from" in fields) != (
        "bundle" in fields and "bundle_size" in fields
    ):
        raise WireError(f"{kind}.bundle", "restore_from, bundle and bundle_size together, or none")
    if kind == ACCEPT and "used" in fields and "restore_from" not in fields:
        raise WireError(f"{kind}.used", "what a moving job used, only with restore_from")
    if kind == REPORT and fields["kind"] == "resized" and "cores" not in fields:
        raise WireError(f"{kind}.cores", "the cores a resized job holds (field is missing)")
    return fields


def encode_peer(kind: str, fields: Mapping[str, Any]) -> bytes:
    """A peer message of ``kind`` with its version ``v``, checked against :data:`PEER_SCHEMAS`
    (the sites and the description are the receiver's to check)."""
    kind = _peer_schema(kind, PEER_SCHEMAS)
    _checked(kind, PEER_SCHEMAS[kind], fields)
    if _VERSION_FIELD in fields:
        raise WireError(f"{kind}.{_VERSION_FIELD}", "no such field (encode_peer sets it)")
    return _pack(kind, {_VERSION_FIELD: WIRE_VERSION, **fields})


def decode_peer_reply(kind: str, data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The answer to a peer message of ``kind``, checked (:data:`PEER_REPLY_SCHEMAS`)."""
    kind = _peer_schema(kind, PEER_REPLY_SCHEMAS)
    return _checked(f"{kind}-reply", PEER_REPLY_SCHEMAS[kind], _unpack_map(data, kind))


def encode_peer_reply(kind: str, fields: Mapping[str, Any]) -> bytes:
    """The answer to a peer message of ``kind``, checked (:data:`PEER_REPLY_SCHEMAS`)."""
    kind = _peer_schema(kind, PEER_REPLY_SCHEMAS)
    _checked(f"{kind}-reply", PEER_REPLY_SCHEMAS[kind], fields)
    return _pack(f"{kind}-reply", dict(fields))
