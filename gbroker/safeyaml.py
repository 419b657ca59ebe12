"""A YAML loader for untrusted documents: PyYAML's safe loader without anchors and aliases.

Theory of operation. PyYAML's ``SafeLoader`` builds only plain data, but it still honours
anchors and aliases, and an alias is a reference: a 384-byte "billion laughs" document builds a
structure of a few nodes whose printed form (or any walk of it) is gigabytes long. Job
descriptions and topologies never need them, so :class:`NoAliasLoader` refuses the first anchor
(``&name``) or alias (``*name``, which includes merge keys ``<<: *name``) it meets, before
anything is built, as an :class:`AliasRefused` (a ``yaml.composer.ComposerError``) carrying the
position. Callers turn that into their own :class:`~gbroker.errors.InvalidInput`, as for any
YAML syntax error.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError

__all__ = ["AliasRefused", "NoAliasLoader", "load"]


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


def load(text: str, loader: type[NoAliasLoader] = NoAliasLoader) -> object:
    """The plain data in one YAML document; raises ``yaml.YAMLError`` (or RecursionError)."""
    return yaml.load(text, Loader=loader)  # a SafeLoader: plain data only
