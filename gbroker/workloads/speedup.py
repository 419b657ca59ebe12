"""How long a job's work takes on n cores: the speed-up models a malleable simulation runs on.

A model gives ``run_time(n)``, the seconds the job's whole work takes on ``n`` cores (nodes, in
ElastiSim's platform), and ``reconfiguration(n)``, the seconds of no progress that starting on,
or changing to, ``n`` cores costs. A job's progress is the fraction of its work done; on ``n``
cores it advances at ``1 / run_time(n)`` per second (:mod:`gbroker.sim.elastic`).

- :class:`Linear`: perfect speed-up from the time at the job's rank (what the plans assume).
- :class:`Amdahl`: a serial fraction ``f``: T(n) = T(1) (f + (1 - f) / n) (Amdahl, 1967).
- :class:`Downey`: Downey's model of average parallelism ``A`` and its variance ``sigma``
  (A. B. Downey, *A model for speedup of parallel programs*, UCB/CSD-97-933, 1997), the speed-up
  S(n) below, T(n) = T(1) / S(n).
- :class:`ElastiSimApplication`: ElastiSim's application model (its example's
  ``application_model.json``) on its platform (``crossbar.xml``): an initialisation (and the same
  on each reconfiguration), then iterations of a coupled compute-and-communicate task and a
  checkpoint. ElastiSim simulates its flows on SimGrid; here each task takes its time alone on the
  platform, with no contention between jobs for the parallel file system (see
  ``docs/MALLEABILITY.md`` for what that changes).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import defusedxml.ElementTree as ET

from gbroker.errors import InvalidInput

__all__ = [
    "Amdahl",
    "Downey",
    "ElastiSimApplication",
    "ElastiSimPlatform",
    "Linear",
    "SpeedupModel",
]


class SpeedupModel(Protocol):
    def run_time(self, cores: int) -> float: ...

    def reconfiguration(self, cores: int) -> float: ...


@dataclass(frozen=True, slots=True)
class Linear:
    """Perfect speed-up: ``time`` seconds on ``rank`` cores."""

    time: float
    rank: int
    cost: float = 0.0

    def run_time(self, cores: int) -> float:
        return self.time * self.rank / cores

    def reconfiguration(self, cores: int) -> float:
        return self.cost


@dataclass(frozen=True, slots=True)
class Amdahl:
    """``serial`` fraction of ``time_one`` (the time on one core) does not parallelise."""

    time_one: float
    serial: float
    cost: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.serial <= 1:
            raise InvalidInput("amdahl.serial", "a fraction in [0, 1]", self.serial)

    def run_time(self, cores: int) -> float:
        return self.time_one * (self.serial + (1 - self.serial) / cores)

    def reconfiguration(self, cores: int) -> float:
        return self.cost


@dataclass(frozen=True, slots=True)
class Downey:
    """Downey's speed-up of average parallelism ``parallelism`` (A >= 1) and ``sigma`` >= 0."""

    time_one: float
    parallelism: float
    sigma: float
    cost: float = 0.0

    def __post_init__(self) -> None:
        if not self.parallelism >= 1:
            raise InvalidInput("downey.parallelism", "a number >= 1", self.parallelism)
        if not self.sigma >= 0:
            raise InvalidInput("downey.sigma", "a number >= 0", self.sigma)

    def speedup(self, n: int) -> float:
        a, s = self.parallelism, self.sigma
        if s <= 1:  # low variance
            if n <= a:
                return a * n / (a + s * (n - 1) / 2)
            if n <= 2 * a - 1:
                return a * n / (s * (a - 0.5) + n * (1 - s / 2))
            return a
        if n <= a + a * s - s:  # high variance
            return n * a * (s + 1) / (s * (n + a - 1) + a)
        return a

    def run_time(self, cores: int) -> float:
        return self.time_one / self.speedup(cores)

    def reconfiguration(self, cores: int) -> float:
        return self.cost


# -- ElastiSim --------------------------------------------------------------------------------

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def _quantity(text: str, unit: str, what: str) -> float:
    """``100Gf``, ``80GBps``, ``100Gbps``: a number with an SI prefix and ``unit``."""
    match = re.fullmatch(rf"([0-9.]+)\s*([kKmMgGtT]?){unit}", text.strip())
    if match is None:
        raise InvalidInput(what, f"a quantity like 100G{unit}", text)
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass(frozen=True, slots=True)
class ElastiSimPlatform:
    """What of a SimGrid platform ElastiSim's example uses: nodes, their speed (flop/s) and link
    bandwidth (bytes/s), and the parallel file system's read and write bandwidths (bytes/s)."""

    nodes: int
    node_speed: float
    node_bandwidth: float
    pfs_read: float
    pfs_write: float

    @classmethod
    def load(cls, path: str | Path) -> ElastiSimPlatform:
        root = ET.parse(str(path)).getroot()
        cluster = root.find(".//cluster")
        if cluster is None:
            raise InvalidInput(f"{path}", "a SimGrid platform with a <cluster>", None)
        low, _, high = cluster.get("radical", "").partition("-")
        try:
            nodes = int(high) - int(low) + 1
        except ValueError:
            raise InvalidInput(f"{path}: cluster.radical", "a range like 100-227", low) from None
        links = {link.get("id"): link.get("bandwidth", "") for link in root.iter("link")}
        return cls(
            nodes=nodes,
            node_speed=_quantity(cluster.get("speed", ""), "f", "cluster.speed"),
            node_bandwidth=_quantity(cluster.get("bw", ""), "bps", "cluster.bw") / 8,
            pfs_read=_quantity(links.get("PFS_read", ""), "Bps", "link PFS_read"),
            pfs_write=_quantity(links.get("PFS_write", ""), "Bps", "link PFS_write"),
        )


_FLOPS = re.compile(r"\s*(\w+)\s*/\s*num_nodes\s*\^\s*(\w+)\s*")
_EVOLVING = re.compile(
    r"\s*phase_iteration\s*%\s*2\s*==\s*0\s*\?\s*num_nodes\s*([-+])\s*(\d+)"
    r"\s*:\s*num_nodes\s*([-+])\s*(\d+)\s*"
)


@dataclass(frozen=True, slots=True)
class ElastiSimApplication:
    """One job of ElastiSim's example: its application model with its ``arguments``.

    Per iteration on n nodes: the coupled compute-and-communicate task takes the longer of
    ``flops / n^alpha / node_speed`` (each node's share) and an all-to-all of
    ``communication_size`` bytes (``communication_size (n - 1) / n / node_bandwidth``); the
    checkpoint writes ``checkpoint_size`` bytes through the file system's write link. The
    initialisation, and each reconfiguration, reads ``model_size`` bytes through the read link and
    scatters them from one node (``model_size (n - 1) / n / node_bandwidth``).
    """

    platform: ElastiSimPlatform
    iterations: int
    flops: float
    alpha: float
    model_size: float
    checkpoint_size: float
    communication_size: float
    evolving_step: tuple[int, int] | None = None  # (change at even, at odd iterations)

    @classmethod
    def from_model(
        cls, model: dict[str, Any], arguments: dict[str, Any], platform: ElastiSimPlatform
    ) -> ElastiSimApplication:
        try:
            (phase,) = model["phases"]
            compute = next(t for t in phase["tasks"] if t["type"] == "cpu")
            flops = _FLOPS.fullmatch(compute["flops"])
            if flops is None:
                raise InvalidInput("phases.tasks.flops", "NAME/num_nodes^NAME", compute["flops"])
            step = None
            if "evolving_request" in phase:
                match = _EVOLVING.fullmatch(phase["evolving_request"])
                if match is None:
                    raise InvalidInput(
                        "phases.evolving_request",
                        "phase_iteration % 2 == 0 ? num_nodes -K : num_nodes +K",
                        phase["evolving_request"],
                    )
                sign = {"+": 1, "-": -1}
                step = (
                    sign[match.group(1)] * int(match.group(2)),
                    sign[match.group(3)] * int(match.group(4)),
                )
            return cls(
                platform=platform,
                iterations=int(arguments[phase["iterations"]]),
                flops=float(arguments[flops.group(1)]),
                alpha=float(arguments[flops.group(2)]),
                model_size=float(arguments["model_size"]),
                checkpoint_size=float(arguments["checkpoint_size"]),
                communication_size=float(arguments["communication_size"]),
                evolving_step=step,
            )
        except (KeyError, ValueError, TypeError, StopIteration) as exc:
            raise InvalidInput("application_model", "ElastiSim's example model", exc) from None

    def iteration_time(self, n: int) -> float:
        p = self.platform
        compute = self.flops / math.pow(n, self.alpha) / p.node_speed
        exchange = self.communication_size * (n - 1) / n / p.node_bandwidth
        return max(compute, exchange) + self.checkpoint_size / p.pfs_write

    def run_time(self, cores: int) -> float:
        return self.iterations * self.iteration_time(cores)

    def reconfiguration(self, cores: int) -> float:
        p = self.platform
        return (
            self.model_size / p.pfs_read + self.model_size * (cores - 1) / cores / p.node_bandwidth
        )

    def evolving_request(self, iteration: int, cores: int) -> int | None:
        """The size an evolving job asks for at the start of ``iteration`` (0-based)."""
        if self.evolving_step is None:
            return None
        return cores + self.evolving_step[iteration % 2]


def load_model(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        model = json.load(f)
    if not isinstance(model, dict):
        raise InvalidInput(str(path), "a JSON object (an ElastiSim application model)", type(model))
    return model
