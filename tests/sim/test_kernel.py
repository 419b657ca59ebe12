from __future__ import annotations

import pytest

from gbroker.errors import InvalidInput
from gbroker.sim.kernel import Kernel


def test_runs_in_time_then_priority_then_insertion_order() -> None:
    k = Kernel()
    seen: list[tuple[float, str]] = []

    def log(tag: str) -> None:
        seen.append((k.now, tag))

    k.at(5.0, log, "late")
    k.at(1.0, log, "low-prio", priority=2)
    k.at(1.0, log, "first")
    k.at(1.0, log, "second")
    k.at(1.0, log, "high-prio", priority=-1)
    k.run()
    assert seen == [
        (1.0, "high-prio"),
        (1.0, "first"),
        (1.0, "second"),
        (1.0, "low-prio"),
        (5.0, "late"),
    ]


def test_actions_can_schedule_more_and_run_until_stops_in_time() -> None:
    k = Kernel()
    ticks: list[float] = []

    def tick(_: None) -> None:
        ticks.append(k.now)
        k.after(10.0, tick, None)

    k.at(0.0, tick, None)
    k.run(until=35.0)
    assert ticks == [0.0, 10.0, 20.0, 30.0]
    assert k.now == 35.0
    assert k.peek() == 40.0
    assert len(k) == 1
    k.step()
    assert ticks[-1] == 40.0


def test_the_past_is_rejected_and_an_empty_agenda_peeks_infinity() -> None:
    k = Kernel(start=100.0)
    assert k.peek() == float("inf")
    with pytest.raises(InvalidInput, match="time"):
        k.at(99.0, print, None)
    with pytest.raises(IndexError):
        k.step()


def test_deferred_actions_run_once_the_instant_is_over() -> None:
    k = Kernel()
    seen: list[tuple[float, str]] = []

    def log(tag: str) -> None:
        seen.append((k.now, tag))
        if tag == "a":
            k.defer(lambda: seen.append((k.now, "end of 1")))
            k.at(1.0, log, "added at 1")

    k.at(1.0, log, "a")
    k.at(1.0, log, "b", priority=5)
    k.at(2.0, log, "c")
    k.run()
    assert seen == [
        (1.0, "a"),
        (1.0, "added at 1"),  # priority 0 runs before b's 5, though added later
        (1.0, "b"),
        (1.0, "end of 1"),
        (2.0, "c"),
    ]


def test_step_runs_deferred_actions_too() -> None:
    k = Kernel()
    seen: list[str] = []
    k.defer(lambda: seen.append("deferred"))
    assert len(k) == 1
    k.step()
    assert seen == ["deferred"]
    assert len(k) == 0
