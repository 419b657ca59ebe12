"""Dynamite's running-job migration on a heterogeneous fleet whose sites slow down, with intervals.

    python -m scripts.experiments.exp_dynamite [--seeds 5] [--jobs 150] [--json] [--plot PNG]
                                   [--dask ADDRESS|local|serial]

The experiment of issue 27 (SEEDS §002): does moving *running* jobs by checkpoint, decided by
Dynamite's rule (:func:`gbroker.core.dynamite.decide_migrations`, migrate when L1 > T and
C1 > 1 − T, only when the remaining time saved exceeds checkpoint + NetMon-forecast transfer +
restore), pay, and where not?

- **Fleet**: six sites of 32 cores, base speeds 1.5, 1.5, 1, 1, 0.75, 0.75, full neighbourhood,
  jobs entering at every site in turn and placed by F(j) (DLO); FCFS at each site.
- **Background load**: in each seed three distinct sites, drawn at random, slow to a quarter of
  their base speed at a random time in the first 60% of the arrivals' span, for 4 to 8 hours
  (``GridConfig.speed_changes``). Running jobs there slow down with them.
- **Jobs**: Poisson arrivals at 70% of the fleet's nominal capacity, 1 to 16 cores (powers of
  two), each asking for its run time times U(1, 1.5) (the estimate the decider uses).
- **Scenarios** (where migration should and should not pay):
  - ``long, small images``: runs of 1 to 4 h, images of 0.1 to 1 GB over 1 Gb/s links;
  - ``long, large images, slow links``: the same jobs, images of 20 to 50 GB over 100 Mb/s;
  - ``short jobs``: runs of 5 to 30 min, small images (the minimum remaining time is 10 min).
- **Runs**: without migration, then with it at thresholds T in {0.55, 0.7, 0.85} (interval 5
  min, dump and restore at 200 MB/s). Each seed's workload and slowdowns are the same in every
  run: the runs are paired.

Per run: mean response time (end − submission), makespan, the running jobs moved, the work they
carried (core-hours of remaining work at nominal speed), the core-hours they stood still while
moving (work lost to migration) and the image bytes. Each is the mean over seeds ± the 95%
Student-t half-width; ``response_change`` is each run's response against the same seed without
migration (negative: migration helped). Progress goes to stderr on a terminal; ``--plot``
draws the response change against T per scenario. The runs (one per scenario, threshold and
seed) go to a local Dask cluster by default (``--dask``); the figures are the same wherever
they run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.dynamite import MigrationPolicy
from gbroker.core.localsched import QueuePolicy
from gbroker.core.model import Job
from gbroker.sim.experiment import estimate
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.sim.sweep import Run, Sweep, resolve
from gbroker.tools.progress import bar
from gbroker.topology import LinkSpec, SiteSpec, Topology
from gbroker.workloads.streams import Arrival
from scripts import options

MB = 1_000_000
GB = 1000 * MB
HOUR = 3600.0
SPEEDS = (1.5, 1.5, 1.0, 1.0, 0.75, 0.75)
CORES = 32
THRESHOLDS = (0.55, 0.7, 0.85)
INTERVAL = 300.0
LOAD = 0.7
SLOWED = 0.25  # a slowed site's speed, as a fraction of its base speed
METRICS = ("response_h", "makespan_h", "moves", "work_moved_ch", "downtime_ch", "image_gb")


@dataclass(frozen=True)
class Scenario:
    name: str
    run_range: tuple[float, float]  # seconds at speed 1
    image_range: tuple[int, int]  # bytes
    bandwidth: float  # bytes/s of every link


SCENARIOS = (
    Scenario("long, small images", (1 * HOUR, 4 * HOUR), (100 * MB, 1 * GB), 125 * MB),
    Scenario("long, large images, slow links", (1 * HOUR, 4 * HOUR), (20 * GB, 50 * GB), 12.5 * MB),
    Scenario("short jobs", (300.0, 1800.0), (100 * MB, 1 * GB), 125 * MB),
)


def fleet(bandwidth: float) -> Topology:
    sites = [SiteSpec(f"s{k}", CORES, speed=v) for k, v in enumerate(SPEEDS)]
    return Topology(sites, "full", name="dynamite-6", default_link=LinkSpec(bandwidth, 0.01))


def workload(
    seed: int, jobs: int, scenario: Scenario
) -> tuple[list[Arrival], tuple[tuple[float, str, float], ...]]:
    """The seed's arrivals and background load (the same for every run of the seed)."""
    rng = random.Random(seed)
    low, high = scenario.run_range
    mean_work = (low + high) / 2 * sum((1, 2, 4, 8, 16)) / 5
    rate = LOAD * CORES * sum(SPEEDS) / mean_work
    arrivals = []
    at = 0.0
    for k in range(jobs):
        at += rng.expovariate(rate)
        rank = rng.choice((1, 2, 4, 8, 16))
        run = rng.uniform(low, high)
        image = rng.randint(*scenario.image_range)
        job = Job(f"j{k}", rank, requested_time=run * rng.uniform(1.0, 1.5))
        arrivals.append(Arrival(at, f"s{k % len(SPEEDS)}", job, run, image_size=image))
    changes = []
    for k in rng.sample(range(len(SPEEDS)), 3):
        start = rng.uniform(0.0, 0.6 * at)
        end = start + rng.uniform(4 * HOUR, 8 * HOUR)
        changes += [(start, f"s{k}", SPEEDS[k] * SLOWED), (end, f"s{k}", SPEEDS[k])]
    return arrivals, tuple(sorted(changes))


def run_once(seed: int, jobs: int, scenario: Scenario, threshold: float | None) -> dict[str, float]:
    arrivals, changes = workload(seed, jobs, scenario)
    policy = None if threshold is None else MigrationPolicy(threshold, INTERVAL)
    config = GridConfig(
        DispatchPolicy(Algorithm.DLO),
        queue_policy=QueuePolicy.FCFS,
        dcsmon_period=10.0,
        netmon_period=0.0,  # NetMon's forecast: the links' bandwidth (no probe traffic)
        migration=policy,
        speed_changes=changes,
    )
    result = GridSimulation(fleet(scenario.bandwidth), config, seed=seed).run(arrivals)
    records = list(result.records.values())
    s = result.summary
    return {
        "response_h": sum(r.end - r.arrival for r in records) / len(records) / HOUR,
        "makespan_h": s.makespan / HOUR,
        "moves": float(s.migrations),
        "work_moved_ch": s.work_moved / HOUR,
        "downtime_ch": s.migration_downtime / HOUR,
        "image_gb": s.image_bytes / GB,
    }


def summarize(samples: list[dict[str, float]], base: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {m: estimate([s[m] for s in samples]).as_dict() for m in METRICS}
    change = [s["response_h"] / b["response_h"] - 1.0 for s, b in zip(samples, base, strict=True)]
    out["response_change"] = estimate(change).as_dict()
    return out


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for scenario in SCENARIOS:
        rows = figures["scenarios"][scenario.name]
        means = [100 * rows[f"T={t:g}"]["response_change"]["mean"] for t in THRESHOLDS]
        errors = [100 * rows[f"T={t:g}"]["response_change"]["ci95"] for t in THRESHOLDS]
        ax.errorbar(THRESHOLDS, means, yerr=errors, marker="o", capsize=3, label=scenario.name)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("threshold T (migrate when L1 > T and C1 > 1 − T)")
    ax.set_ylabel("mean response vs no migration (%)")
    ax.set_title(f"Dynamite on 6 sites, 3 slowed to {SLOWED:g}x ({figures['seeds']} seeds, 95% CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_seeds(parser, default=5)
    parser.add_argument("--jobs", type=int, default=150, help="jobs per run (default 150)")
    options.add_dask(parser)
    options.add_json(parser)
    options.add_plot(parser, "the response change against T")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs takes an integer >= 1, got {args.jobs}")
    began = time.monotonic()
    figures: dict[str, Any] = {"seeds": args.seeds, "jobs": args.jobs, "scenarios": {}}
    thresholds: tuple[float | None, ...] = (None, *THRESHOLDS)
    runs = [
        Run(
            f"seed {k} of {scenario.name}, "
            + ("no migration" if threshold is None else f"T={threshold:g}"),
            run_once,
            (k, args.jobs, scenario, threshold),
        )
        for scenario in SCENARIOS
        for threshold in thresholds
        for k in range(args.seeds)
    ]
    with (
        Sweep(resolve(args.dask, len(runs))) as sweep,
        bar(len(runs), "exp_dynamite", "run") as shown,
    ):
        results = iter(sweep.map(runs, shown.callback))
    for scenario in SCENARIOS:
        base = [next(results) for _ in range(args.seeds)]
        rows = {"no migration": summarize(base, base)}
        for threshold in THRESHOLDS:
            samples = [next(results) for _ in range(args.seeds)]
            rows[f"T={threshold:g}"] = summarize(samples, base)
        figures["scenarios"][scenario.name] = rows
    figures["seconds"] = round(time.monotonic() - began, 1)
    if args.plot is not None:
        plot(figures, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"{'scenario':31} {'run':13} {'response (h)':>14} {'vs none':>15} {'makespan (h)':>14}"
        f" {'moves':>6} {'moved (core-h)':>15} {'lost (core-h)':>14} {'images (GB)':>12}"
    )
    for name, rows in figures["scenarios"].items():
        for label, row in rows.items():
            r, c, mk = row["response_h"], row["response_change"], row["makespan_h"]
            change = "" if label == "no migration" else f"{c['mean']:+.1%} ± {c['ci95']:.1%}"
            print(
                f"{name:31} {label:13} {r['mean']:>6.2f} ± {r['ci95']:<5.2f} {change:>15}"
                f" {mk['mean']:>6.1f} ± {mk['ci95']:<5.1f} {row['moves']['mean']:>6.1f}"
                f" {row['work_moved_ch']['mean']:>15.1f} {row['downtime_ch']['mean']:>14.2f}"
                f" {row['image_gb']['mean']:>12.1f}"
            )
    print(
        f"\n{args.seeds} seeds, {args.jobs} jobs each; ± is the 95% interval (Student's t) over"
        f" seeds; 'vs none' pairs each seed with its run without migration. Ran in"
        f" {figures['seconds']:.0f} s."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
