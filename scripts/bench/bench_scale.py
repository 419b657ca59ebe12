"""Benchmark: does a dispatch decision cost the same at 16 sites as at 4,096?

    python -m scripts.bench.bench_scale [--sides 4,8,16,32,64] [--jobs-per-site 100] [--million]

For each 2D torus of side x side sites (32 cores each), every site's broker receives its own
Poisson stream of the paper's jobs at the same intensity (``--rate``, default 0.04 jobs/s, about
70% of a site's capacity), with the job's input data at its entry site, so the load per site is
the same at every size. The workload is generated as the simulation reads it, the way a broker
receives jobs one by one. NetMon probes are off: every link is forecast from the default
bandwidth.

It prints the simulated jobs per wall second and the decision time per job: the wall time of the
core broker's handling of one submission, as the driver measures it, without the simulator's own
events. Mean, median and p99 are shown, each with its ratio to the smallest torus.

A last row is a control: the largest torus with only 16 active brokers, spread over it, at the
same load each. All sites still exist, but the simulation is as busy as the 16-site one, so the
row separates the decision's own cost from the cache pressure of simulating thousands of busy
sites in one process.

``--evict MB,...`` adds rows for the smallest torus in which, before each submission reaches its
broker, the benchmark copies MB MiB of memory (outside the timed decision). That sweeps the
CPU caches the way simulating thousands of other sites does between two decisions, and shows how
much of the larger tori's decision time is cache misses rather than work (their wall time and
jobs/s include the copies).

``--million`` also simulates 1,000,000 jobs on a 32 x 32 torus (1,024 sites) and prints its wall
time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from gbroker.core.dispatch import Algorithm, BrokerEvent, DispatchPolicy, JobSubmitted
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.topology import Topology, torus
from gbroker.workloads.streams import lazy_streams


class SweepingSimulation(GridSimulation):
    """A simulation that copies ``sweep`` bytes before each submission reaches its broker."""

    def __init__(self, topology: Topology, config: GridConfig, seed: int, sweep: int) -> None:
        super().__init__(topology, config, seed=seed)
        self._source = bytearray(sweep)
        self._target = bytearray(sweep)

    def _to_broker(self, payload: tuple[str, BrokerEvent]) -> None:
        if isinstance(payload[1], JobSubmitted):
            self._target[:] = self._source  # before the decision's timer starts
        super()._to_broker(payload)


def run(
    side: int,
    active: int,
    jobs_per_site: int,
    rate: float,
    algorithm: str,
    seed: int,
    sweep_mb: float = 0.0,
) -> dict[str, float]:
    topology = torus(side, side, cores=32)
    sites = list(topology.sites)
    step = len(sites) // active
    entries = [sites[k * step] for k in range(active)]
    arrivals = lazy_streams(seed, rate, active * jobs_per_site, entries, None)
    config = GridConfig(DispatchPolicy(Algorithm(algorithm)), netmon_period=0)
    sweep = int(sweep_mb * 1024 * 1024)
    sim = (
        SweepingSimulation(topology, config, seed, sweep)
        if sweep
        else GridSimulation(topology, config, seed=seed)
    )
    gc.collect()
    began = time.perf_counter()
    result = sim.run(arrivals)
    wall = time.perf_counter() - began
    times = result.decision_times
    return {
        "sites": side * side,
        "active": active,
        "jobs": len(times),
        "wall": wall,
        "jobs_per_s": len(times) / wall,
        "mean_us": statistics.fmean(times) * 1e6,
        "median_us": statistics.median(times) * 1e6,
        "p99_us": sorted(times)[int(0.99 * (len(times) - 1))] * 1e6,
        "utilization": result.summary.utilization,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="4,8,16,32,64", help="torus sides (sites = side²)")
    parser.add_argument("--jobs-per-site", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.04, help="jobs/s into every broker")
    parser.add_argument("--algorithm", default="dlo", choices=[a.value for a in Algorithm])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--million", action="store_true", help="also 1,000,000 jobs, 1,024 sites")
    parser.add_argument(
        "--evict",
        default="",
        help="MB,...: rows for the smallest torus with MB copied before each decision",
    )
    args = parser.parse_args()

    sides = [int(s) for s in args.sides.split(",")]
    sweeps = [float(mb) for mb in args.evict.split(",") if mb]
    print(f"2D torus, 32 cores per site, λ = {args.rate}/s per active broker, {args.algorithm}")
    print(
        f"{'sites':>6} {'active':>6} {'evict':>6} {'jobs':>9} {'wall s':>7} {'jobs/s':>7} "
        f"{'mean µs':>8} {'x':>5} {'median µs':>9} {'x':>5} {'p99 µs':>7} {'util':>5}"
    )
    runs = [(side, side * side, 0.0) for side in sides]
    if max(sides) ** 2 > 16:  # the control: the largest torus with 16 active brokers
        runs.append((max(sides), 16, 0.0))
    runs += [(min(sides), min(sides) ** 2, mb) for mb in sweeps]
    base: dict[str, float] | None = None
    for side, active, sweep_mb in runs:
        r = run(side, active, args.jobs_per_site, args.rate, args.algorithm, args.seed, sweep_mb)
        base = base or r
        evict = f"{sweep_mb:g}MB" if sweep_mb else "-"
        print(
            f"{r['sites']:>6,.0f} {r['active']:>6,.0f} {evict:>6} {r['jobs']:>9,.0f} "
            f"{r['wall']:>7.1f} "
            f"{r['jobs_per_s']:>7,.0f} {r['mean_us']:>8.1f} {r['mean_us'] / base['mean_us']:>5.2f} "
            f"{r['median_us']:>9.1f} {r['median_us'] / base['median_us']:>5.2f} "
            f"{r['p99_us']:>7.1f} {r['utilization']:>5.2f}",
            flush=True,
        )
    if args.million:
        print("about 1,000,000 jobs on a 32 x 32 torus ...", file=sys.stderr, flush=True)
        r = run(32, 1024, 1_000_000 // 1024 + 1, args.rate, args.algorithm, args.seed)
        print(
            f"million: {r['sites']:,.0f} sites, {r['jobs']:,.0f} jobs simulated in "
            f"{r['wall']:.1f} s ({r['jobs_per_s']:,.0f} jobs/s), decision mean {r['mean_us']:.1f}"
            f" µs, median {r['median_us']:.1f} µs, utilization {r['utilization']:.2f}"
        )


if __name__ == "__main__":
    main()
