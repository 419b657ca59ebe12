"""The ``gbroker`` command line: a module per command group, each importing what its commands
need only when they run, so that a command starts with what it needs and nothing more.

:mod:`.parser` builds the whole parser; :mod:`.jobs` holds the client commands (``submit``,
``status``, ``wait``, ...), which start on a fast path of their own; :mod:`.replay`, :mod:`.sim`,
:mod:`.topology`, :mod:`.jsdl`, :mod:`.serve`, :mod:`.fleet`, :mod:`.chaos` and :mod:`.demo` the
others; :mod:`.show` and :mod:`.exits` what every command prints and how it exits. ``native/``
is the C front that does a plain ``gbroker submit FILE...`` without starting Python.

May import anything of GBroker, lazily.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms at start)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["CLIENT_COMMANDS", "build_parser", "main"]

CLIENT_COMMANDS = (
    "submit", "status", "wait", "jobs", "output", "cancel", "history", "explain", "migrate",
)  # fmt: skip
"""Commands that start on a fast path of their own (:mod:`gbroker.cli.jobs`)."""


def build_parser() -> argparse.ArgumentParser:
    """The whole ``gbroker`` parser (every command)."""
    from gbroker.cli.parser import build_parser as build

    return build()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``gbroker`` command. Every command goes through here: a reader of its output
    that goes away early (``| head``) ends it silently (:func:`gbroker.cli.exits.reader_gone`)."""
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            return _dispatch(args)
        finally:  # what is still buffered goes now, while a closed pipe can still be caught
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        from gbroker.cli.exits import reader_gone

        reader_gone()


def _dispatch(args: list[str]) -> int:
    if len(args) > 1 and args[0] == "submit" and not any(a.startswith("-") for a in args):
        from gbroker.cli.jobs import plain_submit

        return plain_submit(args[1:])
    if args and args[0] in CLIENT_COMMANDS:
        from gbroker.cli.jobs import main as client

        return client(args)
    from gbroker.cli.parser import main as run

    return run(args)
