"""Command-line arguments of scheduling policies shared by ``replay``, ``sim``, ``serve`` and
``fleet up``: dispatch algorithms, KOALA's malleability policies and SD-Policy."""

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
    "random",
    "roundrobin",
    "worstfit",
    "closetofiles",
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
        help="Δ in s for dm/drm, matchmaking interval for central (default 30)",
    )
    parser.add_argument(
        "--epsilon", type=non_negative_float, default=0.2, help="ε for dm/drm (default 0.2)"
    )


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

    return DispatchPolicy(Algorithm(args.algorithm), args.replicas, args.interval, args.epsilon)
