"""The owner's intake of keyed submissions: a repeat of an ``Idempotency-Key`` answers the first
job (see :mod:`gbroker.protocol.idempotency` for the protocol); keys older than the retention
window are forgotten, and purged from the journal at most once a minute."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gbroker.errors import InternalError, InvalidInput
from gbroker.protocol.idempotency import HEADER, IdempotencyKey, KeyReused, fingerprint

if TYPE_CHECKING:
    from gbroker.daemon.driver import Driver
    from gbroker.jobs.description import JobDescription

__all__ = ["DEFAULT_WINDOW", "PURGE_EVERY", "Submissions"]

DEFAULT_WINDOW = 24 * 3600.0
"""Seconds a key is remembered (``gbroker serve --idempotency-window``)."""
PURGE_EVERY = 60.0


class Submissions:
    """The owner's intake of keyed submissions (the client API's POST /api/v1/jobs)."""

    def __init__(self, driver: Driver, window: float = DEFAULT_WINDOW) -> None:
        if window <= 0:
            raise InvalidInput("idempotency window", "a positive number of seconds", window)
        self.driver = driver
        self.window = window
        self._purged_at = float("-inf")

    async def submit(
        self, desc: JobDescription, submitter: str, key: str, body: bytes
    ) -> tuple[str, bool]:
        """Take the job unless ``submitter`` sent ``key`` before; returns the job id holding
        the key and whether this was a repeat. Raises :class:`KeyReused` for a repeat with
        another body."""
        now = time.time()
        self._maybe_purge(now)
        keyed = IdempotencyKey(key, fingerprint(body), now - self.window)
        job_id = await self.driver.submit(desc, submitter, keyed)
        if job_id is not None:
            return job_id, False
        earlier = await self.driver.journal.idempotent(submitter, key, keyed.not_before)
        if earlier is None:  # the journal refused the job without holding the key
            raise InternalError(f"submission with {HEADER} {key[:60]!r} neither taken nor known")
        earlier_id, earlier_fingerprint = earlier
        if earlier_fingerprint != keyed.fingerprint:
            raise KeyReused(key, earlier_id)
        return earlier_id, True

    def _maybe_purge(self, now: float) -> None:
        if now - self._purged_at < PURGE_EVERY:
            return
        self._purged_at = now
        self.driver.tasks.spawn(self.purge(now), "idempotency-purge")

    async def purge(self, now: float | None = None) -> None:
        """Forget the keys older than the window."""
        now = time.time() if now is None else now
        await self.driver.journal.forget_keys(now - self.window)
