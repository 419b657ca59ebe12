"""``gbroker chaos``: the resilience test that kills brokers of a running fleet."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gbroker.cli.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from gbroker.cli.policy_args import DAEMON_ALGORITHMS


def _seconds_range(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    try:
        bounds = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX seconds, got {text!r}") from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text!r}")
    return bounds


def _found_fleet() -> str:
    from gbroker.client import fleetdir
    from gbroker.errors import GBrokerError

    try:
        return fleetdir.find()
    except fleetdir.NoFleet as exc:
        raise GBrokerError(str(exc)) from None


def _cmd_chaos(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from gbroker.tools.chaos import (
        ChaosPlan,
        format_report,
        parse_partition,
        progress_to_stderr,
        run_chaos,
    )

    plan = ChaosPlan(
        jobs=args.jobs,
        rate=args.rate,
        kill_every=args.kill_every,
        down_for=args.down_for,
        kill_mqtt_at=args.kill_mqtt_at,
        burst_clients=args.burst_clients,
        burst_jobs=args.burst_jobs,
        partition=parse_partition(args.partition) if args.partition else None,
        algorithm=args.algorithm,
        seed=args.seed,
        job_seconds=args.job_seconds,
        settle=args.settle,
    )
    show = args.progress or (sys.stderr.isatty() and not args.json)
    try:
        report = asyncio.run(
            run_chaos(
                args.fleet or _found_fleet(),
                plan,
                args.run_dir,
                progress_to_stderr if show else None,
            )
        )
    except OSError as exc:
        print(f"gbroker chaos: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


def add_parsers(sub: Any) -> None:
    cp = sub.add_parser(
        "chaos",
        help="resilience test: a stream of real jobs through a fleet while brokers are killed",
        description="Drive a fleet made by `gbroker fleet up` with a stream of real jobs (each "
        "records its own runs in RUN_DIR/runs.log) submitted like a real client (idempotency "
        "keys, retries), while brokers are SIGKILLed and restarted as the fleet started them; "
        "then compare what ran with what the owners say. Exit 1 on any lost, forgotten or "
        "unanswered job or double run.",
    )
    cp.add_argument(
        "--fleet",
        help="the fleet directory (default: the fleet found, as for `gbroker fleet status`)",
    )
    cp.add_argument("--jobs", type=non_negative_int, default=100, help="jobs in the stream")
    cp.add_argument("--rate", type=positive_float, default=5.0, help="jobs/s (Poisson)")
    cp.add_argument(
        "--kill-every", type=positive_float, metavar="S", help="SIGKILL a random broker every S s"
    )
    cp.add_argument(
        "--down-for",
        type=non_negative_float,
        default=5.0,
        metavar="D",
        help="seconds a killed broker (or MQTT broker) stays down (default 5)",
    )
    cp.add_argument(
        "--kill-mqtt-at",
        type=non_negative_float,
        metavar="T",
        help="kill the fleet's MQTT broker T s into the stream, restart it D s later",
    )
    cp.add_argument(
        "--burst-clients",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="after the stream, K clients submit back to back to one broker, SIGKILLed once "
        "half the burst is acknowledged",
    )
    cp.add_argument(
        "--burst-jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="jobs in the burst, shared by its clients (default 8 per client)",
    )
    cp.add_argument(
        "--partition",
        metavar="SITE:SECONDS",
        help="cut SITE off from the others for SECONDS (a netns or docker fleet)",
    )
    cp.add_argument(
        "--algorithm",
        choices=DAEMON_ALGORITHMS,
        help="restart the brokers with this algorithm first",
    )
    cp.add_argument("--seed", type=non_negative_int, default=1)
    cp.add_argument(
        "--job-seconds",
        type=_seconds_range,
        default=(1.0, 3.0),
        metavar="MIN:MAX",
        help="each job sleeps a uniform time in [MIN, MAX] s (default 1:3)",
    )
    cp.add_argument(
        "--settle",
        type=positive_float,
        default=120.0,
        help="seconds to wait for every job to end after the last submission (default 120)",
    )
    cp.add_argument("--run-dir", help="where the jobs' log goes (default: a fresh temp dir)")
    cp.add_argument("--json", action="store_true", help="print the report as one JSON object")
    cp.add_argument(
        "--progress", action="store_true", help="report events on stderr (default: on a tty)"
    )
    cp.set_defaults(run=_cmd_chaos)
