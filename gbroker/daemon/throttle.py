"""Wrong client tokens, slowed per client address (fail2ban's ``maxretry``/``findtime``, nginx's
``limit_req`` delay, in one broker's memory).

Theory of operation. The guard (:mod:`gbroker.daemon.guard`) tells :class:`FailedTokens` of each
wrong client token it is shown (``Authorization: Bearer`` with a token no user holds, or the
dashboard's sign-in posted one), by the address the request came from. An address's first
:data:`FREE_FAILURES` failures are answered at once, as any 401; each one after that is answered
only after a delay that doubles from :data:`FIRST_DELAY` up to :data:`MAX_DELAY` seconds. The
wait is an ``asyncio.sleep`` of that one request: the event loop, the other clients and the
peers go on meanwhile. A client that waits for its answers (every CLI, script and browser does)
so guesses at most one token per :data:`MAX_DELAY` seconds, where it could try hundreds a second.

What it does not do, and why:

- A right token from a slowed address is served at once: the address may be shared (every user
  of the broker's own host is ``127.0.0.1``), and one user's mistakes, or an attacker's, must
  not slow the others. It does not clear the address's record either: a user holding a token
  could otherwise reset their count between guesses at an admin's.
- Peers (signed requests, :mod:`gbroker.security.auth`) are never counted nor slowed: a
  forged or replayed signature gets its 401 at once, and nothing of a guess's answer is learned
  from a signature (the HMAC's key never leaves the brokers).
- A client that does not wait for its answers could fire guesses in parallel. So an address may
  have at most :data:`MAX_HELD` answers held at once; past that its further requests get a 429
  (with ``Retry-After``) before their token is even looked at, a right one too, until its held
  answers have gone out. Only an address that floods meets that.

Memory is bounded: the records live in a :class:`cachetools.TTLCache` of at most
:data:`MAX_ADDRESSES` addresses (the least recently failed one gives way to a new one), and a
record is forgotten :data:`WINDOW` seconds after its address's last failure. An address that
stops guessing for that long starts afresh. Addresses are the TCP peer's (``request.remote``):
a reverse proxy in front of brokers would make them one address.

The tokens themselves are what keeps a guesser out (192 random bits when generated, at least 16
characters when an operator writes them); this only keeps a broker from answering guesses at the
rate it answers requests, and makes a guesser visible in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

__all__ = [
    "FIRST_DELAY",
    "FREE_FAILURES",
    "MAX_ADDRESSES",
    "MAX_DELAY",
    "MAX_HELD",
    "WINDOW",
    "FailedTokens",
]

log = logging.getLogger("gbroker.daemon")

FREE_FAILURES = 10
"""Wrong tokens an address may present (within :data:`WINDOW` of each other) without a delay."""
WINDOW = 60.0
"""Seconds after its last failure that an address's record is forgotten."""
FIRST_DELAY = 0.25
"""Seconds the first slowed answer waits; each further one waits twice the one before."""
MAX_DELAY = 4.0
"""The longest an answer waits."""
MAX_ADDRESSES = 10_000
"""Addresses remembered at once (the oldest gives way)."""
MAX_HELD = 32
"""Answers of one address held at once; past that, a 429 before the token is looked at."""


@dataclass(slots=True)
class _Record:
    failures: int = 0
    held: int = 0


class FailedTokens:
    """The wrong tokens of each client address, and how long its next answer waits."""

    def __init__(
        self,
        *,
        free: int = FREE_FAILURES,
        window: float = WINDOW,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        max_addresses: int = MAX_ADDRESSES,
        max_held: int = MAX_HELD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.max_held = max_held
        self._records: TTLCache[str, _Record] = TTLCache(
            maxsize=max_addresses, ttl=window, timer=clock
        )

    def __len__(self) -> int:
        return len(self._records)

    def failures(self, address: str) -> int:
        """The wrong tokens ``address`` presented that are still remembered."""
        record = self._records.get(address)
        return 0 if record is None else record.failures

    def crowded(self, address: str) -> bool:
        """Whether ``address`` has :data:`MAX_HELD` answers held: refuse it before looking."""
        record = self._records.get(address)
        return record is not None and record.held >= self.max_held

    def delay(self, failures: int) -> float:
        """Seconds the answer to an address's ``failures``-th wrong token waits."""
        beyond = failures - self.free
        if beyond <= 0:
            return 0.0
        return min(self.max_delay, self.first_delay * 2.0 ** min(beyond - 1, 32))

    def fail(self, address: str) -> float:
        """Count a wrong token of ``address``; the seconds its answer is to wait."""
        record = self._records.pop(address, None) or _Record()
        record.failures += 1
        self._records[address] = record  # (re)inserted: forgotten a window after the last
        if record.failures == self.free + 1:
            log.warning(
                "%s presented %d wrong client tokens: its further 401s are slowed (up to %g s)",
                address,
                record.failures,
                self.max_delay,
            )
        return self.delay(record.failures)

    async def failed(self, address: str) -> float:
        """Count a wrong token of ``address`` and wait as long as its answer is to wait (other
        requests are served meanwhile); the seconds waited."""
        seconds = self.fail(address)
        if seconds <= 0:
            return 0.0
        record = self._records[address]
        record.held += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            record.held -= 1
        return seconds
