"""Black-hole protection: hand-computed verdicts, a from-scratch reference, the broker's hook."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobStarted,
    JobSubmitted,
    SiteExcluded,
)
from gbroker.core.health import HealthPolicy, SiteHealth
from gbroker.core.model import InputFile, Job, Observation, SiteState
from gbroker.errors import InvalidInput

POLICY = HealthPolicy()  # fast 10 s, window 600 s, 5 outcomes, suspect 0.3, x2, exclude 0.6, 300 s


def feed(health: SiteHealth, site: str, ok: int, fast: int, now: float = 0.0) -> list[object]:
    """``ok`` successes then ``fast`` failures 1 s after start, at ``site``."""
    notices: list[object] = []
    for _ in range(ok):
        notices += health.record(site, True, 3.0, now)
    for _ in range(fast):
        notices += health.record(site, False, 1.0, now)
    return notices


def test_three_fast_failures_in_five_against_a_clean_baseline_exclude_the_site() -> None:
    health = SiteHealth(POLICY)
    feed(health, "a", ok=5, fast=0)
    assert feed(health, "c", ok=2, fast=2) == []  # 4 outcomes: not judged yet
    # p_c = 3/5 = 0.6, p_rest = 0/5: excess 0.6 >= 0.6
    assert feed(health, "c", ok=0, fast=1, now=7.0) == [
        SiteExcluded("c", until=307.0, fast_failures=3, outcomes=5, rate=0.6, baseline=0.0)
    ]
    assert health.excluded(306.9) == {"c"}
    assert health.excluded(307.0) == frozenset()  # the cool-down is over
    assert "c" not in health.records(1.0) or health.records(1.0)["c"].outcomes == 0


def test_a_site_twice_as_bad_as_the_baseline_is_scored_down_by_penalty_times_excess() -> None:
    health = SiteHealth(POLICY)
    feed(health, "a", ok=9, fast=1)  # p_rest = 1/10
    feed(health, "c", ok=3, fast=2)  # p_c = 2/5: excess 0.3
    assert health.penalties(0.0) == pytest.approx({"c": 2 * 0.3})
    assert health.excluded(0.0) == frozenset()
    feed(health, "c", ok=0, fast=1)  # p_c = 3/6 = 0.5: excess 0.4
    assert health.penalties(0.0) == pytest.approx({"c": 0.8})


def test_no_baseline_or_a_job_that_fails_everywhere_judges_no_site() -> None:
    health = SiteHealth(POLICY)
    feed(health, "a", ok=4, fast=0)  # four outcomes elsewhere: no baseline yet
    assert feed(health, "c", ok=0, fast=10) == []
    assert health.penalties(0.0) == {}
    everywhere = SiteHealth(POLICY)
    feed(everywhere, "a", ok=0, fast=6)
    assert feed(everywhere, "c", ok=0, fast=6) == []  # excess 0: the job is broken, not c
    assert everywhere.penalties(0.0) == {}


@pytest.mark.parametrize(
    ("ok", "run_time", "fast"),
    [(False, 10.0, True), (False, 10.01, False), (False, None, True), (True, 0.0, False)],
)
def test_what_counts_as_a_fast_failure(ok: bool, run_time: float | None, fast: bool) -> None:
    assert SiteHealth(POLICY).is_fast_failure(ok, run_time) is fast


def test_outcomes_older_than_the_window_stop_counting() -> None:
    health = SiteHealth(POLICY)
    feed(health, "a", ok=5, fast=0, now=0.0)
    feed(health, "c", ok=3, fast=2, now=0.0)  # excess 0.4: suspect
    assert health.penalties(599.0) == pytest.approx({"c": 0.8})
    assert health.penalties(600.0) == {}  # every outcome is exactly window old: gone
    assert health.records(600.0) == {}


def test_policies_are_validated_and_parsed_naming_the_field() -> None:
    assert HealthPolicy.parse("fast=5, cooldown=60,min_outcomes=3") == HealthPolicy(
        fast=5.0, cooldown=60.0, min_outcomes=3
    )
    assert HealthPolicy.parse("") == HealthPolicy()
    for text, field in (
        ("fast=-1", "black_hole.fast"),
        ("cooldown=0", "black_hole.cooldown"),
        ("min_outcomes=0", "black_hole.min_outcomes"),
        ("suspect_excess=0.7", "black_hole.exclude_excess"),
        ("speed=3", "black_hole"),
        ("fast=soon", "black_hole.fast"),
    ):
        with pytest.raises(InvalidInput, match=field):
            HealthPolicy.parse(text)


# -- an independent reference: recompute everything from the list of outcomes ------------------


@dataclass
class Reference:
    """The module docstring's rules, recomputed from scratch at every step."""

    policy: HealthPolicy
    outcomes: list[tuple[float, str, bool]]
    until: dict[str, float]

    def record(self, site: str, fast: bool, now: float) -> set[str]:
        self.outcomes = [o for o in self.outcomes if o[0] > now - self.policy.window]
        self.outcomes.append((now, site, fast))
        newly: set[str] = set()
        while True:
            found = {
                s
                for s, excess in self.excesses(now).items()
                if excess >= self.policy.exclude_excess
            }
            if not found:
                return newly
            for s in found:
                self.until[s] = now + self.policy.cooldown
                self.outcomes = [o for o in self.outcomes if o[1] != s]
            newly |= found

    def excesses(self, now: float) -> dict[str, float]:
        p = self.policy
        out = {}
        outcomes = [o for o in self.outcomes if o[0] > now - p.window]
        for s in {o[1] for o in outcomes}:
            if self.until.get(s, -1.0) > now:
                continue
            mine = [o[2] for o in outcomes if o[1] == s]
            rest = [o[2] for o in outcomes if o[1] != s]
            if len(mine) >= p.min_outcomes and len(rest) >= p.min_outcomes:
                out[s] = sum(mine) / len(mine) - sum(rest) / len(rest)
        return out

    def penalties(self, now: float) -> dict[str, float]:
        p = self.policy
        return {s: p.penalty * e for s, e in self.excesses(now).items() if e >= p.suspect_excess}


outcome = st.tuples(
    st.floats(0, 200), st.sampled_from("abc"), st.booleans()
)  # (seconds since the last outcome, site, fast failure)


@settings(max_examples=200, deadline=None)
@given(st.lists(outcome, max_size=60))
@example([(0.0, "a", False)] * 5 + [(0.0, "c", True)] * 3 + [(0.0, "c", False)] * 2)
@example([(0.0, "a", True)] * 5 + [(0.0, "c", True)] * 5)
@example([(0.0, "a", False)] * 5 + [(0.0, "c", True)] * 5 + [(300.0, "c", True)] * 5)
def test_site_health_agrees_with_a_from_scratch_reference(
    steps: list[tuple[float, str, bool]],
) -> None:
    policy = HealthPolicy(window=300.0, cooldown=150.0)
    health = SiteHealth(policy)
    reference = Reference(policy, [], {})
    now = 0.0
    for gap, site, fast in steps:
        now += gap  # meanwhile old outcomes aged out and cool-downs ended
        assert health.penalties(now) == pytest.approx(reference.penalties(now))
        notices = health.record(site, not fast, 1.0 if fast else 50.0, now)
        assert {n.site for n in notices} == reference.record(site, fast, now)
        assert health.excluded(now) == {s for s, t in reference.until.items() if t > now}
        assert health.penalties(now) == pytest.approx(reference.penalties(now))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=40))
def test_another_fast_failure_never_lowers_a_sites_penalty(
    steps: list[tuple[str, bool]],
) -> None:
    health = SiteHealth(HealthPolicy())
    for site, fast in steps:
        health.record(site, not fast, 1.0, 0.0)
    before = dict(health.penalties(0.0))
    excluded = health.record("c", False, 1.0, 0.0)
    if not excluded and "c" not in health.excluded(0.0):
        assert health.penalties(0.0).get("c", 0.0) >= before.get("c", 0.0)


# -- the owner broker's hook ------------------------------------------------------------------


def idle(*sites: str) -> dict[str, Observation]:
    return {s: Observation(SiteState(8, 8), 0.0) for s in sites}


def run_job(b: Broker, job_id: str, ok: bool, run_time: float, now: float) -> list[object]:
    """Submit a one-core job, start it where it went, end it: the commands of its end."""
    [dispatch] = b.handle(JobSubmitted(Job(job_id, 1)), now, idle("a", "b", "c"))
    assert isinstance(dispatch, Dispatch)
    b.handle(JobStarted(job_id, dispatch.site), now, idle("a", "b", "c"))
    return list(
        b.handle(JobFinished(job_id, dispatch.site, ok, run_time), now, idle("a", "b", "c"))
    )


def test_the_broker_excludes_a_black_hole_for_its_cool_down_then_takes_it_back() -> None:
    policy = HealthPolicy(min_outcomes=2, cooldown=60.0)
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.ROUNDROBIN), lambda *_: 0.0,
               health=policy)  # fmt: skip
    notices: list[object] = []
    for n in range(6):  # round robin: a, b, c, a, b, c; c's jobs fail at once
        site = "abc"[n % 3]
        notices += run_job(b, f"a.{n}", ok=site != "c", run_time=0.5, now=10.0)
    assert notices == [SiteExcluded("c", 70.0, 2, 2, 1.0, 0.0)]
    went = [b.handle(JobSubmitted(Job(f"a.{n}", 1)), 11.0, idle("a", "b", "c")) for n in (6, 7, 8)]
    assert [d.site for [d] in went if isinstance(d, Dispatch)] == ["a", "b", "a"]
    later = [
        b.handle(JobSubmitted(Job(f"a.{n}", 1)), 70.0, idle("a", "b", "c")) for n in (9, 10, 11)
    ]
    assert "c" in [d.site for [d] in later if isinstance(d, Dispatch)]


def test_a_suspect_site_is_scored_down_in_f() -> None:
    # Files at c: t_c = 0, t_b = t_a = 1 s, so F(c) = 0 < F(b) = 1 until c is suspect.
    policy = HealthPolicy(min_outcomes=2, suspect_excess=0.3, exclude_excess=1.0, penalty=3.0)
    b = Broker("a", ["b", "c"], DispatchPolicy(), lambda src, dst, size: 1.0, health=policy)
    job = Job("a.1", 1, input_files=(InputFile("in", 10, "c"),))
    assert b.handle(JobSubmitted(job), 0.0, idle("a", "b", "c")) == [Dispatch(job, "c")]
    health = b.health
    assert health is not None
    for site, ok in (("a", True), ("a", True), ("c", False), ("c", True)):
        health.record(site, ok, 1.0, 0.0)  # p_c = 1/2, p_rest = 0: penalty 1.5
    second = Job("a.2", 1, input_files=(InputFile("in", 10, "c"),))
    [dispatch] = b.handle(JobSubmitted(second), 0.0, idle("a", "b", "c"))
    assert dispatch == Dispatch(second, "a")  # F(a) = 1 beats 0 + 1.5 (fresher than b)


def test_a_broker_without_a_health_policy_trusts_every_site() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.ROUNDROBIN), lambda *_: 0.0,
               rng=random.Random(1))  # fmt: skip
    notices = [run_job(b, f"a.{n}", ok=False, run_time=0.0, now=0.0) for n in range(12)]
    assert notices == [[]] * 12
