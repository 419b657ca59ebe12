from __future__ import annotations

import pytest

from gbroker.core.model import Job
from gbroker.core.site import Claim, Launch, SiteAgent
from gbroker.errors import InvalidInput


def test_ordinary_jobs_launch_replicas_claim_first() -> None:
    site = SiteAgent("s", 8)
    assert site.accept(Job("plain", 4, 10.0), owner="a")
    assert site.accept(Job("rep", 4, 10.0), owner="b", replica=True)
    assert not site.accept(Job("rep", 4, 10.0), owner="b", replica=True)  # duplicate
    out = site.schedule(0.0)
    assert out == [Launch(Job("plain", 4, 10.0), 4, "a"), Claim("rep", "b")]
    assert site.state().free_cores == 0  # the claiming replica holds its cores


def test_a_denied_claim_gives_the_cores_back_and_drops_the_replica() -> None:
    site = SiteAgent("s", 4)
    site.accept(Job("rep", 4, 10.0), owner="b", replica=True)
    site.accept(Job("next", 4, 10.0), owner="a")
    assert site.schedule(0.0) == [Claim("rep", "b")]
    assert site.claim_answered("rep", granted=False) is None
    assert "rep" not in site.hosted
    assert site.schedule(0.1) == [Launch(Job("next", 4, 10.0), 4, "a")]


def test_a_granted_claim_launches_once() -> None:
    site = SiteAgent("s", 4)
    site.accept(Job("rep", 2, 10.0), owner="b", replica=True)
    site.schedule(0.0)
    assert site.claim_answered("rep", granted=True) == Launch(Job("rep", 2, 10.0), 2, "b")
    assert site.claim_answered("rep", granted=True) is None  # a repeated answer starts nothing
    site.finished("rep")
    with pytest.raises(InvalidInput, match="running"):
        site.finished("rep")


def test_withdrawal_succeeds_only_before_the_start() -> None:
    site = SiteAgent("s", 4)
    site.accept(Job("run", 4, 10.0), owner="a")
    site.accept(Job("wait", 4, 10.0), owner="a")
    site.accept(Job("rep", 4, 10.0), owner="b", replica=True)
    site.schedule(0.0)
    assert not site.withdraw("run")
    assert site.withdraw("wait")
    assert not site.withdraw("wait")
    assert not site.withdraw("unknown")
    site.finished("run")
    assert site.schedule(1.0) == [Claim("rep", "b")]
    assert not site.withdraw("rep")  # claiming counts as started


def test_staging_jobs_queue_on_arrival_unless_withdrawn_meanwhile() -> None:
    site = SiteAgent("s", 4)
    assert site.stage("a")
    assert not site.stage("a")  # a repeated dispatch
    assert site.staged(Job("a", 2, 10.0), owner="o")
    assert not site.stage("a")  # now hosted
    assert site.schedule(0.0) == [Launch(Job("a", 2, 10.0), 2, "o")]
    assert site.stage("b")
    assert site.withdraw("b")  # its files are still on the way: always succeeds
    assert not site.staged(Job("b", 1, 10.0), owner="o")  # they arrive: dropped
    assert "b" not in site.hosted
    assert site.stage("c")
    assert site.abandon("c")  # staging failed
    assert not site.abandon("c")
    assert site.stage("d")
    assert site.withdraw("d")
    assert not site.abandon("d")  # withdrawn first: nobody to tell


def test_a_job_whose_lease_ran_out_claims_instead_of_starting() -> None:
    agent = SiteAgent("x", 4)
    agent.accept(Job("fresh", 2), "o", lease_until=10.0)
    agent.accept(Job("stale", 2), "o", lease_until=5.0)
    out = agent.schedule(now=6.0)
    assert out == [Launch(Job("fresh", 2), 2, "o"), Claim("stale", "o")]
    assert agent.claim_answered("stale", granted=False) is None
    assert agent.state().free_cores == 2  # the denied job's cores came back


def test_resume_running_holds_the_cores_of_a_job_taken_back_after_a_restart() -> None:
    agent = SiteAgent("x", 4)
    assert agent.resume_running(Job("r", 3), "o", 3, started_at=1.0)
    assert not agent.resume_running(Job("r", 3), "o", 3, started_at=1.0)
    assert agent.state().free_cores == 1
    agent.accept(Job("q", 2), "o")
    assert agent.schedule(now=2.0) == []
    agent.finished("r")
    assert agent.schedule(3.0) == [Launch(Job("q", 2), 2, "o")]
    with pytest.raises(InvalidInput, match="free cores"):
        agent.resume_running(Job("big", 4), "o", 4, started_at=1.0)


def test_a_job_resized_while_it_claims_launches_on_its_new_size() -> None:
    from gbroker.core.malleable import (
        Malleability,
        MalleabilityPolicy,
        Policy,
        Precedence,
        SizeRule,
    )
    from gbroker.core.model import JobClass

    site = SiteAgent("s", 16, "fcfs", malleability=MalleabilityPolicy(Policy.FPSMA, Precedence.PRA))
    grows = Job(
        "m", 2, 100.0, JobClass.MALLEABLE, 16, malleability=Malleability(SizeRule.parse("any"))
    )
    site.accept(Job("r", 8, 10.0), owner="a")
    site.accept(grows, owner="b", replica=True)
    assert site.schedule(0.0) == [Launch(Job("r", 8, 10.0), 8, "a"), Claim("m", "b")]
    site.finished("r")
    # PRA grows m to 16 cores while its claim is out: nothing runs yet to be resized (the
    # simulator divided by its zero work rate), so it starts on 16 once granted.
    assert site.schedule(1.0) == []
    assert site.claim_answered("m", granted=True) == Launch(grows, 16, "b")
