"""Experiments: a workload over a topology with one policy, repeated over seeds, with intervals.

``run_experiment`` is what ``gbroker sim`` calls; the figure scripts sweep all their points at
once from the same parts: :func:`plan_experiment` checks the configuration,
:meth:`Experiment.runs` is one :class:`~gbroker.sim.sweep.Run` per seed (:func:`run_seed`), which
a :class:`~gbroker.sim.sweep.Sweep` runs here or on Dask, and :meth:`Experiment.report` reduces
their results, in seed order. Seed k (k = 0..K-1) draws the
workload and every random decision from ``random.Random(base_seed + k)``, so each run can be
repeated exactly, wherever it runs. Every figure is reported as its mean over the seeds with a
95% Student-t confidence half-width (0 with one seed).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

from gbroker.core.dispatch import DispatchPolicy
from gbroker.errors import InvalidInput
from gbroker.sim.grid import GridConfig, GridSimulation, GridSummary
from gbroker.sim.sweep import Run, Sweep
from gbroker.topology import Topology
from gbroker.workloads.streams import Arrival, paper_streams

__all__ = [
    "Estimate",
    "Experiment",
    "ExperimentReport",
    "SeedResult",
    "entry_sites",
    "estimate",
    "plan_experiment",
    "run_experiment",
    "run_seed",
]


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    half_width: float
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "ci95": self.half_width, "values": list(self.values)}


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and 95% Student-t half-width of independent replications."""
    n = len(values)
    if n == 0:
        raise InvalidInput("values", "at least one replication", values)
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, 0.0, tuple(values))
    from scipy.stats import t  # lazy: only multi-seed runs need it

    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = float(t.ppf(0.975, n - 1)) * (variance / n) ** 0.5
    return Estimate(mean, half, tuple(values))


@dataclass(frozen=True, slots=True)
class ExperimentReport:
    topology: str
    policy: DispatchPolicy
    rate: float
    jobs: int
    entries: tuple[str, ...]
    seeds: int
    metrics: dict[str, Estimate]
    double_starts: int

    def as_dict(self) -> dict[str, object]:
        policy = asdict(self.policy)
        policy["algorithm"] = str(self.policy.algorithm)
        return {
            "topology": self.topology,
            "policy": policy,
            "rate": self.rate,
            # The count asked for; "jobs" is the summary's, the jobs served (mean over seeds).
            "jobs_requested": self.jobs,
            "entries": list(self.entries),
            "seeds": self.seeds,
            "double_starts": self.double_starts,
            **{name: e.as_dict() for name, e in self.metrics.items()},
        }


def entry_sites(topology: Topology, streams: int, entry: str | None) -> tuple[str, ...]:
    """The brokers S streams enter: ``entry`` (default: where the data lives) and the next ones."""
    sites = list(topology.sites)
    if streams < 1 or streams > len(sites):
        raise InvalidInput("streams", f"between 1 and the {len(sites)} sites", streams)
    first = entry or next(iter(topology.data.values()), sites[0])
    if first not in topology.sites:
        raise InvalidInput("entry", f"a site of {topology.name}", first)
    start = sites.index(first)
    return tuple(sites[(start + k) % len(sites)] for k in range(streams))


@dataclass(frozen=True, slots=True)
class SeedResult:
    """What one seed's run of an experiment gives back: its summary and the jobs started twice."""

    summary: GridSummary
    double_starts: int


def run_seed(
    topology: Topology,
    config: GridConfig,
    rate: float,
    jobs: int,
    entries: tuple[str, ...],
    data_site: str,
    seed: int,
    workload: Callable[[random.Random, tuple[str, ...]], list[Arrival]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> SeedResult:
    """One seed: the workload and every random decision drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    if workload is None:
        arrivals = paper_streams(rng, rate, jobs, entries, data_site)
    else:
        arrivals = workload(rng, entries)
    result = GridSimulation(topology, config, seed=seed).run(arrivals, progress)
    double_starts = sum(1 for r in result.records.values() if r.starts > 1)
    return SeedResult(result.summary, double_starts)


@dataclass(frozen=True, slots=True)
class Experiment:
    """An experiment planned (:func:`plan_experiment`): its runs, one per seed, and the report
    of their results."""

    topology: Topology
    policy: DispatchPolicy
    rate: float
    jobs: int
    entries: tuple[str, ...]
    data_site: str
    seeds: int
    base_seed: int
    config: GridConfig
    workload: Callable[[random.Random, tuple[str, ...]], list[Arrival]] | None
    label: str

    def runs(self) -> list[Run[SeedResult]]:
        """Seed ``base_seed + k`` for k = 0..seeds-1, each named by the experiment's label."""
        return [
            Run(
                f"seed {seed} of {self.label}",
                run_seed,
                (
                    self.topology,
                    self.config,
                    self.rate,
                    self.jobs,
                    self.entries,
                    self.data_site,
                    seed,
                    self.workload,
                ),
                size=self.jobs,
                ticks=True,
            )
            for seed in range(self.base_seed, self.base_seed + self.seeds)
        ]

    def report(self, results: Sequence[SeedResult]) -> ExperimentReport:
        """Every figure as its mean over the seeds' results (in seed order) with its interval."""
        metrics = {
            f.name: estimate([float(getattr(r.summary, f.name)) for r in results])
            for f in fields(GridSummary)
        }
        double_starts = sum(r.double_starts for r in results)
        return ExperimentReport(
            self.topology.name,
            self.policy,
            self.rate,
            self.jobs,
            self.entries,
            self.seeds,
            metrics,
            double_starts,
        )


def plan_experiment(
    topology: Topology,
    policy: DispatchPolicy,
    rate: float,
    jobs: int,
    streams: int = 1,
    entry: str | None = None,
    seeds: int = 1,
    base_seed: int = 0,
    config: GridConfig | None = None,
    workload: Callable[[random.Random, tuple[str, ...]], list[Arrival]] | None = None,
    label: str | None = None,
) -> Experiment:
    """``jobs`` jobs (in total over ``streams`` Poisson streams of intensity ``rate``), checked
    and ready to run; ``label`` names it in the report of a failed run (default: the topology,
    the algorithm, λ, jobs and streams)."""
    if seeds < 1:
        raise InvalidInput("seeds", "an integer >= 1", seeds)
    entries = entry_sites(topology, streams, entry)
    data_site = next(iter(topology.data.values()), entries[0])
    # Every setting of the config given (the forecaster, malleability, ...), with this policy.
    grid_config = dataclasses.replace(config or GridConfig(), policy=policy)
    if label is None:
        label = f"{topology.name} {policy.algorithm} λ={rate:g} jobs={jobs} streams={len(entries)}"
    return Experiment(
        topology,
        policy,
        rate,
        jobs,
        entries,
        data_site,
        seeds,
        base_seed,
        grid_config,
        workload,
        label,
    )


def run_experiment(
    topology: Topology,
    policy: DispatchPolicy,
    rate: float,
    jobs: int,
    streams: int = 1,
    entry: str | None = None,
    seeds: int = 1,
    base_seed: int = 0,
    config: GridConfig | None = None,
    workload: Callable[[random.Random, tuple[str, ...]], list[Arrival]] | None = None,
    progress: Callable[[int], None] | None = None,
    sweep: Sweep | None = None,
) -> ExperimentReport:
    """Simulate ``jobs`` jobs (in total over ``streams`` Poisson streams of intensity ``rate``)
    over ``seeds`` seeds, here one after another or on ``sweep``'s cluster. ``progress`` gets
    the jobs simulated so far (on a cluster: those of the seeds done)."""
    plan = plan_experiment(
        topology, policy, rate, jobs, streams, entry, seeds, base_seed, config, workload
    )
    return plan.report((sweep or Sweep()).map(plan.runs(), progress))
