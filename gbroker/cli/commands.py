"""The ``gbroker`` command line.

Imports are lazy: each subcommand imports what it needs when it runs, so that ``gbroker replay``
starts fast (the replay benchmark times the whole process).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gbroker.cli.argtypes import positive_float as _positive_float
from gbroker.cli.argtypes import positive_int as _positive_int

if TYPE_CHECKING:
    from gbroker.core.dispatch import DispatchPolicy
    from gbroker.sim.replay import ReplayResult
    from gbroker.topology import Topology
    from gbroker.workloads.swf import SwfTrace

__all__ = ["build_parser", "main"]


def _progress_bar(
    total: int, desc: str = "replay"
) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A bar on an interactive stderr (:mod:`gbroker.progress`); nothing otherwise."""
    from gbroker.progress import bar

    shown = bar(total, desc)
    return shown.callback, shown.close


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
    if not _sd_arguments_fit(args, "replay", args.policy):
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
        update, close = _progress_bar(len(trace.jobs))
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


def _replay_malleable(args: argparse.Namespace, trace: SwfTrace) -> int:
    """``replay --malleability``: the trace with a seeded fraction of its jobs malleable (from
    half their processors to all of them), next to the same trace with every job rigid."""
    from gbroker.sim.elastic import ElasticJob, simulate
    from gbroker.sim.replay import choose_malleable
    from gbroker.sim.speedup import Linear

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
    policy = _malleability(args)
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
    print(f"trace      {trace.source} ({trace.cores} cores), {len(jobs):,} jobs, {args.policy}")
    print(
        f"malleable  {report['malleable_jobs']:,} jobs ({args.malleable_fraction:.0%}, seed"
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

    policy = _sd_policy(args)
    malleable = choose_malleable(trace.jobs, args.malleable_fraction, args.seed)
    update, close = _progress_bar(2 * len(trace.jobs))
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
            "max_slowdown": _cut_off_name(policy.max_slowdown),
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
    print(f"trace      {trace.source} ({trace.cores} cores), {len(trace.jobs):,} jobs")
    print(f"SD-Policy  {policy}")
    print(
        f"malleable  {report['malleable_jobs']:,} jobs ({args.malleable_fraction:.0%}, seed"
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


def _shape(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    try:
        shape = (int(rows), int(cols))
    except ValueError:
        shape = (0, 0)
    if not sep or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 4x4, got {text!r}")
    return shape


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _int_list(text: str) -> int | list[int]:
    """One positive integer, or a comma-separated list of them (one per site)."""
    values = [_positive_int(part.strip()) for part in text.split(",")]
    return values[0] if len(values) == 1 else values


def _float_list(text: str) -> float | list[float]:
    """One positive number, or a comma-separated list of them (one per site)."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}") from None
    if not all(0 < value < float("inf") for value in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return values[0] if len(values) == 1 else values


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _offsets(text: str) -> list[int]:
    return [_positive_int(part.strip()) for part in text.split(",")]


def _rate(bytes_per_second: float) -> str:
    return f"{bytes_per_second / 1e6:g} MB/s"


def _fleet_endpoints(path: str) -> tuple[str, dict[str, str]] | None:
    """The fleet found (:mod:`gbroker.fleetdir`) if it runs the topology file ``path``: its
    directory and its sites' URLs (a fleet picks its own ports, whatever the file says)."""
    import os

    from gbroker import fleetdir

    try:
        directory = fleetdir.find()
        record = fleetdir.read(directory)
    except fleetdir.NoFleet:
        return None
    if record.get("source_topology") != os.path.realpath(path):
        return None
    sites: Any = record.get("sites") or {}
    return directory, {name: str(member["url"]) for name, member in sites.items()}


def _topology_summary(
    topology: Topology, fleet: tuple[str, dict[str, str]] | None = None
) -> list[str]:
    import networkx as nx  # type: ignore[import-untyped]

    from gbroker.topology import neighbourhood_form

    graph = topology.neighbourhood
    degrees = [degree for _, degree in graph.out_degree()]
    low, high = min(degrees), max(degrees)
    if len(topology.sites) == 1:
        diameter = "0"
    elif not nx.is_strongly_connected(graph):
        diameter = "inf (some broker cannot reach every site)"
    elif len(topology.sites) > 500:
        diameter = "not computed (over 500 sites)"
    else:
        diameter = str(nx.diameter(graph))
    form = neighbourhood_form(topology) or "explicit"
    default = topology.default_link
    rows = [
        ("topology", f"{topology.name}: {len(topology.sites)} sites, {topology.total_cores} cores"),
        ("description", topology.description or "-"),
        (
            "neighbourhood",
            f"{form}: {graph.number_of_edges()} arcs, out-degree "
            + (f"{low}" if low == high else f"{low}..{high}")
            + f", diameter {diameter}",
        ),
        ("default link", f"{_rate(default.bandwidth)}, latency {default.latency * 1e3:g} ms"),
    ]
    links = [
        f"{a} -> {b} {_rate(link.bandwidth)}, {link.latency * 1e3:g} ms"
        for (a, b), link in topology.links.items()
    ]
    shown = "; ".join(links[:8]) + (f"; and {len(links) - 8} more" if len(links) > 8 else "")
    rows.append(("links", f"{len(links)}: {shown}" if links else "none (all use the default)"))
    sets = ", ".join(f"{name} at {site}" for name, site in topology.data.items())
    rows.append(("data sets", sets or "none"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    table = [("site", "cores", "speed", "uplink", "downlink", "endpoints")]
    for site in topology.sites.values():
        endpoints = " ".join(e for e in (site.http, site.mqtt) if e) or "-"
        if fleet is not None and site.name in fleet[1]:
            endpoints = f"{fleet[1][site.name]} (the running fleet's)"
        table.append(
            (
                site.name,
                str(site.cores),
                f"{site.speed:g}",
                _rate(topology.uplink(site.name)),
                _rate(topology.downlink(site.name)),
                endpoints,
            )
        )
    widths = [max(len(row[k]) for row in table) for k in range(5)]
    lines.append("")
    for row in table:
        name, cores, speed, up, down, endpoints = row
        lines.append(
            f"{name:<{widths[0]}}  {cores:>{widths[1]}}  {speed:>{widths[2]}}  "
            f"{up:>{widths[3]}}  {down:>{widths[4]}}  {endpoints}"
        )
    return lines


def _generate_topology(args: argparse.Namespace) -> Topology:
    from gbroker import topology as topo

    options: dict[str, Any] = {
        "cores": args.cores,
        "speed": args.speed,
        "name": args.name,
        "description": args.description,
        "default_link": topo.LinkSpec(
            topo.DEFAULT_LINK.bandwidth if args.bandwidth is None else args.bandwidth,
            topo.DEFAULT_LINK.latency if args.latency is None else args.latency,
        ),
    }
    kind = args.kind
    if kind == "torus":
        return topo.torus(*args.shape, **options)
    if kind == "full":
        return topo.full(args.n, **options)
    if kind == "ring":
        return topo.ring(args.n, **options)
    if kind == "hypercube":
        return topo.hypercube(args.dim, **options)
    if kind == "circulant":
        return topo.circulant(args.n, args.offsets, **options)
    return topo.random_regular(args.n, args.degree, args.seed, **options)


def _cmd_topology(args: argparse.Namespace) -> int:
    from gbroker.topology import draw_topology, dumps, load_topology

    try:
        if args.kind != "show":
            sys.stdout.write(dumps(_generate_topology(args)))
            return 0
        topology = load_topology(args.file)
    except OSError as exc:
        print(f"gbroker topology: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    fleet = _fleet_endpoints(args.file)
    print("\n".join(_topology_summary(topology, fleet)))
    if fleet is not None:
        print(f"\nthe fleet in {fleet[0]} runs this topology on the endpoints shown")
    if args.png:
        try:
            draw_topology(topology, args.png)
        except ImportError:
            print(
                "gbroker topology: --png needs matplotlib: pip install 'gbroker[plot]'",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(
                f"gbroker topology: cannot write {args.png}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        print(f"\ndrawing written to {args.png}")
    return 0


def _add_topology_parser(sub: Any) -> None:
    tp = sub.add_parser(
        "topology",
        help="generate or inspect topology files",
        description="Generate a topology (printed as YAML; redirect it to a file) or validate "
        "and summarise a topology file. The format is in topologies/README.md.",
    )
    kinds = tp.add_subparsers(dest="kind", required=True, metavar="KIND")
    generators = {
        "torus": "2D torus of ROWSxCOLS sites named r{row}c{col}",
        "full": "N sites s0.. with every arc (complete graph)",
        "ring": "N sites s0.. in a ring",
        "hypercube": "2**DIM sites s{i}, adjacent when i differs in one bit",
        "circulant": "N sites s0.., s_k joined to s_(k ± offset mod N)",
        "random-regular": "a connected random DEGREE-regular graph on N sites, seeded",
    }
    for kind, what in generators.items():
        gp = kinds.add_parser(kind, help=what, description=f"Print as YAML: {what}.")
        if kind == "torus":
            gp.add_argument("shape", type=_shape, metavar="ROWSxCOLS", help="e.g. 4x4")
        elif kind == "hypercube":
            gp.add_argument("dim", type=_non_negative_int, metavar="DIM")
        else:
            gp.add_argument("n", type=_positive_int, metavar="N", help="number of sites")
        if kind == "circulant":
            gp.add_argument(
                "--offsets", type=_offsets, default=[1, 2], help="comma-separated (default: 1,2)"
            )
        if kind == "random-regular":
            gp.add_argument("--degree", type=_non_negative_int, required=True)
            gp.add_argument("--seed", type=_non_negative_int, default=0, help="default: 0")
        gp.add_argument(
            "--cores", type=_int_list, required=True, help="cores per site, or one per site: 8,16"
        )
        gp.add_argument(
            "--speed", type=_float_list, default=1.0, help="relative speed (default: 1.0)"
        )
        gp.add_argument("--name", help="topology name (default: from the kind and size)")
        gp.add_argument("--description", help="free text (default: what was generated)")
        gp.add_argument(
            "--bandwidth",
            type=_positive_float,
            help="default link bandwidth, bytes/s (default: 125e6)",
        )
        gp.add_argument(
            "--latency",
            type=_non_negative_float,
            help="default link latency, seconds (default: 0.0005)",
        )
        gp.set_defaults(run=_cmd_topology)
    sp = kinds.add_parser(
        "show",
        help="validate a topology file and print a summary",
        description="Validate a topology file and print its sites, arcs, out-degrees, "
        "diameter, links and data sets.",
    )
    sp.add_argument("file", help="topology YAML file")
    sp.add_argument("--png", metavar="OUT", help="also draw the neighbourhood graph to OUT")
    sp.set_defaults(run=_cmd_topology)


_ALGORITHMS = (
    "dlo",
    "dr",
    "dm",
    "drm",
    "central",
    "random",
    "roundrobin",
    "worstfit",
    "closetofiles",
)


def _add_policy_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    """--algorithm and its parameters, shared by ``sim`` and ``serve``."""
    parser.add_argument(
        "--algorithm",
        choices=_ALGORITHMS,
        required=required,
        default=None if required else "dlo",
        help="dispatch algorithm" + ("" if required else " (default dlo)"),
    )
    parser.add_argument(
        "--replicas", type=_positive_int, default=2, help="m for dr/drm (default 2)"
    )
    parser.add_argument(
        "--interval",
        type=_positive_float,
        default=30.0,
        help="Δ in s for dm/drm, matchmaking interval for central (default 30)",
    )
    parser.add_argument(
        "--epsilon", type=_non_negative_float, default=0.2, help="ε for dm/drm (default 0.2)"
    )


def _add_malleability_arguments(parser: argparse.ArgumentParser, fraction: bool = True) -> None:
    group = parser.add_argument_group(
        "malleability", "resize running malleable jobs (KOALA's policies; docs/MALLEABILITY.md)"
    )
    group.add_argument(
        "--malleability",
        choices=["fpsma", "egs"],
        help="who is offered what: FPSMA (earliest started grows first, latest shrinks first) "
        "or EGS (equal shares); default: no resizing",
    )
    group.add_argument(
        "--initiative",
        choices=["pra", "pwa"],
        default="pra",
        help="when: PRA grows running jobs before the queue; PWA shrinks them to start the "
        "queue head (default pra)",
    )
    group.add_argument(
        "--reserve",
        type=_non_negative_int,
        default=0,
        help="cores per site that growth never takes (default 0)",
    )
    if not fraction:  # a real site's jobs say for themselves whether they are malleable
        return
    group.add_argument(
        "--malleable-fraction",
        type=_fraction,
        default=0.5,
        metavar="F",
        help="fraction of the jobs (seeded) made malleable, from half to twice their size in "
        "sim (to their size with --sd-policy), half to all of it in replay (default 0.5)",
    )


def _add_sd_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "SD-Policy",
        "malleable backfill: start a waiting malleable job at once on cores that running "
        "malleable mates give up, when that ends it sooner (D'Amico et al., ICPP 2019; "
        "docs/MALLEABILITY.md); EASY queues only",
    )
    group.add_argument(
        "--sd-policy",
        type=_max_slowdown,
        metavar="MAX_SLOWDOWN",
        help="turn SD-Policy on with this cut-off on a mate's predicted slowdown: a number >= 1 "
        "(the paper tried 5, 10, 50), inf (no cut-off), or dynamic (the running jobs' average)",
    )
    group.add_argument(
        "--sharing-factor",
        type=_open_fraction,
        default=0.5,
        metavar="F",
        help="the most of its cores a mate gives up (default 0.5: one socket of two)",
    )
    group.add_argument(
        "--sd-mates",
        type=_mates,
        default=2,
        metavar="M",
        help="the most mates one job shares, 1 to 4 (default 2, the paper's m)",
    )
    group.add_argument(
        "--sd-runtime",
        choices=["ideal", "worst"],
        default="ideal",
        help="how shared jobs run: ideal (their cores over the cores they asked) or worst "
        "(their least-shared part bounds them) (default ideal)",
    )


def _max_slowdown(text: str) -> str:
    """A valid MAX_SLOWDOWN, as given (``dynamic`` parses to None, which means "off" here)."""
    from gbroker.core.sdpolicy import SdPolicy
    from gbroker.errors import InvalidInput

    try:
        SdPolicy.parse_max_slowdown(text)
        return text
    except InvalidInput:
        raise argparse.ArgumentTypeError(
            f"expected a MAX_SLOWDOWN: a number >= 1 (e.g. 10), inf, or dynamic; got {text!r}"
        ) from None


def _cut_off_name(max_slowdown: float | None) -> str | float:
    """MAX_SLOWDOWN as JSON can carry it: a number, "inf" or "dynamic"."""
    if max_slowdown is None:
        return "dynamic"
    return "inf" if math.isinf(max_slowdown) else max_slowdown


def _open_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), got {text!r}")
    return value


def _mates(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 4:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 4, got {text!r}")
    return value


def _sd_arguments_fit(args: argparse.Namespace, command: str, queue: str) -> bool:
    """Refuse (with the reason, on stderr) SD-Policy beside KOALA's policies or without EASY."""
    if args.sd_policy is None:
        return True
    if args.malleability is not None:
        print(
            f"gbroker {command}: --sd-policy and --malleability are two policies for malleable "
            "jobs: give one",
            file=sys.stderr,
        )
        return False
    if queue != "easy":
        option = "--policy" if command == "replay" else "--queue-policy"
        print(
            f"gbroker {command}: --sd-policy needs {option} easy (SD-Policy is a backfill "
            f"variant), got {queue}",
            file=sys.stderr,
        )
        return False
    return True


def _sd_policy(args: argparse.Namespace) -> Any:
    """The SdPolicy the arguments ask for, or None."""
    from gbroker.core.sdpolicy import SdPolicy

    if args.sd_policy is None:
        return None
    return SdPolicy(
        SdPolicy.parse_max_slowdown(args.sd_policy),
        sharing_factor=args.sharing_factor,
        max_mates=args.sd_mates,
        runtime_model=args.sd_runtime,
    )


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


def _malleability(args: argparse.Namespace) -> Any:
    """The MalleabilityPolicy the arguments ask for, or None."""
    from gbroker.core.malleable import MalleabilityPolicy

    if args.malleability is None:
        return None
    return MalleabilityPolicy(args.malleability, args.initiative, args.reserve)


def _policy(args: argparse.Namespace) -> DispatchPolicy:
    from gbroker.core.dispatch import Algorithm, DispatchPolicy

    return DispatchPolicy(Algorithm(args.algorithm), args.replicas, args.interval, args.epsilon)


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
    if not _sd_arguments_fit(args, "sim", args.queue_policy):
        return 2
    try:
        topology = load_topology(args.topology)
        if args.jsdl:
            return _sim_jsdl(args, topology)
        policy = _policy(args)
        malleability = _malleability(args)
        sd_policy = _sd_policy(args)
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
            from gbroker.workloads.streams import make_malleable, paper_streams

            data_site = next(iter(topology.data.values()), None)
            largest = max(spec.cores for spec in topology.sites.values())
            grow = sd_policy is None  # SD-Policy's jobs ask their size and may only give

            def workload(rng: Any, entries: tuple[str, ...]) -> Any:
                arrivals = paper_streams(rng, args.rate, args.jobs, entries, data_site)
                return make_malleable(arrivals, args.malleable_fraction, rng, largest, grow=grow)

        update, close = _progress_bar(args.jobs * args.seeds, desc="sim")
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
            )
        finally:
            close()
    except OSError as exc:
        print(f"gbroker sim: cannot read {args.topology}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.json:
        import json

        print(json.dumps(report.as_dict()))
        return 0
    p = report.policy
    params = {
        "dr": f" m={p.replicas}",
        "drm": f" m={p.replicas} Δ={p.interval:g} ε={p.epsilon:g}",
        "dm": f" Δ={p.interval:g} ε={p.epsilon:g}",
        "central": f" interval={p.interval:g}",
    }
    print(
        f"topology   {report.topology} ({topology.total_cores} cores, {len(topology.sites)} sites)"
    )
    print(f"algorithm  {p.algorithm}{params.get(str(p.algorithm), '')}")
    if malleability is not None:
        print(
            f"malleable  {malleability.policy.upper()}/{malleability.precedence.upper()}"
            f" reserve {malleability.reserve}, {args.malleable_fraction:.0%} of the jobs"
        )
    if sd_policy is not None:
        print(f"SD-Policy  {sd_policy}, {args.malleable_fraction:.0%} of the jobs malleable")
    print(f"workload   {report.jobs} jobs, λ={report.rate:g}/s into {', '.join(report.entries)}")
    print(f"seeds      {report.seeds} (from {args.seed})")
    print(f"started twice  {report.double_starts} jobs")
    width = max(len(label) for _, label, _ in _SIM_ROWS)
    for key, label, fmt in _SIM_ROWS:
        est = report.metrics[key]
        ci = f"  ± {fmt.format(est.half_width)}" if report.seeds > 1 else ""
        print(f"{label:<{width}}  {fmt.format(est.mean)}{ci}")
    return 0


def _sim_jsdl(args: argparse.Namespace, topology: Any) -> int:
    """``gbroker sim --jsdl``: the described jobs (arrays whole) through the simulated brokers."""
    import json

    from gbroker.core.localsched import QueuePolicy
    from gbroker.sim.grid import GridConfig, GridSimulation
    from gbroker.sweep import load_submission
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
        policy=_policy(args),
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


def _add_sim_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "sim",
        help="simulate the broker network serving Poisson job streams",
        description="Simulate the brokers of a topology serving Poisson streams of the paper's "
        "job model with one dispatch algorithm, and print throughput B, mean service time T, "
        "mean wait W and more, with 95% confidence intervals over seeds.",
    )
    sp.add_argument("--topology", required=True, help="topology YAML file")
    _add_policy_arguments(sp, required=True)
    sp.add_argument("--rate", type=_positive_float, help="λ per stream, jobs/s (required)")
    sp.add_argument("--jobs", type=_positive_int, help="jobs over all streams (required)")
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
        type=_non_negative_float,
        metavar="SECONDS",
        help="with --jsdl: how long each job runs (default: its WallTimeLimit)",
    )
    sp.add_argument("--streams", type=_positive_int, default=1, help="entry brokers (default 1)")
    sp.add_argument("--entry", help="first entry broker (default: the site holding the data)")
    sp.add_argument("--seeds", type=_positive_int, default=1, help="replications (default 1)")
    sp.add_argument("--seed", type=_non_negative_int, default=0, help="first seed (default 0)")
    sp.add_argument("--queue-policy", choices=["easy", "fcfs"], default="easy")
    sp.add_argument(
        "--idempotency-window",
        type=_positive_float,
        default=24 * 3600.0,
        metavar="SECONDS",
        help="how long a submission's Idempotency-Key is remembered: a retry within it returns "
        "the first job (default 86400)",
    )
    sp.add_argument(
        "--dcsmon-period",
        type=_non_negative_float,
        default=5.0,
        help="DCSMon publication period in s (default 5; 0 = instant)",
    )
    sp.add_argument(
        "--netmon-period",
        type=_non_negative_float,
        default=300.0,
        help="NetMon probe period in s (default 300; 0 = no probes)",
    )
    _add_forecaster_argument(sp)
    _add_malleability_arguments(sp)
    _add_sd_arguments(sp)
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    sp.set_defaults(run=_cmd_sim)


def _staging_notes(desc: Any) -> list[str]:
    """What a broker would refuse of a description's staging URLs (checked offline: private
    hosts allowed, no DNS), one line each."""
    from gbroker.daemon.urls import check_source, check_target
    from gbroker.errors import InvalidInput

    notes = []
    for i, entry in enumerate(desc.staging):
        try:
            if entry.source is not None and entry.inline_data is None:
                check_source(
                    entry.source, allow_private=True, peers={}, field=f"staging[{i}].source"
                )
            if entry.target is not None:
                check_target(entry.target, allow_private=True, field=f"staging[{i}].target")
        except InvalidInput as exc:
            notes.append(str(exc))
    return notes


def _cmd_jsdl(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gbroker.errors import GBrokerError
    from gbroker.jsdl import JsdlError, summary, to_mapping
    from gbroker.sweep import JobArray, load_submission

    reports: list[dict[str, Any]] = []
    failed = False
    for file in args.files:
        try:
            loaded = load_submission(file)
            desc = loaded.elements[0] if isinstance(loaded, JobArray) else loaded
            job = desc.to_job(Path(file).stem or "job", args.site)
        except OSError as exc:
            error, path = f"{file}: cannot read: {exc.strerror or exc}", None
        except JsdlError as exc:  # names the file already
            error, path = str(exc), exc.path
        except GBrokerError as exc:
            error, path = f"{file}: {exc}", None
        else:
            request = {
                "rank": job.rank,
                "max_rank": job.max_rank,
                "job_class": str(job.job_class),
                "requested_time": job.requested_time,
                "input_files": [
                    {"name": f.name, "size": f.size, "site": f.site} for f in job.input_files
                ],
            }
            notes = _staging_notes(desc)
            report = {"file": file, "ok": True, "job": to_mapping(desc), "request": request}
            if notes:
                report["refused_by_brokers"] = notes
            if isinstance(loaded, JobArray):
                report["array"] = {"size": loaded.size, "varying": loaded.varying()}
            reports.append(report)
            if not args.json:
                if isinstance(loaded, JobArray):
                    print(f"{file}: ok, a sweep of {loaded.size} jobs; the first:")
                else:
                    print(f"{file}: ok")
                for line in summary(desc):
                    print(f"  {line}")
                if isinstance(loaded, JobArray):
                    for key, values in loaded.varying().items():
                        shown = ", ".join(str(v) for v in values)
                        print(f"  varies      {key}: {shown}, ...")
                for note in notes:
                    print(f"  refused     by brokers: {note}")
            continue
        failed = True
        reports.append({"file": file, "ok": False, "error": error, "path": path})
        if not args.json:
            print(error)
    if args.json:
        import json

        print(json.dumps(reports, indent=2))
    return 1 if failed else 0


def _add_jsdl_parser(sub: Any) -> None:
    jp = sub.add_parser(
        "jsdl",
        help="check job descriptions (JSDL 1.0, or the JSON/YAML equivalent)",
        description="Work with job descriptions: JSDL 1.0 documents with the POSIX, HPC Profile "
        "Application, SPMD and GBroker extensions, or the equivalent JSON/YAML.",
    )
    actions = jp.add_subparsers(dest="action", required=True, metavar="ACTION")
    cp = actions.add_parser(
        "check",
        help="parse job descriptions and print the jobs or precise errors",
        description="Parse each file (JSDL .jsdl/.xml, .json, .yaml/.yml; others sniffed) and "
        "print its job: executable, arguments, cores, time limit, staging; or a one-line "
        "error naming the element and what was expected. Exit status 1 if any file is invalid.",
    )
    cp.add_argument("files", nargs="+", metavar="FILE", help="job description files")
    cp.add_argument(
        "--json", action="store_true", help="print a JSON list with one object per file"
    )
    cp.add_argument(
        "--site",
        default="local",
        help="site of input files whose location is not given (default: local)",
    )
    cp.set_defaults(run=_cmd_jsdl)


def _add_token_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        help="file holding the client token, or a broker's token file (default: "
        "$GBROKER_TOKEN, $GBROKER_TOKEN_FILE, else the token of a broker of yours at that URL)",
    )


def _client_token(broker: str, token_file: str | None) -> str | None:
    """The client token: $GBROKER_TOKEN, a token file (a bare token, or a broker's
    'NAME TOKEN [admin]' file), else what the runtime directory says of the broker's URL."""
    import os
    from pathlib import Path

    from gbroker import runtime
    from gbroker.auth import Tokens

    if os.environ.get("GBROKER_TOKEN"):
        return os.environ["GBROKER_TOKEN"]
    path = token_file or os.environ.get("GBROKER_TOKEN_FILE")
    if path:
        text = Path(path).read_text().strip()
        return text if len(text.split()) == 1 else Tokens.parse(text, path).first_token()
    return runtime.find_token(broker)


def _accounts(path: str) -> dict[str, str]:
    """``SUBMITTER ACCOUNT`` lines: which local account runs each user's jobs."""
    from gbroker.errors import InvalidInput

    accounts: dict[str, str] = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2:
                raise InvalidInput(f"{path}:{number}", "SUBMITTER ACCOUNT", line.strip())
            accounts[fields[0]] = fields[1]
    return accounts


def _size(text: str) -> int:
    from netmon.service import parse_size

    return parse_size(text)


def _read_secret(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path) as f:
        return f.read().strip() or None


def _add_mqtt_credential_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mqtt-password-file",
        help="file (mode 600) holding the site's MQTT password, for an MQTT broker with access "
        "control (e.g. FLEET/mqtt/SITE.password); never give a password on the command line",
    )
    parser.add_argument(
        "--mqtt-username", help="MQTT user name with --mqtt-password-file (default: the site)"
    )


def _mqtt_credentials(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(username, password)`` from ``--mqtt-username``/``--mqtt-password-file``, else Nones.

    The password is also kept out of every log line from now on.
    """
    from gbroker.daemon.mqtt import read_password_file
    from gbroker.errors import InvalidInput

    if args.mqtt_password_file is None:
        if args.mqtt_username is not None:
            raise InvalidInput("--mqtt-password-file", "a password file for --mqtt-username")
        return None, None
    password = read_password_file(args.mqtt_password_file)
    _redact_in_logs(password)
    return args.mqtt_username or args.site, password


class _Redacting:
    """A logging filter that masks one secret in every record it passes."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def filter(self, record: Any) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "***"), None
        return True


def _redact_in_logs(secret: str) -> None:
    import logging

    for handler in logging.getLogger().handlers:
        handler.addFilter(_Redacting(secret))


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os
    import signal
    from pathlib import Path

    from gbroker.core.health import HealthPolicy
    from gbroker.core.liveness import HeartbeatPolicy
    from gbroker.daemon.executor import Limits
    from gbroker.daemon.history import Retention
    from gbroker.daemon.server import BrokerDaemon, DaemonConfig
    from gbroker.topology import load_topology

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.site} %(message)s")
    username, password = _mqtt_credentials(args)
    try:
        topology = load_topology(args.topology)
        policy = _policy(args)
        config = DaemonConfig(
            args.site,
            topology,
            Path(args.data_dir or f"gbroker-data/{args.site}"),
            policy,
            host=args.host,
            port=args.port,
            mqtt_url=args.mqtt,
            mqtt_username=username,
            mqtt_password=password,
            token_file=Path(args.token_file) if args.token_file else None,
            token=os.environ.get("GBROKER_TOKEN") or None,
            secret=_read_secret(args.secret_file),
            malleability=_malleability(args),
            lease=args.lease,
            idempotency_window=args.idempotency_window,
            black_hole=None if args.black_hole == "off" else HealthPolicy.parse(args.black_hole),
            heartbeat=HeartbeatPolicy(args.heartbeat) if args.heartbeat > 0 else None,
            neighbour_grace=args.neighbour_grace,
            dcsmon_period=args.dcsmon_period,
            stop_jobs_on_exit=args.stop_jobs_on_exit,
            netmon=not args.no_netmon,
            netmon_period=args.netmon_period,
            netmon_sizes=args.netmon_sizes,
            forecaster=args.forecaster,
            dcsmon=not args.no_dcsmon,
            tls_cert=Path(args.tls_cert) if args.tls_cert else None,
            tls_key=Path(args.tls_key) if args.tls_key else None,
            tls_ca=Path(args.tls_ca) if args.tls_ca else None,
            run_as=args.run_as,
            allow_root=args.allow_root,
            allow_private_sources=args.allow_private_sources,
            accounts=_accounts(args.accounts) if args.accounts else {},
            retention=Retention(days=args.retain_days, jobs=args.retain_jobs),
            job_limits=Limits(
                memory=args.job_memory,
                processes=args.job_processes,
                file_size=args.job_file_size,
                cpu_time=args.job_cpu_time,
                open_files=args.job_open_files,
            ),
        )
        daemon = BrokerDaemon(config)
    except OSError as exc:
        print(f"gbroker serve: cannot read {args.topology}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

        def stop_with_jobs() -> None:  # `fleet down` without --keep-jobs
            daemon.stop_jobs_on_exit = True
            stop.set()

        loop.add_signal_handler(signal.SIGUSR1, stop_with_jobs)
        async with daemon:
            logging.info("broker %s serving on %s", args.site, daemon.url)
            await stop.wait()
            logging.info("broker %s shutting down", args.site)

    asyncio.run(serve())
    return 0


def _add_serve_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "serve",
        help="run one site's broker daemon",
        description="Run the broker daemon of one site of a topology: the client and peer HTTP "
        "APIs, the local scheduler running real processes, and the journal. Stops on SIGINT or "
        "SIGTERM (leaving running jobs for the next start to adopt, unless "
        "--stop-jobs-on-exit), or on SIGUSR1 stopping its running jobs too.",
    )
    sp.add_argument("--site", required=True, help="this broker's site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file")
    _add_policy_arguments(sp, required=False)
    _add_malleability_arguments(sp, fraction=False)
    sp.add_argument("--data-dir", help="journal and job directories (default gbroker-data/SITE)")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    sp.add_argument(
        "--port",
        type=_non_negative_int,
        default=0,
        help="port (default: the one in the site's http endpoint)",
    )
    sp.add_argument("--mqtt", help="MQTT broker URL for DCSMon and liveness")
    _add_mqtt_credential_arguments(sp)
    sp.add_argument(
        "--token-file",
        help="client tokens, one 'NAME TOKEN [admin]' a line (default: $GBROKER_TOKEN, else "
        "DATA_DIR/tokens, generated with one admin token on first start)",
    )
    sp.add_argument(
        "--secret-file",
        help="file holding the fleet secret peers sign with (default DATA_DIR/secret, generated; "
        "every broker of a fleet needs the same)",
    )
    jobs = sp.add_argument_group("jobs: who they run as, and their default limits")
    jobs.add_argument(
        "--run-as",
        metavar="USER",
        help="local account that runs jobs when the broker runs as root (default nobody)",
    )
    jobs.add_argument(
        "--allow-root",
        action="store_true",
        help="let jobs run as root (only if --run-as root or an account map says so)",
    )
    jobs.add_argument(
        "--accounts", metavar="FILE", help="'SUBMITTER ACCOUNT' lines: whose jobs run as whom"
    )
    jobs.add_argument(
        "--allow-private-sources",
        action="store_true",
        help="let jobs stage inputs from loopback, private and link-local hosts (default: "
        "public hosts and the fleet's file stores only)",
    )
    jobs.add_argument("--job-memory", type=_size, metavar="SIZE", help="address space, e.g. 4GiB")
    jobs.add_argument("--job-processes", type=_positive_int, metavar="N", help="processes")
    jobs.add_argument("--job-file-size", type=_size, metavar="SIZE", help="largest file written")
    jobs.add_argument("--job-cpu-time", type=_positive_int, metavar="S", help="CPU seconds")
    jobs.add_argument("--job-open-files", type=_positive_int, metavar="N", help="open files")
    sp.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate")
    sp.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    sp.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="the fleet CA (PEM) that peers, their client certificates and an mqtts:// broker "
        "are verified against (default: the system's CAs)",
    )
    sp.add_argument(
        "--lease",
        type=_positive_float,
        default=30.0,
        help="seconds a site may start a job dispatched to it without asking the owner again; "
        "a lost site's waiting jobs move elsewhere once it runs out (default 30)",
    )
    sp.add_argument(
        "--retain-days",
        type=_positive_float,
        default=30.0,
        metavar="D",
        help="keep finished jobs (status, history, output) queryable D days (default 30)",
    )
    sp.add_argument(
        "--retain-jobs",
        type=_non_negative_int,
        default=1_000_000,
        metavar="N",
        help="keep at most N finished jobs, purging the oldest first (default 1000000)",
    )
    sp.add_argument(
        "--idempotency-window",
        type=_positive_float,
        default=24 * 3600.0,
        metavar="SECONDS",
        help="how long a submission's Idempotency-Key is remembered: a retry within it returns "
        "the first job (default 86400)",
    )
    sp.add_argument(
        "--black-hole",
        metavar="SPEC",
        default="",
        help="black-hole protection: 'off', or name=value pairs overriding the defaults "
        "(fast=10 s, window=600 s, min_outcomes=5, suspect_excess=0.3, penalty=2, "
        "exclude_excess=0.6, cooldown=300 s), e.g. 'fast=5,cooldown=60'",
    )
    sp.add_argument(
        "--heartbeat",
        metavar="S",
        type=_non_negative_float,
        default=2.0,
        help="ping the neighbours MQTT does not vouch for (all of them while the MQTT link is "
        "down) every S s; 3 missed in a row make one lost (default 2; 0 = off)",
    )
    sp.add_argument(
        "--neighbour-grace",
        metavar="S",
        type=_non_negative_float,
        default=None,
        help="after S s, take a neighbour never heard from (no DCSMon state, no online word "
        "over MQTT, no heartbeat answer) as idle, as the topology describes it (default: "
        "never: only neighbours heard from are candidates, so a broker alone runs its own "
        "jobs at once)",
    )
    sp.add_argument(
        "--dcsmon-period",
        type=_positive_float,
        default=1.0,
        help="publish the site's state at most this often, in s (default 1)",
    )
    sp.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="stop the jobs running here when the broker stops (default: leave them running; "
        "the restarted broker adopts them)",
    )
    _add_netmon_arguments(sp, prefix="--netmon-")
    sp.add_argument(
        "--no-netmon",
        action="store_true",
        help="do not run NetMon in-process (e.g. run `gbroker netmon serve` instead)",
    )
    sp.add_argument(
        "--no-dcsmon",
        action="store_true",
        help="do not publish the site's state in-process (e.g. run `gbroker dcsmon serve`)",
    )
    sp.set_defaults(run=_cmd_serve)


def _sizes(text: str) -> tuple[int, ...]:
    from gbroker.errors import InvalidInput
    from netmon.service import parse_sizes

    try:
        return parse_sizes(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_netmon_arguments(parser: argparse.ArgumentParser, prefix: str) -> None:
    """NetMon's period and test sizes: ``--netmon-period`` for serve, ``--period`` standalone."""
    parser.add_argument(
        f"{prefix}period",
        type=_positive_float,
        default=300.0,
        help="seconds between NetMon probe rounds (default 300)",
    )
    parser.add_argument(
        f"{prefix}sizes",
        type=_sizes,
        default=(1 << 20, 8 << 20),
        metavar="SIZES",
        help="NetMon test sizes, comma-separated, e.g. 64KiB,1MiB,8MB (default 1MiB,8MiB)",
    )
    _add_forecaster_argument(parser)


def _add_forecaster_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--forecaster",
        choices=("table", "ensemble"),  # netmon.forecast.FORECASTERS, without importing it
        default="table",
        help="transfer-time forecaster: the paper's piecewise-linear table of NetMon's probes "
        "(default), or an NWS-style ensemble per test size interpolated the same way",
    )


async def _until_signalled(service: Any) -> None:
    """Run ``service`` until it ends, or until SIGINT/SIGTERM cancels it."""
    import asyncio
    import signal

    task = asyncio.ensure_future(service)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise


def _monitor_site(args: argparse.Namespace) -> tuple[Topology, str]:
    """The topology and this monitor's MQTT URL (``--mqtt``, else the site's in the topology)."""
    from gbroker.errors import InvalidInput
    from gbroker.topology import load_topology

    topology = load_topology(args.topology)
    if args.site not in topology.sites:
        raise InvalidInput("--site", f"a site of {topology.name}", args.site)
    mqtt = args.mqtt or topology.sites[args.site].mqtt
    if mqtt is None:
        raise InvalidInput("--mqtt", "an MQTT URL (the topology names none for the site)")
    return topology, mqtt


def _cmd_monitor(args: argparse.Namespace) -> int:
    """``gbroker dcsmon serve`` and ``gbroker netmon serve``: a monitor as its own process."""
    import asyncio
    import logging

    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {args.site} {args.command} %(message)s"
    )
    try:
        topology, mqtt = _monitor_site(args)
    except OSError as exc:
        print(
            f"gbroker {args.command}: cannot read {args.topology}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    username, password = _mqtt_credentials(args)
    if args.command == "dcsmon":
        from dcsmon.service import serve_dcsmon
        from gbroker.errors import InvalidInput

        broker = args.broker_url or topology.sites[args.site].http
        if broker is None:
            raise InvalidInput("--broker-url", "the site's broker URL (the topology names none)")
        service = serve_dcsmon(
            args.site,
            broker,
            mqtt,
            period=args.period,
            token=_client_token(broker, args.token_file),
            mqtt_username=username,
            mqtt_password=password,
        )
        logging.info("dcsmon of %s: sampling %s, publishing on %s", args.site, broker, mqtt)
    else:
        from yarl import URL

        from gbroker.auth import PeerSigner
        from gbroker.errors import InvalidInput
        from netmon.forecast import make_forecaster
        from netmon.service import serve_netmon

        secret = _read_secret(args.secret_file)
        if secret is None:
            raise InvalidInput("--secret-file", "the fleet secret (probes are peer requests)")
        signer = PeerSigner(args.site, secret)
        peers = {name: spec.http for name, spec in topology.sites.items() if spec.http}
        service = serve_netmon(
            args.site,
            topology.neighbours(args.site),
            peers,
            mqtt,
            make_forecaster(args.forecaster, topology.default_link.bandwidth),
            mqtt_username=username,
            mqtt_password=password,
            sizes=args.sizes,
            period=args.period,
            sign=lambda method, url, body: signer.headers(method, URL(url).path_qs, body),
        )
        logging.info(
            "netmon of %s: probing %s every %g s, publishing on %s",
            args.site,
            ", ".join(topology.neighbours(args.site)) or "no neighbours",
            args.period,
            mqtt,
        )
    asyncio.run(_until_signalled(service))
    return 0


def _add_monitor_parsers(sub: Any) -> None:
    dp = sub.add_parser(
        "dcsmon",
        help="run a site's DCSMon on its own (it runs inside `gbroker serve` by default)",
    )
    actions = dp.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser(
        "serve",
        help="sample the site's broker over HTTP and publish its state on MQTT",
        description="Sample the site's broker (GET /api/v1/state) every period and publish "
        "the state (retained) on MQTT when it changes. Run the broker with --no-dcsmon. "
        "Stops on SIGINT or SIGTERM.",
    )
    sp.add_argument("--site", required=True, help="the monitored site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file")
    sp.add_argument("--broker-url", help="the site's broker (default: its http endpoint)")
    sp.add_argument("--mqtt", help="MQTT broker URL (default: the site's mqtt endpoint)")
    _add_mqtt_credential_arguments(sp)
    sp.add_argument(
        "--period", type=_positive_float, default=1.0, help="seconds between samples (default 1)"
    )
    _add_token_file_argument(sp)
    sp.set_defaults(run=_cmd_monitor)

    np = sub.add_parser(
        "netmon",
        help="run a site's NetMon on its own (it runs inside `gbroker serve` by default)",
    )
    actions = np.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser(
        "serve",
        help="probe the neighbours over HTTP and publish the forecast table on MQTT",
        description="Every period, upload test blobs of the configured sizes to each "
        "neighbour's probe endpoint, time them, and publish the site's piecewise-linear "
        "forecast table (retained) on MQTT. Run the broker with --no-netmon. Stops on SIGINT "
        "or SIGTERM.",
    )
    sp.add_argument("--site", required=True, help="the measuring site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file (neighbours, URLs)")
    sp.add_argument("--mqtt", help="MQTT broker URL (default: the site's mqtt endpoint)")
    _add_mqtt_credential_arguments(sp)
    _add_netmon_arguments(sp, prefix="--")
    sp.add_argument(
        "--secret-file", help="file holding the fleet secret peers sign with (required)"
    )
    sp.set_defaults(run=_cmd_monitor)


def _cmd_mqtt_serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    from pathlib import Path

    from gbroker.daemon.mqtt import EmbeddedBroker, TopicAcl, read_amqtt_password_file
    from gbroker.errors import InvalidInput
    from gbroker.tls import server_context

    if args.password_file is None:
        if args.acl_file is not None:
            raise InvalidInput("--acl-file", "a --password-file to go with it")
        if not args.allow_anonymous:
            raise InvalidInput(
                "--password-file", "a password file (or --allow-anonymous, for tests only)"
            )
        users, acl = None, None
    else:
        if args.allow_anonymous:
            raise InvalidInput("--allow-anonymous", "no --password-file with it")
        users = read_amqtt_password_file(args.password_file)
        acl = TopicAcl.load(args.acl_file) if args.acl_file else None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidInput("--tls-cert", "both --tls-cert and --tls-key, or neither")
    tls = server_context(Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with EmbeddedBroker(
            args.host, args.port, users=users, acl=acl, ssl_context=tls
        ) as broker:
            access = "anyone" if users is None else f"{len(users)} users"
            print(f"embedded MQTT broker on {broker.url} ({access})", flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0


def _os_error(exc: OSError) -> str:
    """An OSError for a person: the file it concerns first, when it names one."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _fleet_dir(args: argparse.Namespace) -> str:
    """The fleet directory a ``fleet`` action works on: ``--dir``, else the fleet found
    (:mod:`gbroker.fleetdir`); ``up`` and ``compose`` make one where :func:`for_up` says."""
    from gbroker import fleetdir
    from gbroker.errors import GBrokerError

    if args.dir:
        return str(args.dir)
    if args.action in ("up", "compose"):
        return fleetdir.for_up()
    try:
        return fleetdir.find()
    except fleetdir.NoFleet as exc:
        raise GBrokerError(str(exc)) from None


def _fleet_up_report(directory: str, record: dict[str, Any], runtime: str) -> None:
    """What `fleet up` prints: the members, and how to reach the fleet with nothing typed."""
    import os

    from gbroker import fleetdir

    where = "" if runtime == "local" else f" ({runtime})"
    sites = len(record["sites"])
    print(f"fleet up in {directory}{where}: {sites} sites, MQTT {record['mqtt_url']}")
    for name, member in record["sites"].items():
        print(f"  {name:<12} {member['url']}  pid {member['pid']}")
    root = os.path.dirname(os.path.abspath(directory))
    first = next(iter(record["sites"].values()))["url"]
    print(
        f"\nClient commands find it from any directory under {root} (elsewhere: it is your "
        f"default fleet, or set {fleetdir.ENV}={os.path.abspath(directory)}), e.g.\n"
        "  gbroker submit examples/hello.yaml\n"
        "  gbroker jobs\n"
        f"Dashboard: {first}/fleet (sign in with the token in "
        f"{os.path.join(os.path.abspath(directory), 'tokens')})\n"
        "Stop it with `gbroker fleet down` (it stops the fleet's running jobs; --keep-jobs)."
    )


def _fleet_status(directory: str, as_json: bool) -> int:
    import json

    from gbroker import fleet
    from gbroker.cli import exits, show

    rows = fleet.status(directory)
    healthy = all(r["alive"] and r["answers"] is not False for r in rows)
    if as_json:
        print(json.dumps({"directory": directory, "members": rows, "ok": healthy}, indent=2))
    else:
        table = [
            (
                row["name"],
                row["url"],
                str(row["pid"]),
                "up" if row["alive"] else "DOWN",
                _http_column(row),
            )
            for row in rows
        ]
        print(f"fleet in {directory}")
        show.print_table(("MEMBER", "URL", "PID", "PROCESS", "HTTP"), table)
    return exits.OK if healthy else exits.FAILED


def _http_column(row: dict[str, Any]) -> str:
    """A member's HTTP column in ``fleet status``: answers (healthy), not ok (and what), or no
    answer; ``-`` for the MQTT broker."""
    if row["answers"] is None:
        return "-"
    if row["answers"]:
        return "answers"
    if row.get("not_ok"):
        return "not ok: " + ", ".join(row["not_ok"])
    return "no answer"


def _fleet_down(directory: str, keep_jobs: bool) -> int:
    from gbroker import fleet

    done = fleet.down(directory, keep_jobs=keep_jobs)

    def per_site(counts: dict[str, int]) -> str:
        return ", ".join(f"{site} {n}" for site, n in sorted(counts.items()))

    if done.stopped:
        print(f"stopped {sum(done.stopped.values())} running job(s): {per_site(done.stopped)}")
    if done.left:
        print(
            f"left {sum(done.left.values())} job(s) running for the brokers to adopt when the "
            f"fleet comes up again: {per_site(done.left)}"
        )
    if not done.stopped and not done.left and not done.unanswered:
        print("no jobs were running")
    if done.unanswered:
        print(f"(no answer from {', '.join(done.unanswered)}: their jobs were not counted)")
    for space, count in done.killed.items():
        print(f"killed {count} process(es) still running in {space}")
    print(f"fleet in {directory} is down")
    return 0


def _cmd_fleet(args: argparse.Namespace) -> int:
    from gbroker import fleet
    from gbroker.cli import exits
    from gbroker.errors import InvalidInput

    try:
        if args.action in ("drain", "undrain"):  # with --broker, no fleet directory needed
            if not args.broker:
                args.dir = _fleet_dir(args)
            return _drain(args)
        directory = _fleet_dir(args)
        if args.action == "up":
            extra: tuple[str, ...] = ("--algorithm", args.algorithm) if args.algorithm else ()
            if args.malleability:  # every site resizes its malleable jobs
                extra += ("--malleability", args.malleability, "--initiative", args.initiative)
                extra += ("--reserve", str(args.reserve))
            if args.allow_private_sources:
                extra += ("--allow-private-sources",)
            if args.mqtt and args.mqtt_broker:
                raise InvalidInput("--mqtt", "either --mqtt URL or --mqtt-broker, not both")
            mqtt = args.mqtt or args.mqtt_broker
            record = fleet.up(
                args.topology,
                directory,
                mqtt,
                extra,
                tls=args.tls,
                runtime=args.runtime,
                image=args.image,
                remember=True,
            )
            _fleet_up_report(directory, record, args.runtime)
        elif args.action == "status":
            return _fleet_status(directory, args.json)
        elif args.action == "down":
            return _fleet_down(directory, args.keep_jobs)
        elif args.action == "compose":
            path = fleet.compose(
                args.topology, directory, args.mqtt_broker or "amqtt", args.image, args.first_port
            )
            print(f"wrote {path}: run `docker-compose up -d` in {path.parent}")
        elif args.action == "shape":
            up = args.rate if args.up is None else args.up
            down = args.rate if args.down is None else args.down
            fleet.shape(directory, args.site, up, down)
            shown = {"out of it": up, "into it": down}
            text = ", ".join(
                f"{k} {'unshaped' if v is None else _rate_text(v)}" for k, v in shown.items()
            )
            print(f"{args.site}: {text}")
        elif args.action == "kill":
            alive, pid = fleet.site_alive(directory, args.site)
            if not alive:
                print(
                    f"gbroker fleet kill: {args.site} is not running (pid {pid} is gone); "
                    f"`gbroker fleet restart {args.site}` starts it",
                    file=sys.stderr,
                )
                return exits.FAILED
            print(f"killed {args.site} (pid {fleet.kill(directory, args.site)})")
        else:
            alive, pid = fleet.site_alive(directory, args.site)
            if alive and not args.force:
                print(
                    f"gbroker fleet restart: {args.site} is running (pid {pid}); --force kills "
                    "it first (its running jobs stay, for the new broker to adopt)",
                    file=sys.stderr,
                )
                return exits.FAILED
            print(f"restarted {args.site} (pid {fleet.restart(directory, args.site)})")
    except OSError as exc:
        print(f"gbroker fleet {args.action}: {_os_error(exc)}", file=sys.stderr)
        return exits.USAGE
    return exits.OK


_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
               "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}  # fmt: skip


def _link_rate(text: str) -> float | None:
    """A link rate: ``100mbit``, ``12.5MB`` (bytes/s), a bare number of bytes/s, or ``off``."""
    if text.lower() == "off":
        return None
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ/")
    unit = text[len(number) :].lower().removesuffix("/s") or "b"
    try:
        value = float(number) * _RATE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"expected a rate such as 100mbit, 12.5MB (bytes/s) or off, got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a rate > 0, got {text!r}")
    return value


def _rate_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:g} Mbit/s"


def _drain(args: argparse.Namespace) -> int:
    """``fleet drain`` / ``undrain``: one line on stdout; progress on stderr on a terminal."""
    import json

    from gbroker import fleet

    # A fleet's own admin token unless a broker or a token file is named.
    named = args.broker or args.token_file
    token = _client_token(args.broker or "", args.token_file) if named else None
    target = fleet.drain_target(args.dir, args.site, args.broker, token, args.ca)

    def progress(report: dict[str, Any]) -> None:
        if sys.stderr.isatty():
            print(f"{report['site']}: draining: {fleet.drain_left(report)}", file=sys.stderr)

    try:
        on = args.action == "drain"
        report = fleet.drain(target, on, wait=on and not args.no_wait, timeout=args.timeout,
                             progress=progress)  # fmt: skip
    except fleet.FleetError as exc:
        print(f"gbroker fleet {args.action}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    elif report["drained"]:
        print(f"{report['site']}: drained")
    elif report["draining"]:
        print(f"{report['site']}: draining: {fleet.drain_left(report)}")
    else:
        print(f"{report['site']}: taking new work")
    return 0


def _cmd_image(args: argparse.Namespace) -> int:
    from gbroker import image

    image.build(args.tag, force=args.force)
    return 0


def _add_image_parser(sub: Any) -> None:
    ip = sub.add_parser(
        "image",
        help="build the GBroker container image (no registry needed)",
        description="Build the image that `fleet up --runtime docker` runs: a Debian base made "
        "with mmdebstrap from this host's apt mirror, and GBroker installed offline from wheels "
        "built here. Kept when its sources have not changed.",
    )
    actions = ip.add_subparsers(dest="action", required=True, metavar="ACTION")
    bp = actions.add_parser("build", help="build (or keep) the image")
    bp.add_argument("--tag", default="gbroker:local", help="image tag (default gbroker:local)")
    bp.add_argument("--force", action="store_true", help="rebuild even if up to date")
    bp.set_defaults(run=_cmd_image)


def _add_fleet_parsers(sub: Any) -> None:
    mp = sub.add_parser(
        "mqtt-serve",
        help="run an embedded MQTT broker (amqtt) until SIGTERM",
        description="Run an amqtt MQTT broker. Only the users of --password-file may connect "
        "(lines user:<argon2 hash>, as `gbroker fleet up` writes in FLEET/mqtt/passwords), "
        "each under the topic ACL of --acl-file (YAML: publish/subscribe: {user: [filters]}; "
        "default: each user is a site that publishes under gbroker/v1/site/<user>/# and "
        "reads gbroker/v1/site/+/#).",
    )
    mp.add_argument("--host", default="127.0.0.1")
    mp.add_argument("--port", type=_non_negative_int, default=1883)
    mp.add_argument("--password-file", help="user:<argon2 hash> lines (FLEET/mqtt/passwords)")
    mp.add_argument("--acl-file", help="topic ACL, YAML (FLEET/mqtt/acl.yaml)")
    mp.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="let anyone connect and publish anywhere, without --password-file (tests only)",
    )
    mp.add_argument("--tls-cert", metavar="FILE", help="listen with TLS (mqtts) with this cert")
    mp.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    mp.set_defaults(run=_cmd_mqtt_serve)

    fleet_brokers = ("amqtt", "mosquitto")  # gbroker.fleet.MQTT_BROKERS, without importing it
    fp = sub.add_parser(
        "fleet", help="run a fleet: one broker per site (processes, namespaces, containers)"
    )
    actions = fp.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("up", "start an MQTT broker and one broker per site (see --runtime)"),
        ("status", "show each member's process and HTTP health"),
        ("down", "stop the fleet and its running jobs (--keep-jobs to leave them)"),
        ("kill", "SIGKILL one site's broker"),
        ("restart", "start a stopped site's broker again (it resumes from its journal)"),
        ("shape", "change one site's access link rates (a netns or docker fleet)"),
        ("compose", "write a docker-compose file (and what it mounts) for a topology"),
        ("drain", "stop one site taking new work, move its queued jobs, wait for the rest"),
        ("undrain", "let a drained site take new work again"),
    ):
        ap = actions.add_parser(name, help=text, description=text)
        ap.add_argument(
            "--dir",
            help="fleet directory (default: $GBROKER_FLEET, else the nearest .gbroker-fleet "
            "walking up from here, else your last fleet; `up`: ./.gbroker-fleet if none is "
            "above)",
        )
        ap.set_defaults(run=_cmd_fleet)
        if name == "status":
            ap.add_argument("--json", action="store_true", help="print the members as JSON")
        if name == "down":
            ap.add_argument(
                "--keep-jobs",
                action="store_true",
                help="leave the running jobs running, for the brokers to adopt when the fleet "
                "comes up again (default: stop them)",
            )
        if name == "restart":
            ap.add_argument(
                "--force", action="store_true", help="kill the site's broker first if it runs"
            )
        if name == "compose":
            ap.add_argument("--topology", required=True, help="topology YAML file")
            ap.add_argument("--mqtt-broker", choices=fleet_brokers, help="default amqtt")
            ap.add_argument("--image", default="gbroker:local", help="default gbroker:local")
            ap.add_argument(
                "--first-port",
                type=_positive_int,
                default=8701,
                help="site i is published on 127.0.0.1:FIRST_PORT+i (default 8701)",
            )
        if name == "up":
            ap.add_argument("--topology", required=True, help="topology YAML file")
            _add_malleability_arguments(ap, fraction=False)
            ap.add_argument(
                "--mqtt-broker",
                choices=fleet_brokers,
                help="the MQTT broker the fleet runs, with passwords and a topic ACL "
                "(default amqtt, in a `gbroker mqtt-serve` process)",
            )
            ap.add_argument(
                "--mqtt",
                metavar="URL",
                help="use this external MQTT broker instead (the fleet passes no credentials)",
            )
            ap.add_argument("--algorithm", choices=_ALGORITHMS, help="dispatch algorithm")
            ap.add_argument(
                "--allow-private-sources",
                action="store_true",
                help="let the brokers stage from and to loopback and private hosts (a fleet "
                "on one host or LAN, with its own data servers)",
            )
            ap.add_argument(
                "--runtime",
                choices=("local", "netns", "docker"),
                default="local",
                help="where members run: local processes on loopback (default); each in its "
                "own network namespace with its own address and its access link shaped as the "
                "topology says (root only); or each in its own container (see --image)",
            )
            ap.add_argument(
                "--image",
                default="gbroker:local",
                help="the image of a docker fleet (default gbroker:local, from "
                "`gbroker image build`)",
            )
            ap.add_argument(
                "--tls",
                action="store_true",
                help="HTTPS and mqtts between all members: a fleet CA and a certificate per "
                "site in DIR/tls (clients verify with DIR/tls/ca.crt)",
            )
        if name in ("kill", "restart", "shape"):
            ap.add_argument("site")
        if name == "shape":
            ap.add_argument(
                "rate", type=_link_rate, help="both ways: 100mbit, 12.5MB (bytes/s), off"
            )
            ap.add_argument("--up", type=_link_rate, help="out of the site only (default: RATE)")
            ap.add_argument("--down", type=_link_rate, help="into the site only (default: RATE)")
        if name in ("drain", "undrain"):
            ap.add_argument("site", nargs="?", help="the site (optional with --broker)")
            ap.add_argument("--broker", metavar="URL", help="drive this broker, not a fleet's")
            _add_token_file_argument(ap)
            ap.add_argument("--ca", metavar="FILE", help="verify an https:// --broker with it")
            ap.add_argument("--json", action="store_true", help="print the last report as JSON")
            ap.add_argument(
                "--timeout",
                type=_positive_float,
                default=3600.0,
                help="seconds to wait for drained (default 3600; exit 1 after, still draining)",
            )
        if name == "drain":
            ap.add_argument(
                "--no-wait", action="store_true", help="return once the drain has begun"
            )
        if name == "undrain":
            ap.set_defaults(no_wait=True)


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
    from gbroker import fleetdir
    from gbroker.errors import GBrokerError

    try:
        return fleetdir.find()
    except fleetdir.NoFleet as exc:
        raise GBrokerError(str(exc)) from None


def _cmd_chaos(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from gbroker.chaos import (
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


def _add_chaos_parser(sub: Any) -> None:
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
    cp.add_argument("--jobs", type=_non_negative_int, default=100, help="jobs in the stream")
    cp.add_argument("--rate", type=_positive_float, default=5.0, help="jobs/s (Poisson)")
    cp.add_argument(
        "--kill-every", type=_positive_float, metavar="S", help="SIGKILL a random broker every S s"
    )
    cp.add_argument(
        "--down-for",
        type=_non_negative_float,
        default=5.0,
        metavar="D",
        help="seconds a killed broker (or MQTT broker) stays down (default 5)",
    )
    cp.add_argument(
        "--kill-mqtt-at",
        type=_non_negative_float,
        metavar="T",
        help="kill the fleet's MQTT broker T s into the stream, restart it D s later",
    )
    cp.add_argument(
        "--burst-clients",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="after the stream, K clients submit back to back to one broker, SIGKILLed once "
        "half the burst is acknowledged",
    )
    cp.add_argument(
        "--burst-jobs",
        type=_positive_int,
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
        "--algorithm", choices=_ALGORITHMS, help="restart the brokers with this algorithm first"
    )
    cp.add_argument("--seed", type=_non_negative_int, default=1)
    cp.add_argument(
        "--job-seconds",
        type=_seconds_range,
        default=(1.0, 3.0),
        metavar="MIN:MAX",
        help="each job sleeps a uniform time in [MIN, MAX] s (default 1:3)",
    )
    cp.add_argument(
        "--settle",
        type=_positive_float,
        default=120.0,
        help="seconds to wait for every job to end after the last submission (default 120)",
    )
    cp.add_argument("--run-dir", help="where the jobs' log goes (default: a fresh temp dir)")
    cp.add_argument("--json", action="store_true", help="print the report as one JSON object")
    cp.add_argument(
        "--progress", action="store_true", help="report events on stderr (default: on a tty)"
    )
    cp.set_defaults(run=_cmd_chaos)


def _cmd_demo(args: argparse.Namespace) -> int:
    from gbroker.demo import run_demo

    return run_demo(args.jobs, args.rate, args.seed, args.runtime)


def _add_demo_parser(sub: Any) -> None:
    dp = sub.add_parser(
        "demo",
        help="run a real 6-site fleet serving a stream of real jobs, then tear it down",
        description="Bring up the paper's 6-site testbed as a 2D torus of local broker "
        "processes, submit a stream of real jobs with input files to random brokers, show "
        "progress, print B, T, W and where each job ran, and tear the fleet down.",
    )
    dp.add_argument("--jobs", type=_positive_int, default=40)
    dp.add_argument("--rate", type=_positive_float, default=4.0, help="jobs/s (default 4)")
    dp.add_argument("--seed", type=_non_negative_int, default=1)
    dp.add_argument(
        "--runtime",
        choices=("local", "netns", "docker"),
        default="local",
        help="where the sites run: local processes (default), network namespaces (root), or "
        "containers (the image of `gbroker image build`)",
    )
    dp.set_defaults(run=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    from gbroker.cli.exits import EPILOG

    parser = argparse.ArgumentParser(
        prog="gbroker",
        description="Decentralized scheduling of parallel jobs across many clusters.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    _add_malleability_arguments(rp)
    _add_sd_arguments(rp)
    rp.add_argument(
        "--seed", type=_non_negative_int, default=0, help="which jobs are malleable (default 0)"
    )
    rp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    rp.set_defaults(run=_cmd_replay)
    _add_topology_parser(sub)
    _add_sim_parser(sub)
    _add_serve_parser(sub)
    from gbroker.cli.jobs import add_parsers as add_client_parsers

    add_client_parsers(sub)
    _add_fleet_parsers(sub)
    _add_image_parser(sub)
    _add_monitor_parsers(sub)
    _add_demo_parser(sub)
    _add_chaos_parser(sub)
    _add_jsdl_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gbroker.errors import GBrokerError

    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    name = f"fleet {args.action}" if args.command == "fleet" else args.command
    try:
        return run(args)
    except GBrokerError as exc:  # bad input or a failed action: one line, never a traceback
        print(f"gbroker {name}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the user named that cannot be read or written
        if exc.filename is None:
            raise
        print(f"gbroker {name}: {_os_error(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
