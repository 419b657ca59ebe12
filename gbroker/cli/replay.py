"""``gbroker replay``: a Standard Workload Format trace through one site's local scheduler, with
malleable jobs (KOALA's policies) or SD-Policy where asked."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gbroker.cli.argtypes import non_negative_int, positive_int
from gbroker.cli.policy_args import (
    add_malleability_arguments,
    add_sd_arguments,
    cut_off_name,
    read_malleability_policy,
    read_sd_policy,
    sd_arguments_fit,
)
from gbroker.cli.show import count

if TYPE_CHECKING:
    from gbroker.sim.replay import ReplayResult
    from gbroker.workloads.swf import SwfTrace


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
    from gbroker.sim.replay import replay
    from gbroker.workloads.swf import read_swf

    statuses = frozenset(args.status) if args.status else None
    if not sd_arguments_fit(args, "replay", args.policy):
        return 2
    try:
        trace = read_swf(
            args.trace,
            cores=args.cores,
            processors=args.processors,
            statuses=statuses,
            limit=args.limit,
        )
        if args.sd_policy is not None:
            return _replay_sd(args, trace)
        if args.malleability is not None:
            return _replay_malleable(args, trace)
        from gbroker.tools import progress

        update, close = progress.callbacks(len(trace.jobs), "replay")
        try:
            result = replay(trace.jobs, trace.cores, args.policy, progress=update)
        finally:
            close()
    except OSError as exc:
        print(f"gbroker replay: cannot read {args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    report = _replay_report(trace, result)
    if args.json:
        import json

        print(json.dumps(report))
        return 0
    reasons = ", ".join(f"{why}: {n}" for why, n in report["skipped_by_reason"].items())
    rows = [
        ("trace", f"{report['trace']} ({count(report['cores'], 'core')})"),
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


def _replay_malleable(args: argparse.Namespace, trace: SwfTrace) -> int:
    """``replay --malleability``: the trace with a seeded fraction of its jobs malleable (from
    half their processors to all of them), next to the same trace with every job rigid."""
    from gbroker.sim.elastic import ElasticJob, simulate
    from gbroker.sim.replay import choose_malleable
    from gbroker.workloads.speedup import Linear

    flags = choose_malleable(trace.jobs, args.malleable_fraction, args.seed)
    jobs = []
    for k, (tj, malleable) in enumerate(zip(trace.jobs, flags, strict=True)):
        low = -(-tj.processors // 2) if malleable else tj.processors
        jobs.append(
            ElasticJob(
                str(tj.id if tj.id is not None else k),
                float(tj.submit),
                "malleable" if malleable else "rigid",
                low,
                tj.processors,
                Linear(tj.run_time, tj.processors),
                requested=tj.requested_time,
            )
        )
    policy = read_malleability_policy(args)
    # The baseline: every job rigid on its processors, as the trace ran it.
    rigid = [
        ElasticJob(
            j.id, j.submit, "rigid", j.max_cores, j.max_cores, j.model, requested=j.requested
        )
        for j in jobs
    ]
    results = {
        "rigid": simulate(rigid, trace.cores, None, args.policy),
        f"{policy.policy.upper()}/{policy.precedence.upper()}": simulate(
            jobs, trace.cores, policy, args.policy
        ),
    }
    report = {
        "trace": trace.source,
        "cores": trace.cores,
        "policy": args.policy,
        "malleable_fraction": args.malleable_fraction,
        "malleable_jobs": sum(j.kind == "malleable" for j in jobs),
        "runs": {name: result.summary() for name, result in results.items()},
    }
    if args.json:
        import json

        print(json.dumps(report))
        return 0
    print(
        f"trace      {trace.source} ({count(trace.cores, 'core')}), {count(len(jobs), 'job')}, "
        f"{args.policy}"
    )
    print(
        f"malleable  {count(report['malleable_jobs'], 'job')} ({args.malleable_fraction:.0%}, seed"
        f" {args.seed}), each from half its processors to all of them"
    )
    print(
        f"{'':14} {'makespan':>12} {'mean wait':>12} {'turnaround':>12} {'util.':>7} {'resizes':>8}"
    )
    for name, f in report["runs"].items():
        print(
            f"{name:14} {f['makespan_s']:>11,.0f}s {f['mean_wait_s']:>11,.0f}s"
            f" {f['mean_turnaround_s']:>11,.0f}s {f['utilization']:>7.1%} {f['resizes']:>8,.0f}"
        )
    return 0


def _replay_sd(args: argparse.Namespace, trace: SwfTrace) -> int:
    """``replay --sd-policy``: the trace with a seeded fraction of its jobs malleable (from half
    their processors to all of them), under SD-Policy, next to static EASY backfill."""
    from gbroker.sim.replay import choose_malleable, replay

    policy = read_sd_policy(args)
    malleable = choose_malleable(trace.jobs, args.malleable_fraction, args.seed)
    from gbroker.tools import progress

    update, close = progress.callbacks(2 * len(trace.jobs), "replay")
    try:
        static = replay(trace.jobs, trace.cores, "easy", progress=update)
        done = len(trace.jobs)

        def more(started: int) -> None:
            if update is not None:
                update(done + started)

        shared = replay(
            trace.jobs,
            trace.cores,
            "easy",
            progress=more,
            sd_policy=policy,
            malleable=malleable,
        )
    finally:
        close()
    runs = {}
    for name, result in (("static EASY", static), ("SD-Policy", shared)):
        s = result.summary
        runs[name] = {
            "jobs": s.jobs,
            "makespan_s": s.makespan,
            "avg_response_s": s.avg_service_time,
            "avg_wait_s": s.avg_wait,
            "avg_bounded_slowdown": s.avg_bounded_slowdown,
            "utilization": s.utilization,
            "shared": result.shared,
            "resizes": result.resizes,
        }
    report = {
        "trace": trace.source,
        "cores": trace.cores,
        "policy": "easy",
        "sd_policy": {
            "max_slowdown": cut_off_name(policy.max_slowdown),
            "sharing_factor": policy.sharing_factor,
            "max_mates": policy.max_mates,
            "runtime_model": str(policy.runtime_model),
        },
        "malleable_fraction": args.malleable_fraction,
        "malleable_jobs": sum(malleable),
        "seed": args.seed,
        "runs": runs,
    }
    if args.json:
        import json

        print(json.dumps(report))
        return 0
    print(
        f"trace      {trace.source} ({count(trace.cores, 'core')}), {count(len(trace.jobs), 'job')}"
    )
    print(f"SD-Policy  {policy}")
    print(
        f"malleable  {count(report['malleable_jobs'], 'job')} ({args.malleable_fraction:.0%}, seed"
        f" {args.seed}), each from half its processors to all of them"
    )
    print(
        f"{'':12} {'makespan':>12} {'response':>11} {'wait':>11} {'bounded sld':>11}"
        f" {'util.':>7} {'shared':>7} {'resizes':>8}"
    )
    for name, f in runs.items():
        print(
            f"{name:12} {f['makespan_s']:>11,.0f}s {f['avg_response_s']:>10,.0f}s"
            f" {f['avg_wait_s']:>10,.0f}s {f['avg_bounded_slowdown']:>11,.2f}"
            f" {f['utilization']:>7.1%} {f['shared']:>7,} {f['resizes']:>8,}"
        )
    base, sd = runs["static EASY"], runs["SD-Policy"]
    change = ", ".join(
        f"{label} {sd[key] / base[key] - 1:+.1%}"
        for key, label in (
            ("makespan_s", "makespan"),
            ("avg_response_s", "response"),
            ("avg_bounded_slowdown", "bounded slowdown"),
        )
        if base[key]
    )
    print(f"SD-Policy against static EASY: {change}")
    return 0


def add_parsers(sub: Any) -> None:
    rp = sub.add_parser(
        "replay",
        help="replay a Standard Workload Format trace on one site",
        description="Replay an SWF trace (plain or gzip) through one site's local scheduler "
        "and print average wait, bounded slowdown, utilization and makespan.",
    )
    rp.add_argument("trace", help="SWF trace file (.swf or .swf.gz)")
    rp.add_argument("--policy", choices=["fcfs", "easy"], default="easy", help="default: easy")
    rp.add_argument("--limit", type=positive_int, help="replay only the first N jobs")
    rp.add_argument("--cores", type=positive_int, help="machine size (default: header MaxProcs)")
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
    add_malleability_arguments(rp)
    add_sd_arguments(rp)
    rp.add_argument(
        "--seed", type=non_negative_int, default=0, help="which jobs are malleable (default 0)"
    )
    rp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    rp.set_defaults(run=_cmd_replay)
