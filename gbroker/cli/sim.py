"""``gbroker sim``: the broker network in simulated time (the paper's experiments, scale)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gbroker.cli.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from gbroker.cli.policy_args import (
    add_gridway_arguments,
    add_malleability_arguments,
    add_policy_arguments,
    add_sd_arguments,
    read_dispatch_policy,
    read_malleability_policy,
    read_sd_policy,
    sd_arguments_fit,
)
from gbroker.cli.serve import add_forecaster_argument
from gbroker.cli.show import count

_SIM_ROWS = (
    ("throughput", "throughput B (jobs/s)", "{:.4f}"),
    ("mean_service_time", "mean service time T (s)", "{:,.1f}"),
    ("mean_wait", "mean wait W (s)", "{:,.1f}"),
    ("mean_bounded_slowdown", "mean bounded slowdown", "{:,.2f}"),
    ("utilization", "utilization", "{:.3f}"),
    ("makespan", "makespan (s)", "{:,.0f}"),
    ("file_bytes", "input bytes moved", "{:,.0f}"),
    ("probe_bytes", "NetMon probe bytes", "{:,.0f}"),
    ("messages", "messages between sites", "{:,.0f}"),
    ("dispatches", "dispatches", "{:,.0f}"),
    ("withdrawals", "withdrawals", "{:,.0f}"),
    ("claims_denied", "replica claims denied", "{:,.0f}"),
    ("resizes", "resizes of malleable jobs", "{:,.0f}"),
    ("decision_time_mean", "decision time mean (s)", "{:.2e}"),
    ("decision_time_p99", "decision time p99 (s)", "{:.2e}"),
)


def _cmd_sim(args: argparse.Namespace) -> int:
    from gbroker.core.localsched import QueuePolicy
    from gbroker.sim.experiment import run_experiment
    from gbroker.sim.grid import GridConfig
    from gbroker.topology import load_topology

    if not args.jsdl and (args.rate is None or args.jobs is None):
        print("gbroker sim: the following arguments are required: --rate, --jobs", file=sys.stderr)
        return 2
    if not sd_arguments_fit(args, "sim", args.queue_policy):
        return 2
    try:
        topology = load_topology(args.topology)
        if args.jsdl:
            return _sim_jsdl(args, topology)
        policy = read_dispatch_policy(args)
        malleability = read_malleability_policy(args)
        sd_policy = read_sd_policy(args)
        config = GridConfig(
            queue_policy=QueuePolicy(args.queue_policy),
            dcsmon_period=args.dcsmon_period,
            netmon_period=args.netmon_period,
            forecaster=args.forecaster,
            malleability=malleability,
            sd_policy=sd_policy,
        )
        workload = None
        if malleability is not None or sd_policy is not None:
            import functools

            data_site = next(iter(topology.data.values()), None)
            largest = max(spec.cores for spec in topology.sites.values())
            grow = sd_policy is None  # SD-Policy's jobs ask their size and may only give
            # A module function with its arguments bound: a Dask worker unpickles it by name.
            workload = functools.partial(
                _malleable_streams,
                args.rate,
                args.jobs,
                data_site,
                args.malleable_fraction,
                largest,
                grow,
            )

        from gbroker.sim.sweep import RunFailed, Sweep, resolve
        from gbroker.tools import progress

        try:
            with Sweep(resolve(args.dask, args.seeds, args.seeds * args.jobs)) as sweep:
                update, close = progress.callbacks(args.jobs * args.seeds, desc="sim")
                try:
                    report = run_experiment(
                        topology,
                        policy,
                        args.rate,
                        args.jobs,
                        args.streams,
                        args.entry,
                        args.seeds,
                        args.seed,
                        config,
                        workload=workload,
                        progress=update,
                        sweep=sweep,
                    )
                finally:
                    close()
        except RunFailed as exc:
            from gbroker.cli import exits
            from gbroker.errors import InvalidInput

            print(f"gbroker sim: {exc}", file=sys.stderr)
            return exits.USAGE if isinstance(exc.error, InvalidInput) else exits.FAILED
    except OSError as exc:
        print(f"gbroker sim: cannot read {args.topology}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.json:
        import json

        print(json.dumps(report.as_dict()))
        return 0
    from dataclasses import asdict

    p = report.policy
    params = {
        "dr": f" m={p.replicas}",
        "drm": f" m={p.replicas} Δ={p.interval:g} ε={p.epsilon:g}",
        "dm": f" Δ={p.interval:g} ε={p.epsilon:g}",
        "central": f" interval={p.interval:g}",
        "sparrow": f" d={p.probe_ratio:g}",
        "gridway": " " + " ".join(f"{k}={v}" for k, v in asdict(p.gridway).items()),
    }
    if p.reserving:
        params[str(p.algorithm)] = params.get(str(p.algorithm), "") + (
            ", inputs staged at every placement"
            if p.stage_reservations
            else ", inputs staged once granted"
        )
    print(
        f"topology   {report.topology} ({count(topology.total_cores, 'core')}, "
        f"{count(len(topology.sites), 'site')})"
    )
    print(f"algorithm  {p.algorithm}{params.get(str(p.algorithm), '')}")
    if malleability is not None:
        print(
            f"malleable  {malleability.policy.upper()}/{malleability.precedence.upper()}"
            f" reserve {malleability.reserve}, {args.malleable_fraction:.0%} of the jobs"
        )
    if sd_policy is not None:
        print(f"SD-Policy  {sd_policy}, {args.malleable_fraction:.0%} of the jobs malleable")
    print(
        f"workload   {count(report.jobs, 'job')}, λ={report.rate:g}/s into "
        f"{', '.join(report.entries)}"
    )
    print(f"seeds      {report.seeds} (from {args.seed})")
    print(f"started twice  {count(report.double_starts, 'job')}")
    width = max(len(label) for _, label, _ in _SIM_ROWS)
    for key, label, fmt in _SIM_ROWS:
        est = report.metrics[key]
        ci = f"  ± {fmt.format(est.half_width)}" if report.seeds > 1 else ""
        print(f"{label:<{width}}  {fmt.format(est.mean)}{ci}")
    return 0


def _malleable_streams(
    rate: float,
    jobs: int,
    data_site: str | None,
    fraction: float,
    largest: int,
    grow: bool,
    rng: Any,
    entries: tuple[str, ...],
) -> Any:
    """The paper's streams with a ``fraction`` of the jobs made malleable (``--malleable-*``,
    ``--sd-policy``)."""
    from gbroker.workloads.streams import make_malleable, paper_streams

    arrivals = paper_streams(rng, rate, jobs, entries, data_site)
    return make_malleable(arrivals, fraction, rng, largest, grow=grow)


def _sim_jsdl(args: argparse.Namespace, topology: Any) -> int:
    """``gbroker sim --jsdl``: the described jobs (arrays whole) through the simulated brokers."""
    import json

    from gbroker.core.localsched import QueuePolicy
    from gbroker.jobs.sweep import load_submission
    from gbroker.sim.grid import GridConfig, GridSimulation
    from gbroker.workloads.submissions import submission_arrivals

    entry = args.entry or next(iter(topology.sites))
    if entry not in topology.sites:
        print(f"gbroker sim: --entry {entry}: not a site of the topology", file=sys.stderr)
        return 2
    arrivals = []
    for k, file in enumerate(args.jsdl, start=1):
        arrivals += submission_arrivals(
            load_submission(file),
            entry=entry,
            at=1.0,  # the sites' first DCSMon states have reached the brokers by then
            job_id=f"{entry}.{k}",
            run_time=args.run_time,
        )
    config = GridConfig(
        policy=read_dispatch_policy(args),
        queue_policy=QueuePolicy(args.queue_policy),
        dcsmon_period=args.dcsmon_period,
        netmon_period=args.netmon_period,
        forecaster=args.forecaster,
    )
    result = GridSimulation(topology, config, seed=args.seed).run(arrivals)
    rows = [
        {
            "id": job_id,
            "site": record.site or None,
            "start": None if record.rejected else record.start,
            "end": None if record.rejected else record.end,
            "rejected": record.rejected or None,
        }
        for job_id, record in result.records.items()
    ]
    if args.json:
        print(json.dumps({"jobs": rows, "rejected": result.summary.rejected}))
        return 0
    for row in rows:
        if row["rejected"]:
            print(f"{row['id']:<24} rejected: {row['rejected']}")
        else:
            times = f"{row['start']:9.1f} .. {row['end']:9.1f} s"
            print(f"{row['id']:<24} ran at {row['site']:<12} {times}")
    return 0


def _dask_where(text: str) -> str:
    """``--dask``'s value, checked by :func:`gbroker.sim.sweep.parse_where` (imported only
    then: the parser of every command is built without the simulator)."""
    from gbroker.errors import InvalidInput
    from gbroker.sim.sweep import parse_where

    try:
        return parse_where(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(f"expected {exc.expected}, got {text!r}") from None


def add_parsers(sub: Any) -> None:
    sp = sub.add_parser(
        "sim",
        help="simulate the broker network serving Poisson job streams",
        description="Simulate the brokers of a topology serving Poisson streams of the paper's "
        "job model with one dispatch algorithm, and print throughput B, mean service time T, "
        "mean wait W and more, with 95% confidence intervals over seeds.",
    )
    sp.add_argument("--topology", required=True, help="topology YAML file")
    add_policy_arguments(sp, required=True)
    add_gridway_arguments(sp)
    sp.add_argument("--rate", type=positive_float, help="λ per stream, jobs/s (required)")
    sp.add_argument("--jobs", type=positive_int, help="jobs over all streams (required)")
    sp.add_argument(
        "--jsdl",
        action="append",
        metavar="FILE",
        help="instead of streams, simulate the jobs these descriptions describe (JSDL, JSON or "
        "YAML; a sweep is its whole array), all entering --entry at 1 s (once the first "
        "DCSMon states have reached the brokers), and print where each ran or why no site "
        "would take it (repeatable)",
    )
    sp.add_argument(
        "--run-time",
        type=non_negative_float,
        metavar="SECONDS",
        help="with --jsdl: how long each job runs (default: its WallTimeLimit)",
    )
    sp.add_argument("--streams", type=positive_int, default=1, help="entry brokers (default 1)")
    sp.add_argument("--entry", help="first entry broker (default: the site holding the data)")
    sp.add_argument("--seeds", type=positive_int, default=1, help="replications (default 1)")
    sp.add_argument("--seed", type=non_negative_int, default=0, help="first seed (default 0)")
    sp.add_argument(
        "--dask",
        type=_dask_where,
        metavar="ADDRESS|local|serial",
        help="where the seeds run: 'serial' (here, one after another), 'local' (an embedded Dask "
        "cluster, one single-threaded worker process per core; 'local:N' for N) or the address "
        "of a Dask scheduler, e.g. tcp://HOST:8786 (default: local with several seeds on several "
        "cores, else serial); the figures are the same wherever they run",
    )
    sp.add_argument("--queue-policy", choices=["easy", "fcfs"], default="easy")
    sp.add_argument(
        "--idempotency-window",
        type=positive_float,
        default=24 * 3600.0,
        metavar="SECONDS",
        help="how long a submission's Idempotency-Key is remembered: a retry within it returns "
        "the first job (default 86400)",
    )
    sp.add_argument(
        "--dcsmon-period",
        type=non_negative_float,
        default=5.0,
        help="DCSMon publication period in s (default 5; 0 = instant)",
    )
    sp.add_argument(
        "--netmon-period",
        type=non_negative_float,
        default=300.0,
        help="NetMon probe period in s (default 300; 0 = no probes)",
    )
    add_forecaster_argument(sp)
    add_malleability_arguments(sp)
    add_sd_arguments(sp)
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    sp.set_defaults(run=_cmd_sim)
