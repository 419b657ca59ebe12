"""Site names and job ids: their syntax, checked wherever one enters; and how a count of things
is said (:func:`count`).

Theory of operation. A site name travels in MQTT topics (``gbroker/v1/site/<site>/state``), in
job ids and in URLs, so it is a short token of letters, digits, ``-`` and ``_``
(:data:`SITE_NAME`): no ``/``, ``+`` or ``#`` (MQTT), no ``.`` (it ends the site part of a job
id). A job id is ``<owner site>.<digits>`` (:data:`JOB_ID`), which is how every broker finds a
job's owner; element i of a job array is ``<owner site>.<digits>_<i>``
(:mod:`gbroker.core.arrays`). :func:`check_job_id` is applied to every id a client or a peer
names *before* the id is used as a key, a path or a URL (``X.1%2F..%2F..%2Fmetrics`` was
forwarded as a path).

The checks are pure and raise :class:`~gbroker.errors.InvalidInput` naming the field.
"""

from __future__ import annotations

import re

from gbroker.errors import InvalidInput

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a client's start)
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Final

__all__ = [
    "JOB_ID",
    "MAX_JOB_ID_CHARS",
    "MAX_SITE_NAME_CHARS",
    "SITE_NAME",
    "check_job_id",
    "check_site_name",
    "count",
    "job_owner",
]

MAX_SITE_NAME_CHARS: Final = 64
MAX_JOB_SERIAL_DIGITS: Final = 32
MAX_ELEMENT_DIGITS: Final = 6
MAX_JOB_ID_CHARS: Final = MAX_SITE_NAME_CHARS + 1 + MAX_JOB_SERIAL_DIGITS + 1 + MAX_ELEMENT_DIGITS

SITE_NAME: Final = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_SITE_NAME_CHARS - 1}}}")
"""A site name: a letter or digit, then letters, digits, ``-`` or ``_``; at most 64 characters."""

JOB_ID: Final = re.compile(
    rf"(?P<site>{SITE_NAME.pattern})\.(?P<serial>[0-9]{{1,{MAX_JOB_SERIAL_DIGITS}}})"
    rf"(?:_(?P<element>[1-9][0-9]{{0,{MAX_ELEMENT_DIGITS - 1}}}))?"
)
"""A job id: its owner's site name, a dot, and 1 to 32 digits; an array element's adds an
underscore and its index (1 to 6 digits, no leading zero)."""

_SITE_EXPECTED: Final = (
    f"a site name: letters, digits, '-' or '_', starting with a letter or digit, at most "
    f"{MAX_SITE_NAME_CHARS} characters"
)
_JOB_EXPECTED: Final = (
    f"a job id <site>.<digits> (a site name, a dot, 1 to {MAX_JOB_SERIAL_DIGITS} digits), or an "
    "array element's <site>.<digits>_<index>"
)


def check_site_name(
    text: object, *, field: str = "site", known: Collection[str] | None = None
) -> str:
    """``text`` if it is a well-formed site name (and one of ``known``, when given)."""
    # fullmatch on a str only: re accepts no other type, and "\n" must not end a match.
    if not isinstance(text, str) or SITE_NAME.fullmatch(text) is None:
        raise InvalidInput(field, _SITE_EXPECTED, text)
    if known is not None and text not in known:
        raise InvalidInput(field, "a site of the topology", text)
    return text


def check_job_id(
    text: object, *, field: str = "id", known_sites: Collection[str] | None = None
) -> str:
    """``text`` if it is a well-formed job id (owned by one of ``known_sites``, when given).

    Use it on every id from a URL or a message before looking it up, forwarding it or making a
    path of it.
    """
    if not isinstance(text, str) or JOB_ID.fullmatch(text) is None:
        raise InvalidInput(field, _JOB_EXPECTED, text)
    if known_sites is not None and job_owner(text) not in known_sites:
        raise InvalidInput(field, "a job id whose owner is a site of the topology", text)
    return text


def job_owner(job_id: str) -> str:
    """The site that owns ``job_id`` (checked with :func:`check_job_id` first)."""
    return job_id.rsplit(".", 1)[0]


def count(n: int, noun: str) -> str:
    """``1 core``, ``2 cores``: a number and its noun, singular for one (messages, headers)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
