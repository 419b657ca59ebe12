"""DCSMon as a real service: sample the local scheduler, publish the site's state on MQTT.

Theory of operation. A :class:`DcsMon` takes samples of a site's state (n_j, c_j, q_j, s_j)
with the time each was taken, from a *sampler*, and publishes them (retained) through a
:class:`StatePublisher`, the daemon's :class:`~gbroker.mqtt.link.SiteLink` or a standalone
:class:`~gbroker.mqtt.link.MonitorLink`. It publishes once when it starts (so every (re)joined
link carries the current state), then whenever the state differs from the last one published,
at most once per ``period`` seconds: neighbours' views are stale by up to one period, never
flooded. The same loop serves both modes:

- **in-process** (the broker daemon, the default): the sampler reads the local scheduler
  directly (:func:`local_sampler`), and the daemon wakes the loop when something changed, so
  nothing is sampled in vain;
- **standalone** (``gbroker dcsmon serve``, :func:`gbroker.daemon.monitors.serve_dcsmon`): the
  sampler asks the site's broker over HTTP (``GET /api/v1/state``, :class:`HttpSampler`) every
  period. A broker that does not answer is logged and asked again next period, never fatal; a broker
  of another site is a configuration error and stops the monitor.

:func:`state_document` and :func:`observation_from_document` are the JSON form of a sample, as
``/api/v1/state`` serves it: the ``site-state`` wire message's fields.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import aiohttp
from aiohttp import ClientSession, ClientTimeout

from gbroker.core.model import Observation, SiteState
from gbroker.errors import GBrokerError, InvalidInput

__all__ = [
    "STATE_PATH",
    "DcsMon",
    "HttpSampler",
    "SampleError",
    "StatePublisher",
    "StateSampler",
    "local_sampler",
    "observation_from_document",
    "state_document",
]

log = logging.getLogger("dcsmon")

STATE_PATH: Final = "/api/v1/state"
"""The broker's client route that answers its site's current state."""

StateSampler = Callable[[], Awaitable[Observation]]
"""Takes one sample of a site's state, stamped with the time it was taken."""

_COUNTS: Final = ("total_cores", "free_cores", "queued", "running")


class SampleError(GBrokerError, ConnectionError):
    """The site's broker could not be sampled (it is down, or answered an error)."""


class StatePublisher(Protocol):
    """Where states go: a :class:`~gbroker.mqtt.link.SiteLink` or ``MonitorLink``."""

    async def publish_state(self, state: SiteState, observed_at: float) -> None: ...


def state_document(site: str, observation: Observation) -> dict[str, Any]:
    """The JSON form of a sample: site, total_cores, free_cores, queued, running, observed_at,
    ``draining: true`` when it is, ``shrinkable`` (busy cores shrinking would free at once) and
    ``shareable`` (busy cores SD-Policy's mates would give a job that may share) when there are
    some, and ``cpu`` (the forecast CPU availability) when it is measured."""
    state = observation.state
    document: dict[str, Any] = {
        "site": site,
        "total_cores": state.total_cores,
        "free_cores": state.free_cores,
        "queued": state.queued,
        "running": state.running,
        "observed_at": observation.observed_at,
    }
    if state.draining:  # only then: a site that is not draining reports what it always did
        document["draining"] = True
    if state.shrinkable:
        document["shrinkable"] = state.shrinkable
    if state.shareable:
        document["shareable"] = state.shareable
    if state.cpu is not None:
        document["cpu"] = state.cpu
    return document


def observation_from_document(document: object, site: str) -> Observation:
    """The observation in a :func:`state_document` of ``site``; InvalidInput names what is wrong."""
    if not isinstance(document, Mapping):
        raise InvalidInput("state", "a JSON object", type(document).__name__)
    if document.get("site") != site:
        raise InvalidInput("state.site", f"{site!r} (the monitored site)", document.get("site"))
    counts: dict[str, int] = {}
    for name in _COUNTS:
        value = document.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"state.{name}", "an integer >= 0", value)
        counts[name] = value
    at = document.get("observed_at")
    if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
        raise InvalidInput("state.observed_at", "a finite number (seconds)", at)
    draining = document.get("draining", False)  # absent: a broker from before draining
    if not isinstance(draining, bool):
        raise InvalidInput("state.draining", "true or false", draining)
    lendable: dict[str, int] = {}
    for name in ("shrinkable", "shareable"):  # absent: none, or an older broker
        value = document.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"state.{name}", "an integer >= 0", value)
        lendable[name] = value
    cpu = document.get("cpu")  # absent: not measured, or an older broker
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int | float)):
        raise InvalidInput("state.cpu", "a fraction of a core, 0 < cpu <= 1", cpu)
    try:
        state = SiteState(
            counts["total_cores"],
            counts["free_cores"],
            counts["queued"],
            counts["running"],
            draining=draining,
            shrinkable=lendable["shrinkable"],
            shareable=lendable["shareable"],
            cpu=None if cpu is None else float(cpu),
        )
    except InvalidInput as exc:
        raise InvalidInput(
            "state." + exc.field.removeprefix("site."), exc.expected, exc.found
        ) from exc
    return Observation(state, float(at))


def local_sampler(state: Callable[[], SiteState]) -> StateSampler:
    """A sampler reading ``state()`` in-process, stamped with the wall clock."""

    async def sample() -> Observation:
        return Observation(state(), time.time())

    return sample


class HttpSampler:
    """Samples ``site``'s broker at ``broker_url`` over HTTP (``GET /api/v1/state``).

    Raises :class:`SampleError` when the broker cannot be reached or answers an error, and
    :class:`~gbroker.errors.InvalidInput` when it answers for another site or with a bad state.
    """

    def __init__(
        self,
        session: ClientSession,
        broker_url: str,
        site: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.session = session
        self.url = broker_url.rstrip("/") + STATE_PATH
        self.site = site
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = ClientTimeout(total=timeout)

    async def __call__(self) -> Observation:
        try:
            async with self.session.get(
                self.url, headers=self.headers, timeout=self.timeout
            ) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise SampleError(
                        f"dcsmon {self.site}: {self.url}: HTTP {response.status} {text}"
                    )
                document = await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise SampleError(f"dcsmon {self.site}: cannot sample {self.url}: {reason}") from exc
        except ValueError as exc:  # not JSON
            raise SampleError(f"dcsmon {self.site}: {self.url} answered no JSON") from exc
        return observation_from_document(document, self.site)


class DcsMon:
    """Publishes a site's state: at start, then on change, at most once per ``period``.

    Args:
        sample: the sampler (:func:`local_sampler`, :class:`HttpSampler`).
        period: minimum seconds between two publications (and, without ``changed``, between
            two samples).
        changed: set by the caller when the state may have changed; without it, the monitor
            samples every period.
    """

    def __init__(
        self, sample: StateSampler, period: float, changed: asyncio.Event | None = None
    ) -> None:
        if not (isinstance(period, int | float) and math.isfinite(period) and period >= 0):
            raise InvalidInput("dcsmon.period", "seconds >= 0", period)
        self.sample = sample
        self.period = float(period)
        self.changed = changed
        self.published = 0
        """States published so far (over every link)."""

    async def publish_states(self, link: StatePublisher) -> None:
        """Publish through ``link`` until cancelled (or until the link fails: LinkError)."""
        last: SiteState | None = None
        first = True
        failing = False
        while True:
            if self.changed is not None and not first:
                await self.changed.wait()
                self.changed.clear()
            first = False
            try:
                observation = await self.sample()
            except SampleError as exc:
                # Say it once, not every period, while the broker stays away.
                level = logging.DEBUG if failing else logging.WARNING
                log.log(level, "%s; trying again every %g s", exc, self.period)
                failing = True
            else:
                if failing:
                    log.info("dcsmon: sampling works again")
                    failing = False
                if observation.state != last:
                    await link.publish_state(observation.state, observation.observed_at)
                    last = observation.state
                    self.published += 1
            await asyncio.sleep(self.period)
