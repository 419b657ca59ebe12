"""NetMon as a real service: HTTP test transfers to the neighbours, a forecast table on MQTT.

Theory of operation. Every broker serves a probe endpoint (:data:`PROBE_PATH`, a peer route
guarded by the fleet secret, :func:`probe_endpoint`): it reads a POSTed body, discards it and
answers how many bytes arrived; a body over the endpoint's limit gets a 413 that names the limit.

A :class:`NetMonAgent` at site i measures the links (i, j) to its neighbours j. Every ``period``
seconds it uploads a test blob of each configured size to each neighbour's probe endpoint, one
transfer at a time so that probes do not compete with each other, and times each upload with
:func:`time.perf_counter`, from the request to the answer: a probe measures what staging a file
of that size would cost, latency included.
Each time feeds :meth:`~netmon.forecast.PiecewiseLinearForecaster.observe` of the agent's
forecaster, the same piecewise-linear forecaster the simulator uses, and after each round the
agent makes the site's :class:`~netmon.table.ForecastTable` (per neighbour: the sizes and their
smoothed seconds) and hands it to whoever publishes it (:meth:`NetMonAgent.publish_tables`).
The first round comes ``start_delay`` after the start: by default 2 s plus a random phase of up
to 5 s, so that the sites of a fleet started together do not all probe at once (rounds then keep
a fixed rate, and the sites stay apart).

A failed probe (a neighbour down, a timeout, a 4xx) is logged and skipped, never fatal; the
neighbour's remaining sizes are skipped too in that round. Neighbours that failed are tried
again sooner than the period, after ``retry`` seconds, doubling up to the period, so that a
fleet whose brokers start one after the other is measured within seconds, not minutes.

In the broker daemon the agent feeds the broker's own forecaster, and the daemon publishes the table
on its MQTT link. Standalone (``gbroker netmon serve``,
:func:`gbroker.daemon.monitors.serve_netmon`) the agent has a forecaster of its own and publishes
through a :class:`~gbroker.mqtt.link.MonitorLink`; the site's broker then learns its own links from
its netmon topic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final, Protocol

import aiohttp
from aiohttp import ClientSession, ClientTimeout, web

from gbroker.errors import GBrokerError, InvalidInput
from netmon.forecast import Forecaster
from netmon.table import ForecastTable, table_from

__all__ = [
    "DEFAULT_PERIOD",
    "DEFAULT_SIZES",
    "MAX_PROBE",
    "PROBE_PATH",
    "NetMonAgent",
    "ProbeError",
    "TablePublisher",
    "parse_size",
    "parse_sizes",
    "probe_endpoint",
]

log = logging.getLogger("netmon")

PROBE_PATH: Final = "/peer/v1/probe"
"""The broker's NetMon probe endpoint (POST a test blob; a peer route)."""

DEFAULT_SIZES: Final = (1 << 20, 8 << 20)
"""Test sizes in bytes: 1 MiB and 8 MiB, two points of each link's piecewise-linear table."""

DEFAULT_PERIOD: Final = 300.0
"""Seconds between rounds, as in the paper's deployment: each round costs 9 MiB per link."""

MAX_PROBE: Final = 64 << 20
"""The default limit of the probe endpoint, in bytes."""

_CHUNK: Final = 1 << 16


class ProbeError(GBrokerError, ConnectionError):
    """A test transfer failed: the neighbour is down, refused it, or answered nonsense."""


class TablePublisher(Protocol):
    """Where an agent's tables go: a :class:`~gbroker.mqtt.link.SiteLink` or ``MonitorLink``."""

    async def publish_netmon_table(self, table: ForecastTable) -> None: ...


# --- sizes ----------------------------------------------------------------------------------------

_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, field: str = "size") -> int:
    """Bytes in ``text``: ``65536``, ``64KiB``, ``1MiB``, ``8MB`` (k, M, G are powers of ten)."""
    match = _SIZE.fullmatch(text)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise InvalidInput(field, "a size in bytes such as 65536, 64KiB, 1MiB or 8MB", text)
    size = float(match.group(1)) * unit
    if not 1 <= size < 2**63 or size != int(size):
        raise InvalidInput(field, "a whole number of bytes >= 1", text)
    return int(size)


def parse_sizes(text: str, field: str = "sizes") -> tuple[int, ...]:
    """Comma-separated sizes (see :func:`parse_size`), returned sorted and without repeats."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise InvalidInput(field, "one or more sizes, comma-separated", text)
    return tuple(sorted({parse_size(part, f"{field}[{k}]") for k, part in enumerate(parts)}))


def _check_sizes(sizes: Iterable[int]) -> tuple[int, ...]:
    checked = tuple(sorted(set(sizes)))
    if not checked or any(
        not isinstance(size, int) or isinstance(size, bool) or size <= 0 for size in checked
    ):
        raise InvalidInput("netmon.sizes", "one or more test sizes in bytes > 0", sizes)
    return checked


# --- the probe endpoint ---------------------------------------------------------------------------


def probe_endpoint(limit: int = MAX_PROBE) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler of :data:`PROBE_PATH`: read and discard the body, say how much came.

    A body over ``limit`` bytes gets a 413 naming the limit: at once when its Content-Length says
    so, else as soon as the streamed bytes pass it.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidInput("max_probe", "a probe size limit in bytes >= 0", limit)

    def too_large(size: str) -> web.Response:
        return web.json_response(
            {
                "error": f"probe of {size} bytes is larger than the limit of {limit} bytes",
                "field": "body",
                "expected": f"at most {limit} bytes",
                "limit": limit,
            },
            status=413,
        )

    async def probe(request: web.Request) -> web.Response:
        declared = request.content_length
        if declared is not None and declared > limit:
            return too_large(str(declared))
        received = 0
        async for chunk in request.content.iter_chunked(_CHUNK):
            received += len(chunk)
            if received > limit:
                return too_large(f"over {limit}")
        return web.json_response({"received": received})

    return probe


# --- the agent ------------------------------------------------------------------------------------


class NetMonAgent:
    """Site ``site``'s NetMon: probes the neighbours, feeds ``forecaster``, makes tables.

    Args:
        site: this site, i.
        neighbours: L(i), the sites whose links (i, j) are measured.
        peers: each site's broker URL (``http://host:port``); a neighbour without one is not
            probed. Read at each probe, so it may be filled in after the agent is made.
        forecaster: where measurements go; in the daemon, the one its broker ranks with.
        sizes: test sizes in bytes.
        period: seconds between the starts of two rounds.
        start_delay: seconds before the first round; None: 2 s plus a random phase of up to
            min(period, 5 s), which keeps the sites of a fleet that starts together apart.
        retry: seconds before neighbours that failed are tried again (doubling up to the period).
        timeout: seconds one test transfer may take before it counts as failed.
        sign: the peer signature of a probe, ``sign(method, url, None)`` (the site's
            :meth:`gbroker.security.auth.PeerSigner.headers` for the URL's path; None: unsigned).
    """

    def __init__(
        self,
        site: str,
        neighbours: Iterable[str],
        peers: Mapping[str, str],
        forecaster: Forecaster,
        *,
        sizes: Iterable[int] = DEFAULT_SIZES,
        period: float = DEFAULT_PERIOD,
        start_delay: float | None = None,
        retry: float = 5.0,
        timeout: float = 60.0,
        sign: Callable[[str, str, bytes | None], Mapping[str, str]] | None = None,
    ) -> None:
        for name, value, low in (
            ("netmon.period", period, "> 0"),
            ("netmon.start_delay", 0.0 if start_delay is None else start_delay, ">= 0"),
            ("netmon.retry", retry, "> 0"),
            ("netmon.timeout", timeout, "> 0"),
        ):
            if not (
                isinstance(value, int | float)
                and math.isfinite(value)
                and (value > 0 if low == "> 0" else value >= 0)
            ):
                raise InvalidInput(name, f"seconds {low}", value)
        if start_delay is None:
            start_delay = 2.0 + random.uniform(0.0, min(period, 5.0))
        self.site = site
        self.neighbours = tuple(sorted(set(neighbours) - {site}))
        self.peers = peers
        self.forecaster = forecaster
        self.sizes = _check_sizes(sizes)
        self.period = float(period)
        self.start_delay = float(start_delay)
        self.retry = float(retry)
        self.timeout = float(timeout)
        self.sign = sign
        self.rounds = 0
        """Rounds finished so far (retries of failed neighbours included)."""
        self.table: ForecastTable | None = None
        """The latest table, None before the first round that measured anything."""
        self._version = 0
        self._new_table = asyncio.Condition()
        self._blobs: dict[int, bytes] = {}

    def _blob(self, size: int) -> bytes:
        # Random bytes, made once per size: nothing on the way can compress them.
        blob = self._blobs.get(size)
        if blob is None:
            blob = self._blobs[size] = os.urandom(size)
        return blob

    async def probe(self, session: ClientSession, target: str, size: int) -> float:
        """Upload ``size`` bytes to ``target``'s probe endpoint; the seconds it took.

        Raises :class:`ProbeError` if the transfer fails or is refused.
        """
        base = self.peers.get(target)
        if base is None:
            raise ProbeError(f"netmon {self.site}: no HTTP endpoint known for {target}")
        url = base.rstrip("/") + PROBE_PATH
        signature = self.sign("POST", url, None) if self.sign is not None else {}
        headers = {**signature, "Content-Type": "application/octet-stream"}
        blob = self._blob(size)
        try:
            started = time.perf_counter()
            async with session.post(
                url, data=blob, headers=headers, timeout=ClientTimeout(total=self.timeout)
            ) as response:
                body = await response.read()
                seconds = time.perf_counter() - started
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise ProbeError(
                f"netmon {self.site}: probe of {size} bytes to {target} ({url}) failed: {reason}"
            ) from exc
        if response.status != 200:
            raise ProbeError(
                f"netmon {self.site}: {target} refused a probe of {size} bytes: HTTP "
                f"{response.status} {body[:200].decode(errors='replace')}"
            )
        try:
            received = json.loads(body).get("received")
        except (ValueError, AttributeError) as exc:
            raise ProbeError(
                f"netmon {self.site}: {target} answered a probe with {body[:80]!r}"
            ) from exc
        if received != size:
            raise ProbeError(f"netmon {self.site}: {target} received {received!r} of {size} bytes")
        return seconds

    async def round(self, session: ClientSession, targets: Iterable[str] | None = None) -> set[str]:
        """Probe ``targets`` (default: every neighbour) once with every size; the ones that failed.

        Each measurement is observed at once; the table is remade at the end of the round if
        anything was measured.
        """
        failed: set[str] = set()
        measured = False
        for target in sorted(self.neighbours if targets is None else targets):
            for size in self.sizes:
                try:
                    seconds = await self.probe(session, target, size)
                except ProbeError as exc:
                    log.warning("%s; skipping %s this round", exc, target)
                    failed.add(target)
                    break
                self.forecaster.observe(self.site, target, size, seconds)
                measured = True
        self.rounds += 1
        if measured:
            table = table_from(self.forecaster, self.site, self.neighbours, time.time())
            async with self._new_table:
                self.table = table
                self._version += 1
                self._new_table.notify_all()
        return failed

    async def run(self, session: ClientSession | None = None) -> None:
        """Probe forever: a round every ``period`` s, failed neighbours retried in between."""
        if session is None:
            async with ClientSession() as own:
                await self.run(own)
            return
        if not self.neighbours:
            log.info("netmon %s: no neighbours to measure", self.site)
            return
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.start_delay)
        while True:
            deadline = loop.time() + self.period
            failed = await self.round(session)
            wait = self.retry
            while failed and loop.time() + wait < deadline:
                await asyncio.sleep(wait)
                failed = await self.round(session, failed)
                wait *= 2
            await asyncio.sleep(max(0.0, deadline - loop.time()))

    async def publish_tables(self, link: TablePublisher) -> None:
        """Publish the latest table now (if there is one) and every new one, until cancelled.

        Runs once per MQTT link: a rejoined link republishes the latest table.
        """
        published = 0
        while True:
            async with self._new_table:
                while self._version <= published:
                    await self._new_table.wait()
                published, table = self._version, self.table
            if table is not None:
                await link.publish_netmon_table(table)
