"""A discrete-event kernel: a heap of (time, priority, sequence, action, payload).

Theory of operation (after SimPy's ``core.py``). ``at`` schedules ``action(payload)`` at a virtual
time; ``step`` pops the earliest entry, advances ``now`` to it and runs it; ``run`` steps until the
heap is empty or the next entry lies beyond ``until``. Lower ``priority`` runs first among entries
of the same time, and the sequence number (insertion order) breaks the remaining ties, so a run is
fully determined by its inputs. ``defer`` queues an action for the end of the current instant,
after every entry of that time (including those the instant's actions add): drivers use it to
decide once per instant, having seen all of the instant's changes, without heap traffic.
Randomness is never drawn here: models that need it receive a seeded ``random.Random`` from
whoever builds them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, TypeVar

from gbroker.errors import InvalidInput

__all__ = ["Kernel"]

Action = Callable[[Any], None]
P = TypeVar("P")


class Kernel:
    """The virtual clock and its agenda."""

    __slots__ = ("_deferred", "_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Action, Any]] = []
        self._deferred: list[Callable[[], None]] = []
        self._seq = 0

    def at(self, time: float, action: Callable[[P], None], payload: P, priority: int = 0) -> None:
        """Run ``action(payload)`` at virtual ``time`` (not earlier than now)."""
        if time < self.now:
            raise InvalidInput("time", f"a time >= now ({self.now})", time)
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, action, payload))

    def after(
        self, delay: float, action: Callable[[P], None], payload: P, priority: int = 0
    ) -> None:
        """Run ``action(payload)`` ``delay`` seconds from now."""
        self.at(self.now + delay, action, payload, priority)

    def defer(self, action: Callable[[], None]) -> None:
        """Run ``action()`` once the current instant has no entry left (before time moves on)."""
        self._deferred.append(action)

    def peek(self) -> float:
        """Time of the next entry, or +inf when nothing is scheduled."""
        return self._heap[0][0] if self._heap else float("inf")

    def __len__(self) -> int:
        return len(self._heap) + len(self._deferred)

    def _instant_over(self) -> bool:
        return bool(self._deferred) and (not self._heap or self._heap[0][0] > self.now)

    def _run_deferred(self) -> None:
        actions = self._deferred[:]
        self._deferred.clear()
        for action in actions:
            action()

    def step(self) -> None:
        """Run the next entry, or the deferred actions if the instant is over.

        Raises IndexError when nothing is scheduled.
        """
        if self._instant_over():
            self._run_deferred()
            return
        time, _prio, _seq, action, payload = heapq.heappop(self._heap)
        self.now = time
        action(payload)

    def run(self, until: float | None = None) -> None:
        """Step until the agenda is empty, or until the next entry lies after ``until``."""
        heap = self._heap
        deferred = self._deferred
        pop = heapq.heappop
        limit = float("inf") if until is None else until
        while True:
            if deferred and (not heap or heap[0][0] > self.now):
                self._run_deferred()
                continue
            if not heap or heap[0][0] > limit:
                break
            time, _prio, _seq, action, payload = pop(heap)
            self.now = time
            action(payload)
        if until is not None and until > self.now:
            self.now = until
