from __future__ import annotations

import pytest

from gbroker.core.localsched import QueuePolicy
from gbroker.errors import InvalidInput
from gbroker.sim.replay import TraceJob, replay


def test_known_schedule_and_summary() -> None:
    # 4 cores. j0 takes all 4 for 100 s; j1 (2 cores, asks 300) heads the queue; j2 (2 cores, asks
    # 50) can backfill past j1 under EASY only if it ends before j1's shadow time (100).
    jobs = [(0, 4, 100, 100), (10, 2, 200, 300), (20, 2, 40, 50)]
    easy = replay(jobs, 4, "easy")
    fcfs = replay(jobs, 4, "fcfs")
    # Nothing fits before 100: j1 and j2 both start at 100 under either policy.
    assert easy.start == [0, 100, 100]
    assert fcfs.start == [0, 100, 100]
    assert easy.end == [100, 300, 140]
    s = easy.summary
    assert s.jobs == 3
    assert s.avg_wait == pytest.approx((0 + 90 + 80) / 3)
    # bounded slowdown: j0 1; j1 (90 + 200) / 200; j2 (80 + 40) / 40
    assert s.avg_bounded_slowdown == pytest.approx((1 + 290 / 200 + 120 / 40) / 3)
    assert s.makespan == 300
    assert s.utilization == pytest.approx((400 + 400 + 80) / (4 * 300))
    assert s.throughput == pytest.approx(3 / 300)


def test_easy_backfills_where_fcfs_waits() -> None:
    jobs = [(0, 3, 100, 100), (1, 4, 10, 10), (2, 1, 30, 50)]
    assert replay(jobs, 4, "easy").start == [0, 100, 2]
    assert replay(jobs, 4, "fcfs").start == [0, 100, 110]


def test_underestimated_job_keeps_its_cores_until_it_really_ends() -> None:
    # j0 asks 10 s but runs 100 s: j1 must wait for the real end, not the planned one.
    jobs = [TraceJob(0, 4, 100, 10), TraceJob(0, 4, 5, 5)]
    result = replay(jobs, 4, QueuePolicy.EASY)
    assert result.start == [0, 100]


def test_simultaneous_completion_and_arrival_are_seen_together() -> None:
    # At t=50 j0 ends and j2 arrives: the pass sees both, and the queue order decides.
    jobs = [(0, 4, 50, 50), (10, 3, 10, 10), (50, 2, 10, 10)]
    assert replay(jobs, 4, "easy").start == [0, 50, 60]


def test_unsorted_input_is_replayed_in_arrival_order() -> None:
    jobs = [TraceJob(30, 1, 5, 5, "late"), TraceJob(0, 1, 5, 5, "early")]
    result = replay(jobs, 1, "fcfs")
    assert result.start == [30, 0]
    assert [o.job.id for o in result.outcomes()] == ["late", "early"]


def test_zero_length_jobs_and_empty_workloads() -> None:
    assert replay([(0, 1, 0, 0), (0, 1, 0, 0)], 1, "fcfs").end == [0, 0]
    empty = replay([], 8)
    assert empty.summary.jobs == 0
    assert empty.start == []


def test_progress_is_reported() -> None:
    seen: list[int] = []
    replay([(t, 1, 1, 1) for t in range(10)], 2, progress=seen.append, progress_every=4)
    assert seen == [4, 8, 10]


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ((0, 9, 1, 1), "processors"),
        ((-1, 1, 1, 1), "submit"),
        ((0, 0, 1, 1), "processors"),
        ((0, 1, -5, 1), "run_time"),
        ((0, 1, 5, -1), "requested_time"),
    ],
)
def test_bad_jobs_are_rejected_with_the_field(
    job: tuple[float, int, float, float], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        replay([job], 8)
