"""The owner broker's contract, point by point (what mutation testing found untested).

Exact errors for a bad policy or broker, the boundaries of each parameter, and the owner's
records through the less travelled paths: a withdrawal answered late, a lost site with leases,
a refused dispatch, the view adjusted by the broker's own dispatches. ``test_dispatch.py`` holds
the algorithms' behaviour; ``test_exactly_once.py`` the model check of the claim protocol.
"""

from __future__ import annotations

import math
import random

import pytest

from gbroker.core.dispatch import (
    Abandon,
    Algorithm,
    Broker,
    BrokerCommand,
    CancelRequested,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    DispatchRefused,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Kill,
    Placement,
    PlacementReleased,
    SiteBack,
    SiteLost,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.health import SiteRecord
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.states import JobState
from gbroker.errors import InvalidInput


def view(at: float = 0.0, **sites: tuple[int, int, int]) -> dict[str, Observation]:
    """site=(total cores, free cores, queued) observed at ``at``."""
    return {name: Observation(SiteState(n, c, q), at) for name, (n, c, q) in sites.items()}


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


def make(
    algorithm: Algorithm | str = "dlo",
    neighbours: tuple[str, ...] = ("b", "c"),
    lease: float = math.inf,
    **kw: object,
) -> Broker:
    policy = DispatchPolicy(Algorithm(algorithm), **kw)  # type: ignore[arg-type]
    return Broker("a", list(neighbours), policy, no_transfer, random.Random(1), lease=lease)


# -- a bad policy or broker: the exact error ----------------------------------------------------


def error(build: object) -> str:
    assert callable(build)
    with pytest.raises(InvalidInput) as caught:
        build()
    return str(caught.value)


def test_a_bad_policy_is_refused_with_the_field_the_expectation_and_the_value() -> None:
    assert error(lambda: DispatchPolicy("best")) == (  # type: ignore[arg-type]
        "algorithm: expected one of dlo, dr, dm, drm, central, gridway, random, roundrobin,"
        " worstfit, closetofiles, sparrow, federation, got 'best'"
    )
    assert error(lambda: DispatchPolicy(replicas=0)) == (
        "replicas: expected an integer >= 1, got 0"
    )
    assert error(lambda: DispatchPolicy(interval=0.0)) == "interval: expected seconds > 0, got 0.0"
    assert error(lambda: DispatchPolicy(interval=math.nan)) == (
        "interval: expected seconds > 0, got nan"
    )
    assert error(lambda: DispatchPolicy(epsilon=-0.1)) == (
        "epsilon: expected a threshold >= 0, got -0.1"
    )
    assert error(lambda: DispatchPolicy(epsilon=math.nan)) == (
        "epsilon: expected a threshold >= 0, got nan"
    )
    assert error(lambda: DispatchPolicy(probe_ratio=0.9)) == (
        "probe_ratio: expected a finite ratio >= 1 (probes per task), got 0.9"
    )


def test_a_policy_at_its_bounds_is_accepted_and_its_algorithm_normalised() -> None:
    policy = DispatchPolicy("dr", replicas=1, interval=1e-9, epsilon=0.0)  # type: ignore[arg-type]
    assert policy.algorithm is Algorithm.DR
    assert (policy.replicas, policy.interval, policy.epsilon) == (1, 1e-9, 0.0)
    assert DispatchPolicy() == DispatchPolicy(Algorithm.DLO, 2, 30.0, 0.2, True)


@pytest.mark.parametrize(
    ("algorithm", "replicas", "replicating", "migrating", "periodic"),
    [
        ("dlo", 2, False, False, False),
        ("dr", 2, True, False, False),
        ("dr", 1, False, False, False),  # one replica is no replication
        ("dm", 2, False, True, True),
        ("drm", 2, True, True, True),
        ("drm", 1, False, True, True),
        ("central", 2, False, False, True),
        ("random", 2, False, False, False),
        ("worstfit", 3, False, False, False),
    ],
)
def test_what_each_algorithm_does(
    algorithm: str, replicas: int, replicating: bool, migrating: bool, periodic: bool
) -> None:
    policy = DispatchPolicy(Algorithm(algorithm), replicas=replicas)
    assert (policy.replicating, policy.migrating, policy.periodic) == (
        replicating,
        migrating,
        periodic,
    )


def test_a_bad_broker_is_refused_with_the_field_the_expectation_and_the_value() -> None:
    assert error(lambda: Broker("a", ["b", "a"], DispatchPolicy(), no_transfer)) == (
        "neighbourhood: expected sites other than the broker's own (a), got 'a'"
    )
    assert error(lambda: Broker("a", ["b"], DispatchPolicy(), no_transfer, lease=0.0)) == (
        "lease: expected seconds > 0, got 0.0"
    )
    assert error(lambda: Broker("a", ["b"], DispatchPolicy(), no_transfer, lease=math.nan)) == (
        "lease: expected seconds > 0, got nan"
    )
    assert error(lambda: Broker("a", [], DispatchPolicy(Algorithm.RANDOM), no_transfer)) == (
        "rng: expected a seeded random source for the random baseline"
    )


def test_a_broker_keeps_what_it_was_given() -> None:
    policy = DispatchPolicy(Algorithm.DM)
    rng = random.Random(3)
    b = Broker("a", ["c", "b"], policy, no_transfer, rng, lease=7.5)
    assert (b.site, b.neighbourhood, b.policy, b.forecast, b.rng, b.lease) == (
        "a",
        ("c", "b"),
        policy,
        no_transfer,
        rng,
        7.5,
    )
    assert b.health is None
    assert b.jobs == {}
    assert not b.needs_tick  # periodic, but holds nothing
    b.handle(JobSubmitted(Job("j", 1)), 1.0, view(a=(4, 4, 0)))
    assert b.needs_tick
    assert not make("dlo").needs_tick  # never periodic
    # A broker with no random source is fine for every other algorithm.
    assert Broker("a", [], DispatchPolicy(Algorithm.ROUNDROBIN), no_transfer).rng is None


def test_an_event_the_broker_does_not_know_is_refused() -> None:
    with pytest.raises(InvalidInput, match="event: expected a broker event, got 'boom'"):
        make().handle("boom", 0.0, {})  # type: ignore[arg-type]


# -- the owner's records and its view, path by path ----------------------------------------------


def seen(b: Broker, site: str, v: dict[str, Observation], job: Job | None = None) -> SiteState:
    """``site`` as the broker sees it when ranking ``job`` (a probe by default): observed, plus
    its own dispatches the observation cannot show yet."""
    probe = job if job is not None else Job("probe", 1)
    (state,) = [c.state for c in b.candidates(probe, v) if c.site == site]
    return state


def test_the_owner_stamps_its_records_with_the_time_of_each_event() -> None:
    b = make("dlo")
    v = view(a=(4, 0, 1), b=(4, 4, 0), c=(4, 0, 1))
    assert b.handle(JobSubmitted(Job("j", 1)), 5.0, v) == [Dispatch(Job("j", 1), "b")]
    owned = b.jobs["j"]
    assert (owned.submitted_at, owned.dispatched_at, owned.queued_at) == (5.0, {"b": 5.0}, {})
    assert b.handle(JobQueued("j", "b"), 6.0, v) == []
    assert (owned.placements, owned.queued_at, owned.state) == (
        {"b": Placement.QUEUED},
        {"b": 6.0},
        JobState.QUEUED,
    )
    assert b.handle(JobQueued("unknown", "b"), 7.0, v) == []  # a stale report: nothing
    central = make("central")
    central.handle(JobSubmitted(Job("k", 4)), 3.0, v)
    assert central.jobs["k"].submitted_at == 3.0


def test_a_late_queued_report_does_not_undo_a_withdrawal_in_flight() -> None:
    b = make("dm")
    v = view(a=(4, 0, 2), b=(4, 4, 0), c=(4, 0, 2))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    better = view(2.0, a=(4, 0, 2), b=(4, 0, 3), c=(4, 4, 0))
    assert b.handle(Tick(), 2.0, better) == [Withdraw("j", "b")]
    assert b.handle(JobQueued("j", "b"), 2.5, better) == []
    assert b.jobs["j"].placements == {"b": Placement.WITHDRAWING}
    assert b.jobs["j"].state is JobState.MIGRATING


def test_black_hole_protection_is_told_how_long_each_job_ran() -> None:
    from gbroker.core.health import HealthPolicy

    b = Broker("a", ["b"], DispatchPolicy(), no_transfer, health=HealthPolicy())
    v = view(a=(4, 0, 1), b=(4, 4, 0))
    b.handle(JobSubmitted(Job("j1", 1)), 0.0, v)
    b.handle(JobStarted("j1", "b"), 1.0, v)
    assert b.handle(JobFinished("j1", "b", ok=False, run_time=100.0), 101.0, v) == []
    assert b.health is not None
    assert b.health.records(101.0)["b"].fast_failures == 0  # it ran 100 s: an ordinary failure
    b.handle(JobSubmitted(Job("j2", 1)), 102.0, v)
    b.handle(JobFinished("j2", "b", ok=False, run_time=None), 103.0, v)  # never started
    assert b.health.records(103.0)["b"] == SiteRecord(2, 1, 0.0, None)


def test_central_places_a_held_job_when_a_finished_one_frees_its_site() -> None:
    b = make("central")
    full = view(a=(4, 0, 0), b=(4, 0, 0), c=(2, 0, 0))
    assert b.handle(JobSubmitted(Job("j1", 4)), 0.0, view(a=(4, 4, 0), b=(1, 0, 0), c=(1, 0, 0)))
    assert b.handle(JobSubmitted(Job("j2", 4)), 1.0, full) == []  # held
    assert b.handle(JobSubmitted(Job("j3", 2)), 1.0, full) == []  # held
    b.handle(JobStarted("j1", "a"), 1.0, full)
    freed = view(2.0, a=(4, 2, 0), b=(4, 0, 0), c=(2, 0, 0))
    # j2 (4 cores) cannot start on 2 free cores; j3, behind it, can, exactly.
    assert b.handle(JobFinished("j1", "a"), 2.0, freed) == [Dispatch(Job("j3", 2), "a")]
    assert b.handle(CancelRequested("j2"), 3.0, freed) == []  # held: nothing to withdraw
    assert b.handle(Tick(), 4.0, view(4.0, a=(4, 4, 0), b=(4, 4, 0), c=(2, 2, 0))) == []
    assert "j2" not in b.jobs


def test_central_places_on_the_site_f_ranks_first_with_fresher_data_first() -> None:
    b = make("central")
    v = {
        "a": Observation(SiteState(4, 0, 0), 0.0),
        "b": Observation(SiteState(4, 4, 0), 1.0),
        "c": Observation(SiteState(4, 4, 0), 2.0),  # as good, seen later
    }
    assert b.handle(JobSubmitted(Job("j", 2)), 3.0, v) == [Dispatch(Job("j", 2), "c")]


def test_central_takes_a_job_as_big_as_its_biggest_site_and_refuses_a_bigger_one() -> None:
    b = make("central")
    v = view(a=(2, 0, 0), b=(8, 0, 0), c=(4, 0, 0))
    assert b.handle(JobSubmitted(Job("j", 8)), 0.0, v) == []  # held until b frees up
    assert error(lambda: b.handle(JobSubmitted(Job("big", 9)), 0.0, v)) == (
        "job[big].rank: expected at most the cores of some known site in the neighbourhood, got 9"
    )


def test_a_job_that_fits_only_draining_sites_is_refused_naming_them() -> None:
    b = make("dlo")
    v = {
        "a": Observation(SiteState(2, 2, 0), 0.0),
        "b": Observation(SiteState(4, 4, 0, draining=True), 0.0),
        "c": Observation(SiteState(4, 4, 0, draining=True), 0.0),
    }
    assert error(lambda: b.handle(JobSubmitted(Job("j", 4)), 0.0, v)) == (
        "job[j]: expected a site that takes new work (every site that fits it is draining or"
        " excluded as a black hole: b, c)"
    )
    assert error(lambda: b.handle(JobSubmitted(Job("k", 5)), 0.0, v)) == (
        "job[k].rank: expected at most the cores of some known site in the neighbourhood, got 5"
    )


def test_a_site_that_comes_back_may_take_the_jobs_of_a_lost_one() -> None:
    def run(back: bool) -> list[BrokerCommand]:
        b = make("dlo", lease=10.0)
        v = view(a=(4, 0, 3), b=(4, 4, 0), c=(4, 2, 0))
        assert b.handle(JobSubmitted(Job("j", 1)), 0.0, v) == [Dispatch(Job("j", 1), "b")]
        assert b.handle(SiteLost("c"), 0.0, v) == []
        if back:
            assert b.handle(SiteBack("c"), 1.0, v) == []
        return b.handle(SiteLost("b"), 20.0, v)

    assert run(back=False) == [Dispatch(Job("j", 1), "a")]  # c is still lost
    assert run(back=True) == [Dispatch(Job("j", 1), "c")]


def test_a_migration_ranks_the_job_without_its_own_queue_entry() -> None:
    b = make("dm")
    # The job waits at b; b's queue holds it alone, c's holds another job.
    v = {
        "a": Observation(SiteState(8, 0, 8, running=1), 0.0),
        "b": Observation(SiteState(4, 0, 1, running=3), 0.0),
        "c": Observation(SiteState(8, 0, 1, running=2, draining=True), 0.0),
    }
    own = {c.site: c.state for c in b.candidates(Job("j", 1), v, exclude_self_from="b")}
    assert own["b"] == SiteState(4, 0, 0, running=3)
    assert own["c"] == SiteState(8, 0, 1, running=2, draining=True)
    assert own["a"] == SiteState(8, 0, 8, running=1)
    mine = {c.site: c.state for c in b.candidates(Job("j", 1), v, exclude_self_from="c")}
    assert mine["c"] == SiteState(8, 0, 0, running=2, draining=True)
    assert mine["b"] == SiteState(4, 0, 1, running=3)
    empty = view(a=(4, 0, 0))
    assert [c.state for c in b.candidates(Job("j", 1), empty, "a")] == [SiteState(4, 0, 0)]


def test_a_migration_does_not_flee_its_own_queue_entry() -> None:
    b = make("dm")
    v = view(a=(8, 0, 8), b=(4, 0, 0), c=(8, 0, 1))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, view(a=(8, 0, 8), b=(4, 4, 0), c=(8, 0, 8)))
    b.handle(JobQueued("j", "b"), 1.0, v)
    # Seen with the job in b's queue: F(b) = 0 (its queue is the job alone), F(c) = 1.
    queued = view(2.0, a=(8, 0, 8), b=(4, 0, 1), c=(8, 0, 1))
    assert b.handle(Tick(), 2.0, queued) == []


def test_a_refusing_site_is_passed_over_until_an_observation_newer_than_the_refusal() -> None:
    b = make("dlo")
    v = view(a=(4, 0, 3), b=(4, 4, 0), c=(4, 2, 0))
    b.handle(JobSubmitted(Job("j", 1)), 5.0, v)
    assert b.handle(DispatchRefused("j", "b"), 5.0, v) == [Dispatch(Job("j", 1), "c")]
    same = view(5.0, a=(4, 0, 3), b=(4, 4, 0), c=(4, 2, 0))
    assert "b" not in {c.site for c in b.candidates(Job("p", 1), same)}
    newer = view(5.5, a=(4, 0, 3), b=(4, 4, 0), c=(4, 2, 0))
    assert "b" in {c.site for c in b.candidates(Job("p", 1), newer)}


def test_a_negative_transfer_forecast_is_refused_naming_the_site() -> None:
    from gbroker.core.model import InputFile

    def broken(src: str, dst: str, size: int) -> float:
        return -1.0 if dst == "b" else 0.0

    b = Broker("a", ["b"], DispatchPolicy(), broken)
    job = Job("j", 1, input_files=(InputFile("in", 10, "c"),))
    assert error(lambda: b.candidates(job, view(a=(4, 4, 0), b=(4, 4, 0)))) == (
        "candidate[b].transfer_time: expected seconds >= 0, got -1.0"
    )


# -- the broker's own dispatches in its view ---------------------------------------------------


def only_b(algorithm: str = "dlo", **kw: object) -> Broker:
    """A broker whose own site is too small for the jobs below: they all go to b."""
    policy = DispatchPolicy(Algorithm(algorithm), **kw)  # type: ignore[arg-type]
    return Broker("a", ["b"], policy, no_transfer)


def small_a(**b_state: object) -> dict[str, Observation]:
    state = SiteState(**b_state)  # type: ignore[arg-type]
    return {"a": Observation(SiteState(1, 1, 0), 0.0), "b": Observation(state, 0.0)}


def test_own_dispatches_take_free_cores_then_queue() -> None:
    b = only_b()
    v = small_a(total_cores=8, free_cores=2, queued=0, running=3)
    b.handle(JobSubmitted(Job("j1", 2)), 1.0, v)
    assert seen(b, "b", v) == SiteState(8, 0, 0, running=3)  # exactly fits: cores taken
    b.handle(JobSubmitted(Job("j2", 2)), 1.0, v)
    b.handle(JobSubmitted(Job("j3", 2)), 1.0, v)
    assert seen(b, "b", v) == SiteState(8, 0, 2, running=3)  # then queued, one each
    waiting = small_a(total_cores=8, free_cores=8, queued=1)
    c = only_b()
    c.handle(JobSubmitted(Job("k", 2)), 1.0, waiting)
    assert seen(c, "b", waiting) == SiteState(8, 8, 2)  # a queue ahead: it waits, cores stay


def test_own_dispatches_count_until_an_observation_made_after_they_were_queued() -> None:
    b = only_b()
    v = small_a(total_cores=8, free_cores=8)
    b.handle(JobSubmitted(Job("j1", 2)), 1.0, v)
    b.handle(JobQueued("j1", "b"), 1.0, v)
    b.handle(JobSubmitted(Job("j2", 2)), 2.0, v)
    assert seen(b, "b", v) == SiteState(8, 4, 0)
    # Ranking j1 itself: its own dispatch is not counted against it, j2's is.
    assert seen(b, "b", v, Job("j1", 2)) == SiteState(8, 6, 0)
    # Seen at 1.5: j1 (queued at 1.0) is in the observation, j2 is not yet.
    later = {"a": v["a"], "b": Observation(SiteState(8, 6, 0), 1.5)}
    assert seen(b, "b", later) == SiteState(8, 4, 0)
    b.handle(JobQueued("j2", "b"), 3.0, v)
    at_queue = {"a": v["a"], "b": Observation(SiteState(8, 4, 0), 3.0)}  # exactly when queued
    assert seen(b, "b", at_queue) == SiteState(8, 4, 0)


def test_own_dispatches_keep_the_state_a_draining_site_reports() -> None:
    b = only_b()
    b.handle(JobSubmitted(Job("j", 2)), 1.0, small_a(total_cores=8, free_cores=8))
    draining = {
        "a": Observation(SiteState(1, 1, 0), 0.5),
        "b": Observation(SiteState(8, 8, 0, running=2, draining=True), 0.5),
    }
    assert seen(b, "b", draining) == SiteState(8, 6, 0, running=2, draining=True)


def test_a_move_counts_against_its_target_until_it_is_moot() -> None:
    """Migration b -> c: c counts the job while the withdrawal is in flight, and no longer once
    the job is known to stay at b (it started, claimed, or the withdrawal failed) or ended."""

    def migrating() -> tuple[Broker, dict[str, Observation]]:
        b = make("dm")
        b.handle(JobSubmitted(Job("j", 2)), 0.0, view(a=(4, 0, 2), b=(4, 4, 0), c=(4, 0, 2)))
        b.handle(JobQueued("j", "b"), 1.0, {})
        better = view(2.0, a=(4, 0, 2), b=(4, 0, 3), c=(4, 4, 0))
        assert b.handle(Tick(), 2.0, better) == [Withdraw("j", "b")]
        assert b.jobs["j"].migrate_to == {"b": "c"}
        assert seen(b, "c", better) == SiteState(4, 2, 0)
        return b, better

    b, v = migrating()
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=False), 3.0, v) == []
    assert seen(b, "c", v) == SiteState(4, 4, 0)
    owned = b.jobs["j"]
    assert (owned.placements, owned.migrate_to, owned.state) == (
        {"b": Placement.QUEUED},
        {},
        JobState.QUEUED,
    )
    # Still better at c: the next tick tries again.
    assert b.handle(Tick(), 4.0, v) == [Withdraw("j", "b")]

    b, v = migrating()
    assert b.handle(JobStarted("j", "b"), 3.0, v) == []
    assert (b.jobs["j"].migrate_to, seen(b, "c", v)) == ({}, SiteState(4, 4, 0))
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=False), 3.5, v) == []
    assert b.jobs["j"].placements == {"b": Placement.QUEUED}

    b, v = migrating()
    assert b.handle(ClaimRequested("j", "b"), 3.0, v) == [ClaimAnswer("j", "b", granted=True)]
    owned = b.jobs["j"]
    assert (owned.placements, owned.migrate_to, owned.state, owned.granted) == (
        {"b": Placement.QUEUED},
        {},
        JobState.QUEUED,
        "b",
    )
    assert seen(b, "c", v) == SiteState(4, 4, 0)
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=False), 3.5, v) == []

    b, v = migrating()
    assert b.handle(JobFinished("j", "b"), 3.0, v) == []  # it ran at b after all
    assert seen(b, "c", v) == SiteState(4, 4, 0)


def test_a_completed_move_leaves_no_trace_at_the_site_it_left() -> None:
    b = make("dm")
    b.handle(JobSubmitted(Job("j", 2)), 0.0, view(a=(4, 0, 2), b=(4, 4, 0), c=(4, 0, 2)))
    b.handle(JobQueued("j", "b"), 1.0, {})
    better = view(0.5, a=(4, 0, 2), b=(4, 4, 0), c=(4, 4, 0))  # b not yet seen with the job
    assert seen(b, "b", better) == SiteState(4, 2, 0)
    worse = view(0.5, a=(4, 0, 2), b=(4, 0, 3), c=(4, 4, 0))
    assert b.handle(Tick(), 2.0, worse) == [Withdraw("j", "b")]
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=True), 3.0, better) == [
        Dispatch(Job("j", 2), "c")
    ]
    owned = b.jobs["j"]
    assert (owned.placements, owned.queued_at, owned.state) == (
        {"c": Placement.STAGING},
        {},
        JobState.STAGING,
    )
    assert seen(b, "b", better) == SiteState(4, 4, 0)
    assert seen(b, "c", better) == SiteState(4, 2, 0)


# -- claims, withdrawals, cancels -------------------------------------------------------------


def replicated(algorithm: str = "dr") -> tuple[Broker, dict[str, Observation]]:
    """j with replicas queued at b and c (of a, b, c, d)."""
    b = Broker(
        "a",
        ["b", "c", "d"],
        DispatchPolicy(Algorithm(algorithm), replicas=2),
        no_transfer,
        lease=10.0,
    )
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 3, 0), d=(4, 0, 3))
    assert b.handle(JobSubmitted(Job("j", 1)), 0.0, v) == [
        Dispatch(Job("j", 1), "b", replica=True),
        Dispatch(Job("j", 1), "c", replica=True),
    ]
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobQueued("j", "c"), 1.0, v)
    return b, v


def test_a_grant_withdraws_the_other_replicas_and_their_answers_end_them() -> None:
    b, v = replicated()
    assert b.handle(ClaimRequested("j", "b"), 2.0, v) == [
        ClaimAnswer("j", "b", granted=True),
        Withdraw("j", "c"),
    ]
    assert b.jobs["j"].placements == {"b": Placement.QUEUED, "c": Placement.WITHDRAWING}
    assert b.waiting_at("c") == {"j"}
    # c was about to start it too (its claim crossed the withdrawal): it stays there until
    # denied, and is no longer the job's.
    assert b.handle(WithdrawAnswered("j", "c", withdrawn=False), 3.0, v) == []
    assert b.jobs["j"].placements == {"b": Placement.QUEUED}
    assert not b.placed("j", "c")
    assert b.placed("j", "b")
    assert b.waiting_at("c") == set()
    assert b.handle(WithdrawAnswered("unknown", "c", withdrawn=True), 3.0, v) == []


def test_a_replica_withdrawn_while_migrating_is_not_moved_once_another_was_granted() -> None:
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DRM, replicas=2), no_transfer)
    v = view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 7, 0))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    assert set(b.jobs["j"].placements) == {"b", "d"}
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobQueued("j", "d"), 1.0, v)
    # b fills up; c frees up; d (its queue is the job alone) is as good as c.
    moved = view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 8, 0), d=(8, 8, 1))
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b")]
    assert b.jobs["j"].state is JobState.QUEUED  # still queued at d
    assert b.handle(ClaimRequested("j", "d"), 3.0, moved) == [ClaimAnswer("j", "d", granted=True)]
    # b's withdrawal succeeds: the job runs at d, so it is not moved to c.
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=True), 4.0, moved) == []
    assert b.jobs["j"].placements == {"d": Placement.QUEUED}
    assert seen(b, "c", moved) == SiteState(8, 8, 0)


def test_a_migration_looks_past_the_sites_the_job_is_at() -> None:
    """DRM: d holds a replica and ranks first; b's replica moves to c, the best other site."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DRM, replicas=2), no_transfer)
    v = view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 7, 0))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobQueued("j", "d"), 1.0, v)
    moved = {
        **view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 6, 0)),
        "d": Observation(SiteState(8, 8, 0), 2.5),  # as good as c by F, and seen later
    }
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b")]
    assert b.jobs["j"].migrate_to == {"b": "c"}


def test_a_running_job_is_killed_on_cancel_after_the_view_forgot_its_dispatch() -> None:
    b = only_b()
    v = small_a(total_cores=8, free_cores=8)
    b.handle(JobSubmitted(Job("j", 2)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobStarted("j", "b"), 2.0, v)
    assert seen(b, "b", v) == SiteState(8, 8, 0)  # nothing of the broker's own in flight
    assert b.handle(CancelRequested("j"), 3.0, v) == [Kill("j", "b")]
    assert b.jobs == {}
    assert b.handle(CancelRequested("j"), 4.0, v) == []


def test_a_refusal_after_the_view_caught_up_places_the_job_elsewhere() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer)
    v = view(a=(2, 0, 2), b=(8, 8, 0), c=(8, 4, 0))
    b.handle(JobSubmitted(Job("j", 2)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    caught_up = view(2.0, a=(2, 0, 2), b=(8, 6, 0), c=(8, 4, 0))
    assert seen(b, "b", caught_up) == SiteState(8, 6, 0)
    owned = b.jobs["j"]
    assert owned.state is JobState.QUEUED
    # b, drained and restarted, refuses the job it had queued.
    assert b.handle(DispatchRefused("j", "b"), 3.0, caught_up) == [Dispatch(Job("j", 2), "c")]
    assert (owned.placements, owned.queued_at, owned.dispatched_at, owned.state) == (
        {"c": Placement.STAGING},
        {},
        {"c": 3.0},
        JobState.STAGING,
    )
    assert b.handle(DispatchRefused("unknown", "b"), 3.0, caught_up) == []


def test_a_refused_replica_is_dropped_while_another_carries_on() -> None:
    b, v = replicated()
    assert b.handle(DispatchRefused("j", "b"), 2.0, v) == []
    assert b.jobs["j"].placements == {"c": Placement.QUEUED}
    # Refused at c too: two new replicas, at neither b nor c.
    assert b.handle(DispatchRefused("j", "c"), 2.0, v) == [
        Dispatch(Job("j", 1), "d", replica=True),
        Dispatch(Job("j", 1), "a", replica=True),
    ]


def test_a_refused_dispatch_no_longer_counts_at_the_site_that_refused_it() -> None:
    b = make("dlo")
    v = view(a=(8, 0, 1), b=(8, 8, 0), c=(8, 6, 0))
    b.handle(JobSubmitted(Job("j", 2)), 0.0, v)
    assert b.handle(DispatchRefused("j", "b"), 1.0, v) == [Dispatch(Job("j", 2), "c")]
    newer = view(1.5, a=(8, 0, 1), b=(8, 8, 0), c=(8, 6, 0))
    assert seen(b, "b", newer) == SiteState(8, 8, 0)
    assert seen(b, "c", newer) == SiteState(8, 4, 0)


def test_a_refused_job_does_not_go_to_a_lost_site() -> None:
    for algorithm, expected in (("dlo", "a"), ("worstfit", "a")):
        b = make(algorithm)
        v = view(a=(8, 0, 1), b=(8, 8, 0), c=(8, 6, 0))
        assert b.handle(JobSubmitted(Job("j", 1)), 0.0, v) == [Dispatch(Job("j", 1), "b")]
        assert b.handle(SiteLost("c"), 0.0, v) == []
        assert b.handle(DispatchRefused("j", "b"), 1.0, v) == [Dispatch(Job("j", 1), expected)]


def test_close_to_files_prefers_the_site_with_the_files_over_a_better_f() -> None:
    from gbroker.core.model import InputFile

    def transfer(src: str, dst: str, size: int) -> float:
        return 10.0

    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.CLOSETOFILES), transfer)
    job = Job("j", 1, input_files=(InputFile("in", 100, "c"),))
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 1, 2))
    assert b.handle(JobSubmitted(job), 0.0, v) == [Dispatch(job, "c")]
    # F(j) would not: a (or b) starts it at once, c makes it wait.
    dlo = Broker("a", ["b", "c"], DispatchPolicy(), transfer)
    assert dlo.handle(JobSubmitted(job), 0.0, v) == [Dispatch(job, "a")]
    assert make("worstfit").handle(JobSubmitted(Job("k", 1)), 0.0, v) == [
        Dispatch(Job("k", 1), "a")
    ]


def test_a_released_replica_moves_while_the_job_stays_queued_at_the_other() -> None:
    b, v = replicated()
    assert b.handle(PlacementReleased("j", "b"), 2.0, v) == [Withdraw("j", "b")]
    owned = b.jobs["j"]
    assert owned.state is JobState.QUEUED
    assert owned.migrate_to == {"b": "d"}  # the best site it is not at
    assert seen(b, "d", v) == SiteState(4, 0, 4)  # counted at its target meanwhile
    assert b.handle(PlacementReleased("unknown", "b"), 2.0, v) == []


# -- lost sites ---------------------------------------------------------------------------------


def restored(lease: float = 5.0, algorithm: str = "dlo") -> Broker:
    """j1 placed at b at t=9 (lease runs to 14), j2 at b at t=1 (expired at 6), j3 at c."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm(algorithm)), no_transfer, lease=lease)
    b.restore(Job("j1", 1), 0.0, {"b": True}, None, now=9.0)
    b.restore(Job("j2", 1), 0.5, {"b": False}, None, now=1.0)
    b.restore(Job("j3", 1), 0.7, {"c": True}, None, now=1.0)
    return b


def test_restore_rebuilds_each_placement_and_its_lease() -> None:
    b = restored()
    j1, j2 = b.jobs["j1"], b.jobs["j2"]
    assert (j1.submitted_at, j1.placements, j1.queued_at, j1.dispatched_at, j1.state) == (
        0.0,
        {"b": Placement.QUEUED},
        {"b": 9.0},
        {"b": 9.0},
        JobState.QUEUED,
    )
    assert (j2.submitted_at, j2.placements, j2.queued_at, j2.state) == (
        0.5,
        {"b": Placement.STAGING},
        {},
        JobState.STAGING,
    )
    assert b.waiting_at("b") == {"j1", "j2"}
    assert b.waiting_at("c") == {"j3"}
    assert b.waiting_at("d") == set()
    b.restore(Job("j4", 1), 0.9, {"d": True}, "d", now=2.0)
    assert (b.jobs["j4"].state, b.waiting_at("d")) == (JobState.RUNNING, set())


def test_a_lost_site_gives_up_only_the_expired_placements_there() -> None:
    b = restored()
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 4, 0), d=(4, 2, 0))
    # At 10: j1's lease runs to 14 (it stays), j2's ran out at 6 (it moves), j3 is at c.
    assert b.handle(SiteLost("b"), 10.0, v) == [Dispatch(Job("j2", 1), "c")]
    assert b.jobs["j1"].placements == {"b": Placement.QUEUED}
    assert b.jobs["j3"].placements == {"c": Placement.QUEUED}
    j2 = b.jobs["j2"]
    assert (j2.placements, j2.dispatched_at, j2.queued_at, j2.migrate_to) == (
        {"c": Placement.STAGING},
        {"c": 10.0},
        {},
        {},
    )
    assert b.lease_pending("b") == 14.0
    assert b.handle(SiteLost("b"), 14.0, v) == [Dispatch(Job("j1", 1), "c")]
    assert b.lease_pending("b") is None
    assert (b.jobs["j1"].queued_at, b.jobs["j1"].dispatched_at) == ({}, {"c": 14.0})


def test_a_lost_site_abandons_what_no_other_fits_and_moves_the_rest() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, lease=1.0)
    b.restore(Job("big", 8), 0.0, {"b": True}, None, now=0.0)
    b.restore(Job("small", 1), 0.0, {"b": True}, None, now=0.0)
    v = view(a=(4, 0, 4), b=(8, 8, 0), c=(4, 4, 0))
    assert b.handle(SiteLost("b"), 2.0, v) == [
        Abandon("big", "its site b was lost and no other fits it"),
        Dispatch(Job("small", 1), "c"),
    ]
    assert set(b.jobs) == {"small"}


def test_a_lost_site_skips_a_job_granted_there_and_goes_on_with_the_others() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, lease=1.0)
    b.restore(Job("running", 1), 0.0, {"b": True}, "b", now=0.0)
    b.restore(Job("waiting", 1), 0.0, {"b": True}, None, now=0.0)
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 4, 0))
    assert b.handle(SiteLost("b"), 2.0, v) == [Dispatch(Job("waiting", 1), "c")]
    assert b.jobs["running"].placements == {"b": Placement.QUEUED}


def test_a_replicated_job_whose_sites_are_all_lost_gets_as_many_new_replicas() -> None:
    b, v = replicated()
    assert b.handle(SiteLost("b"), 20.0, v) == []  # c carries on
    assert b.handle(SiteLost("c"), 20.0, v) == [
        Dispatch(Job("j", 1), "d", replica=True),
        Dispatch(Job("j", 1), "a", replica=True),
    ]


def test_a_lost_site_does_not_hold_its_jobs_when_better_sites_are_lost_too() -> None:
    """The best two sites lost, a third fits: the job goes there (not abandoned)."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(), no_transfer, lease=1.0)
    v = view(a=(4, 0, 8), b=(4, 4, 0), c=(4, 3, 0), d=(4, 1, 0))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    assert b.handle(SiteLost("c"), 0.0, v) == []
    assert b.handle(SiteLost("b"), 2.0, v) == [Dispatch(Job("j", 1), "d")]


# -- migration and black-hole penalties ----------------------------------------------------------


def test_a_tick_leaves_a_granted_job_and_moves_the_next_one() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DM), no_transfer, lease=1.0)
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 0, 4))
    for job_id in ("j1", "j2"):
        b.handle(JobSubmitted(Job(job_id, 1)), 0.0, v)
        b.handle(JobQueued(job_id, "b"), 0.5, v)
    # j1's lease ran out: it claims, is granted, and is about to start; j2 still waits.
    assert b.handle(ClaimRequested("j1", "b"), 2.0, v) == [ClaimAnswer("j1", "b", granted=True)]
    assert b.jobs["j1"].state is JobState.QUEUED
    better = view(3.0, a=(4, 0, 4), b=(4, 0, 4), c=(4, 4, 0))
    assert b.handle(Tick(), 3.0, better) == [Withdraw("j2", "b")]


def test_moves_in_one_tick_are_counted_so_they_do_not_herd_to_one_site() -> None:
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DM), no_transfer)
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 0, 4), d=(4, 0, 4))
    for job_id in ("j1", "j2"):
        assert b.handle(JobSubmitted(Job(job_id, 1)), 0.0, v) == [Dispatch(Job(job_id, 1), "b")]
        b.handle(JobQueued(job_id, "b"), 0.5, v)
    freed = view(1.0, a=(4, 0, 4), b=(4, 0, 4), c=(4, 1, 0), d=(4, 1, 0))
    assert b.handle(Tick(), 1.0, freed) == [Withdraw("j1", "b"), Withdraw("j2", "b")]
    assert (b.jobs["j1"].migrate_to, b.jobs["j2"].migrate_to) == ({"b": "c"}, {"b": "d"})


def test_a_move_needs_f_to_improve_by_more_than_epsilon() -> None:
    from gbroker.core.ranking import rank_sites

    v0 = view(a=(1, 1, 0), b=(4, 4, 0), c=(4, 0, 4))
    moved = view(1.0, a=(1, 1, 0), b=(4, 1, 2), c=(4, 2, 0))

    def broker_with(epsilon: float) -> Broker:
        b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DM, epsilon=epsilon), no_transfer)
        b.handle(JobSubmitted(Job("j", 2)), 0.0, v0)
        b.handle(JobQueued("j", "b"), 0.5, v0)
        return b

    probe = broker_with(0.2)
    scores = {s.site: s.value for s in rank_sites(2, probe.candidates(Job("j", 2), moved, "b"))}
    gain = scores["b"] - scores["c"]
    assert gain > 0
    assert broker_with(gain).handle(Tick(), 1.0, moved) == []  # exactly epsilon: stays
    assert broker_with(gain * 0.999).handle(Tick(), 1.0, moved) == [Withdraw("j", "b")]


def suspect_c(algorithm: str = "dm") -> Broker:
    """A broker whose black-hole protection scores c down by 2.0 (excess 0.5, penalty 4)."""
    from gbroker.core.health import HealthPolicy

    policy = HealthPolicy(min_outcomes=1, penalty=4.0)
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm(algorithm)), no_transfer, health=policy)
    assert b.health is not None
    b.health.record("c", False, None, 0.0)
    b.health.record("c", True, 50.0, 0.0)
    b.health.record("b", True, 50.0, 0.0)
    assert b.health.penalties(0.0) == {"c": 2.0}
    return b


def test_a_suspect_site_is_scored_down_in_migration() -> None:
    """F(b) = 2 (it has 1 of the job's 2 cores free; c has 2) and F(c) = 0: worth a move by F
    alone, not once c carries its penalty of 2."""
    v0 = view(a=(1, 1, 0), b=(4, 4, 0), c=(4, 0, 4))
    moved = view(1.0, a=(1, 1, 0), b=(4, 1, 1), c=(4, 2, 0))
    trusting = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DM), no_transfer)
    for b in (trusting, suspect_c()):
        assert b.handle(JobSubmitted(Job("j", 2)), 0.0, v0) == [Dispatch(Job("j", 2), "b")]
        b.handle(JobQueued("j", "b"), 0.5, v0)
    assert trusting.handle(Tick(), 1.0, moved) == [Withdraw("j", "b")]
    assert b.handle(Tick(), 1.0, moved) == []


def test_a_suspect_site_tied_on_penalised_f_loses_to_fresher_data_as_f_ranks() -> None:
    """F(b) = 2; F(c) = 0 plus its penalty 2: a tie, broken as F's own order breaks it: the site
    seen more recently first (c), then the site id."""
    b = suspect_c("dlo")
    v = {
        "a": Observation(SiteState(1, 1, 0), 0.0),
        "b": Observation(SiteState(4, 1, 0), 0.0),
        "c": Observation(SiteState(4, 2, 0), 1.0),
    }
    assert b.handle(JobSubmitted(Job("j", 2)), 1.0, v) == [Dispatch(Job("j", 2), "c")]


def test_a_lost_site_moves_a_lone_job_after_one_whose_other_replica_carries_on() -> None:
    b = Broker(
        "a", ["b", "c", "d"], DispatchPolicy(Algorithm.DR, replicas=2), no_transfer, lease=1.0
    )
    b.restore(Job("both", 1), 0.0, {"b": True, "c": True}, None, now=0.0)
    b.restore(Job("alone", 1), 0.0, {"b": True}, None, now=0.0)
    v = view(a=(4, 0, 4), b=(4, 4, 0), c=(4, 4, 0), d=(4, 2, 0))
    assert b.handle(SiteLost("b"), 2.0, v) == [
        Dispatch(Job("alone", 1), "c", replica=True),
        Dispatch(Job("alone", 1), "d", replica=True),
    ]
    assert b.jobs["both"].placements == {"c": Placement.QUEUED}


def test_the_broker_s_view_keeps_what_shrinking_would_free() -> None:
    """A PWA site's shrinkable cores stay in the view the broker ranks with: when it discounts
    the job's own queue entry (migration), and when its own dispatches take free cores."""
    b = only_b()
    shrinking = {
        "a": Observation(SiteState(1, 1, 0), 0.0),
        "b": Observation(SiteState(8, 2, 1, 3, shrinkable=4), 0.0),
    }
    own = {c.site: c.state for c in b.candidates(Job("j", 2), shrinking, exclude_self_from="b")}
    assert own["b"] == SiteState(8, 2, 0, 3, shrinkable=4)
    idle = {
        "a": Observation(SiteState(1, 1, 0), 0.0),
        "b": Observation(SiteState(8, 4, 0, 2, shrinkable=3), 0.0),
    }
    b.handle(JobSubmitted(Job("k", 2)), 1.0, idle)
    assert seen(b, "b", idle) == SiteState(8, 2, 0, 2, shrinkable=3)  # free cores first
    b.handle(JobSubmitted(Job("m", 4)), 1.0, idle)
    assert seen(b, "b", idle) == SiteState(8, 0, 0, 2, shrinkable=1)  # then shrinkable ones


def test_round_robin_and_random_take_a_site_exactly_as_big_as_the_job() -> None:
    for algorithm in ("roundrobin", "random"):
        b = make(algorithm)
        v = view(a=(2, 2, 0), b=(4, 4, 0), c=(3, 3, 0))
        assert b.handle(JobSubmitted(Job("j", 4)), 0.0, v) == [Dispatch(Job("j", 4), "b")]


# -- the own-dispatch count through moves that cross claims, answers and losses ------------------


def both_moving_to_c() -> tuple[Broker, dict[str, Observation]]:
    """DRM: j's replicas are queued at b and d; a tick moves both to c, the one site that starts
    it at once (each move ranks j without its own count, so the second sees c as the first)."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DRM, replicas=2), no_transfer)
    v = view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 7, 0))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobQueued("j", "d"), 1.0, v)
    moved = view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 8, 0), d=(8, 0, 4))
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b"), Withdraw("j", "d")]
    assert b.jobs["j"].migrate_to == {"b": "c", "d": "c"}
    assert seen(b, "c", moved) == SiteState(8, 7, 0)  # counted once
    return b, moved


def test_a_second_move_to_a_site_the_job_reached_leaves_its_count_there() -> None:
    """b's move lands j at c; d's withdrawal then succeeds, or d claims: j is still staged at
    c, and c counts it until its own withdrawal is answered."""
    for second in (WithdrawAnswered("j", "d", withdrawn=True), ClaimRequested("j", "d")):
        b, v = both_moving_to_c()
        assert b.handle(WithdrawAnswered("j", "b", withdrawn=True), 3.0, v) == [
            Dispatch(Job("j", 1), "c", replica=True)
        ]
        answer = b.handle(second, 4.0, v)
        assert seen(b, "c", v) == SiteState(8, 7, 0)
        if isinstance(second, ClaimRequested):
            assert answer == [ClaimAnswer("j", "d", granted=True), Withdraw("j", "c")]
            assert b.jobs["j"].placements == {"d": Placement.QUEUED, "c": Placement.WITHDRAWING}
            assert b.handle(WithdrawAnswered("j", "c", withdrawn=True), 5.0, v) == []
            assert seen(b, "c", v) == SiteState(8, 8, 0)
        else:
            assert answer == []
            assert b.jobs["j"].placements == {"c": Placement.STAGING}


def test_a_move_that_failed_at_one_replica_leaves_the_other_s_move_to_the_same_site() -> None:
    """b was starting j (its withdrawal fails): c no longer counts j. d's move to c is still in
    flight, after other decisions: d claims (it is granted, b is withdrawn), or d's withdrawal
    succeeds (j goes to c from d)."""
    for second, expected in (
        (
            ClaimRequested("j", "d"),
            [ClaimAnswer("j", "d", granted=True), Withdraw("j", "b")],
        ),
        (
            WithdrawAnswered("j", "d", withdrawn=True),
            [Dispatch(Job("j", 1), "c", replica=True)],
        ),
    ):
        b, v = both_moving_to_c()
        assert b.handle(WithdrawAnswered("j", "b", withdrawn=False), 3.0, v) == []
        assert b.jobs["j"].placements == {"b": Placement.QUEUED, "d": Placement.WITHDRAWING}
        assert seen(b, "c", v) == SiteState(8, 8, 0)
        assert seen(b, "c", v) == SiteState(8, 8, 0)  # a later decision sees the same
        assert b.handle(second, 4.0, v) == expected


def test_a_losing_replica_that_was_moving_no_longer_counts_at_its_target() -> None:
    """b moves j to c; d is granted; b's withdrawal fails (b was claiming too): j runs at d,
    and c, which will never see j, counts it no more."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DRM, replicas=2), no_transfer)
    v = view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 7, 0))
    b.handle(JobSubmitted(Job("j", 1)), 0.0, v)
    b.handle(JobQueued("j", "b"), 1.0, v)
    b.handle(JobQueued("j", "d"), 1.0, v)
    moved = view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 8, 0), d=(8, 8, 1))
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b")]
    assert seen(b, "c", moved) == SiteState(8, 7, 0)
    assert b.handle(ClaimRequested("j", "d"), 3.0, moved) == [ClaimAnswer("j", "d", granted=True)]
    assert b.handle(WithdrawAnswered("j", "b", withdrawn=False), 4.0, moved) == []
    assert seen(b, "c", moved) == SiteState(8, 8, 0)
    assert b.handle(ClaimRequested("j", "b"), 5.0, moved) == [ClaimAnswer("j", "b", granted=False)]


def test_a_move_given_up_with_its_lost_site_no_longer_counts_at_its_target() -> None:
    """j moves from b to c; b is lost past its lease: j goes to d, now the best, and c, which
    will never see j, counts it no more."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DM), no_transfer, lease=10.0)
    b.handle(
        JobSubmitted(Job("j", 1)), 0.0, view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 0, 8))
    )
    b.handle(JobQueued("j", "b"), 1.0, {})
    moved = view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 8, 0), d=(8, 0, 8))
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b")]
    assert seen(b, "c", moved) == SiteState(8, 7, 0)
    later = view(20.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 2, 3), d=(8, 8, 0))
    assert b.handle(SiteLost("b"), 20.0, later) == [Dispatch(Job("j", 1), "d")]
    owned = b.jobs["j"]
    assert (owned.placements, owned.migrate_to, owned.state) == (
        {"d": Placement.STAGING},
        {},
        JobState.STAGING,
    )
    assert seen(b, "c", later) == SiteState(8, 2, 3)
    assert seen(b, "d", later) == SiteState(8, 7, 0)


def test_a_lost_site_back_again_no_longer_counts_the_jobs_given_up_there() -> None:
    b = make("dlo", lease=10.0)
    v = view(a=(4, 0, 3), b=(4, 4, 0), c=(4, 2, 0))
    assert b.handle(JobSubmitted(Job("j", 1)), 0.0, v) == [Dispatch(Job("j", 1), "b")]
    assert seen(b, "b", v) == SiteState(4, 3, 0)
    assert b.handle(SiteLost("b"), 20.0, v) == [Dispatch(Job("j", 1), "c")]
    assert b.handle(SiteBack("b"), 21.0, v) == []
    assert seen(b, "b", v) == SiteState(4, 4, 0)
    assert seen(b, "c", v) == SiteState(4, 1, 0)


def test_a_move_between_sites_tied_on_f_goes_to_the_one_seen_more_recently() -> None:
    """c and d are alike, d seen later: the move goes to d, as F's order breaks ties (fresher
    data first, then the site id)."""
    b = Broker("a", ["b", "c", "d"], DispatchPolicy(Algorithm.DM), no_transfer)
    b.handle(
        JobSubmitted(Job("j", 1)), 0.0, view(a=(8, 0, 8), b=(8, 8, 0), c=(8, 0, 8), d=(8, 0, 8))
    )
    b.handle(JobQueued("j", "b"), 1.0, {})
    moved = {
        **view(2.0, a=(8, 0, 8), b=(8, 0, 4), c=(8, 8, 0)),
        "d": Observation(SiteState(8, 8, 0), 2.5),
    }
    assert b.handle(Tick(), 2.0, moved) == [Withdraw("j", "b")]
    assert b.jobs["j"].migrate_to == {"b": "d"}


def test_a_refusal_after_other_decisions_forgot_the_count_places_the_job_elsewhere() -> None:
    """b had queued j and was seen with it (its count dropped, then b's empty table with the
    next decision, which sent k to a) when it refuses j: j goes to c."""
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer)
    v = view(a=(2, 0, 2), b=(8, 8, 0), c=(8, 4, 0))
    assert b.handle(JobSubmitted(Job("j", 2)), 0.0, v) == [Dispatch(Job("j", 2), "b")]
    b.handle(JobQueued("j", "b"), 1.0, v)
    caught_up = view(2.0, a=(2, 2, 0), b=(8, 6, 0), c=(8, 4, 0))
    assert seen(b, "b", caught_up) == SiteState(8, 6, 0)
    assert b.handle(JobSubmitted(Job("k", 1)), 2.0, caught_up) == [Dispatch(Job("k", 1), "a")]
    assert b.handle(DispatchRefused("j", "b"), 3.0, caught_up) == [Dispatch(Job("j", 2), "c")]
    assert b.jobs["j"].placements == {"c": Placement.STAGING}


def test_a_broker_with_black_hole_protection_lists_candidates_before_any_event() -> None:
    from gbroker.core.health import HealthPolicy

    b = Broker("a", ["b"], DispatchPolicy(), no_transfer, health=HealthPolicy())
    v = view(a=(4, 4, 0), b=(4, 0, 1))
    assert [(c.site, c.state) for c in b.candidates(Job("j", 1), v)] == [
        ("a", SiteState(4, 4, 0)),
        ("b", SiteState(4, 0, 1)),
    ]


def test_a_sites_cpu_availability_survives_the_owners_adjustments() -> None:
    """The owner adjusts a site's state for its own dispatches in flight and for a migrating
    job's own queue entry; the site's published CPU availability stays as it was."""
    b = make("dlo")
    v = {
        "a": Observation(SiteState(4, 0, 1, cpu=0.5), 0.0),
        "b": Observation(SiteState(4, 4, 0, cpu=0.25), 0.0),
        "c": Observation(SiteState(4, 0, 1, cpu=1.0), 0.0),
    }
    assert b.handle(JobSubmitted(Job("j", 1)), 5.0, v) == [Dispatch(Job("j", 1), "b")]
    assert seen(b, "b", v) == SiteState(4, 3, 0, cpu=0.25)  # j counted, its cpu kept
    mine = {c.site: c.state for c in b.candidates(Job("k", 1), v, exclude_self_from="a")}
    assert mine["a"] == SiteState(4, 0, 0, cpu=0.5)
