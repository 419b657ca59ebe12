"""Draining in the core: a draining site is no candidate in F(j); the owner moves its jobs away."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Abandon,
    Algorithm,
    Broker,
    Dispatch,
    DispatchPolicy,
    DispatchRefused,
    JobQueued,
    JobSubmitted,
    PlacementReleased,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.ranking import Candidate, best_sites, rank_sites
from gbroker.core.states import JobState
from gbroker.errors import InvalidInput


def site(n: int, c: int, q: int = 0, draining: bool = False) -> SiteState:
    return SiteState(n, c, q, draining=draining)


def test_a_draining_site_is_in_no_feasible_set_and_weighs_on_no_maximum() -> None:
    # Without d: c_max = 4 and w_max = 2/8. d, draining, has the most free cores and the longest
    # queue; were it counted, F(b) would be 0 + 8/2 + (2/8)/(16/8) = 4.125.
    candidates = [
        Candidate("a", site(8, 4)),  # starts at once: F = 0
        Candidate("b", site(8, 2, 2)),  # waits: F = 0 + 4/2 + (2/8)/(2/8) = 3
        Candidate("d", site(8, 8, 16, draining=True)),
    ]
    scores = rank_sites(4, candidates)
    assert [(s.site, s.value) for s in scores] == [("a", 0.0), ("b", 3.0)]
    rows = [(c.site, c.state, c.transfer_time, c.observed_at) for c in candidates]
    assert best_sites(4, rows, 3) == ["a", "b"]
    assert rank_sites(1, [Candidate("d", site(8, 8, draining=True))]) == []


def view(**sites: SiteState) -> dict[str, Observation]:
    return {name: Observation(state, 0.0) for name, state in sites.items()}


def state(b: Broker, job_id: str) -> JobState:
    return b.jobs[job_id].state


def owner(algorithm: str = "dlo") -> Broker:
    policy = DispatchPolicy(Algorithm(algorithm))
    return Broker("a", ["b", "c"], policy, lambda *_: 0.0, random.Random(3))


@pytest.mark.parametrize("algorithm", ["dlo", "dr", "random", "roundrobin", "worstfit"])
def test_no_algorithm_sends_new_work_to_a_draining_site(algorithm: str) -> None:
    b = owner(algorithm)
    v = view(a=site(8, 0, 4), b=site(8, 2, 1), c=site(8, 8, draining=True))  # c looks best
    targets = set()
    for n in range(6):
        for command in b.handle(JobSubmitted(Job(f"a.{n}", 1)), 1.0, v):
            assert isinstance(command, Dispatch)
            targets.add(command.site)
    assert "c" not in targets


def test_with_every_fitting_site_draining_the_submission_says_so() -> None:
    b = owner()
    v = view(a=site(2, 2), b=site(8, 8, draining=True), c=site(8, 8, draining=True))
    with pytest.raises(InvalidInput, match="draining") as refused:
        b.handle(JobSubmitted(Job("a.1", 4)), 1.0, v)
    assert "b, c" in str(refused.value)
    with pytest.raises(InvalidInput, match="rank"):  # too big for every site: as before
        b.handle(JobSubmitted(Job("a.2", 9)), 1.0, v)


def test_a_refused_dispatch_goes_to_the_next_best_site_or_is_abandoned() -> None:
    b = owner()
    v = view(a=site(8, 0, 3), b=site(8, 8), c=site(8, 4))
    job = Job("a.1", 2)
    assert b.handle(JobSubmitted(job), 1.0, v) == [Dispatch(job, "b")]
    # b turned to draining after we chose it (our view of it is stale): it refuses.
    assert b.handle(DispatchRefused("a.1", "b"), 1.5, v) == [Dispatch(job, "c")]
    assert [s for s in "abc" if b.placed("a.1", s)] == ["c"]
    assert b.handle(DispatchRefused("a.1", "b"), 1.6, v) == []  # a repeat changes nothing
    assert b.handle(DispatchRefused("a.1", "c"), 2.0, v) == [Dispatch(job, "a")]
    assert b.handle(DispatchRefused("a.1", "a"), 2.5, v) == [
        Abandon("a.1", "site a takes no new work and no other site fits it")
    ]
    assert "a.1" not in b.jobs
    # An observation newer than the refusals says b takes work again: b is a candidate again.
    fresh = {**v, "b": Observation(site(8, 8), 3.0)}
    assert b.handle(JobSubmitted(Job("a.2", 1)), 3.5, fresh) == [Dispatch(Job("a.2", 1), "b")]


def test_a_released_job_is_withdrawn_then_dispatched_to_the_best_other_site() -> None:
    b = owner()
    v = view(a=site(8, 0, 3), b=site(8, 8), c=site(8, 0, 1))
    job = Job("a.1", 2)
    assert b.handle(JobSubmitted(job), 1.0, v) == [Dispatch(job, "b")]
    b.handle(JobQueued("a.1", "b"), 2.0, v)
    draining = view(a=site(8, 0, 3), b=site(8, 8, 1, draining=True), c=site(8, 0, 1))
    assert b.handle(PlacementReleased("a.1", "b"), 3.0, draining) == [Withdraw("a.1", "b")]
    assert state(b, "a.1") is JobState.MIGRATING
    assert b.handle(PlacementReleased("a.1", "b"), 3.1, draining) == []  # one withdrawal only
    # c and a both wait: F(c) = 0 + 0 + (1/8)/(3/8) < F(a) = 0 + 0 + 1
    assert b.handle(WithdrawAnswered("a.1", "b", True), 4.0, draining) == [Dispatch(job, "c")]
    assert state(b, "a.1") is JobState.STAGING
    assert [s for s in "abc" if b.placed("a.1", s)] == ["c"]


def test_a_released_job_that_started_meanwhile_stays_and_one_with_nowhere_to_go_stays() -> None:
    b = owner()
    v = view(a=site(1, 1), b=site(8, 8), c=site(1, 1))
    job = Job("a.1", 4)  # only b fits it
    assert b.handle(JobSubmitted(job), 1.0, v) == [Dispatch(job, "b")]
    b.handle(JobQueued("a.1", "b"), 2.0, v)
    assert b.handle(PlacementReleased("a.1", "b"), 3.0, v) == []  # nowhere else: it runs at b
    two = Job("a.2", 1)
    v = view(a=site(8, 0, 3), b=site(8, 8), c=site(8, 0, 1))
    assert b.handle(JobSubmitted(two), 4.0, v) == [Dispatch(two, "b")]
    b.handle(JobQueued("a.2", "b"), 5.0, v)
    assert b.handle(PlacementReleased("a.2", "b"), 6.0, v) == [Withdraw("a.2", "b")]
    assert b.handle(WithdrawAnswered("a.2", "b", False), 7.0, v) == []  # it started first
    assert b.jobs["a.2"].state is JobState.QUEUED
    assert b.placed("a.2", "b")


def test_a_released_replica_is_dropped_while_the_others_carry_on() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DR, replicas=3), lambda *_: 0.0)
    v = view(a=site(8, 8), b=site(8, 8), c=site(8, 8))
    job = Job("a.1", 1)
    assert len(b.handle(JobSubmitted(job), 1.0, v)) == 3  # every site holds a replica
    assert b.handle(PlacementReleased("a.1", "c"), 2.0, v) == [Withdraw("a.1", "c")]
    assert b.handle(WithdrawAnswered("a.1", "c", True), 3.0, v) == []
    assert [s for s in "abc" if b.placed("a.1", s)] == ["a", "b"]


def test_a_release_from_a_site_the_job_is_not_placed_at_changes_nothing() -> None:
    b = owner()
    v = view(a=site(8, 0, 3), b=site(8, 8), c=site(8, 4))
    job = Job("a.1", 1)
    b.handle(JobSubmitted(job), 1.0, v)
    assert b.handle(PlacementReleased("a.1", "c"), 2.0, v) == []
    assert b.handle(PlacementReleased("a.9", "b"), 2.0, v) == []
    assert b.handle(DispatchRefused("a.1", "c"), 2.0, v) == []


site_states = st.builds(
    lambda n, free, q, draining: SiteState(n, min(free, n), q, draining=draining),
    st.integers(1, 16),
    st.integers(0, 16),
    st.integers(0, 5),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["dlo", "dr", "dm", "random", "roundrobin", "worstfit", "closetofiles"]),
    st.fixed_dictionaries({"a": site_states, "b": site_states, "c": site_states}),
    st.integers(1, 16),
)
def test_a_draining_site_is_never_chosen_and_a_fitting_open_one_always_is(
    algorithm: str, states: dict[str, SiteState], rank: int
) -> None:
    b = owner(algorithm)
    open_fits = [s for s, x in states.items() if x.total_cores >= rank and not x.draining]
    try:
        commands = b.handle(JobSubmitted(Job("a.1", rank)), 1.0, view(**states))
    except InvalidInput:
        assert not open_fits
        return
    targets = {c.site for c in commands if isinstance(c, Dispatch)}
    assert targets
    assert targets <= set(open_fits)
