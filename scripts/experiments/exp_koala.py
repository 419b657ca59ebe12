"""KOALA's malleability experiments (SEEDS §000, §6) on the simulated DAS-3, with intervals.

    python -m scripts.experiments.exp_koala [--seeds 5] [--jobs 300] [--load 1] [--json]
                                            [--dask ADDRESS|local|serial]

The setup of Buisson, Sonmez, Mohamed, Lammers and Epema (CoreGRID TR-0092, 2007, §6), as far
as the paper gives it:

- **DAS-3**: ``topologies/das3-5.yaml``, five clusters (544 cores). The jobs enter from a single
  client site (Delft here), and KOALA places them Worst-Fit (our ``worstfit`` algorithm). The
  malleability manager runs per cluster (``--malleability`` of the site agents).
- **Applications** (§6.1, Figure 6), drawn uniformly per job:
  - GADGET2 takes any size from 2 to 46 processors. It runs nearly 10 min on 2 and 4 min at
    best.
  - FT takes powers of two from 2 to 32. It runs about 2 min on 2 and 1 min at best.
  - Both run times are Amdahl curves through those points: GADGET2 has T(1) = 976 s and
    f = 0.229; FT has T(1) = 184 s and f = 0.304.
- **Workloads** (§6.3), 300 jobs each:
  - **Wm**: every job malleable. **Wmr**: each job malleable or rigid with probability 1/2.
  - Rigid jobs run on 2 processors. Malleable ones start with what is free (from 2) and are
    resized.
  - Inter-arrival time is 2 min for PRA and 30 s for PWA (W'm, W'mr).
- **Policies**: FPSMA and EGS, under PRA and under PWA. The baseline runs the same workload with
  every job rigid on 2 processors.

For each workload and policy, over ``--seeds`` seeds, the script prints mean utilization, mean
execution time (end − start) and mean response time (end − submission), each with its 95%
interval. Figure 7 and Figure 8 of the paper compare these. The paper's claim is that
malleability gives "higher utilization and shorter execution times"; the ``claim`` column counts
the seeds in which a run beat the same jobs held rigid on both (a seed draws the same
applications for Wm, Wmr and the baseline). Takes well under a minute. The runs (one per
workload, policy and seed) go to a local Dask cluster by default (``--dask``, as in every
experiment script); the figures are the same wherever they run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from typing import Any

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.localsched import QueuePolicy
from gbroker.core.malleable import Malleability, MalleabilityPolicy, SizeRule
from gbroker.core.model import Job, JobClass
from gbroker.sim.experiment import estimate
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.sim.sweep import Run, Sweep, resolve
from gbroker.tools.progress import bar
from gbroker.topology import Topology, load_topology
from gbroker.workloads.speedup import Amdahl
from gbroker.workloads.streams import Arrival
from scripts import ROOT, options

GADGET2 = ("gadget2", Amdahl(976.3, 0.229), 46, SizeRule())
FT = ("ft", Amdahl(184.0, 0.304), 32, SizeRule.parse("power2"))
ENTRY = "Delft"


def workload(seed: int, jobs: int, mixed: bool, gap: float, rigid: bool) -> list[Arrival]:
    """Wm (``mixed`` False) or Wmr, one job every ``gap`` seconds; ``rigid``: all on 2."""
    rng = random.Random(seed)
    out = []
    for k in range(jobs):
        # Both draws are made for every job, so that a seed gives the same applications to
        # Wm, Wmr and the rigid baseline: each seed's runs are paired.
        name, model, top, sizes = GADGET2 if rng.random() < 0.5 else FT
        coin = rng.random()
        malleable = not rigid and (not mixed or coin < 0.5)
        if malleable:
            declared = Malleability(sizes=sizes, initial=2)
            job = Job(
                f"{name}{k}", 2, model.run_time(2), JobClass.MALLEABLE, top, malleability=declared
            )
        else:
            job = Job(f"{name}{k}", 2, model.run_time(2))
        out.append(Arrival(k * gap, ENTRY, job, model.run_time(2), speedup=model))
    return out


def run_once(
    topology: Topology,
    seed: int,
    jobs: int,
    mixed: bool,
    gap: float,
    policy: MalleabilityPolicy | None,
) -> dict[str, float]:
    config = GridConfig(
        policy=DispatchPolicy(Algorithm.WORSTFIT),
        queue_policy=QueuePolicy.FCFS,
        dcsmon_period=1.0,
        netmon_period=0.0,
        malleability=policy,
    )
    result = GridSimulation(topology, config, seed=seed).run(
        workload(seed, jobs, mixed, gap, rigid=policy is None)
    )
    records = list(result.records.values())
    return {
        "utilization": result.summary.utilization,
        "execution_s": statistics.fmean(r.end - r.start for r in records),
        "response_s": statistics.fmean(r.end - r.arrival for r in records),
        "resizes": float(result.summary.resizes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_seeds(parser, default=5)
    parser.add_argument("--jobs", type=int, default=300, help="jobs per workload (default 300)")
    parser.add_argument(
        "--load",
        type=float,
        default=1.0,
        help="divide the inter-arrival times by this (default 1: the paper's 2 min and 30 s)",
    )
    options.add_dask(parser)
    options.add_json(parser)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs takes an integer >= 1, got {args.jobs}")
    if not args.load > 0:
        parser.error("--load takes a number > 0")
    topology = load_topology(ROOT / "topologies" / "das3-5.yaml")
    configs = []  # (key, policy, mixed, gap): every workload and policy
    for precedence, gap in (("pra", 120.0 / args.load), ("pwa", 30.0 / args.load)):
        for mixed in (False, True):
            workload_name = ("Wmr" if mixed else "Wm") + ("'" if precedence == "pwa" else "")
            policies: dict[str, MalleabilityPolicy | None] = {
                "rigid": None,
                "FPSMA": MalleabilityPolicy("fpsma", precedence),  # type: ignore[arg-type]
                "EGS": MalleabilityPolicy("egs", precedence),  # type: ignore[arg-type]
            }
            for label, policy in policies.items():
                configs.append(
                    (f"{precedence.upper()} {workload_name} {label}", policy, mixed, gap)
                )
    runs = [
        Run(f"seed {s} of {key}", run_once, (topology, s, args.jobs, mixed, gap, policy))
        for key, policy, mixed, gap in configs
        for s in range(args.seeds)
    ]
    with Sweep(resolve(args.dask, len(runs))) as sweep, bar(len(runs), "exp_koala", "run") as shown:
        results = sweep.map(runs, shown.callback)
    figures: dict[str, Any] = {}
    rigid: list[dict[str, float]] = []
    for n, (key, policy, *_) in enumerate(configs):
        samples = results[n * args.seeds : (n + 1) * args.seeds]
        # Each metric's mean, 95% half-width (Student's t with seeds − 1 degrees of freedom)
        # and values, seed by seed.
        figures[key] = {
            metric: estimate([s[metric] for s in samples]).as_dict() for metric in samples[0]
        }
        if policy is None:
            rigid = samples
        else:  # the claim, seed by seed against the same jobs held rigid
            figures[key]["claim_holds_in_seeds"] = sum(
                m["utilization"] > r["utilization"] and m["execution_s"] < r["execution_s"]
                for m, r in zip(samples, rigid, strict=True)
            )
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"{'run':22} {'utilization':>18} {'execution (s)':>18} {'response (s)':>18} {'resizes':>8}"
        f" {'claim':>7}"
    )
    for key, f in figures.items():
        u, e, r = f["utilization"], f["execution_s"], f["response_s"]
        claim = f.get("claim_holds_in_seeds")
        print(
            f"{key:22} {u['mean']:>9.1%} ± {u['ci95']:>5.1%} {e['mean']:>9.0f} ± {e['ci95']:>5.0f}"
            f" {r['mean']:>9.0f} ± {r['ci95']:>5.0f} {f['resizes']['mean']:>8.0f}"
            f" {'' if claim is None else f'{claim}/{args.seeds}':>7}"
        )
    print(
        f"\n{args.seeds} seeds, {args.jobs} jobs each, load x{args.load:g}; ± is the 95% interval"
        " (Student's t). claim: the seeds in which the run had higher utilization and shorter"
        " mean execution than the same jobs held rigid."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
