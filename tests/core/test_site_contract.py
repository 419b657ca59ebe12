"""The site agent's contract where mutation testing found it untested: errors name the site and
the job, staging hands a replica's flag and lease on, a resumed job is held as it ran, the lease
boundary, and the queue policy a site was given."""

from __future__ import annotations

import pytest

from gbroker.core.model import Job, JobClass
from gbroker.core.site import Claim, Hosted, Launch, Phase, SiteAgent
from gbroker.errors import InvalidInput


def test_finishing_a_job_that_does_not_run_here_names_the_site_and_the_job() -> None:
    site = SiteAgent("Xeon80", 4)
    site.accept(Job("o.1", 1), "o")  # queued, not running
    for job_id in ("o.1", "o.404"):
        with pytest.raises(InvalidInput) as caught:
            site.finished(job_id)
        error = caught.value
        assert (error.field, error.expected, error.found) == (
            "job_id",
            "a job running at site Xeon80",
            job_id,
        )


def test_a_staged_replica_must_claim_and_a_staged_job_keeps_its_lease() -> None:
    site = SiteAgent("s", 4)  # starts on leases
    site.stage("o.1")
    assert site.staged(Job("o.1", 1), "o", replica=True, lease_until=100.0)
    assert "o.1" not in site.staging
    assert site.schedule(0.0) == [Claim("o.1", "o")]  # a replica never starts on a lease
    site.stage("o.2")
    assert site.staged(Job("o.2", 1), "o", lease_until=50.0)
    assert site.hosted["o.2"].lease_until == 50.0
    assert site.stage("o.2") is False  # hosted now, not staging


def test_the_lease_runs_out_at_its_instant() -> None:
    """At ``now == lease_until`` the lease is over: the start needs a claim."""
    site = SiteAgent("s", 4)
    site.accept(Job("o.1", 1), "o", lease_until=10.0)
    assert site.schedule(10.0) == [Claim("o.1", "o")]
    inside = SiteAgent("s", 4)
    inside.accept(Job("o.2", 1), "o", lease_until=10.0)
    assert inside.schedule(9.999) == [Launch(Job("o.2", 1), 1, "o")]


def test_a_resumed_job_is_held_as_it_ran_and_can_finish() -> None:
    site = SiteAgent("s", 8)
    job = Job("o.1", 2, job_class=JobClass.MOLDABLE, max_rank=4)
    assert site.resume_running(job, "o", 3, 5.0)
    assert site.hosted["o.1"] == Hosted(job, "o", False, Phase.RUNNING, 3)
    assert site.state().free_cores == 5
    assert site.resume_running(job, "o", 3, 5.0) is False
    assert site.finished("o.1").cores == 3
    assert site.state().free_cores == 8


@pytest.mark.parametrize(("policy", "backfilled"), [("fcfs", []), ("easy", ["o.c"])])
def test_the_site_keeps_the_queue_policy_it_was_given(policy: str, backfilled: list[str]) -> None:
    """2 of 4 cores run a job for 100 s; a 4-core job waits for them; a 1-core 10 s job fits
    before the wait is over: EASY backfills it, FCFS keeps the order."""
    site = SiteAgent("s", 4, policy)
    site.accept(Job("o.a", 2, requested_time=100.0), "o")
    assert [c.job.id for c in site.schedule(0.0) if isinstance(c, Launch)] == ["o.a"]
    site.accept(Job("o.b", 4, requested_time=100.0), "o")
    site.accept(Job("o.c", 1, requested_time=10.0), "o")
    started = [c.job.id for c in site.schedule(1.0) if isinstance(c, Launch)]
    assert started == backfilled


def test_a_site_with_a_malleability_policy_resizes_and_says_whose_job_it_was() -> None:
    """PWA: two malleable jobs fill the site; a rigid job comes; EGS shrinks both (the
    remainder from the later one), the rigid job launches, and each change names its owner."""
    from gbroker.core.localsched import QueuePolicy
    from gbroker.core.malleable import MalleabilityPolicy
    from gbroker.core.model import JobClass
    from gbroker.core.site import Launch, Resized, SiteAgent

    site = SiteAgent(
        "s",
        16,
        QueuePolicy.FCFS,
        malleability=MalleabilityPolicy("egs", "pwa"),  # type: ignore[arg-type]
    )
    early = Job("early", 2, 100.0, JobClass.MALLEABLE, 8)
    late = Job("late", 2, 100.0, JobClass.MALLEABLE, 8)
    site.accept(early, "o1")
    site.accept(late, "o2")
    assert site.schedule(0.0) == [Launch(early, 8, "o1"), Launch(late, 8, "o2")]
    rigid = Job("rigid", 5, 10.0)
    site.accept(rigid, "o3")
    # 5 needed: 2 each, and the remainder 1 from the most recently started (late).
    assert site.schedule(1.0) == [
        Resized("late", "o2", 8, 5),
        Resized("early", "o1", 8, 6),
        Launch(rigid, 5, "o3"),
    ]
    assert (site.hosted["early"].cores, site.hosted["late"].cores) == (6, 5)
    assert site.state().shrinkable == 7  # what shrinking to their minimums would free now


def test_a_running_malleable_jobs_own_size_is_settled_within_its_bounds_and_the_free_cores() -> (
    None
):
    """What the job took (less than a grow offered, more given back than a shrink asked) or
    asked for (an evolving job) becomes its size: never below its rank, never above its maximum
    or what is free; the change names its owner; nothing when the size stays. A job that took
    less is offered no more growth until it asks."""
    from gbroker.core.localsched import QueuePolicy
    from gbroker.core.malleable import MalleabilityPolicy
    from gbroker.core.site import Resized

    policy = MalleabilityPolicy("fpsma", "pra")  # type: ignore[arg-type]
    site = SiteAgent("s", 8, QueuePolicy.FCFS, malleability=policy)
    job = Job("m", 2, 100.0, JobClass.MALLEABLE, 6)
    site.accept(job, "o")
    assert site.schedule(0.0) == [Launch(job, 6, "o")]
    assert site.took("m", 3, 1.0) == Resized("m", "o", 6, 3)  # it took 3 of the 6
    assert site.hosted["m"].cores == 3
    assert site.state().free_cores == 5
    assert site.schedule(1.5) == []  # PRA offers it no more: it declined
    assert site.took("m", 1, 2.0) == Resized("m", "o", 3, 2)  # not below its rank
    assert site.took("m", 2, 3.0) is None  # its size already
    other = Job("r", 5, 10.0)
    site.accept(other, "p")
    assert site.schedule(4.0) == [Launch(other, 5, "p")]  # 1 core left free
    assert site.request("m", 6, 5.0) == Resized("m", "o", 2, 3)  # asks: grows into what is free
    site.finished("r")
    assert site.schedule(6.0) == [Resized("m", "o", 3, 6)]  # asked: PRA grows it again
    with pytest.raises(InvalidInput, match="a job running at site s"):
        site.took("unknown", 2, 7.0)
    queued = Job("q", 1, 10.0, JobClass.MALLEABLE, 2)
    site.accept(queued, "o")
    with pytest.raises(InvalidInput, match="a job running at site s"):
        site.request("q", 2, 7.0)  # queued, not running


@pytest.mark.parametrize("how", ["took", "request"])
def test_settling_the_size_of_a_job_that_does_not_run_here_names_the_site_and_the_job(
    how: str,
) -> None:
    from gbroker.core.malleable import MalleabilityPolicy

    policy = MalleabilityPolicy("fpsma", "pra")  # type: ignore[arg-type]
    site = SiteAgent("Xeon80", 2, malleability=policy)
    site.accept(Job("o.1", 2, 10.0), "o")
    site.accept(Job("o.2", 1, 10.0, JobClass.MALLEABLE, 2), "o")  # queued behind o.1
    assert [c.job.id for c in site.schedule(0.0) if isinstance(c, Launch)] == ["o.1"]
    for job_id in ("o.2", "o.404"):
        with pytest.raises(InvalidInput) as caught:
            getattr(site, how)(job_id, 2, 1.0)
        error = caught.value
        assert (error.field, error.expected, error.found) == (
            "job_id",
            "a job running at site Xeon80",
            job_id,
        )


def sd_site(model: str, *, claim_every_start: bool = False) -> SiteAgent:
    """A 16-core EASY site with an SD-Policy (cut-off slowdown 10) under a runtime model."""
    from gbroker.core.sdpolicy import SdPolicy

    return SiteAgent(
        "s",
        16,
        "easy",
        claim_every_start=claim_every_start,
        sd_policy=SdPolicy(10.0, runtime_model=model),  # type: ignore[arg-type]
    )


def malleable(job_id: str, lo: int, hi: int, requested: float) -> Job:
    """A malleable job asking ``hi`` cores for ``requested`` seconds (stated on its rank)."""
    return Job(job_id, lo, requested * hi / lo, JobClass.MALLEABLE, hi)


def test_a_site_with_an_sd_policy_launches_a_guest_at_its_effective_cores() -> None:
    """16 cores busy until 1000 (M, malleable 4..8, and rigid R on 8 each). J asks 8 for 100 s:
    M gives it 4 of its 8, and J launches on 4 cores at half speed: 4 cores' worth of its 8."""
    from gbroker.core.site import Resized

    site = sd_site("ideal")
    m, r, j = malleable("M", 4, 8, 1000.0), Job("R", 8, 1000.0), malleable("J", 4, 8, 100.0)
    site.accept(m, "o")
    site.accept(r, "p")
    assert site.schedule(0.0) == [Launch(m, 8, "o"), Launch(r, 8, "p")]
    site.accept(j, "q")
    assert site.schedule(10.0) == [Resized("M", "o", 8, 4), Launch(j, 4, "q", 4.0)]
    assert site.hosted["J"].effective == 4.0


def test_a_claimed_guest_launches_on_the_grant_at_its_effective_cores() -> None:
    """As above, but every start is claimed: the grant's launch carries J's effective cores."""
    site = sd_site("ideal", claim_every_start=True)
    m, r, j = malleable("M", 4, 8, 1000.0), Job("R", 8, 1000.0), malleable("J", 4, 8, 100.0)
    site.accept(m, "o")
    site.accept(r, "p")
    assert site.schedule(0.0) == [Claim("M", "o"), Claim("R", "p")]
    assert site.claim_answered("M", True) == Launch(m, 8, "o")
    assert site.claim_answered("R", True) == Launch(r, 8, "p")
    site.accept(j, "q")
    assert site.schedule(10.0)[-1] == Claim("J", "q")
    assert site.claim_answered("J", True) == Launch(j, 4, "q", 4.0)


def test_a_guest_resized_when_a_mate_ends_carries_its_effective_cores() -> None:
    """J asks 16 for 100 s; M2 and M1 each give it 4 of their 8: it runs on 8 at half speed.
    M1 ends at 50 and J takes back M1's cores: 12 cores, but in the worst-case runtime model
    its share on M2 still runs at half speed, so it works at 8 cores' worth."""
    from gbroker.core.site import Resized

    site = sd_site("worst")
    m1, m2, j = (
        malleable("M1", 4, 8, 300.0),
        malleable("M2", 4, 8, 1000.0),
        malleable("J", 8, 16, 100.0),
    )
    for job in (m1, m2, j):
        site.accept(job, "o")
    assert site.schedule(0.0) == [
        Launch(m1, 8, "o"),
        Launch(m2, 8, "o"),
        Resized("M2", "o", 8, 4),
        Resized("M1", "o", 8, 4),
        Launch(j, 8, "o", 8.0),
    ]
    site.finished("M1")
    assert site.schedule(50.0) == [Resized("J", "o", 8, 12, 8.0)]
    assert (site.hosted["J"].cores, site.hosted["J"].effective) == (12, 8.0)
