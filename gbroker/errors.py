"""Exceptions, split by whose fault a failure is.

``GBrokerError`` is the root. ``InvalidInput`` (and its subclasses) means the caller, a user or a
peer, handed us something wrong: it names the field, what was expected and what was found, so an
API can answer with a precise 4xx. ``InternalError`` means we broke an invariant ourselves.
"""

from __future__ import annotations

__all__ = [
    "GBrokerError",
    "IllegalTransition",
    "InternalError",
    "InvalidInput",
    "TraceFormatError",
]


class GBrokerError(Exception):
    """Root of every error GBroker raises on purpose."""


class InvalidInput(GBrokerError, ValueError):
    """Bad input from a user or a peer: which field, what was expected, what was found."""

    def __init__(self, field: str, expected: str, found: object = None) -> None:
        self.field = field
        self.expected = expected
        self.found = found
        message = f"{field}: expected {expected}"
        if found is not None:
            message += f", got {found!r}"
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
