"""Fig. 5 of the GBroker paper: decentralized GBroker (DM) against a centralized GridWay-like one.

    .venv/bin/python scripts/fig5_central.py [--seeds K] [--jobs M] [--out DIR] [--png PATH]

On the paper's 6-site testbed, M = 300 jobs in total arrive as
  (i)  one Poisson stream of intensity λ into Xeon80 (the data site), or
  (ii) six Poisson streams of intensity λ/6 each (M/6 = 50 jobs each), one into every broker,
so that both offer the same total load Λ = 0.1, 0.2, ..., 0.6 1/s (the x axis; the top axis
gives the six streams' λ per stream, 0.017 ... 0.1). Lines, numbered as in the paper:
  1  GBroker DM, one stream (full graph, topologies/paper-6.yaml);
  2  GBroker DM, six streams, full-graph neighbourhoods;
  3  GBroker DM, six streams, 2D torus 2x3 neighbourhoods (topologies/paper-6-torus.yaml);
  4  central: one GridWay-like scheduler on Xeon80 that sees every site and holds each job in
     its own queue until some site can start it at once; one stream, and six streams (4').
DM uses Δ = 30 s and ε = 0.2. --rates gives the total loads Λ. Writes DIR/fig5.csv and the plot
(DIR/fig5.png or --png), one progress line per point on stderr, and the paper's claims checked
on stdout. docs/EXPERIMENTS.md discusses the result.
"""

from __future__ import annotations

from figures import (
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

from gbroker.core.dispatch import Algorithm, DispatchPolicy

FIGURE = "fig5"
STREAMS = 6  # one per broker of paper-6


def main() -> None:
    parser = argument_parser(
        __doc__ or "", FIGURE, jobs=300, rates_help="total arrival intensities Λ, 1/s"
    )
    args = parser.parse_args()
    full = load_paper_topology("paper-6", args.bandwidth)
    torus = load_paper_topology("paper-6-torus", args.bandwidth)
    loads = tuple(args.rates)
    each = tuple(load / STREAMS for load in loads)
    dm = DispatchPolicy(Algorithm.DM, interval=30.0, epsilon=0.2)
    central = DispatchPolicy(Algorithm.CENTRAL)
    styles = (  # label, topology, policy, streams, colour, line style, marker
        ("1 GBroker DM, one stream", full, dm, 1, "tab:blue", "-", "o"),
        ("2 GBroker DM full graph, six streams", full, dm, STREAMS, "tab:green", "--", "s"),
        ("3 GBroker DM 2D torus, six streams", torus, dm, STREAMS, "tab:orange", "--", "^"),
        ("4 central, one stream", full, central, 1, "black", "-", "D"),
        ("4' central, six streams", full, central, STREAMS, "tab:gray", "--", "D"),
    )
    lines = [
        Line(
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
    ]
    points = run_figure(
        FIGURE,
        args,
        lines,
        f"Fig. 5: GBroker (DM) vs central (GridWay-like, on Xeon80), paper-6, M = {args.jobs} "
        f"in one stream or six; mean and 95% CI over {args.seeds} seeds",
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
        for line in lines[1:3]:
            print_comparison(points, line.label, lines[4].label, name, each, relative=True)
        print_comparison(points, lines[0].label, lines[3].label, name, loads, relative=True)
    print_comparison(points, lines[2].label, lines[1].label, "throughput", each, relative=True)

    def at_top_load(mine: list[Point]) -> str:
        top = max(mine, key=lambda p: p.rate)
        staged = top.per_job("file_bytes") / 1e9
        return f"{staged:.2f} GB/job  {top.per_job('withdrawals'):.1f} withdrawals/job"

    print_lines(
        points,
        "\nInput bytes staged per job (GB) and migrations (withdrawals per job) at the top load:",
        at_top_load,
        width=38,
    )


if __name__ == "__main__":
    run_script(FIGURE, main)
