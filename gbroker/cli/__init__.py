"""The ``gbroker`` command line: a package of small modules, each imported only when its
command runs, so that a command starts with what it needs and nothing more (see
:mod:`gbroker.cli.commands` for the commands and their parsers)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms at start)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["CLIENT_COMMANDS", "build_parser", "main"]

CLIENT_COMMANDS = (
    "submit", "status", "wait", "jobs", "output", "cancel", "history", "explain",
)  # fmt: skip
"""Commands that start on a fast path of their own (:mod:`gbroker.cli.jobs`)."""


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gbroker`` parser (every command)."""
    from gbroker.cli.commands import build_parser as build

    return build()


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) > 1 and args[0] == "submit" and not any(a.startswith("-") for a in args):
        from gbroker.cli.jobs import plain_submit

        return plain_submit(args[1:])
    if args and args[0] in CLIENT_COMMANDS:
        from gbroker.cli.jobs import main as client

        return client(args)
    from gbroker.cli.commands import main as run

    return run(args)
