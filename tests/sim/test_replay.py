from __future__ import annotations

import math

import pytest

from gbroker.core.localsched import QueuePolicy
from gbroker.core.sdpolicy import SdPolicy
from gbroker.errors import InvalidInput
from gbroker.sim.replay import choose_malleable, replay
from gbroker.workloads.trace import TraceJob


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


# -- SD-Policy --------------------------------------------------------------------------------

# 16 cores. M1 (8 cores, asks 300 s, runs 50) and M2 (8, asks and runs 1000) start at 0; J asks
# all 16 for 100 s and would wait for M2 until 1000. It starts at once on 4 cores from each
# (half speed). M1, at half speed, ends at 100 (50 s of work); J takes its share back.
SHARED = [TraceJob(0, 8, 50, 300), TraceJob(0, 8, 1000, 1000), TraceJob(0, 16, 100, 100)]


@pytest.mark.parametrize(
    ("model", "ends", "used"),
    [
        # Ideal: J on 12 of 16 (0.75) has 50 s of work left at 100: it ends at 166.67. M2 did
        # 83.33 s by then at half speed, then 916.67 at full speed: 1083.33. The work is
        # conserved: 400 + 8000 + 1600 core-seconds.
        ("ideal", [100.0, 1000.0 + 250.0 / 3, 100.0 + 200.0 / 3], 10_000.0),
        # Worst case: J's share on M2 is still half: it ends at 200, M2 at 1100. J held 12
        # cores for 100 s at the speed of 8: 400 core-seconds wasted.
        ("worst", [100.0, 1100.0, 200.0], 10_400.0),
    ],
)
def test_a_malleable_job_starts_on_its_mates_cores_and_runs_by_the_runtime_model(
    model: str, ends: list[float], used: float
) -> None:
    policy = SdPolicy(10.0, runtime_model=model)  # type: ignore[arg-type]
    result = replay(SHARED, 16, "easy", sd_policy=policy, malleable=[True, True, True])
    assert result.start == [0.0, 0.0, 0.0]
    assert result.end == pytest.approx(ends)
    assert (result.shared, result.resizes) == (1, 4)  # 2 mates shrink, J grows, M2 grows back
    assert result.summary.utilization == pytest.approx(used / (16 * max(ends)))
    static = replay(SHARED, 16, "easy")
    assert static.start == [0.0, 0.0, 1000.0]  # J waits for M2 under static EASY


def test_with_no_malleable_job_sd_policy_is_static_easy() -> None:
    jobs = [(t * 7.0, 1 + t % 5, 30.0 + t % 11 * 13, 60.0 + t % 7 * 20) for t in range(300)]
    static = replay(jobs, 8, "easy")
    for flags in (None, [False] * 300):
        sd = replay(jobs, 8, "easy", sd_policy=SdPolicy(math.inf), malleable=flags)
        assert (sd.start, sd.end, sd.shared) == (static.start, static.end, 0)


def test_which_jobs_are_malleable_is_seeded_and_single_cores_never_are() -> None:
    jobs = [TraceJob(0, 1 + k % 3, 10) for k in range(1000)]
    flags = choose_malleable(jobs, 0.5, 7)
    assert flags == choose_malleable(jobs, 0.5, 7)
    assert flags != choose_malleable(jobs, 0.5, 8)
    assert not any(f for f, j in zip(flags, jobs, strict=True) if j.processors == 1)
    assert 0.4 < sum(flags) / sum(j.processors > 1 for j in jobs) < 0.6
    assert not any(choose_malleable(jobs, 0.0, 7))
    with pytest.raises(InvalidInput, match="malleable_fraction"):
        choose_malleable(jobs, 1.5, 7)
    with pytest.raises(InvalidInput, match="one flag per job"):
        replay(jobs, 4, "easy", malleable=[True])
