"""Argument types shared by the commands' parsers: each refuses a bad value with what was
expected (argparse then exits 2 naming the option); and :class:`CommandParser`, the parser of
every subcommand."""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

__all__ = [
    "CommandParser",
    "TopParser",
    "float_list",
    "int_list",
    "non_negative_float",
    "non_negative_int",
    "offsets",
    "positive_float",
    "positive_int",
    "shape",
]


def _with_suggestion(message: str) -> str:
    """argparse's ``invalid choice: 'sumbit' (choose from ...)`` with the nearest choice named,
    as a misspelt JSDL element or YAML key is (:func:`gbroker.jobs.description.did_you_mean`)."""
    import re

    wrong = re.match(r"(.*invalid choice: '([^']*)') \(choose from (.*)\)$", message)
    if wrong is None:
        return message
    from gbroker.jobs.description import nearest

    found = nearest(wrong[2], re.findall(r"'([^']*)'", wrong[3]), n=2)
    if not found:
        return message
    names = " or ".join(f"`{name}`" for name in found)
    return f"{wrong[1]}: did you mean {names}? (choose from {wrong[3]})"


class TopParser(argparse.ArgumentParser):
    """The ``gbroker`` parser: a mistyped command is answered with the nearest one."""

    def error(self, message: str) -> NoReturn:
        super().error(_with_suggestion(message))


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser (``add_subparsers(parser_class=CommandParser)``; its own
    subcommands inherit it): an argument it does not know is an error shown with *its* usage.

    argparse hands a subcommand's unknown arguments up to the top parser, which then printed
    ``usage: gbroker [-h] COMMAND ...`` for ``gbroker status --bogus``: no help to find the
    right flag. Nothing above a subcommand takes arguments after it, so they are errors here."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:  # a mistyped action: the nearest one named
        super().error(_with_suggestion(message))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def shape(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    try:
        shape = (int(rows), int(cols))
    except ValueError:
        shape = (0, 0)
    if not sep or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 4x4, got {text!r}")
    return shape


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def int_list(text: str) -> int | list[int]:
    """One positive integer, or a comma-separated list of them (one per site)."""
    values = [positive_int(part.strip()) for part in text.split(",")]
    return values[0] if len(values) == 1 else values


def float_list(text: str) -> float | list[float]:
    """One positive number, or a comma-separated list of them (one per site)."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}") from None
    if not all(0 < value < float("inf") for value in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return values[0] if len(values) == 1 else values


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def offsets(text: str) -> list[int]:
    return [positive_int(part.strip()) for part in text.split(",")]
