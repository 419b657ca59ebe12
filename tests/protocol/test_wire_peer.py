"""Peer API messages (gbroker.protocol.wire, /peer/v1/<kind>): schemas, the attacks, fuzz."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.model import Observation, SiteState
from gbroker.protocol.wire import (
    ACCEPT,
    CLAIM,
    KILL,
    MAX_ERROR_CHARS,
    MAX_LEASE_SECONDS,
    MIGRATE,
    MOVING,
    PEER_REPLY_SCHEMAS,
    PEER_SCHEMAS,
    PING,
    REPORT,
    WITHDRAW,
    WireError,
    decode_peer,
    decode_peer_reply,
    encode_peer,
    encode_peer_reply,
    encode_site_state,
)

SITES = frozenset({"s0", "s1", "Xeon80"})
DESCRIPTION = {"executable": "/bin/sleep", "arguments": ["1"], "min_cores": 2}
USED = {"wall": 12.5, "cpu": 3.25, "moves": 2}  # what a moving job used before (issue 35)


def raw(message: object) -> bytes:
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def valid(kind: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A message of ``kind`` as server.py sends it today (no envelope), with ``changes``."""
    every: dict[str, dict[str, Any]] = {
        ACCEPT: {
            "id": "s0.17000000000000001",
            "owner": "s0",
            "replica": False,
            "lease": 30.0,
            "description": DESCRIPTION,
            "submitter": "alice",
        },
        WITHDRAW: {"id": "s0.1"},
        CLAIM: {"id": "s0.1", "site": "s1"},
        REPORT: {
            "id": "s0.1",
            "site": "s1",
            "kind": "finished",
            "at": 1_700_000_000.5,
            "ok": False,
            "exit_code": -9,
            "error": "killed",
        },
        KILL: {"id": "Xeon80.42"},
        PING: {},
        MIGRATE: {"id": "s0.1", "to": "s1"},
        MOVING: {
            "id": "s0.1",
            "site": "s1",
            "to": "Xeon80",
            "bundle": "ab" * 32,
            "bundle_size": 7,
            "used": USED,
        },
    }
    return {**every[kind], **(changes or {})}


@pytest.mark.parametrize("kind", list(PEER_SCHEMAS))
def test_each_message_as_sent_today_decodes_to_its_fields(kind: str) -> None:
    assert decode_peer(kind, raw(valid(kind)), SITES) == valid(kind)


@pytest.mark.parametrize("kind", list(PEER_SCHEMAS))
def test_encode_peer_adds_the_version_and_round_trips(kind: str) -> None:
    data = encode_peer(kind, valid(kind))
    assert msgpack.unpackb(data)["v"] == 1
    assert decode_peer(kind, data, SITES) == valid(kind)


def test_unknown_fields_are_ignored_and_optional_ones_may_be_absent() -> None:
    queued = {"id": "s0.1", "site": "s1", "kind": "queued", "at": 5, "extra": [1, 2]}
    assert decode_peer(REPORT, raw(queued), SITES) == {
        "id": "s0.1",
        "site": "s1",
        "kind": "queued",
        "at": 5,
    }


@pytest.mark.parametrize(
    ("kind", "changes", "field", "expected"),
    [
        # The landed attacks: an id of 2**63 killed the journal thread, Mars reached the core.
        (REPORT, {"id": 2**63}, "report.id", "a job id <site>.<digits>"),
        (REPORT, {"site": "Mars"}, "report.site", "a site of the topology"),
        (REPORT, {"id": "Mars.1"}, "report.id", "a site of the topology"),
        (REPORT, {"id": "s0.1/../../metrics"}, "report.id", "a job id"),
        (REPORT, {"kind": "exploded"}, "report.kind", "queued or started or finished"),
        (REPORT, {"at": math.nan}, "report.at", "a time in [0,"),
        (REPORT, {"at": math.inf}, "report.at", "a time in [0,"),
        (REPORT, {"at": -1.0}, "report.at", "a time in [0,"),
        (REPORT, {"at": 2**64 - 1}, "report.at", "a time in [0,"),
        (REPORT, {"ok": 1}, "report.ok", "true or false"),
        (REPORT, {"exit_code": 2**63}, "report.exit_code", "nil or an integer"),
        (REPORT, {"exit_code": 1.5}, "report.exit_code", "nil or an integer"),
        (REPORT, {"error": "x" * (MAX_ERROR_CHARS + 1)}, "report.error", "nil or text"),
        (CLAIM, {"site": ""}, "claim.site", "a site name"),
        (CLAIM, {"site": "s1/../x"}, "claim.site", "a site name"),
        (CLAIM, {"id": "s0.1\n"}, "claim.id", "a job id"),
        (WITHDRAW, {"id": None}, "withdraw.id", "a job id"),
        (KILL, {"id": "s0." + "1" * 33}, "kill.id", "a job id"),
        (ACCEPT, {"lease": math.inf}, "accept.lease", "seconds in (0,"),
        (ACCEPT, {"lease": 0}, "accept.lease", "seconds in (0,"),
        (ACCEPT, {"lease": MAX_LEASE_SECONDS * 2}, "accept.lease", "seconds in (0,"),
        (ACCEPT, {"replica": "yes"}, "accept.replica", "true or false"),
        (ACCEPT, {"owner": "s1"}, "accept.owner", "the owner of s0.17000000000000001 (s0)"),
        (ACCEPT, {"owner": "Mars", "id": "Mars.1"}, "accept.id", "a site of the topology"),
        (ACCEPT, {"description": []}, "accept.description", "a job description"),
        (ACCEPT, {"description": {**DESCRIPTION, "min_cores": 2**63}},
         "accept.description.min_cores", "an integer from 1 to"),
        (ACCEPT, {"description": {**DESCRIPTION, "output": "../../x"}},
         "accept.description.output", "a relative path inside the job directory"),
        (ACCEPT, {"description": {**DESCRIPTION, "staging": [{"file_name": "/etc/x"}]}},
         "accept.description.staging[0].file_name", "a relative path"),
        (ACCEPT, {"v": 2}, "accept.v", "version 1"),
        # Moving a running job (issue 27).
        (MIGRATE, {"to": "Mars"}, "migrate.to", "a site of the topology"),
        (MOVING, {"bundle": "AB" * 32}, "moving.bundle", "the sha256 of a checkpoint bundle"),
        (MOVING, {"bundle": "../etc/passwd"}, "moving.bundle", "the sha256"),
        (MOVING, {"bundle_size": -1}, "moving.bundle_size", "bytes, an integer"),
        (MOVING, {"bundle_size": 2**62}, "moving.bundle_size", "bytes, an integer"),
        (ACCEPT, {"restore_from": "s1"}, "accept.bundle", "restore_from, bundle and bundle_size"),
        (ACCEPT, {"restore_from": "Mars", "bundle": "ab" * 32, "bundle_size": 1},
         "accept.restore_from", "a site of the topology"),
        # What a moving job used before (issue 35).
        (MOVING, {"used": {**USED, "wall": -1.0}}, "moving.used", "what a moved job used"),
        (MOVING, {"used": {**USED, "cpu": math.nan}}, "moving.used", "what a moved job used"),
        (MOVING, {"used": {**USED, "moves": 1.5}}, "moving.used", "what a moved job used"),
        (MOVING, {"used": [12.5, 3.25, 2]}, "moving.used", "what a moved job used"),
        (ACCEPT, {"used": USED}, "accept.used", "what a moving job used, only with restore_from"),
        (ACCEPT, {"restore_from": "s1", "bundle": "ab" * 32, "bundle_size": 1,
                  "used": {"wall": 1.0, "cpu": 1e300, "moves": 1}},
         "accept.used", "what a moved job used"),
    ],
)  # fmt: skip
def test_bad_peer_messages_are_rejected_naming_the_field(
    kind: str, changes: dict[str, Any], field: str, expected: str
) -> None:
    with pytest.raises(WireError) as caught:
        decode_peer(kind, raw(valid(kind, changes)), SITES)
    assert caught.value.field == field
    assert caught.value.expected.startswith(expected)
    assert len(str(caught.value)) < 400


def test_a_moving_job_carries_what_it_used_to_its_target() -> None:
    moving = {"restore_from": "s1", "bundle": "ab" * 32, "bundle_size": 1, "used": USED}
    assert decode_peer(ACCEPT, encode_peer(ACCEPT, valid(ACCEPT, moving)), SITES)["used"] == USED
    # From a broker that predates it: nothing used (the receiver's default).
    del moving["used"]
    assert "used" not in decode_peer(ACCEPT, raw(valid(ACCEPT, moving)), SITES)


@pytest.mark.parametrize("kind", [kind for kind in PEER_SCHEMAS if kind != PING])
@pytest.mark.parametrize("missing", ["id"])
def test_a_missing_field_is_named(kind: str, missing: str) -> None:
    message = valid(kind)
    del message[missing]
    with pytest.raises(WireError, match=rf"^{kind}\.{missing}: .*missing"):
        decode_peer(kind, raw(message), SITES)


def test_a_finished_report_must_say_whether_it_succeeded() -> None:
    message = valid(REPORT)
    del message["ok"]
    with pytest.raises(WireError, match=r"^report\.ok: expected true or false for a finished"):
        decode_peer(REPORT, raw(message), SITES)


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", raw([1, 2]), raw("id"), raw({1: 2}), b"\x81" + b"\x91" * 100_000]
)
def test_what_is_not_a_map_is_rejected(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_peer(CLAIM, data, SITES)


def test_an_unknown_kind_is_rejected() -> None:
    with pytest.raises(WireError, match=r"^peer message: expected one of accept, withdraw"):
        decode_peer("promote", raw(valid(KILL)), SITES)


def test_encode_peer_refuses_what_a_receiver_would_refuse() -> None:
    with pytest.raises(WireError, match=r"^report\.id"):
        encode_peer(REPORT, valid(REPORT, {"id": 2**63}))
    with pytest.raises(WireError, match=r"^kill\.v"):
        encode_peer(KILL, {"id": "s0.1", "v": 1})


@pytest.mark.parametrize(
    ("kind", "reply"),
    [(ACCEPT, {"ok": True}), (WITHDRAW, {"withdrawn": False}), (CLAIM, {"granted": True}),
     (REPORT, {"ok": True}), (KILL, {"ok": False})],
)  # fmt: skip
def test_replies_round_trip_and_are_checked(kind: str, reply: dict[str, Any]) -> None:
    assert decode_peer_reply(kind, encode_peer_reply(kind, reply)) == reply
    assert decode_peer_reply(kind, raw(reply)) == reply
    name = next(iter(PEER_REPLY_SCHEMAS[kind]))  # the one field every reply of kind has
    with pytest.raises(WireError, match=rf"^{kind}-reply\.{name}: expected true or false"):
        decode_peer_reply(kind, raw({name: "yes"}))
    with pytest.raises(WireError, match=rf"^{kind}-reply\.{name}: .*missing"):
        decode_peer_reply(kind, raw({}))


def test_a_ping_answer_may_carry_a_site_state_and_nothing_else_of_its_own() -> None:
    state = encode_site_state("s1", Observation(SiteState(8, 3, 1, 2), 1_700_000_000.0))
    reply = {"ok": True, "state": state}
    assert decode_peer_reply(PING, encode_peer_reply(PING, reply)) == reply
    assert decode_peer_reply(PING, raw({"ok": True})) == {"ok": True}
    with pytest.raises(WireError, match=r"^ping-reply\.state: expected a site-state message"):
        decode_peer_reply(PING, raw({"ok": True, "state": "not bytes"}))
    with pytest.raises(WireError, match=r"^ping-reply\.state"):
        decode_peer_reply(PING, raw({"ok": True, "state": b"x" * 1025}))
    # A ping names no job and no site: whatever else it carries is dropped.
    assert decode_peer(PING, raw({"id": "Mars.1", "site": "Mars"}), SITES) == {}


# --- fuzz: anything a peer sends is a dict or a WireError ----------------------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=16,
)


def _decode_all(data: bytes) -> None:
    for kind in PEER_SCHEMAS:
        with contextlib.suppress(WireError):
            fields = decode_peer(kind, data, SITES)
            assert isinstance(fields, dict)
            assert set(fields) <= set(PEER_SCHEMAS[kind])
            # What got through can be journaled (the landed OverflowError) and re-sent.
            msgpack.packb(fields)
            assert decode_peer(kind, encode_peer(kind, fields), SITES) == fields
        with contextlib.suppress(WireError):
            decode_peer_reply(kind, data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_message_or_a_wire_error(data: bytes) -> None:
    _decode_all(data)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(list(PEER_SCHEMAS)),
    changes=st.dictionaries(
        st.sampled_from(["id", "site", "owner", "kind", "at", "ok", "exit_code", "error", "lease",
                         "replica", "description", "v"]),
        _values | st.sampled_from(["s0", "s1.3", "Mars", "queued", "finished", True]),
        max_size=3,
    ),
)  # fmt: skip
def test_mutated_valid_messages_are_messages_or_wire_errors(
    kind: str, changes: dict[str, Any]
) -> None:
    _decode_all(raw(valid(kind, changes)))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), kind=st.sampled_from(list(PEER_SCHEMAS)))
def test_corrupted_valid_messages_are_messages_or_wire_errors(
    data: st.DataObject, kind: str
) -> None:
    encoded = bytearray(encode_peer(kind, valid(kind)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
        encoded[position] = data.draw(st.integers(min_value=0, max_value=255))
    _decode_all(bytes(encoded[: data.draw(st.integers(0, len(encoded)))]))


def test_an_accept_carries_its_submitter_to_the_site_that_runs_it() -> None:
    # It was dropped as an unknown field: a job placed at another site ran there as the
    # site's shared account (nobody), not as its submitter's own (issue 25).
    decoded = decode_peer(ACCEPT, encode_peer(ACCEPT, valid(ACCEPT)), SITES)
    assert decoded["submitter"] == "alice"
    without = {k: v for k, v in valid(ACCEPT).items() if k != "submitter"}
    assert "submitter" not in decode_peer(ACCEPT, encode_peer(ACCEPT, without), SITES)
    for bad in ("", "a b", "x" * 257, 7):
        with pytest.raises(WireError, match=r"accept\.submitter"):
            decode_peer(ACCEPT, raw({"v": 1, **valid(ACCEPT, {"submitter": bad})}), SITES)


RANKS = [
    {"rank": 0, "site": "s0", "host": "10.0.0.1", "port": 4000, "cores": 2, "units": 10},
    {"rank": 1, "site": "s1", "host": "10.0.0.2", "port": 4001, "cores": 1},
]


def test_a_components_claim_and_its_grant_carry_where_each_rank_listens() -> None:
    claim = valid(CLAIM, {"endpoint": {"host": "10.0.0.1", "port": 4000}, "cores": 2})
    assert decode_peer(CLAIM, raw(claim), SITES)["endpoint"] == {"host": "10.0.0.1", "port": 4000}
    reply = {"granted": True, "ranks": RANKS}
    assert decode_peer_reply(CLAIM, raw(reply)) == reply
    assert decode_peer_reply(CLAIM, raw({"granted": False, "wait": True}))["wait"] is True


@pytest.mark.parametrize(
    ("field", "value"),
    [("endpoint", {"host": "h", "port": 0}), ("endpoint", {"host": "a b", "port": 80}),
     ("endpoint", {"host": "h", "port": 80, "x": 1}), ("cores", 0)],
)  # fmt: skip
def test_a_bad_endpoint_or_cores_in_a_claim_is_refused(field: str, value: object) -> None:
    with pytest.raises(WireError, match=rf"^claim\.{field}"):
        decode_peer(CLAIM, raw(valid(CLAIM, {field: value})), SITES)


@pytest.mark.parametrize(
    "ranks",
    [[], [{**RANKS[0], "rank": 1}], [{**RANKS[0], "cores": 0}], [{**RANKS[0], "evil": 1}],
     [RANKS[0]] * 257, "x"],
)  # fmt: skip
def test_a_bad_rank_table_is_refused(ranks: object) -> None:
    with pytest.raises(WireError, match=r"^claim-reply\.ranks"):
        decode_peer_reply(CLAIM, raw({"granted": True, "ranks": ranks}))
