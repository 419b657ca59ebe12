"""DCSMon's CPU sensor (dcsmon.cpu): when it probes, what it reports, its probe process, and that
a probe on a core other processes spin on reads lower (real processes, pinned to one core)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dcsmon.cpu import CpuSensor, Prober
from gbroker.errors import InvalidInput
from netmon.cpu import from_probe

DEADLINE = 60.0


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"^cpu.period: expected seconds > 0"):
        CpuSensor(0.0)
    with pytest.raises(InvalidInput, match=r"^cpu.probe_seconds"):
        CpuSensor(1.0, probe_seconds=2.0)
    with pytest.raises(InvalidInput, match=r"^cpu.probe_every: expected an integer >= 1"):
        CpuSensor(1.0, probe_every=0)
    with pytest.raises(InvalidInput, match=r"^site.cpu_share"):
        CpuSensor(1.0, share=0.0)


def test_by_default_it_probes_about_every_5_seconds() -> None:
    assert CpuSensor(1.0).probe_every == 5
    assert CpuSensor(0.1).probe_every == 50
    assert CpuSensor(10.0).probe_every == 1


@pytest.mark.asyncio
async def test_it_probes_every_nth_measurement_and_reads_the_load_every_time() -> None:
    loads = iter([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    changed = asyncio.Event()
    sensor = CpuSensor(1.0, probe_every=3, load=lambda: next(loads), cores=1, changed=changed)
    try:
        assert sensor.reported() is None
        values = [await sensor.measure() for _ in range(7)]
    finally:
        await sensor.prober.aclose()
    assert sensor.probes == 3  # measurements 1, 4 and 7
    assert sensor.probe_cpu_seconds > 0
    assert all(v is not None and 0 < v <= 1 for v in values)
    # Between probes the load moves the value: load 1 on one core is half of what the first
    # probe (at load 0) saw, corrected by that probe's bias.
    assert changed.is_set()
    assert sensor.reported() is not None


@pytest.mark.asyncio
async def test_without_a_load_average_every_measurement_is_a_probe() -> None:
    def no_load() -> float:
        raise OSError("getloadavg unavailable")

    sensor = CpuSensor(1.0, probe_every=10, load=no_load)
    try:
        for _ in range(3):
            assert await sensor.measure() is not None
    finally:
        await sensor.prober.aclose()
    assert sensor.probes == 3


@pytest.mark.asyncio
async def test_a_killed_probe_process_is_started_again() -> None:
    prober = Prober()
    try:
        cpu, wall = await prober.probe(0.01)
        assert 0 <= cpu <= wall * 1.5
        assert wall >= 0.01
        first = prober._process
        assert first is not None
        first.kill()
        await first.wait()
        # The dead one fails once at most; the next probe starts a new process.
        with contextlib.suppress(Exception):
            await prober.probe(0.01)
        await prober.probe(0.01)
        assert prober._process is not first
    finally:
        await prober.aclose()
    assert prober._process is None


@pytest.mark.asyncio
async def test_the_probe_process_ends_when_the_sensor_stops() -> None:
    sensor = CpuSensor(0.05, probe_every=1)
    task = asyncio.create_task(sensor.run())
    async with asyncio.timeout(DEADLINE):
        while sensor.probes < 2:
            await asyncio.sleep(0.05)
    process = sensor.prober._process
    assert process is not None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert process.returncode is not None


@contextlib.contextmanager
def pinned_to(core: int) -> Iterator[None]:
    """This thread (and the processes it starts meanwhile) on ``core`` only."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def hogs(core: int, count: int) -> Iterator[None]:
    """``count`` processes spinning on ``core``, each in a session of its own as jobs are (with
    the kernel's autogroups, one session of many spinners would count as one)."""
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass\n"
    spinning = [
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(count)
    ]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


@pytest.mark.asyncio
async def test_a_probe_beside_processes_spinning_on_its_core_reads_lower() -> None:
    """Three spinners on the probe's core leave it about a quarter of it. Other work on this
    machine may lower the free reading too, so the claim is relative with a wide margin, and
    polled: some probe beside the spinners reads below 0.6 x the best probe without them."""
    core = max(os.sched_getaffinity(0))
    prober = Prober()
    with pinned_to(core):
        await prober.probe(0.001)  # the probe process starts now: pinned like this thread
    try:
        alone = max([from_probe(*await prober.probe(0.03)) for _ in range(5)])
        beside = []
        with hogs(core, 3):
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline:
                beside.append(from_probe(*await prober.probe(0.03)))
                if min(beside) < 0.6 * alone:
                    break
                await asyncio.sleep(0.1)
    finally:
        await prober.aclose()
    assert min(beside) < 0.6 * alone, (alone, beside)
