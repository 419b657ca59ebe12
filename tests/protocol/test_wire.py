"""Versioned MessagePack messages (gbroker.protocol.wire): round trips, precise rejections, fuzz."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.model import Observation, SiteState
from gbroker.errors import InvalidInput
from gbroker.protocol import wire
from gbroker.protocol.wire import (
    MAX_MESSAGE_BYTES,
    SITE_STATE,
    WireError,
    decode,
    decode_alive,
    decode_site_state,
    encode,
    encode_alive,
    encode_site_state,
)
from netmon.table import ForecastTable, LinkPoints

FIELDS = ("site", "total_cores", "free_cores", "queued", "running", "observed_at")


def valid_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "site": "s1",
        "total_cores": 64,
        "free_cores": 16,
        "queued": 3,
        "running": 5,
        "observed_at": 1234.5,
    }
    fields.update(changes)
    return fields


def raw(message: object) -> bytes:
    """Bytes as a peer might send them, bypassing our encoder's checks."""
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def envelope(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "kind": SITE_STATE, **fields}


# --- strategies ---------------------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=2**63 - 1)
times = st.floats(allow_nan=False, allow_infinity=False)
site_names = st.text(min_size=1, max_size=30)


@st.composite
def observations(draw: st.DrawFn) -> Observation:
    total = draw(st.integers(min_value=1, max_value=2**63 - 1))
    free = draw(st.integers(min_value=0, max_value=total))
    shrinkable = draw(st.integers(min_value=0, max_value=total - free))
    shareable = draw(st.integers(min_value=0, max_value=total - free - shrinkable))
    state = SiteState(
        total_cores=total,
        free_cores=free,
        queued=draw(counts),
        running=draw(counts),
        draining=draw(st.booleans()),
        shrinkable=shrinkable,
        shareable=shareable,
        cpu=draw(st.none() | st.floats(min_value=0, max_value=1, exclude_min=True)),
    )
    return Observation(state, draw(times))


# Anything MessagePack can carry: what a confused or hostile peer may send.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)

# Maps that look like site-state messages, with every field possibly missing or wrong.
plausible_messages = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 1, 1, 0, 2, -1, "1", 1.0, None]),
        "kind": st.sampled_from([SITE_STATE, SITE_STATE, "alive", "", None, 7]),
        "site": site_names | msgpack_values,
        "total_cores": counts | msgpack_values,
        "free_cores": counts | msgpack_values,
        "queued": counts | msgpack_values,
        "running": counts | msgpack_values,
        "observed_at": times | msgpack_values,
        "extra": msgpack_values,
    },
)


# --- round trips --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(site=site_names, observation=observations())
def test_site_state_round_trips(site: str, observation: Observation) -> None:
    assert decode_site_state(encode_site_state(site, observation)) == (site, observation)


@settings(max_examples=200, deadline=None)
@given(
    site=site_names,
    observation=observations(),
    extra=st.dictionaries(
        st.text(max_size=12).filter(
            lambda k: k not in (*FIELDS, "v", "kind", "draining", "shrinkable", "shareable", "cpu")
        ),
        msgpack_values,
        max_size=4,
    ),
)
def test_unknown_fields_are_ignored(
    site: str, observation: Observation, extra: dict[str, Any]
) -> None:
    fields = valid_fields(
        site=site,
        total_cores=observation.state.total_cores,
        free_cores=observation.state.free_cores,
        queued=observation.state.queued,
        running=observation.state.running,
        observed_at=observation.observed_at,
    )
    if observation.state.draining:
        fields["draining"] = True
    if observation.state.shrinkable:
        fields["shrinkable"] = observation.state.shrinkable
    if observation.state.shareable:
        fields["shareable"] = observation.state.shareable
    if observation.state.cpu is not None:
        fields["cpu"] = observation.state.cpu
    data = encode(SITE_STATE, {**fields, **extra})
    assert decode(data, SITE_STATE) == fields
    assert decode_site_state(data) == (site, observation)


def test_a_message_is_a_versioned_msgpack_map() -> None:
    message = msgpack.unpackb(encode(SITE_STATE, valid_fields()))
    assert message == envelope(**valid_fields())


def test_integral_times_from_other_encoders_are_accepted() -> None:
    _, observation = decode_site_state(raw(envelope(**valid_fields(observed_at=17))))
    assert observation.observed_at == 17.0
    assert isinstance(observation.observed_at, float)


# --- precise rejections -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIELDS)
def test_a_missing_required_field_is_named(name: str) -> None:
    fields = valid_fields()
    del fields[name]
    with pytest.raises(WireError, match=f"site-state.{name}: .*missing") as caught:
        decode(raw(envelope(**fields)), SITE_STATE)
    assert caught.value.field == f"site-state.{name}"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("site", "", "non-empty string"),
        ("site", 7, "non-empty string"),
        ("total_cores", "64", "integer >= 0"),
        ("total_cores", True, "integer >= 0"),
        ("free_cores", -1, "integer >= 0"),
        ("free_cores", 1.5, "integer >= 0"),
        ("queued", None, "integer >= 0"),
        ("running", [1], "integer >= 0"),
        ("observed_at", "now", "finite number"),
        ("observed_at", float("nan"), "finite number"),
        ("observed_at", float("inf"), "finite number"),
        ("observed_at", False, "finite number"),
    ],
)
def test_a_mistyped_field_is_named_with_what_was_expected(
    name: str, value: object, expected: str
) -> None:
    data = raw(envelope(**valid_fields(**{name: value})))
    with pytest.raises(WireError, match=expected) as caught:
        decode(data, SITE_STATE)
    assert caught.value.field == f"site-state.{name}"


def test_an_inconsistent_state_is_rejected_by_field() -> None:
    data = raw(envelope(**valid_fields(total_cores=4, free_cores=5)))
    decode(data, SITE_STATE)  # well typed...
    with pytest.raises(WireError, match=r"site-state.free_cores: expected between 0 and"):
        decode_site_state(data)  # ...but not a possible state
    with pytest.raises(WireError, match=r"site-state.total_cores"):
        decode_site_state(raw(envelope(**valid_fields(total_cores=0, free_cores=0))))
    busy = valid_fields(total_cores=8, free_cores=5, shrinkable=4)
    with pytest.raises(WireError) as caught:
        decode_site_state(raw(envelope(**busy)))
    assert str(caught.value) == (
        "site-state.shrinkable: expected between 0 and the busy cores (3), got 4"
    )
    with pytest.raises(WireError, match=r"site-state.shrinkable: expected an integer >= 0"):
        decode_site_state(raw(envelope(**valid_fields(shrinkable=-1))))
    lent = valid_fields(total_cores=8, free_cores=2, shrinkable=2, shareable=5)
    with pytest.raises(WireError) as caught:
        decode_site_state(raw(envelope(**lent)))
    assert str(caught.value) == (
        "site-state.shareable: expected between 0 and the busy cores not shrinkable (4), got 5"
    )
    with pytest.raises(WireError, match=r"site-state.shareable: expected an integer >= 0"):
        decode_site_state(raw(envelope(**valid_fields(shareable=True))))


def test_shrinkable_cores_are_sent_only_when_there_are_some() -> None:
    plain = Observation(SiteState(8, 2, 0, 3), 1.0)
    assert b"shrinkable" not in encode_site_state("a", plain)
    shrinking = Observation(SiteState(8, 2, 0, 3, shrinkable=4), 1.0)
    assert decode_site_state(encode_site_state("a", shrinking))[1].state.shrinkable == 4
    assert b"shareable" not in encode_site_state("a", shrinking)
    sharing = Observation(SiteState(8, 0, 0, 3, shareable=3), 1.0)
    assert decode_site_state(encode_site_state("a", sharing))[1].state.shareable == 3


def test_cpu_availability_is_sent_when_measured_and_an_older_peers_state_has_none() -> None:
    measured = Observation(SiteState(8, 2, 0, 3, cpu=0.37), 1.0)
    data = encode_site_state("a", measured)
    assert decode(data, SITE_STATE)["cpu"] == 0.37
    assert decode_site_state(data) == ("a", measured)
    unmeasured = Observation(SiteState(8, 2, 0, 3), 1.0)
    assert b"cpu" not in encode_site_state("a", unmeasured)
    # A peer from before this field sends exactly the fields it always did.
    older = raw(envelope(**valid_fields()))
    assert decode_site_state(older)[1].state.cpu is None


@pytest.mark.parametrize("cpu", [0, 0.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.5", None])
def test_a_bad_cpu_availability_is_named(cpu: object) -> None:
    with pytest.raises(WireError) as info:
        decode_site_state(raw(envelope(**valid_fields(cpu=cpu))))
    assert str(info.value).startswith("site-state.cpu: expected a fraction of a core, 0 < cpu <= 1")


@pytest.mark.parametrize("version", [0, 2, 99, "1", 1.0, None])
def test_unsupported_versions_are_rejected(version: object) -> None:
    data = raw({"v": version, "kind": SITE_STATE, **valid_fields()})
    with pytest.raises(WireError, match=r"site-state.v: expected version 1") as caught:
        decode(data, SITE_STATE)
    assert caught.value.field == "site-state.v"


def test_a_missing_version_is_rejected() -> None:
    with pytest.raises(WireError, match=r"site-state.v: .*missing"):
        decode(raw({"kind": SITE_STATE, **valid_fields()}), SITE_STATE)


def test_a_message_of_another_kind_is_rejected() -> None:
    with pytest.raises(WireError, match=r"site-state.kind: expected 'site-state', got 'other'"):
        decode(raw({"v": 1, "kind": "other", **valid_fields()}), SITE_STATE)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xc1", "a MessagePack message"),  # a reserved byte
        (b"", "a MessagePack message"),
        (b"\x93\x01", "a MessagePack message"),  # truncated array
        (raw(envelope(**valid_fields())) + b"\x00", "a MessagePack message"),  # trailing data
        (raw([1, 2, 3]), "a MessagePack map"),
        (raw("hello"), "a MessagePack map"),
        (raw({1: 2}), "a MessagePack message"),  # non-string keys
        (b"\xa2\xff\xfe", "a MessagePack message"),  # a string that is not UTF-8
    ],
)
def test_what_is_not_a_message_is_rejected(data: bytes, expected: str) -> None:
    with pytest.raises(WireError, match=expected):
        decode(data, SITE_STATE)


def test_oversized_messages_are_rejected_before_parsing() -> None:
    padding = "x" * MAX_MESSAGE_BYTES
    data = raw(envelope(**valid_fields(), padding=padding))
    with pytest.raises(WireError, match=f"at most {MAX_MESSAGE_BYTES} bytes"):
        decode(data, SITE_STATE)
    with pytest.raises(WireError, match=f"at most {MAX_MESSAGE_BYTES} bytes"):
        encode(SITE_STATE, {**valid_fields(), "padding": padding})
    # Just under the limit is fine.
    fits = raw(envelope(**valid_fields(), padding=""))
    room = MAX_MESSAGE_BYTES - len(fits) - 3  # a str8/16 header grows by up to 3 bytes
    assert len(raw(envelope(**valid_fields(), padding="x" * room))) <= MAX_MESSAGE_BYTES
    decode(raw(envelope(**valid_fields(), padding="x" * room)), SITE_STATE)


def test_error_messages_do_not_echo_huge_payloads() -> None:
    data = raw(envelope(**valid_fields(site=["x" * 10_000])))
    with pytest.raises(WireError) as caught:
        decode(data, SITE_STATE)
    assert len(str(caught.value)) < 200
    assert "list of length 1" in str(caught.value)


def test_wire_errors_are_the_peers_fault() -> None:
    assert issubclass(WireError, InvalidInput)
    assert issubclass(WireError, ValueError)


def test_encode_checks_what_it_sends() -> None:
    with pytest.raises(WireError, match=r"site-state.queued"):
        encode(SITE_STATE, valid_fields(queued=-2))
    with pytest.raises(WireError, match=r"site-state.running: .*missing"):
        encode(SITE_STATE, {k: v for k, v in valid_fields().items() if k != "running"})
    with pytest.raises(WireError, match="kind: expected one of"):
        encode("no-such-kind", {})
    with pytest.raises(WireError, match="kind: expected one of"):
        decode(b"\x80", "no-such-kind")
    with pytest.raises(WireError, match="envelope"):
        encode(SITE_STATE, {**valid_fields(), "v": 2})
    with pytest.raises(WireError, match="MessagePack can carry"):
        encode(SITE_STATE, {**valid_fields(), "extra": object()})


def test_decode_accepts_bytes_like_payloads() -> None:
    data = encode(SITE_STATE, valid_fields())
    assert decode(bytearray(data), SITE_STATE) == decode(memoryview(data), SITE_STATE)


# --- fuzz: a peer can make decode raise WireError, and nothing else -------------------------------


def decode_or_wire_error(data: bytes) -> None:
    for decoder in (lambda d: decode(d, SITE_STATE), decode_site_state, decode_alive):
        with contextlib.suppress(WireError):
            decoder(data)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_wire_errors(data: bytes) -> None:
    decode_or_wire_error(data)


@settings(max_examples=500, deadline=None)
@given(msgpack_values)
def test_any_msgpack_value_raises_only_wire_errors(value: object) -> None:
    decode_or_wire_error(raw(value))


@settings(max_examples=1000, deadline=None)
@given(plausible_messages)
def test_plausible_messages_decode_or_raise_wire_errors(message: dict[str, Any]) -> None:
    data = raw(message)
    try:
        site, observation = decode_site_state(data)
    except WireError:
        return
    # Whatever got through is exactly what was sent, and a possible state.
    assert message["v"] == 1
    assert message["kind"] == SITE_STATE
    assert site == message["site"]
    assert observation.state.total_cores == message["total_cores"]
    assert observation.observed_at == message["observed_at"]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), observation=observations())
def test_mutated_valid_messages_raise_only_wire_errors(
    data: st.DataObject, observation: Observation
) -> None:
    encoded = bytearray(encode_site_state("s1", observation))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
        encoded[position] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    decode_or_wire_error(bytes(encoded[:cut]))


# --- alive ----------------------------------------------------------------------------------------


def test_alive_payloads_are_plain_strings() -> None:
    assert encode_alive(True) == b"online"
    assert encode_alive(False) == b"offline"
    assert decode_alive(b"online") is True
    assert decode_alive(bytearray(b"offline")) is False


@pytest.mark.parametrize("payload", [b"", b"Online", b"online\n", b"\x81\xa1v\x01", b"yes"])
def test_other_alive_payloads_are_rejected(payload: bytes) -> None:
    with pytest.raises(WireError, match="alive: expected 'online' or 'offline'"):
        decode_alive(payload)


def test_module_exports_what_it_documents() -> None:
    for name in wire.__all__:
        assert hasattr(wire, name)


# --- netmon-table ---------------------------------------------------------------------------------

NETMON_TABLE = wire.NETMON_TABLE


def table_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "site": "a",
        "measured_at": 1700000000.25,
        "links": {
            "b": {"sizes": [1 << 20, 8 << 20], "seconds": [0.011, 0.072]},
            "c": {"sizes": [1 << 20], "seconds": [0.5]},
        },
    }
    fields.update(changes)
    return fields


def table_envelope(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "kind": NETMON_TABLE, **fields}


@st.composite
def link_points(draw: st.DrawFn) -> LinkPoints:
    sizes = sorted(draw(st.sets(st.integers(min_value=1, max_value=2**40), min_size=1, max_size=4)))
    seconds = draw(
        st.lists(
            st.floats(min_value=0, allow_infinity=False),
            min_size=len(sizes),
            max_size=len(sizes),
        )
    )
    return LinkPoints(tuple(sizes), tuple(seconds))


@st.composite
def forecast_tables(draw: st.DrawFn) -> ForecastTable:
    site = draw(site_names)
    targets = draw(st.lists(site_names.filter(lambda t: t != site), max_size=5, unique=True))
    return ForecastTable(site, draw(times), {t: draw(link_points()) for t in targets})


@settings(max_examples=300, deadline=None)
@given(forecast_tables())
def test_netmon_tables_round_trip(table: ForecastTable) -> None:
    assert wire.decode_netmon_table(wire.encode_netmon_table(table)) == table


def test_a_netmon_table_is_a_versioned_msgpack_map_of_links() -> None:
    table = wire.decode_netmon_table(raw(table_envelope(**table_fields())))
    assert table == ForecastTable(
        "a",
        1700000000.25,
        {
            "b": LinkPoints((1 << 20, 8 << 20), (0.011, 0.072)),
            "c": LinkPoints((1 << 20,), (0.5,)),
        },
    )
    assert msgpack.unpackb(wire.encode_netmon_table(table)) == table_envelope(**table_fields())


def test_unknown_fields_of_a_table_and_of_its_links_are_ignored() -> None:
    fields = table_fields(extra={"x": 1})
    fields["links"]["b"]["jitter"] = [0.001, 0.002]
    table = wire.decode_netmon_table(raw(table_envelope(**fields)))
    assert table.links["b"] == LinkPoints((1 << 20, 8 << 20), (0.011, 0.072))


def test_integral_seconds_and_times_from_other_encoders_are_accepted() -> None:
    fields = table_fields(measured_at=17, links={"b": {"sizes": [10], "seconds": [2]}})
    table = wire.decode_netmon_table(raw(table_envelope(**fields)))
    assert table.measured_at == 17.0
    assert table.links["b"].seconds == (2,)


@pytest.mark.parametrize(
    ("changes", "field", "expected"),
    [
        ({"site": ""}, "netmon-table.site", "a non-empty string"),
        (
            {"measured_at": float("nan")},
            "netmon-table.measured_at",
            "a finite number (seconds)",
        ),
        ({"links": [1, 2]}, "netmon-table.links", "a map of target site -> {sizes, seconds}"),
        ({"links": {"b": [1]}}, "netmon-table.links[b]", "a map with sizes and seconds"),
        (
            {"links": {"b": {"seconds": [0.1]}}},
            "netmon-table.links[b].sizes",
            "a list of sizes in bytes (required field is missing)",
        ),
        (
            {"links": {"b": {"sizes": [1]}}},
            "netmon-table.links[b].seconds",
            "a list of seconds (required field is missing)",
        ),
        (
            {"links": {"b": {"sizes": 1, "seconds": [0.1]}}},
            "netmon-table.links[b].sizes",
            "a list of sizes in bytes",
        ),
        (
            {"links": {"b": {"sizes": [], "seconds": []}}},
            "netmon-table.links[b].sizes",
            "a non-empty list of sizes in bytes",
        ),
        (
            {"links": {"b": {"sizes": [1, 2], "seconds": [0.1]}}},
            "netmon-table.links[b].seconds",
            "one time per size (2 numbers)",
        ),
        (
            {"links": {"b": {"sizes": [8, 1], "seconds": [0.1, 0.2]}}},
            "netmon-table.links[b].sizes[1]",
            "a size in bytes > 8 (sizes strictly increase)",
        ),
        (
            {"links": {"b": {"sizes": [0], "seconds": [0.1]}}},
            "netmon-table.links[b].sizes[0]",
            "a size in bytes > 0",
        ),
        (
            {"links": {"b": {"sizes": [True], "seconds": [0.1]}}},
            "netmon-table.links[b].sizes[0]",
            "a size in bytes > 0",
        ),
        (
            {"links": {"b": {"sizes": [1, 2], "seconds": [0.1, -3.0]}}},
            "netmon-table.links[b].seconds[1]",
            "a finite number of seconds >= 0",
        ),
        (
            {"links": {"b": {"sizes": [1], "seconds": [float("inf")]}}},
            "netmon-table.links[b].seconds[0]",
            "a finite number of seconds >= 0",
        ),
        (
            {"links": {"": {"sizes": [1], "seconds": [0.1]}}},
            "netmon-table.links",
            "non-empty site names as keys",
        ),
        (
            {"links": {"a": {"sizes": [1], "seconds": [0.1]}}},
            "netmon-table.links[a]",
            "a site other than the table's",
        ),
    ],
)
def test_a_bad_netmon_table_is_rejected_naming_the_field(
    changes: dict[str, Any], field: str, expected: str
) -> None:
    with pytest.raises(WireError) as caught:
        wire.decode_netmon_table(raw(table_envelope(**table_fields(**changes))))
    assert caught.value.field == field
    assert caught.value.expected == expected


@pytest.mark.parametrize("name", ["site", "measured_at", "links"])
def test_a_table_missing_a_required_field_is_named(name: str) -> None:
    fields = table_fields()
    del fields[name]
    with pytest.raises(WireError, match=f"netmon-table.{name}: .*missing"):
        wire.decode_netmon_table(raw(table_envelope(**fields)))


def test_a_site_state_is_not_a_netmon_table() -> None:
    with pytest.raises(WireError, match=r"netmon-table\.kind: expected 'netmon-table'"):
        wire.decode_netmon_table(encode(SITE_STATE, valid_fields()))


def test_a_table_too_large_for_one_message_is_refused_when_encoded() -> None:
    points = LinkPoints(tuple(range(1, 201)), (0.5,) * 200)
    table = ForecastTable("a", 1.0, {f"site-{k}": points for k in range(50)})
    with pytest.raises(WireError, match=f"at most {MAX_MESSAGE_BYTES} bytes"):
        wire.encode_netmon_table(table)


plausible_tables = st.fixed_dictionaries(
    {"v": st.just(1), "kind": st.just(NETMON_TABLE)},
    optional={
        "site": site_names | msgpack_values,
        "measured_at": times | msgpack_values,
        "links": st.dictionaries(
            site_names | st.binary(max_size=4),
            st.fixed_dictionaries(
                {},
                optional={
                    "sizes": st.lists(
                        st.integers(min_value=-2, max_value=2**64 - 1) | msgpack_values, max_size=4
                    ),
                    "seconds": st.lists(times | msgpack_values, max_size=4),
                },
            )
            | msgpack_values,
            max_size=3,
        )
        | msgpack_values,
    },
)


@settings(max_examples=1000, deadline=None)
@given(plausible_tables)
def test_plausible_tables_decode_or_raise_wire_errors(message: dict[str, Any]) -> None:
    try:
        table = wire.decode_netmon_table(raw(message))
    except WireError:
        return
    assert table.site == message["site"]
    for target, points in table.links.items():
        assert list(points.sizes) == message["links"][target]["sizes"]
        assert list(points.sizes) == sorted(set(points.sizes))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300) | msgpack_values.map(raw))
def test_random_bytes_are_no_netmon_table(data: bytes) -> None:
    with contextlib.suppress(WireError):
        wire.decode_netmon_table(data)
