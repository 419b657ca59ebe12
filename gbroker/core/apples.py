"""The AppLeS planner: a job's own performance model chooses its sites and its partition (seed 003).

Theory of operation. AppLeS (Berman, Wolski et al., 1996) schedules an application with the
application's own model of how it performs. For Jacobi2D, a grid cut into strips, rank i with
u_i rows takes per iteration

    T_i = u_i * a_i + comm_i,    a_i = compute / (cores * cpu_i * speed_i)

seconds: its area times its time per unit (slowed by the forecast CPU availability ``cpu_i`` and
the site's relative ``speed_i``), plus its border exchange with each neighbour over the forecast
link. With a strip the border is a row whatever u_i is, so comm_i does not depend on u_i.

The four parts of an AppLeS agent, in this module's words: **resource selection**
(:func:`order`: from a locus, the resource the application's own model finds nearest is
appended again and again, and the candidate sets are the list's prefixes); **planning**
(:func:`partition`: every T_i set equal, solved in closed form, then made integers so that the
largest T_i stays as small as integers allow); **filtering** (a set where a rank would need no
area, more memory than its resource offers, or more idle cores than it has is kept as a
:class:`Candidate` with the reason); **estimation** (``iterations * max_i T_i``; the plan is the
feasible candidate of least predicted time).

The model language (:func:`parse_model`) is a mapping a job carries as ``model``. Each part's
rules and why they depart from the paper's d(i, j): docs/APPLES.md. Everything here is pure: the
forecasts come in as numbers and a link function.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gbroker.errors import InvalidInput

__all__ = [
    "MODEL_KEYS",
    "TOPOLOGIES",
    "Candidate",
    "LinkForecast",
    "PerformanceModel",
    "Plan",
    "Resource",
    "blocked",
    "communication",
    "evaluate",
    "neighbours",
    "order",
    "parse_model",
    "partition",
    "plan",
]

LinkForecast = Callable[[str, str], tuple[float, float]]
"""(bandwidth in bytes/s, latency in s) forecast between two sites."""

TOPOLOGIES = ("strip", "ring")
"""Who exchanges borders with whom: ``strip``, rank i with i - 1 and i + 1 (the first and last
have one neighbour); ``ring``, the same and the last with the first (periodic boundaries)."""

MODEL_KEYS = ("units", "compute", "exchange", "memory", "iterations", "cores", "topology")
"""The model language's keys (docs/APPLES.md)."""


# The largest value of each key: far beyond any real job, and small enough that every product the
# planner forms (units x compute x iterations, ...) stays a finite float.
_MOST = {
    "units": 1 << 40,
    "compute": 1e6,
    "exchange": float(1 << 40),
    "memory": float(1 << 50),
    "iterations": 10**9,
    "cores": 1 << 20,
}


def _integer(key: str, value: object, low: int) -> int:
    high = int(_MOST[key])
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"model.{key}", f"an integer from {low} to {high}", value)
    return value


def _number(key: str, value: object, *, positive: bool, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"model.{key}", f"a number of {what}", value)
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0) or number > _MOST[key]:
        bound = "> 0" if positive else ">= 0"
        raise InvalidInput(
            f"model.{key}", f"a finite number of {what} {bound}, at most {_MOST[key]:g}", value
        )
    return number


@dataclass(frozen=True, slots=True)
class PerformanceModel:
    """A job's model (the model language, docs/APPLES.md); checked on construction."""

    units: int
    """Work units to partition between the ranks (Jacobi2D: the grid's rows)."""
    compute: float
    """Core-seconds one unit takes per iteration on a speed-1 core at full availability."""
    exchange: float = 0.0
    """Bytes a rank sends each neighbour per iteration (Jacobi2D: a row)."""
    memory: float = 0.0
    """Bytes one unit needs."""
    iterations: int = 1
    cores: int = 1
    """Cores of every component (rank)."""
    topology: str = "strip"

    def __post_init__(self) -> None:
        _integer("units", self.units, 1)
        object.__setattr__(
            self, "compute", _number("compute", self.compute, positive=True, what="core-seconds")
        )
        object.__setattr__(
            self, "exchange", _number("exchange", self.exchange, positive=False, what="bytes")
        )
        object.__setattr__(
            self, "memory", _number("memory", self.memory, positive=False, what="bytes")
        )
        _integer("iterations", self.iterations, 1)
        _integer("cores", self.cores, 1)
        if self.topology not in TOPOLOGIES:
            raise InvalidInput("model.topology", f"one of {', '.join(TOPOLOGIES)}", self.topology)

    def as_dict(self) -> dict[str, object]:
        """The model in its language (what :func:`parse_model` reads back)."""
        return {key: getattr(self, key) for key in MODEL_KEYS}


def parse_model(data: Mapping[str, object]) -> PerformanceModel:
    """A job's ``model`` mapping as a :class:`PerformanceModel`; InvalidInput names
    ``model.<key>`` and what was expected (unknown keys are refused by name)."""
    if not isinstance(data, Mapping):
        raise InvalidInput("model", "a mapping of " + ", ".join(MODEL_KEYS), type(data).__name__)
    for key in data:
        if not isinstance(key, str):
            raise InvalidInput("model", "keys that are strings", key)
    unknown = sorted(k for k in data if k not in MODEL_KEYS)
    if unknown:
        raise InvalidInput(
            f"model.{unknown[0]}",
            f"one of the model's keys ({', '.join(MODEL_KEYS)}); unknown: {', '.join(unknown)}",
        )
    for key in ("units", "compute"):
        if key not in data:
            raise InvalidInput(f"model.{key}", "a value (it is required)")
    topology = data.get("topology", "strip")
    if not isinstance(topology, str):
        raise InvalidInput("model.topology", f"one of {', '.join(TOPOLOGIES)}", topology)
    return PerformanceModel(
        units=data["units"],  # type: ignore[arg-type]  # checked by the constructor
        compute=data["compute"],  # type: ignore[arg-type]
        exchange=data.get("exchange", 0.0),  # type: ignore[arg-type]
        memory=data.get("memory", 0.0),  # type: ignore[arg-type]
        iterations=data.get("iterations", 1),  # type: ignore[arg-type]
        cores=data.get("cores", 1),  # type: ignore[arg-type]
        topology=topology,
    )


@dataclass(frozen=True, slots=True)
class Resource:
    """A site the planner may use, with its forecasts."""

    site: str
    cores: int
    """Idle cores offered."""
    cpu: float
    """Forecast fraction of a core a new process gets there (NWS's CPU availability), in (0, 1]."""
    speed: float = 1.0
    """Relative speed of a core (the topology's ``speed``)."""
    memory: float | None = None
    """Bytes a component may use there (None: not limited)."""

    def __post_init__(self) -> None:
        where = f"resource {self.site!r}"
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 0:
            raise InvalidInput(f"{where}.cores", "an integer >= 0", self.cores)
        if not 0 < self.cpu <= 1:
            raise InvalidInput(f"{where}.cpu", "a CPU availability in (0, 1]", self.cpu)
        if not 0 < self.speed < math.inf:
            raise InvalidInput(f"{where}.speed", "a finite number > 0", self.speed)
        if self.memory is not None and not 0 <= self.memory < math.inf:
            raise InvalidInput(f"{where}.memory", "bytes >= 0, or None", self.memory)

    def unit_time(self, model: PerformanceModel) -> float:
        """a_i: seconds one unit takes per iteration here."""
        return model.compute / (model.cores * self.cpu * self.speed)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A resource set the planner weighed: its partition and predicted time, or why not."""

    sites: tuple[str, ...]
    units: tuple[int, ...] = ()
    predicted: float | None = None
    """Seconds (iterations x the slowest rank's iteration); None when filtered out."""
    reason: str | None = None
    """Why the set is infeasible (None: feasible)."""

    @property
    def feasible(self) -> bool:
        return self.reason is None

    def as_dict(self) -> dict[str, object]:
        return {
            "sites": list(self.sites),
            "units": list(self.units),
            "predicted": self.predicted,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The chosen set (in rank order), its partition and predicted time, and every candidate."""

    sites: tuple[str, ...]
    units: tuple[int, ...]
    cores: tuple[int, ...]
    predicted: float
    candidates: tuple[Candidate, ...] = field(default=())
    locus: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "sites": list(self.sites),
            "units": list(self.units),
            "cores": list(self.cores),
            "predicted": self.predicted,
            "locus": self.locus,
            "candidates": [c.as_dict() for c in self.candidates],
        }


def _link(link: LinkForecast, a: str, b: str) -> tuple[float, float]:
    bandwidth, latency = link(a, b)
    if not 0 < bandwidth <= math.inf:
        raise InvalidInput(f"link {a}->{b}.bandwidth", "bytes per second > 0", bandwidth)
    if not 0 <= latency < math.inf:
        raise InvalidInput(f"link {a}->{b}.latency", "seconds >= 0", latency)
    return bandwidth, latency


def _message(model: PerformanceModel, link: LinkForecast, a: str, b: str) -> float:
    """Seconds to exchange one border between sites a and b."""
    if model.exchange == 0:
        return 0.0
    bandwidth, latency = _link(link, a, b)
    return model.exchange / bandwidth + latency


def neighbours(model: PerformanceModel, ranks: int) -> list[list[int]]:
    """Each rank's neighbours under the model's topology (a ring of two: each other, twice)."""
    out: list[list[int]] = [[] for _ in range(ranks)]
    for i in range(ranks - 1):
        out[i].append(i + 1)
        out[i + 1].append(i)
    if model.topology == "ring" and ranks > 1:
        out[ranks - 1].append(0)
        out[0].append(ranks - 1)
    return out


def communication(model: PerformanceModel, sites: Sequence[str], link: LinkForecast) -> list[float]:
    """comm_i: each rank's border exchange per iteration, in seconds."""
    return [
        sum(_message(model, link, sites[i], sites[j]) for j in nbrs)
        for i, nbrs in enumerate(neighbours(model, len(sites)))
    ]


def order(
    model: PerformanceModel, resources: Sequence[Resource], link: LinkForecast, locus: str
) -> tuple[list[Resource], list[Candidate]]:
    """The chain from the locus (the paper's Figure 3) and its prefixes weighed (module docstring).

    Each step appends the resource nearest the chain by the model's own distance: the predicted
    time of the chain with it (infeasible: last; ties: the shorter border exchange with the
    tail, the faster resource, the caller's order)."""
    messages: dict[tuple[str, str], tuple[float, float]] = {}

    def cached(a: str, b: str) -> tuple[float, float]:
        if (a, b) not in messages:
            messages[a, b] = _link(link, a, b)
        return messages[a, b]

    left = [r for r in resources if r.site != locus]
    chain = [next(r for r in resources if r.site == locus)]
    prefixes = [evaluate(model, chain, cached)]
    while left:
        tail = chain[-1].site
        weighed = []
        for k, r in enumerate(left):
            candidate = evaluate(model, [*chain, r], cached)
            key = (
                math.inf if candidate.predicted is None else candidate.predicted,
                _message(model, cached, tail, r.site),
                r.unit_time(model),
                k,
            )
            weighed.append((key, candidate))
        key, candidate = min(weighed, key=lambda pair: pair[0])
        chain.append(left.pop(key[-1]))
        prefixes.append(candidate)
    return chain, prefixes


def partition(
    model: PerformanceModel, unit_times: Sequence[float], comm: Sequence[float]
) -> tuple[list[int], tuple[int, str] | None]:
    """The integer units that balance T_i = u_i a_i + comm_i (module docstring).

    Returns (units, None), or ([], (rank, reason)) naming the first rank (0-based) whose area
    would be negative or zero."""
    inverse = sum(1.0 / a for a in unit_times)
    balanced = (model.units + sum(c / a for c, a in zip(comm, unit_times, strict=True))) / inverse
    real = [(balanced - c) / a for c, a in zip(comm, unit_times, strict=True)]
    for rank, (u, c) in enumerate(zip(real, comm, strict=True)):
        if u <= 0:
            return [], (
                rank,
                f"a {'negative' if u < 0 else 'zero'} area: its border exchange ({c:.4g} s)"
                f" outlasts the balanced iteration ({balanced:.4g} s)",
            )
    units = [math.floor(u) for u in real]
    # Each unit left to the rank it slows least (a heap of each rank's time with one unit more).
    heap = [
        ((u + 1) * a + c, i)
        for i, (u, a, c) in enumerate(zip(units, unit_times, comm, strict=True))
    ]
    heapq.heapify(heap)
    for _ in range(model.units - sum(units)):
        _, i = heapq.heappop(heap)
        units[i] += 1
        heapq.heappush(heap, ((units[i] + 1) * unit_times[i] + comm[i], i))
    for rank, u in enumerate(units):
        if u == 0:
            return [], (rank, "a zero area: no unit left for it once rounded")
    return units, None


def evaluate(
    model: PerformanceModel, resources: Sequence[Resource], link: LinkForecast
) -> Candidate:
    """Plan, filter and estimate one resource set in this rank order (one rank per resource)."""
    sites = tuple(r.site for r in resources)
    for r in resources:
        if r.cores < model.cores:
            return Candidate(
                sites,
                reason=f"{r.site} offers {r.cores} idle cores; a component needs {model.cores}",
            )
    unit_times = [r.unit_time(model) for r in resources]
    comm = communication(model, sites, link)
    units, failed = partition(model, unit_times, comm)
    if failed is not None:
        rank, why = failed
        return Candidate(sites, reason=f"{sites[rank]} (rank {rank}) would need {why}")
    for r, u in zip(resources, units, strict=True):
        if r.memory is not None and u * model.memory > r.memory:
            return Candidate(
                sites,
                tuple(units),
                reason=f"{r.site}: {u} units need {u * model.memory:.4g} bytes of memory;"
                f" it offers {r.memory:.4g}",
            )
    iteration = max(u * a + c for u, a, c in zip(units, unit_times, comm, strict=True))
    return Candidate(sites, tuple(units), model.iterations * iteration)


def blocked(model: PerformanceModel, ranks: int) -> list[int]:
    """HPF's block partition: equal shares, the remainder one each to the first ranks."""
    share, extra = divmod(model.units, ranks)
    return [share + (1 if i < extra else 0) for i in range(ranks)]


def plan(
    model: PerformanceModel,
    resources: Sequence[Resource],
    link: LinkForecast,
    *,
    locus: str | None = None,
    select: bool = True,
) -> Plan:
    """Select, filter, plan and estimate (module docstring); InvalidInput when nothing fits."""
    if not resources:
        raise InvalidInput("resources", "at least one resource to plan on", [])
    names = [r.site for r in resources]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidInput("resources", "each site once", dup)
    if locus is None:
        locus = min(resources, key=lambda r: r.unit_time(model)).site
    elif locus not in names:
        raise InvalidInput("locus", f"one of the resources' sites ({', '.join(names)})", locus)
    _, prefixes = order(model, resources, link, locus)
    candidates = tuple(prefixes if select else prefixes[-1:])
    feasible = [c for c in candidates if c.predicted is not None]
    if not feasible:
        reasons = "; ".join(f"{'+'.join(c.sites)}: {c.reason}" for c in candidates)
        raise InvalidInput("model", f"a resource set the model can run on (none fits: {reasons})")
    best = min(feasible, key=lambda c: (c.predicted, len(c.sites)))
    assert best.predicted is not None
    return Plan(
        best.sites,
        best.units,
        (model.cores,) * len(best.sites),
        best.predicted,
        candidates,
        locus,
    )
