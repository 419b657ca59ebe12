"""Fig. 4 of the GBroker paper: migration DM against DLO and replication with migration DRM.

    .venv/bin/python -m scripts.experiments.fig4_migration [--seeds K] [--jobs M] [--out DIR]
                                                           [--png PATH]

One Poisson stream of M = 200 jobs enters Xeon80, the broker at the data site, of the paper's
6-site testbed (topologies/paper-6.yaml, full-graph neighbourhoods) at λ = 0.1, 0.2, ..., 0.6 1/s.
Lines: DM(Δ = 30 s, ε = 0.2), DLO, and DRM with m = 2 and 3 replicas (each replica migrates as
in DM). Writes DIR/fig4.csv and the plot (DIR/fig4.png or --png), one progress line per point on
stderr, and the paper's claims checked on stdout. docs/EXPERIMENTS.md discusses the result.
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

FIGURE = "fig4"


def main() -> None:
    parser = argument_parser(__doc__ or "", FIGURE, jobs=200)
    parser.add_argument("--interval", type=float, default=30.0, help="Δ in s (default 30)")
    parser.add_argument("--epsilon", type=float, default=0.2, help="ε (default 0.2)")
    args = parser.parse_args()
    topology = load_paper_topology("paper-6", args.bandwidth)
    rates = tuple(args.rates)
    migration = {"interval": args.interval, "epsilon": args.epsilon}
    styles = (  # label, policy, colour, marker
        ("DM", DispatchPolicy(Algorithm.DM, **migration), "tab:blue", "s"),
        ("DLO", DispatchPolicy(Algorithm.DLO), "black", "o"),
        ("DRM m=2", DispatchPolicy(Algorithm.DRM, replicas=2, **migration), "tab:purple", "^"),
        ("DRM m=3", DispatchPolicy(Algorithm.DRM, replicas=3, **migration), "tab:brown", "v"),
    )
    lines = [
        Line(label, topology, policy, rates, args.jobs, color=color, marker=marker)
        for label, policy, color, marker in styles
    ]
    points = run_figure(
        FIGURE,
        args,
        lines,
        f"Fig. 4: DM, DLO, DRM (Δ = {args.interval:g} s, ε = {args.epsilon:g}) on {topology.name} "
        f"(full graph), one stream of M = {args.jobs} into Xeon80; mean and 95% CI over "
        f"{args.seeds} seeds",
    )

    print_paper_claims(
        "DM the highest throughput; DLO and DM the lowest T and W; DRM (m = 3) the highest T and W."
    )
    for other in ("DLO", "DRM m=2", "DRM m=3"):
        print_comparison(points, "DM", other, "throughput", rates)
    for name in ("mean_service_time", "mean_wait"):
        for first, second in (("DLO", "DM"), ("DRM m=3", "DM"), ("DRM m=3", "DLO")):
            print_comparison(points, first, second, name, rates)

    def extremes(mine: list[Point]) -> str:
        b, t, w = (
            max(p.metric(name).mean for p in mine)
            for name in ("throughput", "mean_service_time", "mean_wait")
        )
        moves = max(p.per_job("withdrawals") for p in mine)
        return (
            f"B max {b:.4f}  T max {t:4.0f} s  W max {w:4.0f} s  withdrawals/job up to {moves:.1f}"
        )

    print_lines(
        points,
        "\nExtremes (paper: B peaks DM ~0.16, DLO ~0.14; T max ~570 s DM/DLO, ~840 s DRM m=3;\n"
        "W max ~330 s DM/DLO, ~620 s DRM m=3), and migrations (withdrawals per job):",
        extremes,
    )


if __name__ == "__main__":
    run_script(FIGURE, main)
