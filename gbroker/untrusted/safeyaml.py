"""A YAML loader for untrusted documents: PyYAML's safe loader without anchors and aliases.

Theory of operation. PyYAML's ``SafeLoader`` builds only plain data, but it still honours
anchors and aliases, and an alias is a reference: a 384-byte "billion laughs" document builds a
structure of a few nodes whose printed form (or any walk of it) is gigabytes long. Job
descriptions and topologies never need them, so :class:`NoAliasLoader` refuses the first anchor
(``&name``) or alias (``*name``, which includes merge keys ``<<: *name``) it meets, before
anything is built, as an :class:`AliasRefused` (a ``yaml.composer.ComposerError``) carrying the
position. Callers turn that into their own :class:`~gbroker.errors.InvalidInput`, as for any
YAML syntax error. :func:`load` also turns the plain exceptions that PyYAML's constructors let
escape (``ValueError`` for ``2020-13-45`` or a 5000-digit integer, ``AttributeError`` for
``!!timestamp x``) into a ``yaml.YAMLError`` (:class:`UnreadableValue`).

Speed. Every YAML submission is read here, on the broker's event loop. With :class:`NoAliasLoader`
itself (no subclass) and PyYAML built with libyaml, :func:`load` reads with libyaml instead: a
first pass over its events refuses the first anchor or alias the same way, then libyaml's loader
builds the data with PyYAML's same safe constructors (several times as fast for a small job:
docs/JSDL.md, "The read budget"; libyaml also refuses nesting deeper than 1,000 levels).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError

__all__ = ["AliasRefused", "NoAliasLoader", "UnreadableValue", "load"]


class AliasRefused(ComposerError):
    """An anchor or alias in a document read by :class:`NoAliasLoader`; ``problem`` says which."""


class NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors and aliases (see the module docstring)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise AliasRefused(None, None, "an alias (*name)", mark)
        if getattr(event, "anchor", None) is not None:
            raise AliasRefused(None, None, "an anchor (&name)", mark)
        return super().compose_node(parent, index)


class UnreadableValue(yaml.YAMLError):
    """A scalar that PyYAML's constructors choke on with a plain Python exception."""


_LIBYAML: Any = getattr(yaml, "CSafeLoader", None)
_TOO_DEEP = "exceeded maximum nesting depth"  # libyaml's problem for nesting beyond 1,000


def _refuse_anchors(text: str) -> None:
    """Raise :class:`AliasRefused` at the first anchor or alias in ``text`` (libyaml's events)."""
    for event in yaml.parse(text, Loader=_LIBYAML):
        mark: Any = event.start_mark  # libyaml's own Mark: line and column as PyYAML's
        if isinstance(event, yaml.AliasEvent):
            raise AliasRefused(None, None, "an alias (*name)", mark)
        if getattr(event, "anchor", None) is not None:
            raise AliasRefused(None, None, "an anchor (&name)", mark)


def load(text: str, loader: type[NoAliasLoader] = NoAliasLoader) -> object:
    """The plain data in one YAML document.

    Raises:
        yaml.YAMLError: the text is not YAML, holds an anchor or alias (:class:`AliasRefused`)
            or a scalar PyYAML cannot construct (:class:`UnreadableValue`).
        RecursionError: it is nested too deeply.
    """
    try:
        if loader is NoAliasLoader and _LIBYAML is not None:
            _refuse_anchors(text)
            return yaml.load(text, Loader=_LIBYAML)  # a CSafeLoader: plain data only
        return yaml.load(text, Loader=loader)  # a SafeLoader: plain data only
    except yaml.MarkedYAMLError as exc:
        if exc.problem == _TOO_DEEP:  # libyaml's own nesting limit: as Python's recursion's
            raise RecursionError(f"YAML {_TOO_DEEP}") from exc
        raise
    except yaml.YAMLError:
        raise
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML's constructors raise these for "2020-13-45", "!!int x", an integer of more
        # than 4300 digits (Python's int-from-str limit), "!!timestamp x".
        raise UnreadableValue(
            f"a value PyYAML cannot construct ({type(exc).__name__}: {exc})"
        ) from exc
