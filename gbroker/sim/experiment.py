"""Experiments: a workload over a topology with one policy, repeated over seeds, with intervals.

``run_experiment`` is what ``gbroker sim`` and the figure scripts call. Seed k (k = 0..K-1) draws
the workload and every random decision from ``random.Random(base_seed + k)``, so each run can be
repeated exactly. Every figure is reported as its mean over the seeds with a 95% Student-t
confidence half-width (0 with one seed).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

from gbroker.core.dispatch import DispatchPolicy
from gbroker.errors import InvalidInput
from gbroker.sim.grid import GridConfig, GridSimulation, GridSummary
from gbroker.topology import Topology
from gbroker.workloads.streams import Arrival, paper_streams

__all__ = ["Estimate", "ExperimentReport", "entry_sites", "estimate", "run_experiment"]


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
) -> ExperimentReport:
    """Simulate ``jobs`` jobs (in total over ``streams`` Poisson streams of intensity ``rate``)."""
    if seeds < 1:
        raise InvalidInput("seeds", "an integer >= 1", seeds)
    entries = entry_sites(topology, streams, entry)
    data_site = next(iter(topology.data.values()), entries[0])
    # Every setting of the config given (the forecaster, malleability, ...), with this policy.
    grid_config = dataclasses.replace(config or GridConfig(), policy=policy)
    summaries: list[GridSummary] = []
    double_starts = 0
    done_before = 0
    for k in range(seeds):
        rng = random.Random(base_seed + k)
        if workload is None:
            arrivals = paper_streams(rng, rate, jobs, entries, data_site)
        else:
            arrivals = workload(rng, entries)
        sim = GridSimulation(topology, grid_config, seed=base_seed + k)

        def tick(done: int, offset: int = done_before) -> None:
            if progress is not None:
                progress(offset + done)

        result = sim.run(arrivals, tick if progress is not None else None)
        done_before += len(arrivals)
        summaries.append(result.summary)
        double_starts += sum(1 for r in result.records.values() if r.starts > 1)
    metrics = {
        f.name: estimate([float(getattr(s, f.name)) for s in summaries])
        for f in fields(GridSummary)
    }
    return ExperimentReport(
        topology.name, policy, rate, jobs, entries, seeds, metrics, double_starts
    )
