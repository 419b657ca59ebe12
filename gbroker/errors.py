"""Exceptions, split by whose fault a failure is.

``GBrokerError`` is the root. ``InvalidInput`` (and its subclasses) means the caller, a user or a
peer, handed us something wrong: it names the field, what was expected and what was found, so an
API can answer with a precise 4xx. ``InternalError`` means we broke an invariant ourselves.

Errors stay small. What was found may be anything a caller sent: a 1 MiB string, a list nested
a thousand deep, a YAML alias bomb whose ``repr`` would take gigabytes, an integer too long for
``str``. :class:`InvalidInput` therefore keeps ``found`` itself only when it is small and cheap to
print (so tests and callers can compare it); anything else becomes a :class:`Shown`, a bounded
snippet of at most :data:`SNIPPET_CHARS` characters, built by a :mod:`reprlib` walk that never
visits more than a few dozen elements. The field and the expectation are clipped too. Every
caller gets this for free: nothing needs to shorten a value before raising.
"""

from __future__ import annotations

import reprlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a client's start)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "SNIPPET_CHARS",
    "GBrokerError",
    "IllegalTransition",
    "InternalError",
    "InvalidInput",
    "Shown",
    "TraceFormatError",
    "shown",
]

SNIPPET_CHARS: Final = 120
"""The most characters an error quotes of a bad value (plus a short note of its type and size)."""

_FIELD_CHARS: Final = 200
_EXPECTED_CHARS: Final = 1000
_SMALL_NODES: Final = 32  # a value with more elements than this is always shown as a snippet
_BIG_INT_BITS: Final = 256
_PLAIN: Final = (list, tuple, set, frozenset)  # subclasses may print anything


class Shown:
    """A bounded stand-in for a value in an error message: its ``repr`` is the snippet."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shown) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class _BoundedRepr(reprlib.Repr):
    """reprlib with shallow limits, and no attempt to print huge integers or byte strings."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxset = self.maxfrozenset = 4
        self.maxdeque = self.maxdict = 4
        self.maxstring = SNIPPET_CHARS
        self.maxlong = 40
        self.maxother = SNIPPET_CHARS

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _BIG_INT_BITS:  # str() of a long int is slow, then refused
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x[: self.maxstring]) + ("..." if len(x) > self.maxstring else "")

    def repr_bytearray(self, x: bytearray, level: int) -> str:
        return self.repr_bytes(bytes(x[: self.maxstring + 1]), level)


_REPR = _BoundedRepr()


def _small(value: object) -> bool:
    """Whether ``value`` prints short and cheaply: few elements, short strings, no long ints."""
    budget = _SMALL_NODES
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            return False
        if isinstance(item, str | bytes | bytearray):
            if len(item) > SNIPPET_CHARS:
                return False
        elif isinstance(item, int):
            if item.bit_length() > _BIG_INT_BITS:
                return False
        elif isinstance(item, float) or item is None:
            continue
        elif isinstance(item, list | tuple | set | frozenset) and type(item) in _PLAIN:
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            return False  # other objects may print anything: show their bounded repr
    return True


def _sized(value: object) -> str:
    if isinstance(value, str | bytes | bytearray | list | tuple | dict | set | frozenset):
        return f" ({type(value).__name__} of length {len(value)})"
    return ""


def shown(value: object) -> object:
    """What an error keeps of ``value``: itself when small, else a bounded :class:`Shown`."""
    if isinstance(value, Shown):
        return value
    try:
        if _small(value) and len(text := repr(value)) <= SNIPPET_CHARS:
            return value
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__ must not turn a 4xx into a 500
        text = f"<{type(value).__name__}>"
    if len(text) > SNIPPET_CHARS:
        text = text[: SNIPPET_CHARS - 3] + "..."
    return Shown(text + _sized(value))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class GBrokerError(Exception):
    """Root of every error GBroker raises on purpose."""


class InvalidInput(GBrokerError, ValueError):
    """Bad input from a user or a peer: which field, what was expected, what was found.

    ``found`` is kept as given when small (see :func:`shown`), else as a bounded :class:`Shown`;
    ``field`` and ``expected`` are clipped, so the message stays a few hundred characters.
    """

    def __init__(self, field: str, expected: str, found: object = None) -> None:
        self.field = _clip(str(field), _FIELD_CHARS)
        self.expected = _clip(str(expected), _EXPECTED_CHARS)
        self.found = None if found is None else shown(found)
        message = f"{self.field}: expected {self.expected}"
        if self.found is not None:
            message += f", got {self.found!r}"
        super().__init__(message)


class TraceFormatError(InvalidInput):
    """A workload trace line that cannot be read; carries the file position."""

    def __init__(self, source: str, line: int, field: str, expected: str, found: object) -> None:
        self.source = source
        self.line = line
        super().__init__(f"{source}:{line}: {field}", expected, found)


class InternalError(GBrokerError, RuntimeError):
    """An invariant of ours is broken: a bug, never the caller's fault."""


class IllegalTransition(InternalError):
    """A job was asked to move between two states that the transition table does not link."""
