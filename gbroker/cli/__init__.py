"""The ``gbroker`` command line: a package of small modules, each imported only when its
command runs, so that a command starts with what it needs and nothing more (see
:mod:`gbroker.cli.commands` for the commands and their parsers)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms at start)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gbroker`` parser (every command)."""
    from gbroker.cli.commands import build_parser as build

    return build()


def main(argv: Sequence[str] | None = None) -> int:
    from gbroker.cli.commands import main as run

    return run(argv)
