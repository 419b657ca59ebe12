"""Idempotent submission: the ``Idempotency-Key`` request header (IETF httpapi draft).

Theory of operation. A client that is not told whether its submission was taken (the connection
reset, a 5xx, a timeout) cannot know whether to send it again: a second POST would make a second
job. So every logical submission carries a fresh key (``gbroker.client.gclient`` sends a uuid4), and
a retry sends the *same* key. The owner keeps, for each submitter, ``(submitter, key) -> job id`` in
the journal **in the same transaction as the job row** (:meth:`Journal.submit` with a
:class:`IdempotencyKey`), so a SIGKILL can never keep one without the other. A repeat of a key
answers the first job's id (200, the 201's body, ``Idempotent-Replayed: true``), also when it
arrives while the first is being committed: the journal's single writer checks and inserts the key
in one step, so of concurrent requests with one key exactly one makes a job. A key reused with a
different request body (by its SHA-256 fingerprint) is refused with 422.

Keys are scoped to the submitter (two users may pick the same key), validated where they enter
(:func:`parse_key`: at most 255 printable ASCII characters; the draft's quoted sf-string or a bare
value), and remembered for a retention window (``serve --idempotency-window``, default 24 h): an
older key is treated as new, and :meth:`gbroker.daemon.submissions.Submissions.purge` deletes them
from the journal, at most once a minute as submissions arrive.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import http_sf

from gbroker.errors import GBrokerError, InvalidInput

__all__ = [
    "HEADER",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "IdempotencyKey",
    "KeyReused",
    "fingerprint",
    "header_value",
    "parse_key",
]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255


class KeyReused(GBrokerError):
    """The key was used before for a different request body (answered 422)."""

    def __init__(self, key: str, job_id: str) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(
            f"{HEADER}: {key[:60]!r} was already used for another job description (job {job_id});"
            " send a fresh key for a new submission"
        )


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A submission's key, its body's fingerprint, and since when keys still count."""

    key: str
    fingerprint: str
    not_before: float
    """Keys journaled before this time are forgotten (the retention window's start)."""


def parse_key(value: str) -> str:
    """The key in an ``Idempotency-Key`` header value: the draft's sf-string (``"..."``), else
    the value as sent. Raises :class:`InvalidInput` naming the header unless it is 1 to 255
    printable ASCII characters."""
    key = value
    if value.startswith('"'):
        try:
            parsed = http_sf.parse(value.encode("ascii", "replace"), tltype="item")
        except ValueError:
            raise InvalidInput(HEADER, "a quoted string (sf-string) or a bare key", value) from None
        item = parsed[0] if isinstance(parsed, tuple) else None
        if not isinstance(item, str):
            raise InvalidInput(HEADER, "a string", value)
        key = item
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidInput(HEADER, f"1 to {MAX_KEY_LENGTH} printable ASCII characters", value)
    return key


def header_value(key: str) -> str:
    """``key`` as the draft sends it: a structured-field string."""
    return str(http_sf.ser(key))


def fingerprint(body: bytes) -> str:
    """The SHA-256 of a submission's body: a repeat with another body reuses its key."""
    return hashlib.sha256(body).hexdigest()
