"""Jacobi2D partitioned four ways on eight shared machines (AppLeS, Figures 6-7), with intervals.

    python -m scripts.experiments.exp_apples [--quick] [--seeds 20] [--json] [--plot PNG]
                                             [--tolerance 0.05] [--dask ADDRESS|local|serial]

The experiment of issue 28 (SEEDS §003), in virtual time (:mod:`gbroker.sim.apples` has the
testbed, the background load, the NWS forecasts and the execution model): compile-time blocked,
compile-time AppLeS (static estimates, with selection), runtime AppLeS without selection (NWS
forecasts, every machine) and runtime AppLeS (forecasts and selection), on N x N grids. Every
method meets the same conditions in a seed (the runs are paired).

Per size and method: the execution time's mean over seeds ± its 95% Student-t half-width, the
planner's predicted time (runtime AppLeS), the machines used. Then the issue's two claims, each
judged at every size on the per-seed paired ratio r = time(A) / time(B) - 1:

- runtime AppLeS beats blocked: mean(r) + ci95(r) < 0;
- selection is never worse than using every machine: mean(r) + ci95(r) <= --tolerance.

The script exits 1 naming each claim that failed (on stderr), 2 on bad arguments. Sizes 1000 to
2000 by 100 and 100 iterations; ``--quick`` runs 1000, 1500 and 2000 with 20 iterations. The runs
(one per size and seed) go to a local Dask cluster by default (``--dask``); the figures are the
same wherever they run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gbroker.sim.apples import METHODS, check_claims, run_experiment
from gbroker.sim.sweep import Sweep, resolve
from gbroker.tools.progress import bar
from scripts import options

FULL_SIZES = tuple(range(1000, 2001, 100))
QUICK_SIZES = (1000, 1500, 2000)
SHORT = {
    "blocked": "blocked",
    "compile-time AppLeS": "compile-time",
    "runtime AppLeS, no selection": "runtime, all",
    "runtime AppLeS": "runtime AppLeS",
}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for method in METHODS:
        rows = [r["methods"][method]["time"] for r in report["results"]]
        ax.errorbar(
            sizes,
            [r["mean"] for r in rows],
            yerr=[r["ci95"] for r in rows],
            marker="o",
            markersize=3,
            capsize=2,
            label=method,
        )
    predicted = [r["methods"]["runtime AppLeS"]["predicted"]["mean"] for r in report["results"]]
    ax.plot(sizes, predicted, linestyle="--", color="grey", label="runtime AppLeS, predicted")
    ax.set_xlabel("problem size N (an N x N grid)")
    ax.set_ylabel(f"execution time of {report['iterations']} iterations (s)")
    ax.set_title(f"Jacobi2D on 8 shared machines ({report['seeds']} seeds, 95% CI)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(report: dict[str, Any]) -> str:
    def cell(e: dict[str, Any] | None) -> str:
        return "-" if e is None else f"{e['mean']:.1f} ± {e['ci95']:.1f}"

    head = f"{'N':>5} " + " ".join(f"{SHORT[m]:>16}" for m in METHODS)
    head += f" {'predicted':>16} {'machines':>9}"
    lines = [head]
    for row in report["results"]:
        methods = row["methods"]
        best = methods["runtime AppLeS"]
        line = f"{row['size']:>5} " + " ".join(f"{cell(methods[m]['time']):>16}" for m in METHODS)
        line += f" {cell(best['predicted']):>16} {best['machines']['mean']:>9.1f}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_seeds(parser, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="3 sizes and 20 iterations (a CI run: seconds)"
    )
    options.add_dask(parser)
    options.add_json(parser)
    options.add_plot(parser, "execution time against size")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="how much slower (a fraction) selection may be than every machine, at the upper"
        " bound of its interval, before its claim fails (default 0.05)",
    )
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    iterations = 20 if args.quick else 100
    began = time.monotonic()
    runs = len(sizes) * args.seeds
    with Sweep(resolve(args.dask, runs)) as sweep, bar(runs, "exp_apples", "run") as shown:
        report = run_experiment(sizes, iterations, args.seeds, shown.callback, sweep)
    claims = check_claims(report, args.tolerance)
    report["claims"] = [c.as_dict() for c in claims]
    report["seconds"] = round(time.monotonic() - began, 1)
    if args.plot is not None:
        plot(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(report))
        print(
            f"\nExecution time (s) of {iterations} iterations, mean ± 95% interval (Student's t)"
            f" over {args.seeds} seeds; 'predicted' and 'machines' are runtime AppLeS's. Ran in"
            f" {report['seconds']:.1f} s."
        )
        for claim in claims:
            worst = max(claim.sizes, key=lambda s: float(s["mean"]) + float(s["ci95"]))  # type: ignore[arg-type]
            print(
                f"{'holds' if claim.holds else 'FAILS'}: {claim.name} ({claim.rule}; worst at"
                f" N={worst['size']}: r = {worst['mean']:+.1%} ± {worst['ci95']:.1%})"
            )
    failed = [c for c in claims if not c.holds]
    for claim in failed:
        bad = ", ".join(str(s["size"]) for s in claim.sizes if not s["holds"])
        print(f"claim failed: {claim.name} (at N = {bad}; {claim.rule})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
