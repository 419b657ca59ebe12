"""Fig. 3 of the GBroker paper: local-optimal dispatch (DLO) against replication DR(m).

    .venv/bin/python -m scripts.experiments.fig3_replication [--seeds K] [--jobs M] [--out DIR]
                                                             [--png PATH]

One Poisson stream of M = 200 jobs enters Xeon80, the broker at the data site, of the paper's
6-site testbed (topologies/paper-6.yaml, full-graph neighbourhoods) at λ = 0.1, 0.2, ..., 0.6 1/s.
Lines: DLO, and DR with m = 2, 3 and 6 replicas (late binding: the first replica about to start
claims the job, the others are withdrawn). Writes DIR/fig3.csv and the plot (DIR/fig3.png or
--png), one progress line per point on stderr, and the paper's claims checked on stdout.
docs/EXPERIMENTS.md shows and discusses the result.
"""

from __future__ import annotations

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from scripts.experiments.figures import (
    Line,
    Point,
    argument_parser,
    load_paper_topology,
    print_comparison,
    print_lines,
    print_paper_claims,
    run_figure,
    run_script,
)

FIGURE = "fig3"
#: (m, colour, marker) of the DR lines.
REPLICAS = ((2, "tab:orange", "^"), (3, "tab:green", "s"), (6, "tab:red", "v"))


def main() -> None:
    args = argument_parser(__doc__ or "", FIGURE, jobs=200).parse_args()
    topology = load_paper_topology("paper-6", args.bandwidth)
    rates = tuple(args.rates)
    lines = [Line("DLO", topology, DispatchPolicy(Algorithm.DLO), rates, args.jobs)]
    lines += [
        Line(
            f"DR m={m}",
            topology,
            DispatchPolicy(Algorithm.DR, replicas=m),
            rates,
            args.jobs,
            color=color,
            marker=marker,
        )
        for m, color, marker in REPLICAS
    ]
    points = run_figure(
        FIGURE,
        args,
        lines,
        f"Fig. 3: DLO vs DR(m) on {topology.name} (full graph), one stream of M = {args.jobs} "
        f"into Xeon80; mean and 95% CI over {args.seeds} seeds",
    )

    print_paper_claims(
        "DR with m = 2, 3 gives higher throughput than DLO; m = 6 degrades (link load)."
    )
    for m, *_ in REPLICAS:
        print_comparison(points, f"DR m={m}", "DLO", "throughput", rates)
    print_comparison(points, "DR m=6", "DR m=2", "throughput", rates)
    for name in ("mean_service_time", "mean_wait"):
        print_comparison(points, "DR m=6", "DR m=2", name, rates)

    def peak_and_staging(mine: list[Point]) -> str:
        best = max(mine, key=lambda p: p.metric("throughput").mean)
        per_job = [p.per_job("file_bytes") / 1e6 for p in mine]
        return (
            f"B max {best.metric('throughput').mean:.4f} at λ={best.rate:g};"
            f"  MB staged per job {min(per_job):.0f}..{max(per_job):.0f}"
        )

    print_lines(points, "\nPeak throughput and input bytes staged per job:", peak_and_staging)


if __name__ == "__main__":
    run_script(FIGURE, main)
