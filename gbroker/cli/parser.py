"""The whole ``gbroker`` parser and its entry point for every command but the client's fast ones.

Each command group lives in a module of its own and imports what it needs when it runs, so that a
command starts with what it needs and nothing more (the replay benchmark times whole processes)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gbroker.cli import chaos, demo, exits, fleet, jobs, jsdl, replay, serve, sim, topology
from gbroker.cli.argtypes import CommandParser, TopParser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = TopParser(
        prog="gbroker",
        description="Decentralized scheduling of parallel jobs across many clusters.",
        epilog=exits.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    for group in (replay, topology, sim, serve, jobs, fleet, demo, chaos, jsdl):
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gbroker.errors import GBrokerError

    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    name = args.command
    if args.command == "fleet":
        name = " ".join(filter(None, ("fleet", args.action, getattr(args, "user_action", None))))
    try:
        return run(args)
    except GBrokerError as exc:  # bad input or a failed action: one line, never a traceback
        print(f"gbroker {name}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the user named that cannot be read or written
        if exc.filename is None:
            raise
        print(f"gbroker {name}: {exits.os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, never a traceback
        print(f"gbroker {name}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
