"""KOALA's co-allocation placement policies compared on the simulated DAS-3, with intervals.

    python -m scripts.experiments.exp_coalloc [--quick] [--seeds 5] [--jobs 300] [--load 0.7]
                                              [--json] [--dask ADDRESS|local|serial]

Issue 28 (SEEDS §000): Worst-Fit, Close-to-Files, Cluster Minimization and Flexible Cluster
Minimization (:mod:`gbroker.core.coalloc`) place the same stream of co-allocated jobs.

- **Multicluster**: ``topologies/das3-5.yaml``, DAS-3's five clusters of dual-CPU nodes
  (85, 41, 68, 46 and 32 nodes: 170, 82, 136, 92, 64 cores), full neighbourhood, 1 Gbit/s links.
  Every job enters at one site (Delft), whose broker sees all five, as KOALA's single
  scheduler does; it sees them through DCSMon every 5 s (stale in between).
- **Jobs**: Poisson arrivals; each job has 1 to 4 components of 1 to 32 cores (uniform), runs
  5 to 30 min (uniform, the same at every component, at the slowest site's speed) and reads
  one input file of 0.5 to 2 GB that lives at one of the clusters (uniform), which each
  component stages to its cluster. The arrival rate gives ``--load`` (default 0.7) of the 544
  cores' capacity on average.
- **Placement queue**: a job that does not fit is retried every 60 s and fails after 30 tries
  (30 min). A placed job's components are its owner broker's jobs, and their claims go by the
  broker's protocol, the daemon's (``gbroker.core.dispatch``): held until all have claimed (a
  waiting site asks again every 0.5 s), then granted at once; a round not complete 60 s after
  its first claim sends the held components back to their sites' queues, and after 10 such
  rounds the job fails.
- **Policies**: WF, CTF and CM place the components as drawn; FCM gets the same jobs as
  *flexible* ones (their total re-split over the fewest clusters). In a seed every policy
  gets the same jobs: the runs are paired.

Per policy: mean wait (start − arrival) and response (end − arrival) in seconds, utilization,
mean placement tries, jobs failed (by the threshold of tries or by their rounds), those of them
failed by their rounds, mean clusters per job, rounds of claims that timed out, and bytes
staged, each as the mean over ``--seeds`` seeds ± the 95% Student-t half-width
(:func:`gbroker.sim.experiment.estimate`). ``--quick``: 60 jobs, 2 seeds (a smoke run). The runs
(one per policy and seed) go to a local Dask cluster by default (``--dask``); the figures are
the same wherever they run.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from gbroker.core.coalloc import CoAllocation, CoPolicy
from gbroker.core.dispatch import DispatchPolicy
from gbroker.core.model import InputFile, Job
from gbroker.sim.experiment import plan_experiment
from gbroker.sim.grid import GridConfig
from gbroker.sim.sweep import Sweep, resolve
from gbroker.tools.progress import bar
from gbroker.topology import Topology, load_topology
from gbroker.workloads.streams import Arrival
from scripts import ROOT, options

GB = 1_000_000_000
ENTRY = "Delft"
COMPONENTS = (1, 4)  # components per job
CORES = (1, 32)  # cores per component
RUN = (300.0, 1800.0)  # seconds at speed 1
INPUT = (GB // 2, 2 * GB)
INTERVAL = 60.0
THRESHOLD = 30
ROUNDS = 10
METRICS = {  # summary field -> (column, format)
    "mean_wait": ("wait (s)", "{:.0f}"),
    "mean_service_time": ("response (s)", "{:.0f}"),
    "utilization": ("utilization", "{:.1%}"),
    "placement_tries": ("tries", "{:.1f}"),
    "coalloc_failed": ("failed", "{:.1f}"),
    "rounds_out": ("by rounds", "{:.1f}"),
    "coalloc_sites": ("clusters/job", "{:.2f}"),
    "claim_timeouts": ("timeouts", "{:.1f}"),
    "file_bytes": ("staged (GB)", "{:.0f}"),
}


def mean_work() -> float:
    """Core-seconds of an average job: E[components] x E[cores] x E[run]."""
    return sum(COMPONENTS) / 2 * sum(CORES) / 2 * sum(RUN) / 2


def workload(topology: Topology, rate: float, jobs: int, flexible: bool) -> Any:
    sites = list(topology.sites)

    def draw(rng: random.Random, entries: tuple[str, ...]) -> list[Arrival]:
        out, t = [], 0.0
        for n in range(jobs):
            t += rng.expovariate(rate)
            parts = tuple(rng.randint(*CORES) for _ in range(rng.randint(*COMPONENTS)))
            run = rng.uniform(*RUN)
            data = InputFile(f"in{n}", rng.randint(*INPUT), sites[rng.randrange(len(sites))])
            job = Job(f"j{n}", sum(parts), run * 1.5, input_files=(data,))
            out.append(Arrival(t, entries[0], job, run, components=parts, flexible=flexible))
        return out

    return draw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_seeds(parser, default=None, what="replications (default 5; 2 with --quick)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per run (default 300)")
    parser.add_argument("--load", type=float, default=0.7, help="offered load (default 0.7)")
    parser.add_argument("--quick", action="store_true", help="60 jobs, 2 seeds: a smoke run")
    options.add_dask(parser)
    options.add_json(parser)
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    jobs = args.jobs if args.jobs is not None else (60 if args.quick else 300)
    if jobs < 1:
        parser.error(f"--jobs takes an integer >= 1, got {jobs}")
    if not 0 < args.load < 10:
        parser.error(f"--load takes a number in (0, 10), got {args.load}")
    topology = load_topology(ROOT / "topologies" / "das3-5.yaml")
    capacity = sum(spec.cores for spec in topology.sites.values())
    rate = args.load * capacity / mean_work()
    plans = {
        policy: plan_experiment(
            topology,
            DispatchPolicy(),  # ordinary jobs' algorithm: there are none here
            rate,
            jobs,
            entry=ENTRY,
            seeds=seeds,
            config=GridConfig(
                coallocation=CoAllocation(policy, INTERVAL, THRESHOLD, rounds=ROUNDS)
            ),
            workload=workload(topology, rate, jobs, flexible=policy is CoPolicy.FCM),
            label=f"{policy}, {jobs} jobs at load {args.load:g}",
        )
        for policy in CoPolicy
    }
    runs = [run for plan in plans.values() for run in plan.runs()]
    with (
        Sweep(resolve(args.dask, len(runs))) as sweep,
        bar(len(runs), "exp_coalloc", "run") as shown,
    ):
        results = sweep.map(runs, shown.callback)
    figures: dict[str, Any] = {}
    for n, (policy, plan) in enumerate(plans.items()):
        report = plan.report(results[n * seeds : (n + 1) * seeds])
        figures[str(policy)] = {name: report.metrics[name].as_dict() for name in METRICS}
        if report.double_starts:  # never: a job's components start once, together
            raise SystemExit(f"{policy}: {report.double_starts} jobs started twice")
    if args.json:
        meta = {"seeds": seeds, "jobs": jobs, "load": args.load, "rate": rate}
        print(json.dumps({**meta, "policies": figures}, indent=2))
        return 0
    print(f"{'policy':15}" + "".join(f" {column:>22}" for column, _ in METRICS.values()))
    for name, row in figures.items():
        cells = []
        for metric, (_, fmt) in METRICS.items():
            scale = 1e-9 if metric == "file_bytes" else 1.0
            mean, half = row[metric]["mean"] * scale, row[metric]["ci95"] * scale
            cells.append(f"{fmt.format(mean)} ± {fmt.format(half)}")
        print(f"{name:15}" + "".join(f" {cell:>22}" for cell in cells))
    print(
        f"\n{seeds} seeds, {jobs} jobs each, load {args.load:g} ({rate * 3600:.1f} jobs/h) on"
        " DAS-3 (544 cores); ± is the 95% interval (Student's t)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
