"""Command-line arguments of scheduling policies shared by ``replay``, ``sim``, ``serve`` and
``fleet up``: dispatch algorithms (and the GridWay baseline's settings, ``sim`` only), KOALA's
malleability policies and SD-Policy."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from gbroker.cli.argtypes import non_negative_float, non_negative_int, positive_float, positive_int

if TYPE_CHECKING:
    from gbroker.core.dispatch import DispatchPolicy

ALGORITHMS = (
    "dlo",
    "dr",
    "dm",
    "drm",
    "central",
    "gridway",
    "random",
    "roundrobin",
    "worstfit",
    "closetofiles",
    "sparrow",
    "federation",
)


def add_policy_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    """--algorithm and its parameters, shared by ``sim`` and ``serve``."""
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        required=required,
        default=None if required else "dlo",
        help="dispatch algorithm" + ("" if required else " (default dlo)"),
    )
    parser.add_argument("--replicas", type=positive_int, default=2, help="m for dr/drm (default 2)")
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=30.0,
        help="Δ in s for dm/drm, matchmaking interval for central (default 30; gridway has "
        "--gw-scheduling-interval)",
    )
    parser.add_argument(
        "--epsilon", type=non_negative_float, default=0.2, help="ε for dm/drm (default 0.2)"
    )
    parser.add_argument(
        "--probe-ratio",
        type=_probe_ratio,
        default=2.0,
        metavar="D",
        help="d for sparrow: a job's reservations go to ceil(d) sites drawn at random "
        "(a number >= 1; default 2, the Sparrow paper's)",
    )
    parser.add_argument(
        "--stage-reservations",
        action="store_true",
        help="sparrow/federation: stage a job's input files to every reservation or sibling "
        "when it is placed, as dr's replicas (default: only to the one granted its start)",
    )


def _probe_ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1 <= value < math.inf:
        raise argparse.ArgumentTypeError(
            f"expected a probe ratio: a number >= 1 (probes per task), got {text!r}"
        )
    return value


SIM_ONLY = ("gridway", "sparrow", "federation")
"""Baselines only the simulator runs: a daemon (``serve``, ``fleet up``) refuses them (GridWay's
model is a central scheduler's; Sparrow's and the federation's placements stage their inputs
once granted, which daemon sites do not do)."""

DAEMON_ALGORITHMS = tuple(a for a in ALGORITHMS if a not in SIM_ONLY)


def refuse_sim_only(algorithm: str | None, command: str) -> None:
    """Raise :class:`InvalidInput` (one line, exit 2) for a baseline only ``sim`` runs."""
    if algorithm in SIM_ONLY:
        from gbroker.errors import InvalidInput

        raise InvalidInput(
            "--algorithm",
            f"an algorithm a broker daemon runs ({', '.join(DAEMON_ALGORITHMS)}): {algorithm} is "
            f"a baseline of the simulator (gbroker sim), not for `gbroker {command}`",
            algorithm,
        )


# (option, GridWayPolicy field, type, default, metavar, help): the defaults are GridWay 5.6.1's
# shipped values (tests/cli check them against GridWayPolicy's).
_GRIDWAY_OPTIONS: tuple[tuple[str, str, Any, Any, str, str], ...] = (
    (
        "--gw-scheduling-interval",
        "scheduling_interval",
        positive_float,
        15.0,
        "SECONDS",
        "SCHEDULING_INTERVAL: seconds between scheduling actions (gwd.conf: 15)",
    ),
    (
        "--gw-discovery-interval",
        "discovery_interval",
        positive_float,
        300.0,
        "SECONDS",
        "DISCOVERY_INTERVAL: seconds between discoveries of new hosts (300)",
    ),
    (
        "--gw-monitoring-interval",
        "monitoring_interval",
        positive_float,
        180.0,
        "SECONDS",
        "MONITORING_INTERVAL: seconds between two refreshes of GridWay's view of a host (180)",
    ),
    (
        "--gw-number-of-jobs",
        "number_of_jobs",
        positive_int,
        200,
        "N",
        "NUMBER_OF_JOBS: the job pool; submissions beyond it wait and are retried (200)",
    ),
    (
        "--gw-dispatch-chunk",
        "dispatch_chunk",
        non_negative_int,
        15,
        "N",
        "DISPATCH_CHUNK: jobs dispatched per scheduling action, 0 = no limit (15)",
    ),
    (
        "--gw-max-running-user",
        "max_running_user",
        non_negative_int,
        30,
        "N",
        "MAX_RUNNING_USER: jobs of the (one) user dispatched and not done, 0 = no limit (30)",
    ),
    (
        "--gw-max-running-resource",
        "max_running_resource",
        non_negative_int,
        10,
        "N",
        "MAX_RUNNING_RESOURCE: a host takes no job once GridWay's used slots there plus this "
        "action's dispatches reach it, 0 = no limit (10)",
    ),
    (
        "--gw-suspension-timeout",
        "suspension_timeout",
        non_negative_float,
        600.0,
        "SECONDS",
        "SUSPENSION_TIMEOUT: a job pending this long in a host's queue moves, and the host is "
        "banned, 0 = never (job_template.default: 600)",
    ),
    (
        "--gw-fr-max-banned",
        "fr_max_banned",
        non_negative_float,
        3600.0,
        "SECONDS",
        "FR_MAX_BANNED: the longest ban of a failing host, 0 = no bans (3600)",
    ),
    (
        "--gw-fr-banned-c",
        "fr_banned_c",
        positive_float,
        650.0,
        "SECONDS",
        "FR_BANNED_C: how fast repeated failures lengthen a ban (650)",
    ),
    (
        "--gw-wt-weight",
        "wt_weight",
        non_negative_float,
        0.0,
        "W",
        "WT_WEIGHT: the waiting-time job policy (0)",
    ),
    (
        "--gw-sh-weight",
        "sh_weight",
        non_negative_float,
        1.0,
        "W",
        "SH_WEIGHT: the share job policy (1)",
    ),
    (
        "--gw-ug-weight",
        "ug_weight",
        non_negative_float,
        1.0,
        "W",
        "UG_WEIGHT: the usage host policy, hosts whose last job took least first (1)",
    ),
)


def add_gridway_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings of ``--algorithm gridway`` (``sim`` only), each defaulting to GridWay
    5.6.1's shipped value."""
    group = parser.add_argument_group(
        "GridWay 5.6.1",
        "the settings of --algorithm gridway, each defaulting to what GridWay 5.6.1 ships "
        '(docs/EXPERIMENTS.md, "The GridWay 5.6.1 model")',
    )
    for option, _, kind, default, metavar, text in _GRIDWAY_OPTIONS:
        group.add_argument(option, type=kind, default=default, metavar=metavar, help=text)
    group.add_argument(
        "--gw-information",
        choices=["dynamic", "static"],
        default="dynamic",
        help="what GridWay's information driver reports as a host's free cores at each "
        "monitoring: dynamic (MDS, BDII: the free cores then) or static (its host file: every "
        "core, whatever the load) (default dynamic)",
    )


def read_gridway_policy(args: argparse.Namespace) -> Any:
    """The GridWayPolicy the arguments ask for (the shipped one without the options)."""
    from gbroker.core.gridway import GridWayPolicy

    if getattr(args, "gw_information", None) is None:
        return GridWayPolicy()
    values = {
        name: getattr(args, option[2:].replace("-", "_")) for option, name, *_ in _GRIDWAY_OPTIONS
    }
    return GridWayPolicy(**values, information=args.gw_information)


def add_malleability_arguments(parser: argparse.ArgumentParser, fraction: bool = True) -> None:
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
        type=non_negative_int,
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


def add_sd_arguments(parser: argparse.ArgumentParser) -> None:
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


def cut_off_name(max_slowdown: float | None) -> str | float:
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


def sd_arguments_fit(args: argparse.Namespace, command: str, queue: str) -> bool:
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


def sd_serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``gbroker serve`` flags of the SD-Policy the arguments ask for (``fleet up`` gives
    them to every site), or none."""
    if args.sd_policy is None:
        return ()
    return (
        "--sd-policy", args.sd_policy,
        "--sharing-factor", repr(args.sharing_factor),
        "--sd-mates", str(args.sd_mates),
        "--sd-runtime", args.sd_runtime,
    )  # fmt: skip


def read_sd_policy(args: argparse.Namespace) -> Any:
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


def read_malleability_policy(args: argparse.Namespace) -> Any:
    """The MalleabilityPolicy the arguments ask for, or None."""
    from gbroker.core.malleable import MalleabilityPolicy

    if args.malleability is None:
        return None
    return MalleabilityPolicy(args.malleability, args.initiative, args.reserve)


def read_dispatch_policy(args: argparse.Namespace) -> DispatchPolicy:
    from gbroker.core.dispatch import Algorithm, DispatchPolicy

    return DispatchPolicy(
        Algorithm(args.algorithm),
        args.replicas,
        args.interval,
        args.epsilon,
        probe_ratio=args.probe_ratio,
        stage_reservations=args.stage_reservations,
        gridway=read_gridway_policy(args),
    )
