"""ElastiSim's example workload (500 jobs, 128 nodes) under FCFS, held rigid and malleable.

    python -m scripts.experiments.exp_elastisim [--data DIR] [--json] [--gantt PNG]
                                    [--dask ADDRESS|local|serial]

Runs ElastiSim's example project (``../shared/data/elastisim``: ``jobs.json``, its application
model, ``crossbar.xml``) through :mod:`gbroker.sim.elastic` under:

- *FCFS, held rigid*: every job keeps the size it starts with (moldable, malleable, evolving and
  adaptive jobs start on the most nodes free up to their maximum) and evolving requests are
  refused: malleability off.
- *FCFS + malleability (ElastiSim's example)*: the same FCFS queue; then running malleable and
  adaptive jobs grow to what is free (FPSMA: earliest started first), never shrunk for the queue;
  evolving and adaptive jobs' own requests are granted, shrinks always, growth up to the free
  nodes. This mirrors the scheduler of ElastiSim's example (its README).
- KOALA's policies on the same FCFS queue: FPSMA and EGS under PRA and PWA (PWA shrinks
  malleable jobs to start the queue head).

Prints makespan, mean wait, mean turnaround, utilization and the number of resizes per policy,
and each one's change against the rigid baseline. ``--gantt PNG`` draws the nodes over time of
the ElastiSim-mirror run (scripts/experiments/gantt.py). Takes about a second, so its six runs go
one after another here unless ``--dask local`` (or a scheduler's address) sends them to Dask.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gbroker.core.malleable import MalleabilityPolicy
from gbroker.sim.elastic import ElasticJob, ElasticResult, load_elastisim, simulate
from gbroker.sim.sweep import Run, Sweep
from scripts import ROOT, options

DATA = ROOT.parent / "shared" / "data" / "elastisim"


def run_one(
    jobs: list[ElasticJob], nodes: int, policy: MalleabilityPolicy | None, hold_rigid: bool
) -> ElasticResult:
    return simulate(jobs, nodes, policy, hold_rigid=hold_rigid)


def runs(data: Path, where: str) -> dict[str, ElasticResult]:
    jobs, platform = load_elastisim(data)
    nodes = platform.nodes
    configs: dict[str, tuple[MalleabilityPolicy | None, bool]] = {
        "FCFS, held rigid": (None, True),
        "FCFS + malleability (ElastiSim's example)": (
            MalleabilityPolicy("fpsma", "pwa", shrink_for_head=False),  # type: ignore[arg-type]
            False,
        ),
    }
    for precedence in ("pra", "pwa"):
        for policy in ("fpsma", "egs"):
            name = f"FCFS + {policy.upper()}/{precedence.upper()}"
            configs[name] = (MalleabilityPolicy(policy, precedence), False)  # type: ignore[arg-type]
    batch = [
        Run(name, run_one, (jobs, nodes, policy, hold_rigid))
        for name, (policy, hold_rigid) in configs.items()
    ]
    with Sweep(where) as sweep:
        return dict(zip(configs, sweep.map(batch), strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="ElastiSim project directory")
    # Its six runs take about a second, less than a cluster takes to start: serial by default.
    options.add_dask(parser, default="serial")
    options.add_json(parser)
    parser.add_argument("--gantt", type=Path, help="draw the ElastiSim-mirror run to this PNG")
    args = parser.parse_args(argv)
    results = runs(args.data, args.dask)
    figures = {name: result.summary() for name, result in results.items()}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        base = figures["FCFS, held rigid"]
        print(
            f"{'policy':44} {'makespan':>10} {'mean wait':>10} {'turnaround':>11}"
            f" {'util.':>6} {'resizes':>8}"
        )
        for name, f in figures.items():
            print(
                f"{name:44} {f['makespan_s']:>9.0f}s {f['mean_wait_s']:>9.0f}s"
                f" {f['mean_turnaround_s']:>10.0f}s {f['utilization']:>6.1%} {f['resizes']:>8.0f}"
            )
        print("\nchange against FCFS held rigid (negative is better):")
        for name, f in list(figures.items())[1:]:
            said = ", ".join(
                f"{label} {f[key] / base[key] - 1:+.1%}"
                for key, label in (
                    ("makespan_s", "makespan"),
                    ("mean_wait_s", "wait"),
                    ("mean_turnaround_s", "turnaround"),
                )
            )
            print(f"  {name}: {said}")
    if args.gantt is not None:
        from scripts.experiments.gantt import draw

        draw(
            results["FCFS + malleability (ElastiSim's example)"].outcomes,
            args.gantt,
            title="ElastiSim's example workload, FCFS + malleability",
            total=128,
        )
        print(f"wrote {args.gantt}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
