"""Fig. 4 of the GBroker paper: migration DM against DLO and replication with migration DRM.

    .venv/bin/python scripts/fig4_migration.py [--seeds K] [--jobs M] [--out DIR] [--png PATH]

One Poisson stream of M = 200 jobs enters Xeon80, the broker at the data site, of the paper's
6-site testbed (topologies/paper-6.yaml, full-graph neighbourhoods) at λ = 0.1, 0.2, ..., 0.6 1/s.
Lines: DM(Δ = 30 s, ε = 0.2), DLO, and DRM with m = 2 and 3 replicas (each replica migrates as
in DM). Writes DIR/fig4.csv and the plot (DIR/fig4.png or --png), one progress line per point on
stderr, and the paper's claims checked on stdout. docs/EXPERIMENTS.md discusses the result.
"""

from __future__ import annotations

import sys

from figures import (
    Line,
    argument_parser,
    load_paper_topology,
    plot_figure,
    print_comparison,
    print_table,
    run_lines,
    write_csv,
)

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.errors import GBrokerError

FIGURE = "fig4"


def main() -> None:
    parser = argument_parser(__doc__ or "", FIGURE, jobs=200)
    parser.add_argument("--interval", type=float, default=30.0, help="Δ in s (default 30)")
    parser.add_argument("--epsilon", type=float, default=0.2, help="ε (default 0.2)")
    args = parser.parse_args()
    try:
        topology = load_paper_topology("paper-6", args.bandwidth)
        rates = tuple(args.rates)
        migration = {"interval": args.interval, "epsilon": args.epsilon}
        lines = [
            Line(
                "DM",
                topology,
                DispatchPolicy(Algorithm.DM, **migration),
                rates,
                args.jobs,
                color="tab:blue",
                marker="s",
            ),
            Line("DLO", topology, DispatchPolicy(Algorithm.DLO), rates, args.jobs),
            Line(
                "DRM m=2",
                topology,
                DispatchPolicy(Algorithm.DRM, replicas=2, **migration),
                rates,
                args.jobs,
                color="tab:purple",
                marker="^",
            ),
            Line(
                "DRM m=3",
                topology,
                DispatchPolicy(Algorithm.DRM, replicas=3, **migration),
                rates,
                args.jobs,
                color="tab:brown",
                marker="v",
            ),
        ]
        points = run_lines(FIGURE, lines, args.seeds, args.seed)
    except GBrokerError as exc:
        sys.exit(f"{FIGURE}: {exc}")

    csv_path = args.out / f"{FIGURE}.csv"
    png_path = args.png or args.out / f"{FIGURE}.png"
    write_csv(csv_path, FIGURE, points)
    plot_figure(
        png_path,
        f"Fig. 4: DM, DLO, DRM (Δ = {args.interval:g} s, ε = {args.epsilon:g}) on {topology.name} "
        f"(full graph), one stream of M = {args.jobs} into Xeon80; mean and 95% CI over "
        f"{args.seeds} seeds",
        points,
    )
    print(f"wrote {csv_path} and {png_path}", file=sys.stderr)

    print_table(points)
    print(
        "\nPaper: DM the highest throughput; DLO and DM the lowest T and W; DRM (m = 3) the "
        "highest T and W."
    )
    print("Paired differences over seeds (+: above, −: below, ≈: CI includes 0):")
    for other in ("DLO", "DRM m=2", "DRM m=3"):
        print_comparison(points, "DM", other, "throughput", rates)
    for name in ("mean_service_time", "mean_wait"):
        for first, second in (("DLO", "DM"), ("DRM m=3", "DM"), ("DRM m=3", "DLO")):
            print_comparison(points, first, second, name, rates)
    print("\nExtremes (paper: B peaks DM ~0.16, DLO ~0.14; T max ~570 s DM/DLO, ~840 s DRM m=3;")
    print("W max ~330 s DM/DLO, ~620 s DRM m=3), and migrations (withdrawals per job):")
    for line in lines:
        mine = [p for p in points if p.line == line]
        b = max(p.metric("throughput").mean for p in mine)
        t = max(p.metric("mean_service_time").mean for p in mine)
        w = max(p.metric("mean_wait").mean for p in mine)
        moves = max(p.metric("withdrawals").mean / p.report.jobs for p in mine)
        print(
            f"  {line.label:8} B max {b:.4f}  T max {t:4.0f} s  W max {w:4.0f} s"
            f"  withdrawals/job up to {moves:.1f}"
        )


if __name__ == "__main__":
    main()
