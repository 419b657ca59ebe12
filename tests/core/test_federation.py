"""Slurm's federation (gbroker.core.federation): siblings at every site, the origin's lock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    DispatchRefused,
    JobQueued,
    JobSubmitted,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.federation import sibling_sites
from gbroker.core.model import InputFile, Job, Observation, SiteState
from gbroker.core.site import Phase
from gbroker.errors import InvalidInput
from tests.core.reservations import Harness, no_transfer, run_and_settle

MB = 1_000_000


def view(**sites: tuple[int, int, int]) -> dict[str, Observation]:
    """site=(total cores, free cores, queued) observed at t=0."""
    return {name: Observation(SiteState(n, c, q), 0.0) for name, (n, c, q) in sites.items()}


def origin(**kw: object) -> Broker:
    policy = DispatchPolicy(Algorithm.FEDERATION, **kw)  # type: ignore[arg-type]
    return Broker("b", ["c", "a", "d", "e"], policy, no_transfer)  # no generator: none drawn


def test_siblings_go_to_every_eligible_site_the_origin_included() -> None:
    # a is too small for rank 4, d drains, e was never heard from: b (the origin) and c.
    v = view(a=(2, 2, 0), b=(8, 0, 7), c=(8, 8, 0))
    v["d"] = Observation(SiteState(8, 8, 0, draining=True), 0.0)
    job = Job("b.1", 4, input_files=(InputFile("in", 100 * MB, "c"),))
    out = origin().handle(JobSubmitted(job), 0.0, v)
    assert out == [
        Dispatch(job, "b", replica=True, deferred=True),
        Dispatch(job, "c", replica=True, deferred=True),
    ]
    assert sibling_sites(["e", "a", "c"]) == ["a", "c", "e"]


def test_a_single_sibling_still_asks_for_the_lock() -> None:
    v = view(a=(2, 2, 0), b=(2, 2, 0), c=(8, 8, 0))
    job = Job("b.1", 4)
    assert origin().handle(JobSubmitted(job), 0.0, v) == [
        Dispatch(job, "c", replica=True, deferred=True)
    ]


def test_with_stage_reservations_every_sibling_stages_its_inputs() -> None:
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
    job = Job("b.1", 1)
    out = origin(stage_reservations=True).handle(JobSubmitted(job), 0.0, v)
    assert out == [Dispatch(job, s, replica=True) for s in ("a", "b", "c")]


def test_a_job_no_site_can_hold_is_refused() -> None:
    with pytest.raises(InvalidInput, match="rank"):
        origin().handle(JobSubmitted(Job("b.1", 16)), 0.0, view(a=(8, 8, 0), b=(8, 8, 0)))


def test_the_lock_goes_to_the_first_and_the_other_siblings_are_revoked() -> None:
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
    b = origin()
    job = Job("b.1", 2)
    b.handle(JobSubmitted(job), 0.0, v)
    for site in ("a", "b", "c"):
        b.handle(JobQueued(job.id, site), 0.1, v)
    assert b.handle(ClaimRequested(job.id, "c"), 1.0, v) == [
        ClaimAnswer(job.id, "c", granted=True),
        Withdraw(job.id, "a"),
        Withdraw(job.id, "b"),
    ]
    # a's claim crossed its revocation: denied. b's sibling was revoked while still queued.
    assert b.handle(ClaimRequested(job.id, "a"), 1.0, v) == [
        ClaimAnswer(job.id, "a", granted=False)
    ]
    assert b.handle(WithdrawAnswered(job.id, "a", withdrawn=False), 1.1, v) == []
    assert b.handle(WithdrawAnswered(job.id, "b", withdrawn=True), 1.1, v) == []
    assert set(b.jobs[job.id].placements) == {"c"}


def test_a_sibling_site_that_refuses_leaves_the_others_carrying_on() -> None:
    v = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))
    b = origin()
    job = Job("b.1", 2)
    b.handle(JobSubmitted(job), 0.0, v)
    assert b.handle(DispatchRefused(job.id, "a"), 0.1, v) == []  # no new sibling is sent
    assert set(b.jobs[job.id].placements) == {"b", "c"}


def test_a_job_waits_at_every_full_site_and_runs_where_cores_free_first() -> None:
    h = Harness(Algorithm.FEDERATION, {"a": 4, "b": 4, "c": 4}, random.Random(0))
    for site in ("a", "b", "c"):
        h.agents[site].accept(Job(f"{site}.busy", 4), site)
        h._pass(site)
    job = Job("a.1", 4, input_files=(InputFile("in", 10 * MB, "c"),))
    h.submit(job)
    h.deliver_all()
    assert h.hosting(job.id) == dict.fromkeys(("a", "b", "c"), Phase.QUEUED)
    h.finish("b.busy")
    h.deliver_all()
    assert h.fetches == [(job.id, "b")]  # the lock holder alone moves the input
    assert h.where[job.id] == "b"
    assert h.hosting(job.id) == {"b": Phase.RUNNING}  # the others were revoked
    h.finish("a.busy")
    h.finish("c.busy")
    h.deliver_all()
    assert h.launched[job.id] == 1
    assert not any(h.agents[s].local.state().queued for s in ("a", "c"))


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from(["submit", "deliver", "finish"]), st.integers(0, 50))),
    staged=st.booleans(),
)
def test_no_sibling_ever_starts_a_job_twice(steps: list[tuple[str, int]], staged: bool) -> None:
    h = Harness(
        Algorithm.FEDERATION,
        {"a": 3, "b": 2, "c": 4},
        random.Random(0),
        stage_reservations=staged,
    )
    run_and_settle(h, steps)
    if staged:
        assert not h.fetches  # staged at placement: nothing is left to fetch once granted
    else:
        assert len(h.fetches) == len(h.submitted)  # exactly the lock holders fetched
