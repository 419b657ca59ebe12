"""Fig. 5 of the GBroker paper: decentralized GBroker (DM) against GridWay 5.6.1, with Sparrow,
Slurm's federation and an idealized central scheduler beside them.

    .venv/bin/python -m scripts.experiments.fig5_central [--seeds K] [--jobs M] [--out DIR]
                                                         [--png PATH] [--sensitivity]

On the paper's 6-site testbed, M = 300 jobs in total arrive as
  (i)  one Poisson stream of intensity λ into Xeon80 (the data site), or
  (ii) six Poisson streams of intensity λ/6 each (M/6 = 50 jobs each), one into every broker,
so that both offer the same total load Λ = 0.1, 0.2, ..., 0.6 1/s (the x axis; the top axis
gives the six streams' λ per stream, 0.017 ... 0.1). Lines (one stream, and six streams'):
  1, 2   GBroker DM, full-graph neighbourhoods (topologies/paper-6.yaml);
  1t, 3  GBroker DM, 2D torus 2x3 neighbourhoods (topologies/paper-6-torus.yaml);
  G, G'  GridWay 5.6.1 on Xeon80 as shipped (gbroker.core.gridway; every stream's jobs go to it);
  S, S'  Sparrow, probe ratio 2, full graph (gbroker.core.sparrow);
  F, F'  Slurm's federation, full graph (gbroker.core.federation);
  C, C'  central: an idealized scheduler on Xeon80 that sees every site through DCSMon and holds
         each job until some site can start it at once (an upper bound, not GridWay).
DM uses Δ = 30 s and ε = 0.2. --rates gives the total loads Λ. Writes DIR/fig5.csv and the plot
(DIR/fig5.png or --png), one progress line per point on stderr, and the paired comparisons on
stdout. --sensitivity also runs GridWay at the top load with six streams over its scheduling
interval, dispatch chunk, per-resource and per-user limits and information driver (every
combination), each paired
with GBroker DM on the torus, and says which settings, if any, make GridWay win.
docs/EXPERIMENTS.md discusses the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.gridway import GridWayPolicy, Information
from gbroker.topology import Topology
from scripts.experiments.figures import (
    Line,
    Point,
    argument_parser,
    load_paper_topology,
    paired_difference,
    print_comparison,
    print_lines,
    print_paper_claims,
    run_figure,
    run_lines,
    run_script,
)

FIGURE = "fig5"
STREAMS = 6  # one per broker of paper-6

# GridWay's settings swept by --sensitivity (shipped: 15 s, 15, 10, 30, dynamic; 0: no limit).
SCHEDULING_INTERVALS = (5.0, 15.0, 30.0, 60.0)
DISPATCH_CHUNKS = (5, 15, 0)
MAX_RUNNING_RESOURCE = (10, 20, 0)  # 40 and 0 gave the same runs: no site takes 40 at once
MAX_RUNNING_USER = (30, 0)
# What the information driver reports: MDS's free counts (dynamic), or every core always free
# less GridWay's own used slots (static: exact here, where GridWay is the only user).
INFORMATION = (Information.DYNAMIC, Information.STATIC)


def main() -> None:
    parser = argument_parser(
        __doc__ or "", FIGURE, jobs=300, rates_help="total arrival intensities Λ, 1/s"
    )
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="also sweep GridWay's scheduling interval, dispatch chunk and per-resource and "
        "per-user limits at the top load with six streams",
    )
    args = parser.parse_args()
    full = load_paper_topology("paper-6", args.bandwidth)
    torus = load_paper_topology("paper-6-torus", args.bandwidth)
    loads = tuple(args.rates)
    each = tuple(load / STREAMS for load in loads)
    dm = DispatchPolicy(Algorithm.DM, interval=30.0, epsilon=0.2)
    gridway = DispatchPolicy(Algorithm.GRIDWAY)
    sparrow = DispatchPolicy(Algorithm.SPARROW, probe_ratio=2.0)
    federation = DispatchPolicy(Algorithm.FEDERATION)
    central = DispatchPolicy(Algorithm.CENTRAL)
    styles = (  # label, topology, policy, streams, colour, line style, marker
        ("1 GBroker DM full graph, one stream", full, dm, 1, "tab:blue", "-", "o"),
        ("1t GBroker DM 2D torus, one stream", torus, dm, 1, "tab:cyan", "-", "v"),
        ("2 GBroker DM full graph, six streams", full, dm, STREAMS, "tab:green", "--", "s"),
        ("3 GBroker DM 2D torus, six streams", torus, dm, STREAMS, "tab:orange", "--", "^"),
        ("G GridWay 5.6.1, one stream", full, gridway, 1, "tab:red", "-", "X"),
        ("G' GridWay 5.6.1, six streams", full, gridway, STREAMS, "tab:red", "--", "x"),
        ("S Sparrow d=2, one stream", full, sparrow, 1, "tab:purple", "-", "P"),
        ("S' Sparrow d=2, six streams", full, sparrow, STREAMS, "tab:purple", "--", "p"),
        ("F federation, one stream", full, federation, 1, "tab:brown", "-", "h"),
        ("F' federation, six streams", full, federation, STREAMS, "tab:brown", "--", "H"),
        ("C central bound, one stream", full, central, 1, "black", "-", "D"),
        ("C' central bound, six streams", full, central, STREAMS, "tab:gray", "--", "d"),
    )
    lines = {
        label.split()[0]: Line(
            label,
            topology,
            policy,
            loads if streams == 1 else each,
            args.jobs,
            streams,
            color=color,
            linestyle=linestyle,
            marker=marker,
        )
        for label, topology, policy, streams, color, linestyle, marker in styles
    }
    points = run_figure(
        FIGURE,
        args,
        list(lines.values()),
        f"Fig. 5: GBroker (DM) vs GridWay 5.6.1, Sparrow, federation and a central bound, "
        f"paper-6, M = {args.jobs} in one stream or six; mean and 95% CI over {args.seeds} seeds",
        x_of=lambda p: p.total_rate,
        x_label="total arrival intensity Λ (1/s)",
        top_axis=("λ per stream with six streams (1/s)", STREAMS),
    )

    print_paper_claims(
        "with several streams GBroker's throughput exceeds GridWay's (thesis: by 10-15% under "
        "heavy load); T and W are close.",
        axis=", at λ per stream",
    )
    for name in ("throughput", "mean_service_time", "mean_wait"):
        for mine in ("2", "3"):
            for other in ("G'", "S'", "F'", "C'"):
                print_comparison(
                    points, lines[mine].label, lines[other].label, name, each, relative=True
                )
        for mine in ("1", "1t"):
            for other in ("G", "S", "F", "C"):
                print_comparison(
                    points, lines[mine].label, lines[other].label, name, loads, relative=True
                )
    print_comparison(points, lines["3"].label, lines["2"].label, "throughput", each, relative=True)

    def at_top_load(mine: list[Point]) -> str:
        top = max(mine, key=lambda p: p.rate)
        staged = top.per_job("file_bytes") / 1e9
        return (
            f"{staged:.2f} GB/job  {top.per_job('withdrawals'):.1f} withdrawals/job  "
            f"utilization {top.metric('utilization').mean:.2f}"
        )

    print_lines(
        points,
        "\nAt the top load: input bytes staged per job (GB), withdrawals per job, utilization:",
        at_top_load,
        width=38,
    )
    if args.sensitivity:
        sensitivity(args, full, lines["3"], max(each))


def sensitivity(args: argparse.Namespace, topology: Topology, dm_torus: Line, rate: float) -> None:
    """GridWay at ``rate`` per stream (six streams) over every combination of its settings,
    each paired with GBroker DM on the torus (the same seeds, so the same workloads)."""
    combinations = list(
        itertools.product(
            SCHEDULING_INTERVALS,
            DISPATCH_CHUNKS,
            MAX_RUNNING_RESOURCE,
            MAX_RUNNING_USER,
            INFORMATION,
        )
    )
    grid = [
        dataclasses.replace(
            dm_torus,
            label=f"GridWay interval={i:g} chunk={c} resource={r} user={u} information={info}",
            topology=topology,
            policy=DispatchPolicy(
                Algorithm.GRIDWAY,
                gridway=GridWayPolicy(
                    scheduling_interval=i,
                    dispatch_chunk=c,
                    max_running_resource=r,
                    max_running_user=u,
                    information=info,
                ),
            ),
            rates=(rate,),
        )
        for i, c, r, u, info in combinations
    ]
    reference = dataclasses.replace(dm_torus, rates=(rate,))
    points = run_lines(FIGURE, [reference, *grid], args.seeds, args.seed, where=args.dask)
    dm = points[0]
    rows = []
    for setting, point in zip(combinations, points[1:], strict=True):
        d = paired_difference(point, dm, "throughput")
        rows.append((point.metric("throughput").mean, setting, point, d))
    rows.sort(key=lambda row: -row[0])
    b = dm.metric("throughput")
    print(
        f"\nGridWay's settings at Λ = {rate * STREAMS:g} (six streams), against "
        f"{dm_torus.label}: B = {b.mean:.4f} ± {b.half_width:.4f}"
    )
    print(
        "  (0: no limit; shipped: interval 15, chunk 15, resource 10, user 30, information "
        "dynamic; +: GridWay wins)"
    )
    print(
        f"  {'interval':>8} {'chunk':>5} {'resource':>8} {'user':>4} {'information':>11} "
        f"{'B (jobs/s)':>16} {'T (s)':>10} {'W (s)':>10} {'B − B(DM)':>22}"
    )
    wins = []
    for _, (i, c, r, u, info), point, d in rows:
        t, w = point.metric("mean_service_time"), point.metric("mean_wait")
        bp = point.metric("throughput")
        verdict = "+" if d.mean - d.half_width > 0 else "−" if d.mean + d.half_width < 0 else "≈"
        if verdict == "+":
            wins.append(f"interval={i:g} chunk={c} resource={r} user={u} information={info}")
        print(
            f"  {i:8g} {c:5d} {r:8d} {u:4d} {info:>11} {bp.mean:9.4f}±{bp.half_width:.4f} "
            f"{t.mean:6.0f}±{t.half_width:<3.0f} {w.mean:6.0f}±{w.half_width:<3.0f} "
            f"{d.mean:+.4f}±{d.half_width:.4f} ({100 * d.mean / b.mean:+.1f}%) {verdict}"
        )
    if wins:
        print(f"GridWay wins on throughput with: {'; '.join(wins)}")
    else:
        print("No combination of these settings makes GridWay's throughput exceed GBroker DM's.")


if __name__ == "__main__":
    run_script(FIGURE, main)
