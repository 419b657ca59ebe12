"""``gbroker demo``: a real 6-site fleet serving a stream of real jobs, end to end."""

from __future__ import annotations

import argparse
from typing import Any

from gbroker.cli.argtypes import non_negative_int, positive_float, positive_int


def _cmd_demo(args: argparse.Namespace) -> int:
    from gbroker.tools.demo import run_demo

    return run_demo(args.jobs, args.rate, args.seed, args.runtime)


def add_parsers(sub: Any) -> None:
    dp = sub.add_parser(
        "demo",
        help="run a real 6-site fleet serving a stream of real jobs, then tear it down",
        description="Bring up the paper's 6-site testbed as a 2D torus of local broker "
        "processes, submit a stream of real jobs with input files to random brokers, show "
        "progress, print B, T, W and where each job ran, and tear the fleet down.",
    )
    dp.add_argument("--jobs", type=positive_int, default=40)
    dp.add_argument("--rate", type=positive_float, default=4.0, help="jobs/s (default 4)")
    dp.add_argument("--seed", type=non_negative_int, default=1)
    dp.add_argument(
        "--runtime",
        choices=("local", "netns", "docker"),
        default="local",
        help="where the sites run: local processes (default), network namespaces (root), or "
        "containers (the image of `gbroker image build`)",
    )
    dp.set_defaults(run=_cmd_demo)
