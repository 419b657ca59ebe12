"""The local scheduler with a malleability manager: PRA, PWA, the reserve, evolving requests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.localsched import LocalScheduler, ResizeJob, StartJob
from gbroker.core.malleable import (
    Malleability,
    MalleabilityPolicy,
    SizeKind,
    SizeRule,
)
from gbroker.core.model import Job, JobClass
from gbroker.errors import InternalError, InvalidInput


def malleable(
    job_id: str, lo: int, hi: int, time: float = 100.0, sizes: str = "any", **kw: object
) -> Job:
    declared = Malleability(sizes=SizeRule.parse(sizes), **kw)  # type: ignore[arg-type]
    return Job(job_id, lo, time, JobClass.MALLEABLE, hi, malleability=declared)


def rigid(job_id: str, cores: int, time: float = 100.0) -> Job:
    return Job(job_id, cores, time)


def site(
    cores: int, policy: str = "fpsma", precedence: str = "pra", reserve: int = 0
) -> LocalScheduler:
    mp = MalleabilityPolicy(policy, precedence, reserve)  # type: ignore[arg-type]
    return LocalScheduler(cores, "fcfs", mp)


def test_pra_grows_running_malleable_jobs_with_freed_cores_before_the_queue() -> None:
    s = site(16, reserve=2)
    m = malleable("m", 2, 16)
    s.submit(m)
    s.submit(rigid("r", 8))
    assert s.schedule(0.0) == [StartJob(m, 16)]  # a start takes what is free; r waits
    s.finish("m")
    assert s.schedule(10.0) == [StartJob(rigid("r", 8), 8)]
    m2 = malleable("m2", 2, 16)
    s.submit(m2)
    assert s.schedule(11.0) == [StartJob(m2, 8)]
    s.finish("r")  # 8 cores free: PRA grows m2 by what is beyond the reserve of 2
    assert s.schedule(20.0) == [ResizeJob("m2", 8, 14)]
    assert s.free_cores == 2
    alloc = s.allocation("m2")
    assert alloc is not None
    assert alloc.history == [(11.0, 8), (20.0, 14)]


def test_pwa_shrinks_running_malleable_jobs_so_the_waiting_head_starts_now() -> None:
    s = site(16, "fpsma", "pwa")
    early = malleable("early", 2, 16)
    s.submit(early)
    assert s.schedule(0.0) == [StartJob(early, 16)]
    s.submit(rigid("r", 6))
    assert s.schedule(1.0) == [ResizeJob("early", 16, 10), StartJob(rigid("r", 6), 6)]
    assert s.free_cores == 0
    # The planned end moved: 100 s on 2 cores end at 12.5 on 16; the 11.5 s left take 18.4 on 10.
    alloc = s.allocation("early")
    assert alloc is not None
    assert alloc.planned_end == pytest.approx(1.0 + 11.5 * 16 / 10)


def test_pwa_shrinks_only_when_minimums_allow_it_and_grows_instead() -> None:
    s = site(16, "egs", "pwa", reserve=1)
    s.submit(rigid("big", 10))
    assert s.schedule(0.0) == [StartJob(rigid("big", 10), 10)]
    m = malleable("m", 4, 16)
    s.submit(m)
    assert s.schedule(1.0) == [StartJob(m, 6)]
    s.submit(rigid("huge", 12))  # needs 12: m can give 2 (6 -> 4), not enough
    assert s.schedule(2.0) == []  # and nothing is free beyond the reserve to grow with
    s.finish("big")  # 10 free: m gives 2, huge starts
    assert s.schedule(3.0) == [ResizeJob("m", 6, 4), StartJob(rigid("huge", 12), 12)]
    s.finish("huge")
    assert s.schedule(4.0) == [ResizeJob("m", 4, 15)]  # empty queue: grow, keep the reserve
    g = site(16, "fpsma", "pwa", reserve=1)
    g.submit(rigid("a", 8))
    g2 = malleable("g", 4, 16)
    g.submit(g2)
    assert g.schedule(0.0) == [StartJob(rigid("a", 8), 8), StartJob(g2, 8)]
    g.submit(rigid("wide", 14))
    g.finish("a")  # 8 free; wide needs 6 more, g can give only 4: g grows instead
    assert g.schedule(1.0) == [ResizeJob("g", 8, 15)]


def test_the_reserve_is_never_handed_to_growth_and_must_leave_a_core() -> None:
    s = site(8, reserve=3)
    s.submit(malleable("m", 1, 8))
    assert s.schedule(0.0) == [StartJob(malleable("m", 1, 8), 8)]  # a start may use all
    s.finish("m")
    s.submit(rigid("r", 4))
    s.submit(malleable("m2", 1, 8))
    assert s.schedule(1.0) == [StartJob(rigid("r", 4), 4), StartJob(malleable("m2", 1, 8), 4)]
    s.finish("r")
    assert s.schedule(2.0) == [ResizeJob("m2", 4, 5)]  # 4 free, 3 reserved
    with pytest.raises(InvalidInput, match="reserve"):
        site(4, reserve=4)


def test_a_job_starts_and_grows_only_to_sizes_it_accepts() -> None:
    s = site(16, "fpsma", "pra")
    s.submit(rigid("r", 5))
    s.submit(malleable("ft", 2, 32, sizes="power2"))
    assert s.schedule(0.0) == [
        StartJob(rigid("r", 5), 5),
        StartJob(malleable("ft", 2, 32, sizes="power2"), 8),  # 11 free: 8
    ]
    s.finish("r")  # 8 free: 8 + 8 = 16
    assert s.schedule(1.0) == [ResizeJob("ft", 8, 16)]


def test_application_initiative_keeps_the_scheduler_s_hands_off() -> None:
    s = site(16, "fpsma", "pra")
    s.submit(malleable("app", 2, 16, initiative="application"))
    [start] = s.schedule(0.0)
    assert isinstance(start, StartJob)
    assert start.cores == 16
    s2 = site(16, "fpsma", "pwa")
    s2.submit(malleable("app", 2, 16, initiative="application"))
    s2.schedule(0.0)
    s2.submit(rigid("r", 4))
    assert s2.schedule(1.0) == []  # PWA may not shrink it: r waits


def test_an_evolving_job_s_requests_shrink_freely_and_grow_up_to_the_free_cores() -> None:
    s = LocalScheduler(16, "fcfs")  # no malleability manager: requests still work
    s.submit(malleable("e", 2, 16, evolving=True, initiative="application"))
    s.submit(rigid("r", 4))
    assert [c.cores for c in s.schedule(0.0) if isinstance(c, StartJob)] == [16]
    assert s.request("e", 8, 5.0) == ResizeJob("e", 16, 8)
    assert s.schedule(5.0) == [StartJob(rigid("r", 4), 4)]
    assert s.request("e", 20, 6.0) == ResizeJob("e", 8, 12)  # clipped: 4 free, max 16
    assert s.request("e", 1, 7.0) == ResizeJob("e", 12, 2)  # not below its rank
    assert s.request("e", 2, 8.0) is None
    with pytest.raises(InvalidInput, match="malleable"):
        s.request("r", 2, 9.0)
    with pytest.raises(InvalidInput, match="running"):
        s.request("nope", 2, 9.0)


def test_a_reconfiguration_costs_its_declared_time_on_the_planned_end() -> None:
    s = site(8, "fpsma", "pra")
    s.submit(rigid("r", 4, 10.0))
    s.submit(malleable("m", 2, 8, time=100.0, reconfiguration_cost=5.0))
    s.schedule(0.0)
    alloc = s.allocation("m")
    assert alloc is not None
    assert (alloc.cores, alloc.planned_end) == (4, 50.0)  # 100 s on 2 cores = 50 on 4
    s.finish("r")
    assert s.schedule(10.0) == [ResizeJob("m", 4, 8)]
    assert alloc.planned_end == pytest.approx(10.0 + 40.0 * 4 / 8 + 5.0)


# -- properties -------------------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    k = draw(st.integers(0, 10_000))
    if draw(st.booleans()):
        return rigid(f"r{k}", draw(st.integers(1, 8)), draw(st.floats(1, 100)))
    lo = draw(st.integers(1, 8))
    hi = draw(st.integers(lo, 24))
    sizes = draw(st.sampled_from(["any", "power2", "multiple:2", "2,3,5,8,13"]))
    rule = SizeRule.parse(sizes)
    if rule.kind is not SizeKind.ANY and rule.smallest(lo, hi) is None:
        sizes = "any"
    return malleable(f"m{k}", lo, hi, draw(st.floats(1, 100)), sizes=sizes)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["fpsma", "egs"]),
    st.sampled_from(["pra", "pwa"]),
    st.integers(0, 4),
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "finish", "request", "took"]), jobs(), st.integers(1, 30)
        ),
        max_size=40,
    ),
)
def test_no_allocation_exceeds_the_site_nor_leaves_a_job_s_bounds(
    policy: str, precedence: str, reserve: int, steps: list[tuple[str, Job, int]]
) -> None:
    total = 24
    s = site(total, policy, precedence, reserve)
    now = 0.0
    seen: set[str] = set()
    for action, job, n in steps:
        now += 1.0
        running = [a.job.id for a in s.running]
        if action == "submit" and job.id not in seen:
            seen.add(job.id)
            s.submit(job)
        elif action == "finish" and running:
            s.finish(running[n % len(running)])
        elif action in ("request", "took") and running:
            target = s.allocation(running[n % len(running)])
            assert target is not None
            if target.job.job_class is JobClass.MALLEABLE:
                before = target.cores
                change = getattr(s, action)(target.job.id, n, now)
                if action == "took" and change is not None and change.cores < before:
                    # It took less: no growth is offered to it until it asks.
                    assert all(
                        not (isinstance(c, ResizeJob) and c.job_id == target.job.id)
                        or c.cores <= change.cores
                        for c in s.schedule(now)
                    )
        for command in s.schedule(now):
            if isinstance(command, ResizeJob):
                alloc = s.allocation(command.job_id)
                assert alloc is not None
                assert alloc.cores == command.cores
        allocated = 0
        for alloc in s.running:
            job = alloc.job
            assert job.rank <= alloc.cores <= job.max_rank, (job, alloc.cores)
            allocated += alloc.cores
        assert allocated + s.free_cores == total
        assert s.free_cores >= 0


def test_a_resize_out_of_bounds_is_an_internal_error() -> None:
    s = site(8)
    s.submit(malleable("m", 2, 4))
    s.schedule(0.0)
    alloc = s.allocation("m")
    assert alloc is not None
    with pytest.raises(InternalError, match="out of bounds"):
        s._resize(alloc, 5, 1.0)


def test_a_pwa_site_publishes_what_shrinking_would_free() -> None:
    s = site(16, "fpsma", "pwa")
    s.submit(malleable("m", 4, 16))
    s.submit(malleable("ft", 2, 8, sizes="power2"))
    s.schedule(0.0)
    # m took 16; ft, waiting, made it shrink to 14 and runs on 2 (its minimum): m can give 10.
    assert [(a.job.id, a.cores) for a in s.running] == [("m", 14), ("ft", 2)]
    assert s.state().shrinkable == 10
    pra = site(16, "fpsma", "pra")
    pra.submit(malleable("m", 4, 16))
    pra.schedule(0.0)
    assert pra.state().shrinkable == 0  # PRA never shrinks for the queue
    assert LocalScheduler(4).state().shrinkable == 0
