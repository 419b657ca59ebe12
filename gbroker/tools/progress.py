"""Progress of long commands for a person watching: a tqdm bar on stderr when stderr is a
terminal, nothing at all otherwise (a pipe, a log file, CI), and no import of tqdm then.

``sim``, ``replay``, the figure scripts and ``demo`` use :func:`bar`; ``chaos`` and ``fleet drain``
print event lines on a terminal the same way (:func:`on_terminal`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Bar", "bar", "on_terminal"]


def on_terminal() -> bool:
    """Whether a person is watching stderr."""
    return sys.stderr.isatty()


class Bar:
    """A bar's three operations; all do nothing when there is no terminal."""

    def __init__(self, impl: Any = None) -> None:
        self._bar = impl

    def update(self, done: int) -> None:
        """Set the count done so far (absolute, not an increment)."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def note(self, text: str) -> None:
        """A line above the bar (on a terminal only)."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)

    def describe(self, text: str) -> None:
        """What the bar is counting now (shown after its counts and rate)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def callback(self) -> Callable[[int], None] | None:
        """:meth:`update`, or None without a terminal (callers then skip counting at all)."""
        return None if self._bar is None else self.update


def bar(total: int, desc: str, unit: str = "job") -> Bar:
    """A bar of ``total`` ``unit``s with counts, rate and time left, on a terminal only."""
    if not on_terminal():
        return Bar()
    import os

    from tqdm import tqdm

    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        columns = 0
    width = None if columns else 100  # a terminal that says no size: tqdm would draw nothing
    return Bar(tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, smoothing=0.1,
                    ncols=width))  # fmt: skip


def callbacks(total: int, desc: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A :func:`bar`'s update callback (None: no bar shown) and its close."""
    shown = bar(total, desc)
    return shown.callback, shown.close
