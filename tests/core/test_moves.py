"""A running job's move between sites, as its owner's core decides it (issue 27): one grant."""

from __future__ import annotations

import random
from itertools import permutations

import pytest

from gbroker.core.dispatch import (
    Broker,
    CancelRequested,
    ClaimAnswer,
    ClaimRequested,
    DispatchPolicy,
    JobFinished,
    JobStarted,
    Kill,
    SiteLost,
    Tick,
    Withdraw,
)
from gbroker.core.model import Job, Observation, SiteState
from gbroker.errors import InvalidInput

V = {s: Observation(SiteState(8, 8, 0), 0.0) for s in ("a", "b", "c")}


def running(at: str = "b") -> Broker:
    """Owner ``a`` of job ``j``, which runs at ``at``."""
    b = Broker("a", ["b", "c"], DispatchPolicy(), lambda s, d, n: 0.0, random.Random(1))
    b.restore(Job("j", 2), 0.0, {at: True}, at, now=1.0)
    return b


def claim(b: Broker, site: str) -> bool:
    [answer] = [
        c for c in b.handle(ClaimRequested("j", site), 2.0, V) if isinstance(c, ClaimAnswer)
    ]
    return answer.granted


def test_a_move_passes_the_grant_once_the_source_froze_the_job() -> None:
    b = running("b")
    assert b.begin_move("j", "c") == "b"
    assert b.move_verdict("j", "b") == "wait"
    assert not claim(b, "c")  # not frozen yet: the target cannot start it
    assert b.move_ready("j", "b", "c")
    assert claim(b, "c")
    assert b.jobs["j"].granted == "c"
    assert not claim(b, "b")  # the source can never start it again
    assert b.move_verdict("j", "b") == "wait"  # until the target has started it
    b.handle(JobStarted("j", "c"), 3.0, V)
    assert b.moving_of("j") is None
    assert b.move_verdict("j", "b") == "release"
    assert b.placed("j", "c")
    assert not b.placed("j", "b")


def test_an_abandoned_move_gives_the_grant_back_and_the_source_resumes() -> None:
    b = running("b")
    b.begin_move("j", "c")
    b.move_ready("j", "b", "c")
    assert claim(b, "c")
    assert b.abandon_move("j") == "c"  # the target could not restore it (it never ran there)
    assert b.jobs["j"].granted == "b"
    assert b.move_verdict("j", "b") == "resume"
    assert not claim(b, "c")  # a late claim of the target is denied
    assert b.placed("j", "b")
    assert not b.placed("j", "c")


def test_a_job_moves_only_when_running_once_at_a_time_and_to_another_known_site() -> None:
    b = running("b")
    with pytest.raises(InvalidInput, match="other than the one"):
        b.begin_move("j", "b")
    with pytest.raises(InvalidInput, match="neighbourhood"):
        b.begin_move("j", "mars")
    b.begin_move("j", "c")
    with pytest.raises(InvalidInput, match="moving to c"):
        b.begin_move("j", "a")
    with pytest.raises(InvalidInput, match="a running job"):
        b.begin_move("nope", "c")
    assert not b.move_ready("j", "b", "a")  # not the move under way


def test_a_cancel_during_a_move_kills_where_the_grant_is_and_the_source_releases() -> None:
    b = running("b")
    b.begin_move("j", "c")
    b.move_ready("j", "b", "c")
    out = b.handle(CancelRequested("j"), 2.0, V)
    assert Kill("j", "b") in out
    assert Withdraw("j", "c") in out
    assert b.move_verdict("j", "b") == "release"


def test_the_job_ending_at_the_target_ends_the_move() -> None:
    b = running("b")
    b.begin_move("j", "c")
    b.move_ready("j", "b", "c")
    claim(b, "c")
    b.handle(JobStarted("j", "c"), 3.0, V)
    b.handle(JobFinished("j", "c", True, 1.0), 4.0, V)
    assert "j" not in b.jobs
    assert b.move_verdict("j", "b") == "release"


def test_a_restored_owner_answers_as_before_its_restart() -> None:
    b = running("b")
    b.restore_move("j", "b", "c", ready=True)
    assert b.move_verdict("j", "b") == "wait"
    assert claim(b, "c")
    after = running("c")  # the grant had passed before the restart: journaled with the target
    after.restore_move("j", "b", "c", ready=True)
    assert after.move_verdict("j", "b") == "wait"
    after.handle(JobStarted("j", "c"), 3.0, V)
    assert after.move_verdict("j", "b") == "release"


@pytest.mark.parametrize(
    "order",
    list(permutations(["claim_target", "abandon", "claim_source", "started_target"])),
)
def test_whatever_the_order_of_events_one_site_at_most_may_run_the_job(
    order: tuple[str, ...],
) -> None:
    # The frozen source resumes only on "resume"; the target starts only with a grant. Never
    # both, in any interleaving of the owner's events.
    b = running("b")
    b.begin_move("j", "c")
    b.move_ready("j", "b", "c")
    target_runs = False
    for event in order:
        if event == "claim_target":
            target_runs = target_runs or claim(b, "c")
        elif event == "abandon" and not target_runs:  # only a target that never ran says so
            b.abandon_move("j")
        elif event == "claim_source":
            claim(b, "b")
        elif event == "started_target" and target_runs:
            b.handle(JobStarted("j", "c"), 3.0, V)
        source_resumes = b.move_verdict("j", "b") == "resume"
        assert not (source_resumes and target_runs)


def test_a_target_lost_before_it_took_the_job_calls_the_move_off_once_its_lease_is_out() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), lambda s, d, n: 0.0, lease=10.0)
    b.restore(Job("j", 2), 0.0, {"b": True}, "b", now=1.0)
    b.begin_move("j", "c")
    b.handle(Tick(), 5.0, V)  # the time of the move's readiness
    b.move_ready("j", "b", "c")
    b.handle(SiteLost("c"), 6.0, V)  # lost: it may still claim on its lease
    assert b.move_verdict("j", "b") == "wait"
    assert b.lease_pending("c") == 15.0
    b.handle(SiteLost("c"), 15.0, V)  # the lease is out: it never took the grant, nor can now
    assert b.moving_of("j") is None
    assert b.move_verdict("j", "b") == "resume"
    assert not claim(b, "c")


def test_a_target_lost_after_it_took_the_job_keeps_it() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), lambda s, d, n: 0.0, lease=10.0)
    b.restore(Job("j", 2), 0.0, {"b": True}, "b", now=1.0)
    b.begin_move("j", "c")
    b.move_ready("j", "b", "c")
    assert claim(b, "c")
    b.handle(SiteLost("c"), 100.0, V)  # it may be restoring it: the move stands
    assert b.jobs["j"].granted == "c"
    assert b.move_verdict("j", "b") == "wait"
