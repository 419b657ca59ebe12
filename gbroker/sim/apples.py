"""Jacobi2D on a shared, heterogeneous testbed: AppLeS's Figures 6 and 7 in virtual time (seed 003).

Theory of operation. The testbed (:data:`TESTBED`) has eight machines on three network segments
like the paper's (Figure 5), and every machine and network hop is shared with background work
that comes and goes: a birth-death chain per machine (and per hop) of competing processes
(flows), stepping every :data:`PERIOD` seconds. Each chain has its own rates, drawn per world,
and its own random stream, so every method meets the very same conditions (the runs are
paired: the paper ran its four methods back to back "hoping that all four executions would
enjoy similar conditions"; here they do exactly).

NWS watches the testbed for :data:`HISTORY` seconds before the run, feeding noisy measurements
to an NWS ensemble (:class:`netmon.ensemble.Series`); at the run's start the planner
(:func:`gbroker.core.apples.plan`) asks it for forecasts. The paper's four partitioning methods
(blocked, compile-time AppLeS, runtime AppLeS without and with resource selection) each plan
the run; a method whose planner finds no feasible partition balances compute alone and is
counted in ``fallbacks``.

The actual execution is then simulated with the *true* conditions, iteration by iteration, as a
bulk-synchronous step: an iteration lasts as long as the slowest rank's compute plus its border
exchanges at time t, and t moves on by that much. The testbed, the methods and the results:
docs/APPLES.md.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gbroker.core.apples import (
    PerformanceModel,
    Resource,
    blocked,
    communication,
    plan,
)
from gbroker.errors import InvalidInput
from gbroker.sim.experiment import estimate
from gbroker.sim.sweep import Run, Sweep
from netmon.ensemble import Series

__all__ = [
    "HISTORY",
    "METHODS",
    "PERIOD",
    "TESTBED",
    "Claim",
    "Machine",
    "MethodRun",
    "World",
    "check_claims",
    "execute",
    "forecasts",
    "jacobi_model",
    "run_experiment",
    "run_methods",
]

PERIOD = 10.0
"""Seconds between two steps of the background load, and between two NWS measurements."""
HISTORY = 600.0
"""Seconds NWS measures before the run starts."""
POINT_SECONDS = 0.5e-6
"""Seconds a speed-1 CPU (an RS6000 of 1996, some 10 Mflop/s on this loop) takes to update one
grid point (a five-point average: about five flops) once."""
POINT_BYTES = 8
MAX_LOAD = 3
NOISE = 0.05

METHODS = ("blocked", "compile-time AppLeS", "runtime AppLeS, no selection", "runtime AppLeS")


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    segment: str
    speed: float
    memory: float


MB = 1_000_000
TESTBED = (
    Machine("sparc2", "ucsd-eth1", 0.3, 32 * MB),
    Machine("sparc10", "ucsd-eth1", 0.8, 64 * MB),
    Machine("rs6000a", "ucsd-eth2", 1.0, 128 * MB),
    Machine("rs6000b", "ucsd-eth2", 1.0, 128 * MB),
    Machine("alpha1", "sdsc-fddi", 1.5, 128 * MB),
    Machine("alpha2", "sdsc-fddi", 1.5, 128 * MB),
    Machine("alpha3", "sdsc-fddi", 1.5, 128 * MB),
    Machine("alpha4", "sdsc-fddi", 1.5, 128 * MB),
)
"""The paper's eight workstations (Figure 5), with speeds relative to an RS6000."""

HOPS: dict[str, tuple[float, float]] = {
    "ucsd-eth1": (1.25 * MB, 0.5e-3),  # 10 Mb/s Ethernet: (bytes/s, latency s)
    "ucsd-eth2": (1.25 * MB, 0.5e-3),
    "ucsd-gw": (1.25 * MB, 1e-3),
    "sdsc-fddi": (12.5 * MB, 0.2e-3),  # 100 Mb/s FDDI
    "wan": (0.1 * MB, 5e-3),  # UCSD to SDSC, 0.8 Mb/s
}
"""Each shared network hop's nominal bandwidth and latency."""


def path(a: Machine, b: Machine) -> tuple[str, ...]:
    """The hops between two machines."""
    if a.segment == b.segment:
        return (a.segment,)
    ucsd = a.segment.startswith("ucsd"), b.segment.startswith("ucsd")
    if all(ucsd):
        return (a.segment, "ucsd-gw", b.segment)
    return (a.segment, "ucsd-gw", "wan", b.segment)


class Load:
    """A birth-death chain of k = 0..MAX_LOAD competitors, one step every PERIOD; 1 / (1 + k)."""

    __slots__ = ("_down", "_rng", "_states", "_up")

    def __init__(self, rng: random.Random, up: float, down: float) -> None:
        self._rng = rng
        self._up = up
        self._down = down
        self._states = [rng.randint(0, 2)]

    def share(self, t: float) -> float:
        step = int(t // PERIOD)
        while len(self._states) <= step:
            k = self._states[-1]
            draw = self._rng.random()
            if draw < self._up and k < MAX_LOAD:
                k += 1
            elif draw > 1 - self._down and k > 0:
                k -= 1
            self._states.append(k)
        return 1.0 / (1 + self._states[step])


@dataclass
class World:
    """One seed's testbed conditions (the same for every method) and NWS's view of them."""

    seed: int
    size: int
    cpu: dict[str, Load] = field(default_factory=dict)
    hops: dict[str, Load] = field(default_factory=dict)
    cpu_forecast: dict[str, float] = field(default_factory=dict)
    hop_forecast: dict[str, float] = field(default_factory=dict)

    @classmethod
    def make(cls, seed: int, size: int) -> World:
        rng = random.Random(f"apples:{seed}:{size}")
        world = cls(seed, size)
        for m in TESTBED:  # production machines: some busy, some nearly idle
            world.cpu[m.name] = Load(random.Random(rng.random()), rng.uniform(0.0, 0.08), 0.05)
        for hop in HOPS:
            world.hops[hop] = Load(random.Random(rng.random()), rng.uniform(0.0, 0.08), 0.05)
        noise = random.Random(rng.random())
        cpu_series = {m.name: Series() for m in TESTBED}
        hop_series = {hop: Series() for hop in HOPS}
        t = 0.0
        while t < HISTORY:
            for name, series in cpu_series.items():
                measured = world.cpu[name].share(t) * (1 + noise.gauss(0.0, NOISE))
                series.observe(min(1.0, max(0.01, measured)))
            for hop, series in hop_series.items():
                measured = HOPS[hop][0] * world.hops[hop].share(t) * (1 + noise.gauss(0.0, NOISE))
                series.observe(max(1.0, measured))
            t += PERIOD
        world.cpu_forecast = {n: min(1.0, max(0.01, s.forecast())) for n, s in cpu_series.items()}
        world.hop_forecast = {h: max(1.0, s.forecast()) for h, s in hop_series.items()}
        return world

    def bandwidth(self, a: Machine, b: Machine, t: float) -> tuple[float, float]:
        hops = path(a, b)
        return (
            min(HOPS[h][0] * self.hops[h].share(t) for h in hops),
            sum(HOPS[h][1] for h in hops),
        )


def jacobi_model(size: int, iterations: int) -> PerformanceModel:
    """Jacobi2D on a size x size grid cut in strips of rows (two grids of doubles in memory)."""
    return PerformanceModel(
        units=size,
        compute=size * POINT_SECONDS,
        exchange=size * POINT_BYTES,
        memory=2 * size * POINT_BYTES,
        iterations=iterations,
    )


_BY_NAME = {m.name: m for m in TESTBED}


def _static_link(a: str, b: str) -> tuple[float, float]:
    hops = path(_BY_NAME[a], _BY_NAME[b])
    return min(HOPS[h][0] for h in hops), sum(HOPS[h][1] for h in hops)


def _static() -> list[Resource]:
    return [Resource(m.name, 1, 1.0, m.speed, m.memory) for m in TESTBED]


def forecasts(world: World) -> tuple[list[Resource], Callable[[str, str], tuple[float, float]]]:
    """What the planner is told at the run's start: NWS's forecasts as resources and links."""
    resources = [
        Resource(m.name, 1, world.cpu_forecast[m.name], m.speed, m.memory) for m in TESTBED
    ]

    def link(a: str, b: str) -> tuple[float, float]:
        hops = path(_BY_NAME[a], _BY_NAME[b])
        return min(world.hop_forecast[h] for h in hops), sum(HOPS[h][1] for h in hops)

    return resources, link


def execute(
    world: World, model: PerformanceModel, sites: Sequence[str], units: Sequence[int]
) -> float:
    """The true execution time of a partition: iteration by iteration, in the true conditions."""
    machines = [_BY_NAME[s] for s in sites]
    t = HISTORY
    for _ in range(model.iterations):

        def link(a: str, b: str, t: float = t) -> tuple[float, float]:
            return world.bandwidth(_BY_NAME[a], _BY_NAME[b], t)

        comm = communication(model, sites, link)
        t += max(
            u * model.compute / (world.cpu[m.name].share(t) * m.speed) + c
            for m, u, c in zip(machines, units, comm, strict=True)
        )
    return t - HISTORY


@dataclass(frozen=True, slots=True)
class MethodRun:
    """One method's partition in one world: what it predicted and how long it really took."""

    method: str
    sites: tuple[str, ...]
    units: tuple[int, ...]
    actual: float
    predicted: float | None
    fallback: bool = False


def run_methods(seed: int, size: int, iterations: int) -> dict[str, MethodRun]:
    """The four methods in one world (seed, size), in :data:`METHODS` order."""
    if size < len(TESTBED):
        raise InvalidInput("size", f"at least {len(TESTBED)} rows (one per machine)", size)
    world = World.make(seed, size)
    model = jacobi_model(size, iterations)
    everyone = tuple(m.name for m in TESTBED)
    runs: dict[str, MethodRun] = {}

    def add(method: str, sites: tuple[str, ...], units: tuple[int, ...], **kw: object) -> None:
        actual = execute(world, model, sites, units)
        runs[method] = MethodRun(method, sites, units, actual, **kw)  # type: ignore[arg-type]

    add("blocked", everyone, tuple(blocked(model, len(everyone))), predicted=None)
    static = plan(model, _static(), _static_link)
    add("compile-time AppLeS", static.sites, static.units, predicted=static.predicted)
    resources, link = forecasts(world)
    try:
        whole = plan(model, resources, link, select=False)
    except InvalidInput:  # no balanced partition of every machine: balance the compute alone
        compute_only = plan(replace(model, exchange=0.0), resources, link, select=False)
        add(
            "runtime AppLeS, no selection",
            compute_only.sites,
            compute_only.units,
            predicted=None,
            fallback=True,
        )
    else:
        add("runtime AppLeS, no selection", whole.sites, whole.units, predicted=whole.predicted)
    best = plan(model, resources, link)
    add("runtime AppLeS", best.sites, best.units, predicted=best.predicted)
    return runs


def run_experiment(
    sizes: Sequence[int],
    iterations: int,
    seeds: int,
    progress: Callable[[int], None] | None = None,
    sweep: Sweep | None = None,
) -> dict[str, object]:
    """Every method at every size over ``seeds`` worlds: the figures as one JSON-ready mapping.

    Per size and method: the execution time (``time``), the planner's prediction where it made
    one (``predicted``, over the runs that have one), the machines used and the fallbacks; each
    a mean over seeds with its 95% Student-t half-width (:func:`gbroker.sim.experiment.estimate`).
    The per-seed ``values`` keep the pairing that :func:`check_claims` uses. Each seed of each
    size is one run of ``sweep`` (default: here, one after another); ``progress`` gets the runs
    done so far."""
    if seeds < 1:
        raise InvalidInput("seeds", "an integer >= 1", seeds)
    if iterations < 1:
        raise InvalidInput("iterations", "an integer >= 1", iterations)
    batch = [
        Run(f"seed {seed} of Jacobi2D N={size}", run_methods, (seed, size, iterations))
        for size in sizes
        for seed in range(seeds)
    ]
    done = (sweep or Sweep()).map(batch, progress)
    results = []
    for n, size in enumerate(sizes):
        runs = done[n * seeds : (n + 1) * seeds]
        methods: dict[str, object] = {}
        for method in METHODS:
            mine = [r[method] for r in runs]
            predicted = [r.predicted for r in mine if r.predicted is not None]
            methods[method] = {
                "time": estimate([r.actual for r in mine]).as_dict(),
                "predicted": estimate(predicted).as_dict() if predicted else None,
                "machines": estimate([float(len(r.sites)) for r in mine]).as_dict(),
                "fallbacks": sum(r.fallback for r in mine),
            }
        results.append({"size": size, "methods": methods})
    return {
        "experiment": "Jacobi2D on 8 shared machines, AppLeS Figures 6-7",
        "seeds": seeds,
        "iterations": iterations,
        "sizes": list(sizes),
        "methods": list(METHODS),
        "results": results,
    }


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim of the paper, judged size by size on paired per-seed ratios."""

    name: str
    rule: str
    holds: bool
    sizes: tuple[dict[str, object], ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "claim": self.name,
            "rule": self.rule,
            "holds": self.holds,
            "sizes": list(self.sizes),
        }


def _times(row: Mapping[str, object], method: str) -> list[float]:
    methods = row["methods"]
    assert isinstance(methods, Mapping)
    return [float(v) for v in methods[method]["time"]["values"]]


def check_claims(report: Mapping[str, object], tolerance: float = 0.05) -> list[Claim]:
    """The issue's two claims on a :func:`run_experiment` report.

    Each seed pairs two methods in the same world; r = time(A) / time(B) - 1 per seed, and the
    claim is judged on r's mean and 95% half-width over the seeds (0 with one seed):

    - *runtime AppLeS beats blocked at every size*: at every size, the upper bound of r
      (A = runtime AppLeS, B = blocked) is below 0;
    - *selection is never worse than using every machine*: at every size, the upper bound of r
      (A = runtime AppLeS, B = runtime AppLeS without selection) is at most ``tolerance``.
    """
    rows = report["results"]
    assert isinstance(rows, Sequence)
    specs = (
        (
            "runtime AppLeS beats blocked at every size",
            "runtime AppLeS",
            "blocked",
            "per seed r = runtime AppLeS / blocked - 1; at every size mean(r) + ci95(r) < 0",
            0.0,
            True,
        ),
        (
            "selection is never worse than using every machine",
            "runtime AppLeS",
            "runtime AppLeS, no selection",
            "per seed r = runtime AppLeS / runtime AppLeS without selection - 1; at every size"
            f" mean(r) + ci95(r) <= {tolerance:g}",
            tolerance,
            False,
        ),
    )
    claims = []
    for name, a, b, rule, limit, strict in specs:
        sizes = []
        for row in rows:
            ratios = [x / y - 1 for x, y in zip(_times(row, a), _times(row, b), strict=True)]
            e = estimate(ratios)
            upper = e.mean + e.half_width
            sizes.append(
                {
                    "size": row["size"],
                    "mean": e.mean,
                    "ci95": e.half_width,
                    "holds": upper < limit if strict else upper <= limit,
                }
            )
        claims.append(Claim(name, rule, all(s["holds"] for s in sizes), tuple(sizes)))
    return claims
