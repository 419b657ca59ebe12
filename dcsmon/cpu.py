"""DCSMon's CPU sensor: this site's CPU availability, measured as NWS does, forecast, reported.

Theory of operation. A :class:`CpuSensor` takes one measurement every ``period`` seconds (the
DCSMon period) into a :class:`netmon.cpu.CpuAvailability`, which keeps the series and its
ensemble forecast (the arithmetic and the forecast are pure and live there):

- the **passive** value from the 1-minute load average and the machine's cores
  (:func:`netmon.cpu.from_load`), every period: a counter read;
- an **active probe** every ``probe_every`` periods (by default about every 5 s): a small child
  process of the broker's (started once, at the first probe; it ends when its stdin closes, so
  also when the broker is killed) hashes a 64 KiB block over and over for ``probe_seconds``
  (20 ms by default) and reports the CPU time it got over the wall time it ran
  (:func:`netmon.cpu.from_probe`). A process, not a thread: a thread would share the broker's
  GIL, and a busy event loop would read as a busy CPU. It competes for a core only with the
  machine's other processes, as a new job would, on the cores the broker may use (it inherits
  the broker's CPU affinity, and its cgroup). It runs in a session of its own, as every job
  does (the launcher's ``setsid``): where the kernel groups the scheduling by session
  (``sched_autogroup``, on in most distributions), a new session gets a fair share among
  the busy sessions, not among the busy processes, and the probe must see that share.

The probe's cost is bounded: ``probe_seconds`` of one core every ``probe_every x period``
seconds (20 ms per 5 s: 0.4% of a core), plus the probe process, idle between probes (a bare
interpreter: no site packages, about 10 MB).

A site whose jobs are capped (its topology's ``cpu_share``) caps its measurements at the share
(:class:`~netmon.cpu.CpuAvailability`): a job there can get no more, however idle the machine
is. The sensor does not run its probe under the cap itself: the cap is a quota on a job's cgroup,
the probe a process of the broker's.

:meth:`CpuSensor.reported` is what the site publishes (``SiteState.cpu``); the sensor sets the
``changed`` event when it moves, so DCSMon publishes the state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable

from gbroker.errors import GBrokerError, InternalError, InvalidInput
from netmon.cpu import CpuAvailability, from_load, from_probe

__all__ = [
    "PROBE_EVERY_SECONDS",
    "PROBE_SCRIPT",
    "PROBE_SECONDS",
    "CpuSensor",
    "ProbeError",
    "Prober",
]

log = logging.getLogger("dcsmon")

PROBE_SECONDS = 0.02
"""How long one active probe runs (wall time)."""

PROBE_EVERY_SECONDS = 5.0
"""About how often the probe runs: every ``ceil(5 / period)`` measurements."""

PROBE_SCRIPT = """
import hashlib, sys, time
block = bytes(64 * 1024)
for line in sys.stdin:
    seconds = float(line)
    digest = hashlib.sha256()
    wall_start = time.perf_counter()
    cpu_start = time.process_time()
    while True:
        digest.update(block)
        wall = time.perf_counter() - wall_start
        if wall >= seconds:
            break
    print(time.process_time() - cpu_start, wall, flush=True)
"""
"""The probe process: for each line (seconds), CPU-bound work for that long in wall time,
answered with a line "CPU-seconds wall-seconds". A bare interpreter (``-I -S``) runs it."""


class ProbeError(GBrokerError, RuntimeError):
    """The probe process did not answer (it could not start, died, or took too long)."""


class Prober:
    """The probe process: started at the first :meth:`probe`, again if it died."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._process: asyncio.subprocess.Process | None = None

    async def probe(self, seconds: float) -> tuple[float, float]:
        """(CPU seconds, wall seconds) of one probe of ``seconds``; ProbeError if it failed."""
        process = self._process
        try:
            if process is None or process.returncode is not None:
                process = self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    PROBE_SCRIPT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # as a job's: see the module docstring
                )
            if process.stdin is None or process.stdout is None:
                raise InternalError("the CPU probe process has no pipes")
            process.stdin.write(f"{seconds!r}\n".encode())
            await process.stdin.drain()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that
            # lands as the line arrives, and the broker's shutdown then waited on this task
            # forever (tests/daemon/test_monitors.py under load).
            async with asyncio.timeout(self.timeout + seconds):
                line = await process.stdout.readline()
            cpu, wall = (float(word) for word in line.split())
        except (OSError, TimeoutError, ValueError) as exc:
            await self.aclose()
            raise ProbeError(f"the CPU probe failed: {exc or type(exc).__name__}") from exc
        return cpu, wall

    async def aclose(self) -> None:
        """Stop the probe process (it would also end by itself when the broker's end closes)."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def _load() -> float:
    return os.getloadavg()[0]


class CpuSensor:
    """Measures, forecasts and reports this site's CPU availability; see the module docstring.

    Args:
        period: seconds between two measurements (the DCSMon period).
        share: the site's ``cpu_share`` (1.0: uncapped).
        changed: set whenever :meth:`reported` moves (DCSMon then publishes the state).
        probe_seconds: how long each probe runs.
        probe_every: probe every this many measurements (default: about every 5 s).
        load: the 1-minute load average (a seam for tests).
        cores: the machine's cores.
    """

    def __init__(
        self,
        period: float,
        *,
        share: float = 1.0,
        changed: asyncio.Event | None = None,
        probe_seconds: float = PROBE_SECONDS,
        probe_every: int | None = None,
        load: Callable[[], float] = _load,
        cores: int | None = None,
    ) -> None:
        if not (isinstance(period, int | float) and math.isfinite(period) and period > 0):
            raise InvalidInput("cpu.period", "seconds > 0", period)
        if not (math.isfinite(probe_seconds) and 0 < probe_seconds <= 1):
            raise InvalidInput(
                "cpu.probe_seconds", "seconds, 0 < probe_seconds <= 1", probe_seconds
            )
        if probe_every is None:
            probe_every = max(1, math.ceil(PROBE_EVERY_SECONDS / period))
        if isinstance(probe_every, bool) or probe_every < 1:
            raise InvalidInput("cpu.probe_every", "an integer >= 1", probe_every)
        self.period = float(period)
        self.availability = CpuAvailability(share)
        self.changed = changed
        self.probe_seconds = probe_seconds
        self.probe_every = probe_every
        self._load = load
        self._cores = cores or os.cpu_count() or 1
        self.prober = Prober()
        self._measured = 0
        self.probes = 0
        """Probes run so far."""
        self.probe_cpu_seconds = 0.0
        """The CPU time they cost, in all."""

    def reported(self) -> float | None:
        """The forecast CPU availability as published (None before the first measurement)."""
        return self.availability.reported

    async def measure(self) -> float | None:
        """Take one measurement (with a probe when one is due); return it (None: no load
        average on this system and the probe failed, so nothing was measured)."""
        try:
            passive: float | None = from_load(self._load(), self._cores)
        except OSError:  # no load average on this system: the probe alone, every time
            passive = None
        active = None
        if passive is None or self._measured % self.probe_every == 0:
            active = await self._probe()
        if passive is None:
            passive = active
        if passive is None:
            return None
        self._measured += 1
        before = self.availability.reported
        value = self.availability.measure(passive, active)
        if self.changed is not None and self.availability.reported != before:
            self.changed.set()
        return value

    async def _probe(self) -> float | None:
        try:
            cpu, wall = await self.prober.probe(self.probe_seconds)
        except ProbeError as exc:  # the load alone this time; the next probe starts it again
            log.warning("dcsmon: %s", exc)
            return None
        self.probes += 1
        self.probe_cpu_seconds += cpu
        return from_probe(cpu, wall)

    async def run(self) -> None:
        """Measure every period until cancelled; the probe process ends with it."""
        try:
            while True:
                await self.measure()
                await asyncio.sleep(self.period)
        finally:
            await self.prober.aclose()
