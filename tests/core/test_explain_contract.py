"""What :meth:`Broker.explain` and :meth:`Broker.check` promise, value by value: every verdict's
reason and F(j) terms, the order of the candidates (F plus black-hole penalty, then freshness),
and the exact refusal a submission would meet; and :func:`f_terms` term by term."""

from __future__ import annotations

import pytest

import gbroker.core.dispatch as dispatch_module
from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    CancelRequested,
    Dispatch,
    DispatchPolicy,
    DispatchRefused,
    JobQueued,
    JobSubmitted,
    SiteLost,
    Tick,
    Verdict,
    Withdraw,
)
from gbroker.core.health import HealthPolicy
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.ranking import Candidate, Terms, f_terms
from gbroker.core.requirements import Need, Requirements, SiteProperties, Unmet, unmet
from gbroker.errors import InvalidInput

MiB = 1 << 20
GiB = 1 << 30


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


def seen(total: int, free: int, queued: int = 0, at: float = 0.0, **kw: bool) -> Observation:
    return Observation(SiteState(total, free, queued, **kw), at)


def idle_terms(site: str, observed_at: float = 0.0) -> Terms:
    return Terms(site, 0, 0.0, 0.0, 0.0, False, 0.0, observed_at)


# -- f_terms ---------------------------------------------------------------------------------


def test_f_terms_refuses_a_rank_below_one_naming_it() -> None:
    with pytest.raises(InvalidInput) as caught:
        f_terms(0, [Candidate("x", SiteState(4, 4))])
    assert (caught.value.field, caught.value.expected, caught.value.found) == (
        "rank",
        "an integer >= 1",
        0,
    )


def test_f_terms_keep_each_sites_staging_time_and_freshness_and_put_fresher_first_on_a_tie() -> (
    None
):
    candidates = [
        Candidate("x", SiteState(4, 4), 2.0, observed_at=1.0),
        Candidate("y", SiteState(4, 4), 2.0, observed_at=7.0),
        Candidate("z", SiteState(4, 4), 4.0, observed_at=9.0),
    ]
    # t_max = 4 s: x and y tie at F = 0.5; y was seen later, so it comes first.
    assert f_terms(1, candidates) == [
        Terms("y", 2.0, 0.5, 0.0, 0.0, False, 0.5, 7.0),
        Terms("x", 2.0, 0.5, 0.0, 0.0, False, 0.5, 1.0),
        Terms("z", 4.0, 1.0, 0.0, 0.0, False, 1.0, 9.0),
    ]


# -- explain ---------------------------------------------------------------------------------


def test_explain_gives_every_reason_a_site_is_left_out_and_the_feasible_sites_terms() -> None:
    rich = SiteProperties(cores=8, memory_per_core=GiB)
    props = {
        "a": SiteProperties(cores=4, memory_per_core=GiB),
        "b": rich,
        "c": SiteProperties(cores=8, memory_per_core=512 * MiB),  # 2 GiB for 4 cores
        "d": SiteProperties(cores=2, memory_per_core=4 * GiB),
        **{site: rich for site in "efgh"},
    }
    b = Broker("a", list("bcdefgh"), DispatchPolicy(), no_transfer, properties=props)
    view = {
        "a": seen(4, 4),  # exactly the job's rank: it fits
        "b": seen(8, 2, 1),
        "c": seen(8, 8),
        "d": seen(2, 2),
        "e": seen(8, 8, draining=True),
        "h": seen(8, 8, at=2.0),
    }
    b.handle(SiteLost("f"), 1.0, view)
    b.handle(DispatchRefused("elsewhere", "h"), 2.0, view)  # h seen no later than it refused
    job = Job("j", 4, requirements=Requirements(total_memory=4 * GiB))

    # c_max = 4 (a), w_max = 1/8 (b); b waits: F = 4/2 + (1/8)/(1/8) = 3.
    assert b.explain(job, view, 3.0) == [
        Verdict("a", terms=idle_terms("a"), best=True),
        Verdict("b", terms=Terms("b", 0, 0.0, 2.0, 1.0, True, 3.0, 0.0)),
        Verdict(
            "c",
            "total_physical_memory: the job needs >= 4 GiB memory for 4 cores; "
            "site c has 2 GiB memory for 4 cores",
            unmet=Unmet(
                "c",
                Need.TOTAL_MEMORY,
                ">= 4 GiB memory for 4 cores",
                "2 GiB memory for 4 cores",
                0.5,
            ),
        ),
        Verdict("d", "too small: 2 cores", unmet=Unmet("d", Need.CORES, "4 cores", "2")),
        Verdict("e", "draining: it takes no new work"),
        Verdict("f", "lost (offline)"),
        Verdict("g", "no state known yet"),
        Verdict("h", "refused a dispatch (draining); not heard from since"),
    ]
    assert b.jobs == {}


def test_explain_without_site_properties_matches_cores_alone() -> None:
    b = Broker("a", ["b"], DispatchPolicy(), no_transfer)
    job = Job("j", 4, requirements=Requirements(total_memory=4 * GiB))
    assert b.explain(job, {"a": seen(4, 4), "b": seen(2, 2)}, 1.0) == [
        Verdict("a", terms=idle_terms("a"), best=True),
        Verdict("b", "too small: 2 cores", unmet=Unmet("b", Need.CORES, "4 cores", "2")),
    ]


def test_explain_orders_by_f_plus_penalty_then_freshness_and_names_black_holes() -> None:
    policy = HealthPolicy(min_outcomes=2, suspect_excess=0.3, exclude_excess=0.6, penalty=1.0)
    b = Broker("a", ["b", "c", "x"], DispatchPolicy(), no_transfer, health=policy)
    health = b.health
    assert health is not None
    for site, ok in (("a", True), ("a", True), ("x", False), ("x", False)):
        health.record(site, ok, 1.0, 0.0)  # x: every job fails at once; excluded
    for site, ok in (("b", False), ("b", True)):
        health.record(site, ok, 1.0, 0.0)  # b: 1/2 against 0 elsewhere; penalty 1.0 x 0.5
    view = {"a": seen(8, 8), "b": seen(8, 8, at=3.0), "c": seen(8, 8, at=5.0), "x": seen(8, 8)}
    # Every F is 0: c is freshest; b, fresher than a, falls behind it by its penalty.
    assert b.explain(Job("j", 1), view, 1.0) == [
        Verdict("c", terms=idle_terms("c", 5.0), best=True),
        Verdict("a", terms=idle_terms("a")),
        Verdict("b", terms=idle_terms("b", 3.0), penalty=0.5),
        Verdict("x", "excluded as a black hole (its jobs fail fast)"),
    ]


def test_explain_counts_the_owners_other_dispatches_in_flight_but_not_the_jobs_own() -> None:
    b = Broker("a", ["b"], DispatchPolicy(), no_transfer)
    view = {"a": seen(1, 1), "b": seen(8, 8)}
    first, second = Job("j1", 4), Job("j2", 6)
    b.handle(JobSubmitted(first), 1.0, view)
    b.handle(JobSubmitted(second), 1.0, view)  # b looks 4 free after j1: it waits there
    # For j1, b has j2's 6 cores taken (2 free of 4 needed): F = c_max/c_b = 1.
    verdicts = b.explain(first, view, 2.0)
    assert verdicts[0] == Verdict(
        "b", terms=Terms("b", 0, 0.0, 1.0, 0.0, True, 1.0, 0.0), best=True
    )


# -- requirements depend on the job's rank ---------------------------------------------------


def test_memory_in_all_is_matched_for_the_cores_the_job_gets() -> None:
    # Regression: sites were matched for 1 core, so 1 GiB per core never gave 4 GiB in all,
    # and a job of 4 cores needing 4 GiB was refused with an AssertionError.
    props = {s: SiteProperties(cores=8, memory_per_core=GiB) for s in "ab"}
    b = Broker("a", ["b"], DispatchPolicy(), no_transfer, properties=props)
    view = {"a": seen(8, 8), "b": seen(8, 4)}
    fits = Job("j", 4, requirements=Requirements(total_memory=4 * GiB))
    [command] = b.handle(JobSubmitted(fits), 1.0, view)
    assert command == Dispatch(fits, "a")
    too_much = Job("k", 3, requirements=Requirements(total_memory=4 * GiB))
    with pytest.raises(InvalidInput) as caught:
        b.check(too_much, view)
    assert caught.value.field == "job[k].total_physical_memory"
    assert caught.value.expected == (
        "a site of the neighbourhood of a with >= 4 GiB memory for 3 cores"
    )
    assert caught.value.found == "3 GiB memory for 3 cores at site a, the closest of 2"


def test_requirements_are_matched_once_per_set_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(requirements: Requirements | None, site: str, *args: object) -> list[Unmet]:
        calls.append(site)
        return unmet(requirements, site, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(dispatch_module, "unmet", counted)
    props = {s: SiteProperties(cores=8, memory_per_core=GiB) for s in "abc"}
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, properties=props)
    view = {s: seen(8, 8) for s in "abc"}
    needs = Requirements(total_memory=GiB)
    for k in range(5):
        b.handle(JobSubmitted(Job(f"j{k}", 1, requirements=needs)), 1.0, view)
    assert calls == ["a", "b", "c"]
    b.handle(JobSubmitted(Job("wide", 2, requirements=needs)), 1.0, view)
    assert calls == ["a", "b", "c"] * 2


# -- check -----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", [Algorithm.DLO, Algorithm.CENTRAL])
def test_check_takes_a_job_as_big_as_the_biggest_site_and_refuses_one_core_more(
    algorithm: Algorithm,
) -> None:
    b = Broker("a", ["b"], DispatchPolicy(algorithm), no_transfer)
    view = {"a": seen(4, 0, 3), "b": seen(8, 0, 2)}
    b.check(Job("j", 8), view)  # no error
    with pytest.raises(InvalidInput) as caught:
        b.check(Job("j", 9), view)
    assert (caught.value.field, caught.value.expected, caught.value.found) == (
        "job[j].rank",
        "at most the cores of some known site in the neighbourhood",
        9,
    )
    assert b.jobs == {}


def test_check_refuses_a_job_only_draining_sites_are_big_enough_for() -> None:
    b = Broker("a", ["b"], DispatchPolicy(), no_transfer)
    view = {"a": seen(4, 4), "b": seen(8, 8, draining=True)}
    with pytest.raises(InvalidInput) as caught:
        b.check(Job("j", 8), view)
    assert caught.value.field == "job[j]"
    assert caught.value.expected == (
        "a site that takes new work (every site that fits it is draining or excluded "
        "as a black hole: b)"
    )
    # The central queue holds such a job until some site can start it.
    central = Broker("a", ["b"], DispatchPolicy(Algorithm.CENTRAL), no_transfer)
    central.check(Job("j", 8), view)  # no error


def test_check_names_only_the_draining_sites_that_meet_the_requirements() -> None:
    props = {
        "a": SiteProperties(cores=8, memory_per_node=512 * MiB),
        "b": SiteProperties(cores=8, memory_per_node=4 * GiB),
        "c": SiteProperties(cores=8, memory_per_node=256 * MiB),
    }
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, properties=props)
    view = {"a": seen(8, 8), "b": seen(8, 8, draining=True), "c": seen(8, 8)}
    with pytest.raises(InvalidInput) as caught:
        b.check(Job("j", 1, requirements=Requirements(individual_memory=800 * MiB)), view)
    assert caught.value.expected == (
        "a site that takes new work (every site that fits it is draining or excluded "
        "as a black hole: b)"
    )


def test_a_move_given_up_leaves_the_other_moves_to_its_target_counted() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DM, epsilon=0.0), no_transfer)
    before = {"a": seen(1, 1), "b": seen(8, 8), "c": seen(8, 0, 3)}
    for job_id in ("m1", "m2"):
        b.handle(JobSubmitted(Job(job_id, 4)), 1.0, before)
        b.handle(JobQueued(job_id, "b"), 2.0, before)
    after = {"a": seen(1, 1), "b": seen(8, 0, 2, at=3.0), "c": seen(8, 8, at=3.0)}
    assert b.handle(Tick(), 3.0, after) == [Withdraw("m1", "b"), Withdraw("m2", "b")]
    b.handle(CancelRequested("m1"), 3.0, after)  # m1's move to c is given up with it
    # c still expects m2's 4 cores: 4 free of the 8 a job needs. c_max = 4, so F(c) = 1.
    [verdict] = [v for v in b.explain(Job("z", 8), after, 4.0) if v.site == "c"]
    assert verdict.terms == Terms("c", 0, 0.0, 1.0, 0.0, True, 1.0, 3.0)
