"""The ``gbroker`` command line.

Imports are lazy: each subcommand imports what it needs when it runs, so that ``gbroker replay``
starts fast (the replay benchmark times the whole process).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gbroker.sim.replay import ReplayResult
    from gbroker.workloads.swf import SwfTrace

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _progress_bar(total: int) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A tqdm bar on an interactive stderr for long runs; nothing otherwise (and no import)."""
    if total < 20_000 or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="job", desc="replay", file=sys.stderr, smoothing=0.1)

    def update(done: int) -> None:
        bar.update(done - bar.n)

    return update, bar.close


def _replay_report(trace: SwfTrace, result: ReplayResult) -> dict[str, Any]:
    s = result.summary
    return {
        "trace": trace.source,
        "policy": str(result.policy),
        "cores": result.cores,
        "records": trace.records,
        "jobs": s.jobs,
        "skipped": len(trace.skipped),
        "skipped_by_reason": trace.skip_summary(),
        "avg_wait": s.avg_wait,
        "avg_bounded_slowdown": s.avg_bounded_slowdown,
        "avg_service_time": s.avg_service_time,
        "utilization": s.utilization,
        "makespan": s.makespan,
        "throughput": s.throughput,
    }


def _cmd_replay(args: argparse.Namespace) -> int:
    from gbroker.errors import GBrokerError
    from gbroker.sim.replay import replay
    from gbroker.workloads.swf import read_swf

    statuses = frozenset(args.status) if args.status else None
    try:
        trace = read_swf(
            args.trace,
            cores=args.cores,
            processors=args.processors,
            statuses=statuses,
            limit=args.limit,
        )
        update, close = _progress_bar(len(trace.jobs))
        try:
            result = replay(trace.jobs, trace.cores, args.policy, progress=update)
        finally:
            close()
    except OSError as exc:
        print(f"gbroker replay: cannot read {args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except GBrokerError as exc:
        print(f"gbroker replay: {exc}", file=sys.stderr)
        return 2
    report = _replay_report(trace, result)
    if args.json:
        import json

        print(json.dumps(report))
        return 0
    reasons = ", ".join(f"{why}: {n}" for why, n in report["skipped_by_reason"].items())
    rows = [
        ("trace", f"{report['trace']} ({report['cores']} cores)"),
        ("policy", report["policy"]),
        ("jobs replayed", f"{report['jobs']:,} of {report['records']:,} records"),
        ("jobs skipped", f"{report['skipped']:,}" + (f" ({reasons})" if reasons else "")),
        ("average wait", f"{report['avg_wait']:,.2f} s"),
        ("avg bounded slowdown", f"{report['avg_bounded_slowdown']:,.2f} (threshold 10 s)"),
        ("utilization", f"{report['utilization']:.4f}"),
        ("makespan", f"{report['makespan']:,.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gbroker",
        description="Decentralized scheduling of parallel jobs across many clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rp = sub.add_parser(
        "replay",
        help="replay a Standard Workload Format trace on one site",
        description="Replay an SWF trace (plain or gzip) through one site's local scheduler "
        "and print average wait, bounded slowdown, utilization and makespan.",
    )
    rp.add_argument("trace", help="SWF trace file (.swf or .swf.gz)")
    rp.add_argument("--policy", choices=["fcfs", "easy"], default="easy", help="default: easy")
    rp.add_argument("--limit", type=_positive_int, help="replay only the first N jobs")
    rp.add_argument("--cores", type=_positive_int, help="machine size (default: header MaxProcs)")
    rp.add_argument(
        "--processors",
        choices=["requested", "allocated"],
        default="requested",
        help="which SWF field gives a job's processors (default: requested, else allocated)",
    )
    rp.add_argument(
        "--status",
        type=int,
        action="append",
        metavar="CODE",
        help="keep only jobs with this SWF status (repeatable; default: all)",
    )
    rp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    rp.set_defaults(run=_cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
