"""The reading workers (gbroker.daemon.bounded): a reading past the budget kills its worker and
is refused naming the budget; a worker that dies is replaced; the next reading works."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from gbroker.daemon.bounded import Budget, Readers
from gbroker.errors import InvalidInput
from gbroker.jobs.description import JobDescription
from gbroker.jobs.sweep import JobArray
from tests.daemon.test_bounded_work import wide_sweep, xpath_bomb

pytestmark = pytest.mark.asyncio

PLAIN = b"executable: /bin/echo\narguments: [x]\n"


async def running(readers: Readers, count: int) -> list[int]:
    """The workers' pids once ``count`` of them run (within 60 s; started if they were not)."""
    readers.start()
    async with asyncio.timeout(60):
        while len(readers.pids) < count:
            await asyncio.sleep(0.01)
    return readers.pids


async def busy_other_than(readers: Readers, seen: set[int]) -> int:
    """The pid of a worker reading now that is not in ``seen`` (within 60 s)."""
    async with asyncio.timeout(60):
        while not (fresh := set(readers.busy_pids) - seen):
            await asyncio.sleep(0.01)
    return fresh.pop()


async def test_a_reading_past_the_budget_kills_its_worker_and_the_next_one_works() -> None:
    # A budget that a plain sweep meets on a loaded CI machine (0.2 s did not, once), and a
    # bomb that no machine reads within it (400 elements: over 20 minutes, cubic).
    async with Readers(Budget(seconds=3, workers=1)) as readers:
        [first] = await running(readers, 1)
        with pytest.raises(InvalidInput) as refused:
            await readers.load(xpath_bomb(400))
        assert refused.value.field == "job"
        assert "within 3 s, the broker's read budget" in str(refused.value)
        assert first not in readers.pids
        [second] = await running(readers, 1)
        assert second != first
        loaded = await readers.load(wide_sweep(3, 1))
        assert isinstance(loaded, JobArray)
        assert loaded.size == 3


async def test_a_worker_that_dies_twice_reading_is_a_clean_refusal_then_replaced() -> None:
    async with Readers(Budget(seconds=120, workers=1)) as readers:
        await running(readers, 1)
        reading = asyncio.create_task(readers.load(xpath_bomb(130)))
        killed: set[int] = set()
        for _ in range(2):  # a first death is retried (the worker may have died while idle)
            pid = await busy_other_than(readers, killed)
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        with pytest.raises(InvalidInput) as refused:
            await reading
        # SIGKILL, as sent; or 255, asyncio's word for a child another waitpid reaped first
        # (seen once in a loaded CI run): the refusal is clean and says the worker ended.
        assert re.search(r"the worker ended \((signal 9|exit status 255)\)", str(refused.value))
        assert not set(await running(readers, 1)) & killed
        assert isinstance(await readers.load(wide_sweep(2, 1)), JobArray)


async def test_a_worker_that_died_idle_costs_the_next_reading_nothing() -> None:
    async with Readers(Budget(workers=1)) as readers:
        [pid] = await running(readers, 1)
        os.kill(pid, signal.SIGKILL)
        loaded = await readers.load(wide_sweep(2, 1))
        assert isinstance(loaded, JobArray)
        assert loaded.size == 2


async def test_a_small_plain_document_is_read_without_a_worker() -> None:
    async with Readers(Budget(workers=1)) as readers:
        [pid] = await running(readers, 1)
        os.kill(pid, signal.SIGSTOP)  # a worker that cannot answer
        try:
            loaded = await readers.load(PLAIN)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert isinstance(loaded, JobDescription)


async def test_jobs_larger_than_the_result_budget_are_refused_naming_it() -> None:
    async with Readers(Budget(result_bytes=1 << 10, workers=1)) as readers:
        with pytest.raises(InvalidInput) as refused:
            await readers.load(wide_sweep(100, 1))
        assert "jobs of at most 1024 bytes in all, the broker's read budget" in str(refused.value)
        assert "(100 jobs)" in str(refused.value)
        assert isinstance(await readers.load(wide_sweep(1, 1)), JobArray)  # same worker, alive


async def test_a_bad_sweep_is_refused_as_the_reader_says() -> None:
    async with Readers(Budget(workers=1)) as readers:
        bad = wide_sweep(2, 1).replace(b"arguments[0]", b"arguments[9]")
        with pytest.raises(InvalidInput) as refused:
            await readers.load(bad)
        assert "sweep.assignments[0].parameters[0]" in str(refused.value)
        assert "a field the job has" in str(refused.value)


async def test_no_worker_starts_before_a_document_needs_one() -> None:
    async with Readers(Budget(workers=2)) as readers:
        assert isinstance(await readers.load(PLAIN), JobDescription)  # read inline
        assert readers.pids == []
        assert isinstance(await readers.load(wide_sweep(2, 1)), JobArray)
        assert len(await running(readers, 2)) == 2
