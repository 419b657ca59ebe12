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


def load(text: str, loader: type[NoAliasLoader] = NoAliasLoader) -> object:
    """The plain data in one YAML document.

    Raises:
        yaml.YAMLError: the text is not YAML, holds an anchor or alias (:class:`AliasRefused`)
            or a scalar PyYAML cannot construct (:class:`UnreadableValue`).
        RecursionError: it is nested too deeply.
    """
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader: plain data only
    except yaml.YAMLError:
        raise
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML's constructors raise these for "2020-13-45", "!!int x", an integer of more
        # than 4300 digits (Python's int-from-str limit), "!!timestamp x".
        raise UnreadableValue(
            f"a value PyYAML cannot construct ({type(exc).__name__}: {exc})"
        ) from exc
