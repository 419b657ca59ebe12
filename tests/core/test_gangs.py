"""Co-allocated jobs in the owner's core (issue 28): every component starts, or none does."""

from __future__ import annotations

import random
from itertools import permutations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Abandon,
    Broker,
    BrokerCommand,
    CancelRequested,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    DispatchRefused,
    GangGranted,
    JobSubmitted,
    SiteLost,
    Withdraw,
)
from gbroker.core.model import Gang, Job, Observation, SiteState
from gbroker.core.site import Launch, SiteAgent
from gbroker.errors import InvalidInput

SITES = ("a", "b", "c")
V = {s: Observation(SiteState(8, 8, 0), 0.0) for s in SITES}


def owner(timeout: float = 10.0, rounds: int = 3) -> Broker:
    return Broker(
        "a",
        ["b", "c"],
        DispatchPolicy(),
        lambda s, d, n: 0.0,
        random.Random(1),
        coalloc_timeout=timeout,
        coalloc_rounds=rounds,
    )


def components(b: Broker, sites: tuple[str, ...] = SITES, gang: str = "a.1") -> list[str]:
    ids = []
    for i, site in enumerate(sites):
        job = Job(f"{gang}_{i + 1}", 2, gang=Gang(gang, len(sites), i, site))
        [dispatch] = b.handle(JobSubmitted(job), 0.0, V)
        assert isinstance(dispatch, Dispatch)
        assert dispatch.site == site  # placed with its mates, never re-ranked
        ids.append(job.id)
    return ids


def claim(b: Broker, job_id: str, site: str, now: float) -> tuple[ClaimAnswer, list[BrokerCommand]]:
    out = b.handle(ClaimRequested(job_id, site), now, V)
    [answer] = [c for c in out if isinstance(c, ClaimAnswer) and c.job_id == job_id]
    return answer, [c for c in out if c is not answer]


def test_claims_are_held_until_every_component_has_claimed_then_granted_at_once() -> None:
    b = owner()
    ids = components(b)
    first, _ = claim(b, ids[0], "a", 1.0)
    assert (first.granted, first.wait) == (False, True)
    second, _ = claim(b, ids[1], "b", 2.0)
    assert second.wait
    again, _ = claim(b, ids[0], "a", 2.5)  # a site asks again while it waits
    assert again.wait
    last, rest = claim(b, ids[2], "c", 3.0)
    assert last.granted
    assert rest == [GangGranted("a.1", tuple(zip(ids, SITES, strict=True)))]
    for job_id, site in zip(ids, SITES, strict=True):
        answer, _ = claim(b, job_id, site, 4.0)
        assert answer.granted
        assert b.jobs[job_id].granted == site


@given(st.permutations(range(3)))
def test_whatever_the_order_of_claims_the_last_one_grants_all(order: list[int]) -> None:
    b = owner()
    ids = components(b)
    grants: list[GangGranted] = []
    for n, i in enumerate(order):
        answer, rest = claim(b, ids[i], SITES[i], 1.0 + n)
        assert answer.granted == (n == len(order) - 1)
        grants.extend(c for c in rest if isinstance(c, GangGranted))
    assert len(grants) == 1


def test_a_round_that_does_not_complete_in_time_is_requeued_and_then_fails() -> None:
    b = owner(timeout=10.0, rounds=2)
    ids = components(b)
    claim(b, ids[0], "a", 1.0)
    claim(b, ids[1], "b", 5.0)
    late, _ = claim(b, ids[1], "b", 11.5)  # 10.5 s after the round's first claim
    assert (late.granted, late.requeue) == (False, True)
    told, _ = claim(b, ids[0], "a", 12.0)  # the other held claim learns it too
    assert told.requeue
    # Second round: again only two come.
    claim(b, ids[0], "a", 20.0)
    claim(b, ids[1], "b", 21.0)
    last, rest = claim(b, ids[0], "a", 31.0)
    assert not last.granted
    assert not last.requeue  # the job is given up
    abandoned = {c.job_id for c in rest if isinstance(c, Abandon)}
    assert abandoned == set(ids)
    assert {(c.job_id, c.site) for c in rest if isinstance(c, Withdraw)} == set(
        zip(ids, SITES, strict=True)
    )
    for job_id, site in zip(ids, SITES, strict=True):
        answer, _ = claim(b, job_id, site, 32.0)
        assert not answer.granted  # none of them ever starts
        assert not answer.wait


def test_a_cancelled_job_denies_its_components_claims() -> None:
    b = owner()
    ids = components(b)
    claim(b, ids[0], "a", 1.0)
    for job_id in ids:
        b.handle(CancelRequested(job_id), 2.0, V)
    for job_id, site in zip(ids, SITES, strict=True):
        answer, _ = claim(b, job_id, site, 3.0)
        assert not answer.granted
        assert not answer.wait


def test_one_component_cancelled_denies_the_others_claims() -> None:
    b = owner()
    ids = components(b)
    b.handle(CancelRequested(ids[2]), 1.0, V)
    answer, _ = claim(b, ids[0], "a", 2.0)
    assert not answer.granted
    assert not answer.wait


def test_a_refused_component_fails_the_whole_job() -> None:
    b = owner()
    ids = components(b)
    out = b.handle(DispatchRefused(ids[1], "b"), 1.0, V)
    assert {c.job_id for c in out if isinstance(c, Abandon)} == set(ids)
    assert not b.jobs


def test_a_lost_site_keeps_its_component_placed_there() -> None:
    b = owner()
    ids = components(b)
    assert b.handle(SiteLost("c"), 1e6, V) == []
    assert b.placed(ids[2], "c")
    assert b.lease_pending("c") is None


def test_a_component_placed_outside_the_neighbourhood_is_refused() -> None:
    b = owner()
    job = Job("a.1_1", 1, gang=Gang("a.1", 1, 0, "zz"))
    with pytest.raises(InvalidInput, match="site"):
        b.handle(JobSubmitted(job), 0.0, V)


def test_a_restarted_owner_grants_again_what_it_had_granted() -> None:
    b = owner()
    ids = components(b)
    for i, site in enumerate(SITES):
        claim(b, ids[i], site, 1.0 + i)
    restarted = owner()
    for i, site in enumerate(SITES):
        job = Job(ids[i], 2, gang=Gang("a.1", 3, i, site))
        restarted.restore(job, 0.0, {site: True}, b.jobs[ids[i]].granted, now=5.0)
    for job_id, site in zip(ids, SITES, strict=True):
        answer, _ = claim(restarted, job_id, site, 6.0)
        assert answer.granted


def test_a_site_holds_a_components_cores_while_it_waits_and_requeues_on_request() -> None:
    site = SiteAgent("b", 4)
    job = Job("a.1_2", 3, gang=Gang("a.1", 3, 1, "b"))
    site.accept(job, "a")
    [claim_cmd] = site.schedule(0.0)  # a component always claims, even on a valid lease
    assert not isinstance(claim_cmd, Launch)
    assert site.state().free_cores == 1  # held while the owner decides
    assert site.claim_answered(job.id, False, requeue=True) is None
    assert job.id in site.hosted
    assert site.state().free_cores == 4  # given back meanwhile
    [again] = site.schedule(1.0)
    assert not isinstance(again, Launch)
    launch = site.claim_answered(job.id, True)
    assert isinstance(launch, Launch)
    assert launch.cores == 3


@pytest.mark.parametrize("order", list(permutations(range(3))))
def test_no_order_of_claims_and_timeouts_starts_part_of_a_job(order: tuple[int, ...]) -> None:
    """Claims arrive in every order, some after the round timed out: at every point either
    no component or all of them are granted."""
    b = owner(timeout=1.0, rounds=5)
    ids = components(b)
    now = 0.0
    for _ in range(4):
        for i in order:
            now += 0.6
            claim(b, ids[i], SITES[i], now)
            granted = [b.jobs[j].granted for j in ids if j in b.jobs]
            assert all(g is None for g in granted) or all(g is not None for g in granted)


def test_a_claim_from_a_site_the_component_is_not_placed_at_is_denied() -> None:
    b = owner()
    ids = components(b)
    answer, rest = claim(b, ids[0], "b", 1.0)  # component 0 is placed at a
    assert (answer.granted, answer.wait, answer.requeue) == (False, False, False)
    assert rest == []
    for i, site in enumerate(SITES):  # the real claims still grant all
        answer, _ = claim(b, ids[i], site, 2.0 + i)
    assert answer.granted


def test_offers_are_the_idle_cores_the_owner_sees_less_its_own_dispatches() -> None:
    b = owner()
    view = dict(V)
    view["c"] = Observation(SiteState(8, 8, 0, draining=True), 0.0)
    job = Job("a.9", 4)
    assert [(o.site, o.free, o.total) for o in b.offers(job, view)] == [
        ("a", 8, 8),
        ("b", 8, 8),
    ]  # a draining site takes no work
    b.handle(JobSubmitted(Job("a.1_1", 6, gang=Gang("a.1", 1, 0, "b"))), 0.0, view)
    assert [(o.site, o.free) for o in b.offers(job, view)] == [("a", 8), ("b", 2)]


def test_gang_rounds_counts_the_rounds_that_timed_out_until_the_job_is_granted() -> None:
    b = owner(timeout=10.0, rounds=5)
    ids = components(b)
    assert b.gang_rounds("a.1") == 0
    claim(b, ids[0], "a", 1.0)
    claim(b, ids[0], "a", 12.0)  # the round timed out
    assert b.gang_rounds("a.1") == 1
    claim(b, ids[0], "a", 13.0)
    claim(b, ids[1], "b", 14.0)
    claim(b, ids[2], "c", 15.0)  # all in: granted
    assert b.gang_rounds("a.1") == 0
