"""Heartbeats (gbroker.core.liveness): who is pinged when, and what misses and answers mean."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.liveness import HeartbeatPolicy, Heartbeats, PeerBack, PeerLost
from gbroker.errors import InvalidInput

POLICY = HeartbeatPolicy(period=2.0, misses=3)


def test_every_neighbour_is_pinged_at_once_then_every_period() -> None:
    beats = Heartbeats(["b", "c"], POLICY)
    assert beats.due(100.0) == ["b", "c"]
    assert beats.due(100.0) == []  # in flight: not pinged twice
    assert beats.next_due() is None
    assert beats.answered("b") is None
    assert beats.next_due() == 102.0
    assert beats.due(101.9) == []
    assert beats.due(102.0) == ["b"]  # c's ping is still out


def test_a_neighbour_is_lost_after_the_third_miss_in_a_row_and_only_once() -> None:
    beats = Heartbeats(["b"], POLICY)
    verdicts = []
    for now in (0.0, 2.0, 4.0, 6.0, 8.0):
        assert beats.due(now) == ["b"]
        verdicts.append(beats.missed("b"))
    assert verdicts == [None, None, PeerLost("b", 3), None, None]
    assert beats.lost == {"b"}


def test_an_answer_resets_the_count_of_misses() -> None:
    beats = Heartbeats(["b"], POLICY)
    outcomes = ["miss", "miss", "answer", "miss", "miss"]
    verdicts = []
    for n, outcome in enumerate(outcomes):
        assert beats.due(2.0 * n) == ["b"]
        verdicts.append(beats.missed("b") if outcome == "miss" else beats.answered("b"))
    assert verdicts == [None] * 5
    assert beats.lost == set()


def test_a_lost_neighbour_that_answers_is_back() -> None:
    beats = Heartbeats(["b"], POLICY, lost=["b", "not-a-neighbour"])
    assert beats.lost == {"b"}
    assert beats.due(0.0) == ["b"]  # lost ones are pinged too: to find them back
    assert beats.answered("b") == PeerBack("b")
    assert beats.lost == set()
    assert beats.due(2.0) == ["b"]
    assert beats.answered("b") is None  # back once


def test_misses_needed_is_the_policy_s() -> None:
    beats = Heartbeats(["b"], HeartbeatPolicy(period=1.0, misses=1))
    beats.due(0.0)
    assert beats.missed("b") == PeerLost("b", 1)


def test_mqtt_speaks_for_a_neighbour_once_it_said_online_or_offline() -> None:
    beats = Heartbeats(["b", "c", "d"], POLICY)
    assert beats.pinged == {"b", "c", "d"}
    beats.mqtt_said("b", True)
    beats.mqtt_said("c", False)
    beats.mqtt_said("zz", True)  # not a neighbour: ignored
    assert beats.pinged == {"d"}
    assert beats.due(0.0) == ["d"]
    assert beats.lost == {"c"}
    beats.mqtt_said("c", True)
    assert beats.lost == set()


def test_an_answer_or_miss_that_mqtt_overtook_is_ignored() -> None:
    beats = Heartbeats(["b"], POLICY)
    for now in (0.0, 2.0):
        beats.due(now)
        beats.missed("b")
    beats.due(4.0)
    beats.mqtt_said("b", True)  # while the third ping is out
    assert beats.missed("b") is None
    assert beats.answered("b") is None
    assert beats.lost == set()


def test_when_the_link_is_lost_every_neighbour_is_pinged_again_from_scratch() -> None:
    beats = Heartbeats(["b", "c"], POLICY)
    beats.due(0.0)
    beats.missed("b")
    beats.missed("c")
    beats.mqtt_said("b", True)
    beats.mqtt_said("c", False)  # c died; MQTT said so
    assert beats.due(10.0) == []
    beats.link_lost(20.0)
    assert beats.pinged == {"b", "c"}
    assert beats.due(20.0) == ["b", "c"]
    # b's misses before MQTT spoke for it do not count: three new ones are needed.
    assert beats.missed("b") is None
    assert beats.lost == {"c"}  # still lost until it answers
    assert beats.answered("c") == PeerBack("c")


def test_without_neighbours_nothing_is_ever_due() -> None:
    beats = Heartbeats([], POLICY)
    assert beats.due(0.0) == []
    assert beats.next_due() is None


@pytest.mark.parametrize(
    ("period", "misses", "field"),
    [
        (0.0, 3, "heartbeat.period"),
        (float("nan"), 3, "heartbeat.period"),
        (2.0, 0, "heartbeat.misses"),
        (2.0, True, "heartbeat.misses"),
        (2.0, 1.5, "heartbeat.misses"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(period: float, misses: int, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        HeartbeatPolicy(period, misses)
    assert caught.value.field == field


# Each step: which neighbour, and what happens to its ping (or what MQTT says of it).
steps = st.lists(
    st.tuples(
        st.sampled_from(["b", "c"]),
        st.sampled_from(["answer", "miss", "online", "offline", "link lost"]),
    ),
    max_size=60,
)


@given(steps)
def test_the_verdicts_follow_a_reference_of_consecutive_misses(
    plan: list[tuple[str, str]],
) -> None:
    """Against an independent reference: a site is lost after `misses` consecutive missed
    pings, counted only while MQTT does not speak for it; back at its first answer."""
    beats = Heartbeats(["b", "c"], POLICY)
    heard: set[str] = set()
    run = {"b": 0, "c": 0}
    lost: set[str] = set()
    now = 0.0
    for site, what in plan:
        now += POLICY.period
        beats.due(now)
        if what in ("online", "offline"):
            beats.mqtt_said(site, what == "online")
            heard.add(site)
            run[site] = 0
            (lost.discard if what == "online" else lost.add)(site)
            continue
        if what == "link lost":
            beats.link_lost(now)
            heard.clear()
            continue
        verdict = beats.answered(site) if what == "answer" else beats.missed(site)
        if site in heard:
            assert verdict is None
            continue
        if what == "answer":
            run[site] = 0
            expected: PeerBack | PeerLost | None = PeerBack(site) if site in lost else None
            lost.discard(site)
        else:
            run[site] += 1
            expected = None
            if run[site] >= POLICY.misses and site not in lost:
                expected = PeerLost(site, run[site])
                lost.add(site)
        assert verdict == expected
    assert beats.lost == lost
    assert beats.pinged == {"b", "c"} - heard
