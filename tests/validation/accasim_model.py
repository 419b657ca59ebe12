"""AccaSim 1.1.3's ``EASYBackfilling`` rules, written on our local scheduler, for validation only.

AccaSim's EASY (accasim/base/scheduler_class.py:376-601, FirstFit, one-core units) is not the
textbook EASY that GBroker implements. Three rules differ:

1. The reservation is never enforced: backfill candidates are allocated with
   ``reserved_nodes=[]`` (lines 497-501), so any later job that fits in the free cores starts now,
   with no "ends before the shadow time" or "extra cores" test.
2. Before its reservation time the blocked head is not tried at all (lines 483-488), even when
   enough cores have come free early.
3. Once computed, the reservation time is not recomputed while the same head stays blocked
   (lines 470-475); after it passes, the head is tried first at every instant.

One rule of its event loop differs too, under FIFO as well as EASY:

4. The dispatcher runs once per time point (accasim/base/simulator_class.py:542-566). A job of
   run time 0 that starts at a time point frees its cores after that round
   (event_class.py:472-474, 592-593), and nothing is dispatched again until the next time point.
   Our driver ends such a job at the same instant and schedules again at once.

This model exists so a test can show that, with these rules, our driver and data path reproduce
AccaSim's published KTH-SP2 figures; the remaining gap between our EASY and AccaSim's is then
entirely these rules. It is not a policy we offer.
"""

from __future__ import annotations

from gbroker.core.localsched import LocalScheduler, SchedulerCommand
from gbroker.core.model import Job
from gbroker.errors import InternalError


class AccaSimFifo(LocalScheduler):
    """Our FCFS with rule 4: at most one dispatching round per instant."""

    __slots__ = ("_last_round",)

    def __init__(self, total_cores: int, policy: object = "fcfs") -> None:
        super().__init__(total_cores, str(policy))
        self._last_round = float("-inf")

    def schedule(self, now: float) -> list[SchedulerCommand]:
        # Our driver asks again at the same instant only after a zero-length job ended (rule 4).
        if now == self._last_round:
            return []
        self._last_round = now
        return self._round(now)

    def _round(self, now: float) -> list[SchedulerCommand]:
        return super().schedule(now)


class AccaSimEasy(AccaSimFifo):
    """AccaSim's EASYBackfilling: rules 1-4."""

    __slots__ = ("_blocked", "_reserved_at")

    def __init__(self, total_cores: int, policy: object = "easy") -> None:
        super().__init__(total_cores, "easy")
        self._blocked: str | None = None
        self._reserved_at: float | None = None

    def _take(self, job: Job, now: float, out: list[SchedulerCommand]) -> None:
        self._queue.remove(job)
        out.append(self._start(job, job.rank, now))

    def _round(self, now: float) -> list[SchedulerCommand]:
        started: list[SchedulerCommand] = []
        queue = list(self._queue)
        time_reached = self._reserved_at is not None and self._reserved_at <= now
        if time_reached:
            head = queue.pop(0)
            if head.rank <= self.free_cores:
                self._take(head, now, started)
                self._blocked = self._reserved_at = None
        if self._blocked is None and queue:
            fill: list[Job] = []
            for i, job in enumerate(queue):
                if job.rank <= self.free_cores:
                    self._take(job, now, started)
                    continue
                self._blocked = job.id
                if self._reserved_at is None:
                    self._reserved_at = self._shadow(job.rank)
                fill = queue[i + 1 :]
                break
        else:
            fill = queue if time_reached else queue[1:]
        for job in fill:  # rule 1: no reservation check at all
            if job.rank <= self.free_cores:
                self._take(job, now, started)
        return started

    def _shadow(self, need: int) -> float:
        available = self.free_cores
        for planned_end, _seq, alloc in self._by_end:
            available += alloc.cores
            if available >= need:
                return planned_end
        raise InternalError("no slot")
