"""The owner broker's algorithms, driven synchronously with a hand-made view."""

from __future__ import annotations

import random

import pytest

from gbroker.core.dispatch import (
    Abandon,
    Algorithm,
    Broker,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    SiteBack,
    SiteLost,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.model import InputFile, Job, Observation, SiteState
from gbroker.core.states import JobState
from gbroker.errors import InvalidInput

MB = 1_000_000


def view(**sites: tuple[int, int, int]) -> dict[str, Observation]:
    """site=(total cores, free cores, queued) observed at t=0."""
    return {name: Observation(SiteState(n, c, q), 0.0) for name, (n, c, q) in sites.items()}


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


def broker(algorithm: Algorithm | str = "dlo", **kw: object) -> Broker:
    policy = DispatchPolicy(Algorithm(algorithm), **kw)  # type: ignore[arg-type]
    return Broker("a", ["b", "c"], policy, no_transfer, random.Random(1))


def state(b: Broker, job_id: str) -> JobState:
    return b.jobs[job_id].state


def submit(b: Broker, job: Job, v: dict[str, Observation], now: float = 1.0) -> list[object]:
    return list(b.handle(JobSubmitted(job), now, v))


def test_dlo_sends_the_job_to_argmin_f() -> None:
    b = broker()
    v = view(a=(8, 0, 3), b=(8, 8, 0), c=(8, 2, 0))
    assert submit(b, Job("j1", 4), v) == [Dispatch(Job("j1", 4), "b")]
    assert b.jobs["j1"].state is JobState.STAGING


def test_transfer_forecast_steers_jobs_towards_their_files() -> None:
    def forecast(src: str, dst: str, size: int) -> float:
        return size / 10e6  # 10 MB/s everywhere

    b = Broker("a", ["b", "c"], DispatchPolicy(), forecast)
    job = Job("j1", 2, input_files=(InputFile("in", 100 * MB, "c"),))
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
    [command] = b.handle(JobSubmitted(job), 0.0, v)
    assert isinstance(command, Dispatch)
    assert command.site == "c"


def test_own_recent_dispatches_count_until_observed() -> None:
    b = broker()
    v = view(a=(8, 0, 5), b=(8, 8, 0), c=(8, 7, 0))
    first = submit(b, Job("j1", 8), v)
    second = submit(b, Job("j2", 8), v)  # the view still shows b empty: we know better
    assert [c.site for c in first + second] == ["b", "c"]  # type: ignore[attr-defined]
    unaccounted = broker(account_own_dispatches=False)
    sites = [c.site for j in ("j1", "j2") for c in submit(unaccounted, Job(j, 8), v)]  # type: ignore[attr-defined]
    assert sites == ["b", "b"]


def test_a_decision_forgets_sites_whose_dispatches_all_started() -> None:
    # Own dispatches count until observed or started; a site left with none is dropped from the
    # table a decision reads, instead of lingering as an empty entry per site ever used.
    b = broker()
    v = view(a=(8, 0, 5), b=(8, 7, 0), c=(8, 8, 0))
    assert [c.site for c in submit(b, Job("j1", 8), v)] == ["c"]  # type: ignore[attr-defined]
    b.handle(JobStarted("j1", "c"), 2.0, v)
    assert [c.site for c in submit(b, Job("j2", 1), v)] == ["b"]  # type: ignore[attr-defined]
    assert b._inflight == {"b": {"j2": 1}}
    assert [c.site for c in submit(b, Job("j3", 7), v)] == ["c"]  # type: ignore[attr-defined]


def test_replication_queues_m_replicas_and_grants_exactly_one_claim() -> None:
    b = broker("dr", replicas=2)
    v = view(a=(8, 1, 2), b=(8, 8, 0), c=(8, 6, 0))
    job = Job("j1", 4)
    out = submit(b, job, v)
    assert out == [Dispatch(job, "b", replica=True), Dispatch(job, "c", replica=True)]
    b.handle(JobQueued("j1", "b"), 2.0, v)
    b.handle(JobQueued("j1", "c"), 2.0, v)
    granted = b.handle(ClaimRequested("j1", "c"), 3.0, v)
    assert granted == [ClaimAnswer("j1", "c", granted=True), Withdraw("j1", "b")]
    assert b.handle(ClaimRequested("j1", "b"), 3.1, v) == [ClaimAnswer("j1", "b", granted=False)]
    # A repeated claim from the winner is granted again (idempotent), never a second site.
    assert b.handle(ClaimRequested("j1", "c"), 3.2, v) == [ClaimAnswer("j1", "c", granted=True)]
    assert b.handle(WithdrawAnswered("j1", "b", withdrawn=False), 3.3, v) == []
    b.handle(JobStarted("j1", "c"), 3.4, v)
    assert b.jobs["j1"].state is JobState.RUNNING
    b.handle(JobFinished("j1", "c"), 9.0, v)
    assert "j1" not in b.jobs


def test_unknown_jobs_and_sites_never_get_a_claim() -> None:
    b = broker("dr", replicas=2)
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
    assert b.handle(ClaimRequested("nope", "b"), 0.0, v) == [ClaimAnswer("nope", "b", False)]
    submit(b, Job("j1", 1), v)
    assert b.handle(ClaimRequested("j1", "zzz"), 0.0, v) == [ClaimAnswer("j1", "zzz", False)]


def test_migration_moves_a_queued_job_when_a_better_site_frees_up() -> None:
    b = broker("dm", interval=30.0, epsilon=0.2)
    busy = view(a=(8, 0, 4), b=(8, 2, 1), c=(8, 0, 6))
    job = Job("j1", 4)
    assert submit(b, job, busy) == [Dispatch(job, "b")]
    b.handle(JobQueued("j1", "b"), 2.0, busy)
    assert b.handle(Tick(), 30.0, busy) == []  # nothing better yet
    freed = view(a=(8, 0, 4), b=(8, 2, 1), c=(8, 8, 0))
    assert b.handle(Tick(), 60.0, freed) == [Withdraw("j1", "b")]
    assert state(b, "j1") is JobState.MIGRATING
    out = b.handle(WithdrawAnswered("j1", "b", withdrawn=True), 60.1, freed)
    assert out == [Dispatch(job, "c")]
    assert state(b, "j1") is JobState.STAGING


def test_migration_that_loses_the_race_leaves_the_job_running() -> None:
    b = broker("dm")
    job = Job("j1", 4)
    submit(b, job, view(a=(8, 0, 4), b=(8, 2, 1), c=(8, 0, 6)))
    b.handle(JobQueued("j1", "b"), 2.0, view())
    freed = view(a=(8, 0, 4), b=(8, 2, 1), c=(8, 8, 0))
    assert b.handle(Tick(), 30.0, freed) == [Withdraw("j1", "b")]
    b.handle(JobStarted("j1", "b"), 30.05, freed)  # the site started it before the withdrawal
    assert b.handle(WithdrawAnswered("j1", "b", withdrawn=False), 30.1, freed) == []
    assert b.jobs["j1"].state is JobState.RUNNING


def test_the_job_does_not_flee_its_own_queue_entry() -> None:
    # b's only queued job is j1 itself: discounting it, b is as good as c; no migration.
    b = broker("dm", epsilon=0.2)
    job = Job("j1", 4)
    assert submit(b, job, view(a=(8, 0, 9), b=(8, 2, 0), c=(8, 2, 0))) == [Dispatch(job, "b")]
    b.handle(JobQueued("j1", "b"), 2.0, view())
    assert b.handle(Tick(), 30.0, view(a=(8, 0, 9), b=(8, 2, 1), c=(8, 2, 0))) == []


def test_central_holds_jobs_until_a_site_can_start_them() -> None:
    b = broker("central")
    full = view(a=(8, 0, 0), b=(8, 1, 0), c=(8, 2, 0))
    job = Job("j1", 4)
    assert submit(b, job, full) == []
    assert b.jobs["j1"].state is JobState.SUBMITTED
    assert b.needs_tick
    assert b.handle(Tick(), 30.0, full) == []
    assert b.handle(Tick(), 60.0, view(a=(8, 0, 0), b=(8, 8, 0), c=(8, 2, 0))) == [
        Dispatch(job, "b")
    ]


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("worstfit", ["c", "c"]),  # most free cores (c 14, a 6, b 5), own dispatches counted
        ("closetofiles", ["b", "b"]),  # the file lives at b
        ("roundrobin", ["a", "b"]),
    ],
)
def test_baselines(algorithm: str, expected: list[str]) -> None:
    def forecast(src: str, dst: str, size: int) -> float:
        return size / 1e6

    policy = DispatchPolicy(Algorithm(algorithm))
    b = Broker("a", ["b", "c"], policy, forecast)
    v = view(a=(16, 6, 0), b=(16, 5, 0), c=(16, 14, 0))
    files = (InputFile("in", 10 * MB, "b"),)
    sites = [
        c.site
        for j in ("j1", "j2")
        for c in b.handle(JobSubmitted(Job(j, 1, input_files=files)), 0.0, v)
        if isinstance(c, Dispatch)
    ]
    assert sites == expected


def test_random_baseline_is_seeded() -> None:
    def run(seed: int) -> list[str]:
        b = Broker(
            "a", ["b", "c"], DispatchPolicy(Algorithm.RANDOM), no_transfer, random.Random(seed)
        )
        v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
        return [
            c.site
            for j in range(20)
            for c in b.handle(JobSubmitted(Job(f"j{j}", 1)), 0.0, v)
            if isinstance(c, Dispatch)
        ]

    assert run(7) == run(7)
    assert set(run(7)) == {"a", "b", "c"}
    with pytest.raises(InvalidInput, match="rng"):
        Broker("a", [], DispatchPolicy(Algorithm.RANDOM), no_transfer)


def test_bad_input_is_rejected_precisely() -> None:
    b = broker()
    with pytest.raises(InvalidInput, match=r"job\[big\]\.rank"):
        submit(b, Job("big", 64), view(a=(8, 8, 0), b=(16, 16, 0)))
    assert "big" not in b.jobs
    assert submit(b, Job("j1", 1), view(a=(8, 8, 0))) != []
    assert submit(b, Job("j1", 1), view(a=(8, 8, 0))) == []  # duplicate submission: idempotent
    with pytest.raises(InvalidInput, match="algorithm"):
        DispatchPolicy("best")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="replicas"):
        DispatchPolicy(Algorithm.DR, replicas=0)
    with pytest.raises(InvalidInput, match="neighbourhood"):
        Broker("a", ["a"], DispatchPolicy(), no_transfer)


def test_cancel_withdraws_waiting_replicas_and_kills_the_running_one() -> None:
    from gbroker.core.dispatch import CancelRequested, Kill

    b = broker("dr", replicas=2)
    v = view(a=(8, 1, 2), b=(8, 8, 0), c=(8, 6, 0))
    submit(b, Job("j1", 4), v)
    submit(b, Job("j2", 4), v)
    for job in ("j1", "j2"):
        b.handle(JobQueued(job, "b"), 2.0, v)
        b.handle(JobQueued(job, "c"), 2.0, v)
    assert b.handle(CancelRequested("j1"), 3.0, v) == [Withdraw("j1", "b"), Withdraw("j1", "c")]
    assert "j1" not in b.jobs
    assert b.handle(ClaimRequested("j1", "b"), 3.1, v) == [ClaimAnswer("j1", "b", granted=False)]
    b.handle(ClaimRequested("j2", "c"), 4.0, v)
    b.handle(JobStarted("j2", "c"), 4.1, v)
    assert b.handle(CancelRequested("j2"), 5.0, v) == [Withdraw("j2", "b"), Kill("j2", "c")]
    assert b.handle(CancelRequested("j2"), 5.1, v) == []  # already gone: idempotent
    assert b.handle(JobFinished("j2", "c", ok=False), 6.0, v) == []  # a late report is ignored


# -- leases, lost sites and recovery ------------------------------------------------------------


def leased(algorithm: str = "dlo", lease: float = 10.0, **kw: object) -> Broker:
    policy = DispatchPolicy(Algorithm(algorithm), **kw)  # type: ignore[arg-type]
    return Broker("a", ["b", "c"], policy, no_transfer, lease=lease)


def test_a_lost_site_keeps_its_jobs_until_their_lease_runs_out_then_they_move() -> None:
    b = leased(lease=10.0)
    v = view(a=(8, 0, 3), b=(8, 8, 0), c=(8, 2, 0))
    assert submit(b, Job("j1", 4), v, now=1.0) == [Dispatch(Job("j1", 4), "b")]
    b.handle(JobQueued("j1", "b"), 2.0, v)
    gone = {k: o for k, o in v.items() if k != "b"}
    # Lost at t=5: b may still start j1 on its lease (until t=11), so nothing moves yet.
    assert b.handle(SiteLost("b"), 5.0, gone) == []
    assert b.lease_pending("b") == 11.0
    assert b.jobs["j1"].placements == {"b": "queued"}
    # At t=11 the lease is over: the job goes to the best remaining site.
    assert b.handle(SiteLost("b"), 11.0, gone) == [Dispatch(Job("j1", 4), "c")]
    assert b.lease_pending("b") is None
    assert state(b, "j1") is JobState.STAGING
    # b comes back and tries to start j1 (its lease ran out, so it claims): denied.
    assert b.handle(ClaimRequested("j1", "b"), 12.0, v) == [ClaimAnswer("j1", "b", granted=False)]
    assert b.handle(ClaimRequested("j1", "c"), 12.5, v) == [ClaimAnswer("j1", "c", granted=True)]


def test_a_job_running_at_a_lost_site_stays_and_nothing_fits_elsewhere_is_abandoned() -> None:
    b = leased(lease=1.0)
    v = view(a=(2, 2, 0), b=(8, 8, 0), c=(2, 2, 0))
    submit(b, Job("big", 8), v, now=0.0)  # only b has 8 cores
    submit(b, Job("run", 8), v, now=0.0)
    b.handle(JobStarted("run", "b"), 0.5, v)
    gone = {k: o for k, o in v.items() if k != "b"}
    out = b.handle(SiteLost("b"), 5.0, gone)
    assert out == [Abandon("big", "its site b was lost and no other fits it")]
    assert "big" not in b.jobs
    assert state(b, "run") is JobState.RUNNING  # its site reports its end when it is back
    assert b.handle(JobFinished("run", "b"), 9.0, v) == []


def test_a_lost_replica_is_dropped_while_the_others_carry_on_and_a_site_can_come_back() -> None:
    b = leased("dr", lease=1.0, replicas=2)
    v = view(a=(8, 0, 3), b=(8, 8, 0), c=(8, 8, 0))
    out = submit(b, Job("j", 2), v, now=0.0)
    assert {c.site for c in out if isinstance(c, Dispatch)} == {"b", "c"}
    assert b.handle(SiteLost("c"), 2.0, v) == []
    assert set(b.jobs["j"].placements) == {"b"}
    b.handle(SiteBack("c"), 3.0, v)
    assert b.lease_pending("c") is None
    out = submit(b, Job("k", 2), v, now=3.0)
    assert {c.site for c in out if isinstance(c, Dispatch)} == {"b", "c"}


def test_restore_rebuilds_placements_and_grants_so_claims_are_answered_as_before() -> None:
    b = leased("dr", replicas=2)
    v = view(a=(8, 0, 3), b=(8, 8, 0), c=(8, 8, 0))
    b.restore(Job("r", 2), 0.0, {"b": True, "c": False}, None, now=100.0)
    assert state(b, "r") is JobState.QUEUED
    out = b.handle(ClaimRequested("r", "c"), 101.0, v)
    assert out == [ClaimAnswer("r", "c", granted=True), Withdraw("r", "b")]
    b.restore(Job("g", 2), 0.0, {"b": True}, "b", now=100.0)
    assert state(b, "g") is JobState.RUNNING
    assert b.handle(ClaimRequested("g", "c"), 101.0, v) == [ClaimAnswer("g", "c", granted=False)]
    assert b.handle(JobFinished("g", "b"), 102.0, v) == []
    assert "g" not in b.jobs


def test_lease_must_be_positive() -> None:
    with pytest.raises(InvalidInput, match="lease"):
        leased(lease=0.0)
