"""The table of wrong client tokens per address (gbroker.daemon.throttle), on a pinned clock."""

from __future__ import annotations

import asyncio

import pytest

from gbroker.daemon.throttle import FailedTokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_slowed_after_its_free_failures_doubling_up_to_the_cap() -> None:
    failed = FailedTokens(free=3, first_delay=0.25, max_delay=2.0, clock=Clock())
    delays = [failed.fail("10.0.0.1") for _ in range(8)]
    assert delays == [0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    assert failed.failures("10.0.0.1") == 8
    assert failed.fail("10.0.0.2") == 0.0  # another address has its own count
    assert failed.delay(10**9) == 2.0  # no overflow however many


def test_an_address_is_forgotten_a_window_after_its_last_failure() -> None:
    clock = Clock()
    failed = FailedTokens(free=1, window=60.0, clock=clock)
    failed.fail("a")
    clock.now += 50
    assert failed.fail("a") > 0  # within the window of the first: slowed
    clock.now += 50  # 100 s after the first, 50 after the last: still remembered
    assert failed.failures("a") == 2
    clock.now += 11
    assert failed.failures("a") == 0
    assert failed.fail("a") == 0.0  # starts afresh


def test_the_table_holds_at_most_its_size() -> None:
    failed = FailedTokens(max_addresses=100, clock=Clock())
    for n in range(10_000):
        failed.fail(f"10.0.{n // 256}.{n % 256}")
    assert len(failed) == 100
    assert failed.failures("10.0.39.15") == 1  # the latest are kept
    assert failed.failures("10.0.0.0") == 0  # the oldest gave way


@pytest.mark.asyncio
async def test_an_address_with_its_held_answers_at_the_limit_is_crowded() -> None:
    failed = FailedTokens(free=0, first_delay=30.0, max_held=2)
    waits = [asyncio.create_task(failed.failed("a")) for _ in range(2)]
    await asyncio.sleep(0)  # both now wait
    assert failed.crowded("a")
    assert not failed.crowded("b")
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert not failed.crowded("a")  # their answers went (or were given up): room again
