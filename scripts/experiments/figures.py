"""Shared helpers of the paper's figure scripts (fig3_replication, fig4_migration, fig5_central).

A figure is a set of *lines*. A line is one configuration (topology, dispatch policy, number of
streams, jobs) swept over arrival intensities λ. Each point of a line is one experiment
(:func:`~gbroker.sim.experiment.plan_experiment`) over K seeds, and every seed of every point is
one run of a sweep (:mod:`gbroker.sim.sweep`): on an embedded Dask cluster by default, on a
scheduler of one's own with ``--dask tcp://HOST:8786``, or here with ``--dask serial``; the
figures are the same wherever the runs go. Seed k draws the same workload for
every line of a figure with the same λ, jobs and streams (common random numbers), so two lines
can be compared seed by seed: :func:`paired_difference`.

Every script writes a CSV (one row per point: the paper's B, T, W with 95% confidence
half-widths, and the diagnostics that explain them) and a PNG of three panels side by side, like
the paper's figures: (a) throughput B, (b) mean service time T, (c) mean queue wait W, all against
λ. On a terminal it shows a progress bar on stderr with a line per point; it prints a short
summary of the paper's claims on stdout. docs/EXPERIMENTS.md shows the figures and discusses them.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gbroker.core.dispatch import DispatchPolicy
from gbroker.errors import GBrokerError
from gbroker.sim.experiment import (
    Estimate,
    ExperimentReport,
    SeedResult,
    estimate,
    plan_experiment,
)
from gbroker.sim.sweep import Run, Sweep, resolve
from gbroker.tools.progress import bar
from gbroker.topology import LinkSpec, Topology, load_topology

__all__ = [
    "PAPER_RATES",
    "ROOT",
    "Line",
    "Point",
    "argument_parser",
    "load_paper_topology",
    "paired_difference",
    "plot_figure",
    "print_comparison",
    "print_lines",
    "print_paper_claims",
    "print_table",
    "run_figure",
    "run_lines",
    "run_script",
    "write_csv",
]

from scripts import ROOT, options

#: The paper's λ axis for Fig. 3 and 4 (1/s).
PAPER_RATES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)

#: (metric name in GridSummary, short name, panel title, unit) of the paper's three panels.
PANELS = (
    ("throughput", "B", "(a) throughput B", "jobs/s"),
    ("mean_service_time", "T", "(b) mean service time T", "s"),
    ("mean_wait", "W", "(c) mean queue wait W", "s"),
)
#: Diagnostics written to the CSV beside B, T, W (means over the seeds, with half-widths).
DIAGNOSTICS = (
    "mean_bounded_slowdown",
    "utilization",
    "makespan",
    "file_bytes",
    "probe_bytes",
    "messages",
    "dispatches",
    "withdrawals",
    "claims_denied",
)


@dataclass(frozen=True, slots=True)
class Line:
    """One curve of a figure: a configuration swept over λ (per stream)."""

    label: str
    topology: Topology
    policy: DispatchPolicy
    rates: tuple[float, ...]
    jobs: int
    streams: int = 1
    color: str = "black"
    linestyle: str = "-"
    marker: str = "o"


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a line: the experiment at one λ, and the wall time its runs took (summed
    over its seeds, wherever they ran)."""

    line: Line
    rate: float
    report: ExperimentReport
    seconds: float
    base_seed: int = 0

    @property
    def total_rate(self) -> float:
        """The offered load: λ per stream times the number of streams (1/s)."""
        return self.rate * self.line.streams

    def metric(self, name: str) -> Estimate:
        return self.report.metrics[name]

    def per_job(self, name: str) -> float:
        """The mean of metric ``name`` divided by the jobs of one run (bytes or moves per job)."""
        return float(self.metric(name).mean / self.report.jobs)


def load_paper_topology(name: str, bandwidth: float | None = None) -> Topology:
    """``topologies/<name>.yaml``, with every access link and the default link set to
    ``bandwidth`` bytes/s when given (a diagnostic: how the results depend on the links)."""
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    if bandwidth is None:
        return topology
    sites = [replace(s, uplink=bandwidth, downlink=bandwidth) for s in topology.sites.values()]
    links = {pair: replace(link, bandwidth=bandwidth) for pair, link in topology.links.items()}
    return Topology(
        sites,
        topology.neighbourhood,
        name=f"{topology.name}@{bandwidth:g}B/s",
        description=topology.description,
        links=links,
        default_link=LinkSpec(bandwidth, topology.default_link.latency),
        data=topology.data,
    )


def argument_parser(
    doc: str,
    figure: str,
    jobs: int,
    rates_help: str = "arrival intensities λ of one stream, 1/s",
) -> argparse.ArgumentParser:
    """The options every figure script shares; ``doc`` is the script's module docstring."""
    summary, _, details = doc.partition("\n\n")
    parser = argparse.ArgumentParser(
        description=summary,
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_seeds(parser, default=5, what="replications per point")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument(
        "--jobs", type=int, default=jobs, help=f"M, jobs per run over all streams (default {jobs})"
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=list(PAPER_RATES),
        metavar="λ",
        help=f"{rates_help} (default 0.1 0.2 ... 0.6)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="B/s",
        help="diagnostic: set every link of the topology to this many bytes/s "
        "(default: the topology's own, Gigabit 125e6)",
    )
    options.add_dask(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "out",
        metavar="DIR",
        help=f"directory of {figure}.csv (and of {figure}.png unless --png; default out/)",
    )
    parser.add_argument(
        "--png",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the plot (default DIR/{figure}.png)",
    )
    return parser


def run_lines(
    figure: str,
    lines: Sequence[Line],
    seeds: int,
    base_seed: int = 0,
    log: Callable[[str], None] | None = None,
    where: str | None = None,
) -> list[Point]:
    """Run every point of every line: each seed of each point is one run of a sweep
    (:mod:`gbroker.sim.sweep`) ``where`` says (``--dask``; default: a local Dask cluster when
    there are several runs and cores). On a terminal, a progress bar on stderr (jobs simulated,
    over all points and seeds) with a line per point as it finishes; nothing in a pipe, unless
    ``log`` is given. The points come back in the order of the lines and rates."""
    plans = [
        (
            line,
            rate,
            plan_experiment(
                line.topology,
                line.policy,
                rate,
                line.jobs,
                streams=line.streams,
                seeds=seeds,
                base_seed=base_seed,
                label=f"{figure} {line.label} λ={rate:.3g}",
            ),
        )
        for line in lines
        for rate in line.rates
    ]
    runs: list[Run[SeedResult]] = []
    first = []  # each point's first run in the sweep
    for *_, plan in plans:
        first.append(len(runs))
        runs += plan.runs()
    point_of = [n for n, (*_, plan) in enumerate(plans) for _ in range(plan.seeds)]
    results: list[list[SeedResult | None]] = [[None] * plan.seeds for *_, plan in plans]
    left = [plan.seeds for *_, plan in plans]
    seconds = [0.0] * len(plans)
    points: list[Point | None] = [None] * len(plans)
    progress = bar(sum(run.size for run in runs), figure)
    say = log or progress.note
    try:
        with Sweep(resolve(where, len(runs), sum(run.size for run in runs))) as sweep:
            for done in sweep.as_completed(runs, progress.callback):
                n = point_of[done.index]
                line, rate, plan = plans[n]
                results[n][done.index - first[n]] = done.value
                seconds[n] += done.seconds
                left[n] -= 1
                if left[n]:
                    continue
                report = plan.report([r for r in results[n] if r is not None])
                point = points[n] = Point(line, rate, report, seconds[n], base_seed)
                b, t, w = (point.metric(name) for name, *_ in PANELS)
                load = f" (Λ={point.total_rate:.3g})" if line.streams > 1 else ""
                say(
                    f"{figure} {line.label} λ={rate:.3g}{load}: B={b.mean:.3f}±{b.half_width:.3f} "
                    f"T={t.mean:.0f}±{t.half_width:.0f} W={w.mean:.0f}±{w.half_width:.0f} "
                    f"({point.seconds:.1f} s)"
                )
    finally:
        progress.close()
    return [p for p in points if p is not None]


def run_figure(
    figure: str,
    args: argparse.Namespace,
    lines: Sequence[Line],
    title: str,
    x_of: Callable[[Point], float] = lambda p: p.rate,
    x_label: str = "λ (1/s)",
    top_axis: tuple[str, float] | None = None,
) -> list[Point]:
    """What every figure script does with its lines, given the options of :func:`argument_parser`.

    Runs every point (``--seeds``, ``--seed``), writes ``<figure>.csv`` in ``--out`` and the plot
    (``--png``, default ``<figure>.png`` in ``--out``; see :func:`plot_figure` for the axes), and
    prints the table of B, T, W on stdout.
    """
    points = run_lines(figure, lines, args.seeds, args.seed, where=args.dask)
    csv_path = args.out / f"{figure}.csv"
    png_path = args.png or args.out / f"{figure}.png"
    write_csv(csv_path, figure, points)
    plot_figure(png_path, title, points, x_of, x_label, top_axis)
    print(f"wrote {csv_path} and {png_path}", file=sys.stderr)
    print_table(points, x_of)
    return points


def run_script(figure: str, main: Callable[[], None]) -> None:
    """Call a figure script's ``main``; a GBrokerError (bad input) exits with one line."""
    try:
        main()
    except GBrokerError as exc:
        sys.exit(f"{figure}: {exc}")


def write_csv(path: Path, figure: str, points: Sequence[Point]) -> None:
    """One row per point: configuration, B/T/W and diagnostics with 95% half-widths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [
        "figure",
        "line",
        "topology",
        "algorithm",
        "replicas",
        "interval",
        "epsilon",
        "streams",
        "jobs",
        "rate",
        "total_rate",
        "seeds",
        "base_seed",
    ]
    for name in (*(p[0] for p in PANELS), *DIAGNOSTICS):
        header += [name, f"{name}_ci95"]
    header += ["double_starts", "wall_s"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for p in points:
            policy = p.report.policy
            row: list[object] = [
                figure,
                p.line.label,
                p.report.topology,
                str(policy.algorithm),
                policy.replicas,
                policy.interval,
                policy.epsilon,
                p.line.streams,
                p.report.jobs,
                f"{p.rate:g}",
                f"{p.total_rate:g}",
                p.report.seeds,
                p.base_seed,
            ]
            for name in (*(q[0] for q in PANELS), *DIAGNOSTICS):
                e = p.metric(name)
                row += [f"{e.mean:.6g}", f"{e.half_width:.6g}"]
            row += [p.report.double_starts, f"{p.seconds:.2f}"]
            writer.writerow(row)


def plot_figure(
    path: Path,
    title: str,
    points: Sequence[Point],
    x_of: Callable[[Point], float] = lambda p: p.rate,
    x_label: str = "λ (1/s)",
    top_axis: tuple[str, float] | None = None,
) -> None:
    """The paper's three panels side by side with 95% CI error bars, one curve per line.

    ``top_axis`` = (label, divisor) adds a secondary λ scale on top of each panel (x / divisor).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _lines_of(points)
    xs = [x_of(p) for p in points]
    dodge = 0.006 * (max(xs) - min(xs)) if xs else 0.0
    divisor = top_axis[1] if top_axis is not None else 1.0
    scales = (lambda x: x / divisor, lambda x: x * divisor)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 4.3))
    for ax, (name, _short, panel, unit) in zip(axes, PANELS, strict=True):
        for k, line in enumerate(lines):
            mine = sorted((p for p in points if p.line == line), key=x_of)
            shift = (k - (len(lines) - 1) / 2) * dodge  # keep the error bars apart
            ax.errorbar(
                [x_of(p) + shift for p in mine],
                [p.metric(name).mean for p in mine],
                yerr=[p.metric(name).half_width for p in mine],
                label=line.label,
                color=line.color,
                linestyle=line.linestyle,
                marker=line.marker,
                markersize=4,
                capsize=3,
                linewidth=1.3,
            )
        ax.set_title(panel, fontsize=11)
        ax.set_xlabel(x_label)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if top_axis is not None:
            top = ax.secondary_xaxis("top", functions=scales)
            top.set_xlabel(top_axis[0], fontsize=8)
            top.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    columns = len(labels) if len(labels) <= 4 else 3
    fig.legend(handles, labels, loc="lower center", ncol=columns, frameon=False, fontsize=9)
    fig.suptitle(title, fontsize=11)
    rows = (len(labels) + columns - 1) // columns
    fig.tight_layout(rect=(0, 0.04 + 0.045 * rows, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def paired_difference(a: Point, b: Point, name: str) -> Estimate:
    """Mean and 95% half-width of a − b over the seeds (same seeds, hence same workloads)."""
    same = (a.rate, a.line.jobs, a.line.streams, a.report.seeds, a.base_seed) == (
        b.rate,
        b.line.jobs,
        b.line.streams,
        b.report.seeds,
        b.base_seed,
    )
    if not same:
        raise ValueError(f"{a.line.label} and {b.line.label} did not run the same workloads")
    va, vb = a.metric(name).values, b.metric(name).values
    return estimate([x - y for x, y in zip(va, vb, strict=True)])


def _lines_of(points: Sequence[Point]) -> list[Line]:
    """The lines of ``points``, in the order of their first point."""
    lines: list[Line] = []
    for p in points:
        if p.line not in lines:
            lines.append(p.line)
    return lines


def _find(points: Sequence[Point], label: str, rate: float) -> Point | None:
    for p in points:
        if p.line.label == label and abs(p.rate - rate) < 1e-12:
            return p
    return None


def print_table(points: Sequence[Point], x_of: Callable[[Point], float] = lambda p: p.rate) -> None:
    """B, T, W of every point as mean ± half-width, one row per point (stdout)."""
    width = max((len(p.line.label) for p in points), default=4) + 2
    print(f"{'line':{width}}{'λ':>6}{'B (jobs/s)':>18}{'T (s)':>14}{'W (s)':>14}")
    for p in points:
        b, t, w = (p.metric(name) for name, *_ in PANELS)
        print(
            f"{p.line.label:{width}}{x_of(p):6.3g}{b.mean:11.4f}±{b.half_width:.4f}"
            f"{t.mean:8.0f}±{t.half_width:<5.0f}{w.mean:8.0f}±{w.half_width:<5.0f}"
        )


def print_paper_claims(claims: str, axis: str = "") -> None:
    """The paper's claims, then the legend of the paired comparisons that follow (stdout)."""
    print(f"\nPaper: {claims}")
    print(f"Paired differences over seeds{axis} (+: above, −: below, ≈: CI includes 0):")


def print_lines(
    points: Sequence[Point], heading: str, describe: Callable[[list[Point]], str], width: int = 8
) -> None:
    """``heading``, then one row per line: its label and ``describe`` of its points (stdout)."""
    print(heading)
    for line in _lines_of(points):
        print(f"  {line.label:{width}} {describe([p for p in points if p.line == line])}")


def print_comparison(
    points: Sequence[Point],
    a: str,
    b: str,
    name: str,
    rates: Sequence[float],
    relative: bool = False,
) -> None:
    """``a − b`` of metric ``name`` at each λ, paired over seeds, with a verdict per λ.

    With ``relative``, each cell also gives the difference as a percentage of ``b``'s mean.
    """
    short = next((s for n, s, *_ in PANELS if n == name), name)
    cells = []
    for rate in rates:
        pa, pb = _find(points, a, rate), _find(points, b, rate)
        if pa is None or pb is None:
            continue
        d = paired_difference(pa, pb, name)
        sign = "+" if d.mean - d.half_width > 0 else "−" if d.mean + d.half_width < 0 else "≈"
        digits = 4 if name == "throughput" else 0
        cell = f"λ={rate:.3g}: {d.mean:+.{digits}f}±{d.half_width:.{digits}f}"
        if relative and pb.metric(name).mean:
            cell += f" ({100 * d.mean / pb.metric(name).mean:+.1f}%)"
        cells.append(f"{cell} {sign}")
    print(f"{short}({a}) − {short}({b}):")
    for k in range(0, len(cells), 3):
        print("    " + "   ".join(cells[k : k + 3]))
