"""Credentials compared where they enter: the fleet secret and client tokens.

Theory of operation. :func:`same_secret` compares what a request presents with what is
configured as UTF-8 bytes with :func:`hmac.compare_digest` (constant time). On ``str``
arguments ``compare_digest`` raises ``TypeError`` for anything non-ASCII, which turned a header
with one ``é`` into a 500; as bytes it is simply a mismatch, answered 401 like any other.
"""

from __future__ import annotations

import hmac

__all__ = ["same_secret"]


def same_secret(presented: str | None, expected: str) -> bool:
    """Whether ``presented`` is ``expected``, in constant time; never raises for any header.

    Both are compared as UTF-8 bytes, so non-ASCII input is a mismatch, not a ``TypeError``.
    An absent header (None) never matches.
    """
    if presented is None:
        return False
    try:
        given = presented.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from surrogateescape-decoded headers
        return False
    return hmac.compare_digest(given, expected.encode("utf-8"))
