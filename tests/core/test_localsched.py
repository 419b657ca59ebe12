"""The local scheduler: hand-built schedules with known answers, and an independent reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.localsched import LocalScheduler, QueuePolicy, SchedulerCommand, StartJob
from gbroker.core.model import Job, JobClass
from gbroker.errors import InvalidInput
from gbroker.sim.replay import replay


def started(sched: LocalScheduler, now: float) -> dict[str, int]:
    return {cmd.job.id: cmd.cores for cmd in sched.schedule(now) if isinstance(cmd, StartJob)}


def test_easy_backfills_a_short_job_past_a_blocked_head() -> None:
    for policy, expect_c in ((QueuePolicy.EASY, {"C": 2}), (QueuePolicy.FCFS, {})):
        s = LocalScheduler(10, policy)
        s.submit(Job("A", 8, 100.0))
        assert started(s, 0) == {"A": 8}
        s.submit(Job("B", 5, 100.0))  # head, blocked until A ends at 100
        assert started(s, 1) == {}
        s.submit(Job("C", 2, 50.0))  # fits now and ends (52) before B's shadow time (100)
        assert started(s, 2) == expect_c
        if policy is QueuePolicy.EASY:
            assert s.reservation is not None
            assert (s.reservation.job_id, s.reservation.shadow_time) == ("B", 100.0)


def test_easy_never_delays_the_heads_reservation() -> None:
    s = LocalScheduler(10, QueuePolicy.EASY)
    s.submit(Job("A", 6, 100.0))
    assert started(s, 0) == {"A": 6}
    s.submit(Job("B", 8, 100.0))  # blocked head: shadow 100, extra 10 - 8 = 2
    s.submit(Job("C", 3, 500.0))  # fits now, but runs past 100 and needs more than the 2 extra
    s.submit(Job("D", 2, 500.0))  # runs past 100 but fits in the extra cores
    s.submit(Job("E", 1, 500.0))  # the extra cores are used up by D
    assert started(s, 1) == {"D": 2}
    assert s.reservation is not None
    assert (s.reservation.shadow_time, s.reservation.extra_cores) == (100.0, 0)  # D took both
    s.finish("A")
    assert started(s, 100) == {"B": 8}  # on time: nothing took its cores


def test_every_job_ending_at_the_shadow_time_counts_towards_the_extra_cores() -> None:
    s = LocalScheduler(8, QueuePolicy.EASY)
    s.submit(Job("A", 2, 100.0))  # started first: the head fits once A's cores are back...
    s.submit(Job("B", 1, 100.0))  # ...but B ends at the same instant, so its core is extra
    assert started(s, 0) == {"A": 2, "B": 1}
    s.submit(Job("H", 7, 10.0))  # blocked head: 5 free, 8 at 100, so 1 extra core
    s.submit(Job("X", 1, 500.0))  # runs past 100 but fits in that extra core
    assert started(s, 1) == {"X": 1}
    assert s.reservation is not None
    assert (s.reservation.shadow_time, s.reservation.extra_cores) == (100.0, 0)


def test_fcfs_never_lets_a_later_job_overtake() -> None:
    s = LocalScheduler(4, QueuePolicy.FCFS)
    s.submit(Job("big", 4, 10.0))
    s.submit(Job("small", 1, 1.0))
    assert started(s, 0) == {"big": 4}
    s.submit(Job("head", 3, 10.0))
    s.submit(Job("tiny", 1, 1.0))
    assert started(s, 0) == {}
    s.finish("big")
    # small (1) and head (3) fill the machine; tiny waits although it arrived with cores in view
    assert started(s, 10) == {"small": 1, "head": 3}
    assert [j.id for j in s.queue] == ["tiny"]


def test_moldable_job_starts_with_the_largest_size_that_fits() -> None:
    s = LocalScheduler(8)
    s.submit(Job("r", 2, 10.0))
    s.submit(Job("m", 2, 60.0, JobClass.MOLDABLE, max_rank=16 // 2))
    assert started(s, 0) == {"r": 2, "m": 6}
    alloc = s.allocation("m")
    assert alloc is not None
    assert alloc.planned_end == pytest.approx(60.0 * 2 / 6)


def test_backfilled_moldable_job_is_shrunk_to_the_extra_cores() -> None:
    s = LocalScheduler(10)
    s.submit(Job("A", 7, 100.0))
    assert started(s, 0) == {"A": 7}
    s.submit(Job("B", 8, 10.0))  # shadow 100, extra 2
    s.submit(Job("M", 1, 1000.0, JobClass.MOLDABLE, max_rank=3))  # too long to end by 100
    assert started(s, 0) == {"M": 2}


def test_unknown_estimates_only_backfill_into_extra_cores() -> None:
    s = LocalScheduler(10)
    s.submit(Job("A", 9, 100.0))
    assert started(s, 0) == {"A": 9}
    s.submit(Job("B", 10, 10.0))  # shadow 100, extra 0
    s.submit(Job("U", 1, None))  # could end any time: may not take the head's cores
    assert started(s, 0) == {}


def test_state_cancel_and_errors() -> None:
    s = LocalScheduler(4)
    s.submit(Job("a", 4, 10.0))
    s.submit(Job("b", 2, 10.0))
    started(s, 0)
    assert s.state().total_cores == 4
    assert (s.state().free_cores, s.state().queued, s.state().running) == (0, 1, 1)
    with pytest.raises(InvalidInput, match="already"):
        s.submit(Job("b", 1))
    with pytest.raises(InvalidInput, match="already"):
        s.submit(Job("a", 1))
    with pytest.raises(InvalidInput, match="at most the site's 4 cores"):
        s.submit(Job("huge", 5))
    with pytest.raises(InvalidInput, match="running"):
        s.finish("b")
    assert s.cancel("nope") is None
    cancelled = s.cancel("b")
    assert cancelled is not None
    assert cancelled.id == "b"
    assert s.state().queued == 0
    s.submit(Job("b", 1))  # the id is free again
    with pytest.raises(InvalidInput, match="policy"):
        LocalScheduler(4, "lifo")


# -- an independent reference ------------------------------------------------------------------


def reference_schedule(
    jobs: list[tuple[int, int, int, int]], cores: int, easy: bool
) -> list[float]:
    """A deliberately naive FCFS/EASY, written from the textbook rule, for comparison.

    jobs: (submit, procs, run, requested). At each instant: end jobs, admit arrivals, then start
    the queue head while it fits; for EASY compute the shadow time by sorting the running jobs by
    planned end, and backfill in queue order.
    """
    start = [-1.0] * len(jobs)
    running: list[tuple[float, float, int, int]] = []  # (end, planned_end, procs, k)
    queue: list[int] = []
    pending = sorted(range(len(jobs)), key=lambda k: (jobs[k][0], k))
    while pending or queue or running:
        next_arrival = jobs[pending[0]][0] if pending else float("inf")
        next_end = min((r[0] for r in running), default=float("inf"))
        now = min(next_arrival, next_end)
        running = [r for r in running if r[0] > now]
        while pending and jobs[pending[0]][0] == now:
            queue.append(pending.pop(0))
        free = cores - sum(r[2] for r in running)
        while queue and jobs[queue[0]][1] <= free:
            k = queue.pop(0)
            start[k] = now
            running.append((now + jobs[k][2], now + jobs[k][3], jobs[k][1], k))
            free -= jobs[k][1]
        if easy and queue:
            need = jobs[queue[0]][1]
            shadow = extra = 0.0
            for planned in sorted({r[1] for r in running}):
                # Every job planned to end by then has freed its cores.
                avail = free + sum(r[2] for r in running if r[1] <= planned)
                if avail >= need:
                    shadow, extra = planned, avail - need
                    break
            for k in list(queue[1:]):
                procs = jobs[k][1]
                if procs > free:
                    continue
                if now + jobs[k][3] <= shadow:
                    pass
                elif procs <= extra:
                    extra -= procs
                else:
                    continue
                queue.remove(k)
                start[k] = now
                running.append((now + jobs[k][2], now + jobs[k][3], procs, k))
                free -= procs
    return start


workloads = st.lists(
    st.tuples(
        st.integers(0, 200),  # submit
        st.integers(1, 8),  # procs
        st.integers(0, 120),  # run
        st.integers(0, 60),  # requested - run (may be exceeded below)
        st.booleans(),  # underestimate: requested < run
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(workloads, st.booleans())
def test_matches_the_naive_reference(
    raw: list[tuple[int, int, int, int, bool]], easy: bool
) -> None:
    jobs = [(s, p, r, max(0, r - slack) if under else r + slack) for s, p, r, slack, under in raw]
    result = replay(jobs, 8, "easy" if easy else "fcfs")
    assert result.start == reference_schedule(jobs, 8, easy)


@settings(max_examples=100, deadline=None)
@given(workloads)
def test_invariants_with_exact_estimates(raw: list[tuple[int, int, int, int, bool]]) -> None:
    """Run == requested: no over-allocation, FCFS order kept, EASY keeps every reservation."""
    jobs = [(s, p, r, r) for s, p, r, _, _ in raw]
    cores = 8
    reservations: dict[str, float] = {}

    class Watching(LocalScheduler):
        __slots__ = ()

        def schedule(self, now: float) -> list[SchedulerCommand]:
            out = super().schedule(now)
            if self.reservation is not None:
                rid = self.reservation.job_id
                reservations[rid] = min(reservations.get(rid, 1e18), self.reservation.shadow_time)
            return out

    easy = replay(jobs, cores, "easy", scheduler_factory=Watching)
    fcfs = replay(jobs, cores, "fcfs")

    for result in (easy, fcfs):
        points = sorted({*result.start, *result.end})
        for t in points:
            used = sum(
                p
                for (_, p, _, _), b, e in zip(jobs, result.start, result.end, strict=True)
                if b <= t < e
            )
            assert used <= cores
    order = sorted(range(len(jobs)), key=lambda k: (jobs[k][0], k))
    fcfs_starts = [fcfs.start[k] for k in order]
    assert fcfs_starts == sorted(fcfs_starts)
    for job_id, shadow in reservations.items():
        assert easy.start[int(job_id)] <= shadow
