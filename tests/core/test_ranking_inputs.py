"""F(j)'s inputs: the staging term t_j against a forecast that depends on where files are, and
the precise errors for what F(j) cannot take (mutation testing found both untested)."""

from __future__ import annotations

import pytest

from gbroker.core.model import InputFile, SiteState
from gbroker.core.ranking import Candidate, best_sites, rank_sites, staging_time
from gbroker.errors import InvalidInput

# Seconds per byte from each source: a forecast that ignores its source gets these wrong.
PER_BYTE = {"x": 1.0, "y": 10.0, "z": 100.0}


def forecast(source: str, target: str, size: int) -> float:
    return PER_BYTE[source] * size


X1 = InputFile("a", 1, "x")
Y2 = InputFile("b", 2, "y")
AT_J = InputFile("c", 5, "j")  # already at the site: free


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ((X1,), 1.0),  # the one-file shortcut
        ((Y2,), 20.0),
        ((AT_J,), 0.0),
        ([Y2], 20.0),  # a list takes the general path, to the same value
        ((X1, Y2), 21.0),  # two files: both count, not only the first
        ((X1, AT_J, Y2), 21.0),
        ((), 0.0),
    ],
)
def test_t_j_sums_each_file_from_where_it_is(files: tuple[InputFile, ...], expected: float) -> None:
    assert staging_time(files, "j", forecast) == expected


def test_t_j_takes_any_iterable_of_files() -> None:
    assert staging_time((f for f in (Y2,)), "j", forecast) == 20.0
    assert staging_time(iter([X1, Y2]), "j", forecast) == 21.0


def test_a_negative_transfer_time_is_refused_naming_the_candidate() -> None:
    with pytest.raises(InvalidInput) as caught:
        Candidate("s1", SiteState(4, 4, 0, 0), transfer_time=-1.5)
    error = caught.value
    assert (error.field, error.expected, error.found) == (
        "candidate[s1].transfer_time",
        "seconds >= 0",
        -1.5,
    )


@pytest.mark.parametrize("rank", [0, -3])
def test_a_rank_below_one_is_refused_with_the_rank(rank: int) -> None:
    rows = [("s1", SiteState(4, 4, 0, 0), 0.0, 0.0)]
    for decide in (
        lambda: best_sites(rank, rows),
        lambda: rank_sites(rank, [Candidate("s1", SiteState(4, 4, 0, 0))]),
    ):
        with pytest.raises(InvalidInput) as caught:
            decide()
        assert (caught.value.field, caught.value.expected, caught.value.found) == (
            "rank",
            "an integer >= 1",
            rank,
        )


def test_best_sites_gives_the_one_best_by_default() -> None:
    rows = [("s1", SiteState(4, 4, 0, 0), 5.0, 0.0), ("s2", SiteState(4, 4, 0, 0), 1.0, 0.0)]
    assert best_sites(1, rows) == ["s2"]
    assert best_sites(1, rows, how_many=2) == ["s2", "s1"]


def test_a_site_that_can_start_the_job_by_shrinking_counts_those_cores_as_free() -> None:
    """c_j includes the cores a site frees at once by shrinking malleable jobs: 2 free and 4
    shrinkable start a 6-core job now (F = 0); without them it would wait."""
    from gbroker.core.dispatch import Broker, Dispatch, DispatchPolicy, JobSubmitted
    from gbroker.core.model import Job, Observation, SiteState
    from gbroker.core.ranking import Candidate, rank_sites

    shrinking = Candidate("a", SiteState(8, 2, 0, 2, shrinkable=4), 0.0)
    busy = Candidate("b", SiteState(8, 4, 1, 2), 0.0)
    scores = {s.site: s for s in rank_sites(6, [shrinking, busy])}
    assert (scores["a"].value, scores["a"].waits) == (0.0, False)
    assert scores["b"].waits
    # c_max counts them too: b waits with c_max / c_b = 6 / 4.
    assert scores["b"].value == 6 / 4 + 1.0
    plain = Candidate("a", SiteState(8, 2, 0, 2), 0.0)
    assert rank_sites(6, [plain])[0].waits

    def none(src: str, dst: str, size: int) -> float:
        return 0.0

    broker = Broker("b", ["a"], DispatchPolicy(), none)
    view = {
        "a": Observation(shrinking.state, 0.0),
        "b": Observation(busy.state, 0.0),
    }
    assert broker.handle(JobSubmitted(Job("j", 6)), 1.0, view) == [Dispatch(Job("j", 6), "a")]
    # The broker's own dispatch takes the free cores first, then the shrinkable ones.
    (state,) = [c.state for c in broker.candidates(Job("p", 1), view) if c.site == "a"]
    assert state == SiteState(8, 0, 0, 2, shrinkable=0)


def test_an_sd_policy_site_s_mates_count_as_free_only_for_a_job_that_may_share() -> None:
    """Site a is full, but its SD-Policy mates would give 4 cores to a job that may share
    (``shareable``); b has one free core. A 2-core malleable job of any size starts at a at
    once (F = 0; b would wait, c_max / c_b = 4); a rigid one, or a malleable one that accepts
    only powers of two, would wait at either, and b, with a free core, is better. The broker's
    own dispatch to a takes 2 of the 4 from what it shows the next job that may share."""
    from gbroker.core.dispatch import Broker, Dispatch, DispatchPolicy, JobSubmitted
    from gbroker.core.malleable import Malleability, SizeRule
    from gbroker.core.model import Job, JobClass, Observation, SiteState

    def none(src: str, dst: str, size: int) -> float:
        return 0.0

    view = {
        "a": Observation(SiteState(8, 0, 0, 2, shareable=4), 0.0),
        "b": Observation(SiteState(8, 1, 0, 2), 0.0),
    }
    sharing = Job("j", 2, 100.0, JobClass.MALLEABLE, 8)
    power2 = Malleability(sizes=SizeRule.parse("power2"))
    ft = Job("ft", 2, 100.0, JobClass.MALLEABLE, 8, malleability=power2)
    assert sharing.shares_cores
    assert not ft.shares_cores
    for job in (Job("r", 2, 100.0), ft):
        broker = Broker("b", ["a"], DispatchPolicy(), none)
        f = {
            v.site: (v.terms.value, v.terms.waits)
            for v in broker.explain(job, view, 1.0)
            if v.terms
        }
        assert f == {"a": (2.0, True), "b": (1.0, True)}  # c_max = 1: a's c_j is 0
        assert broker.handle(JobSubmitted(job), 1.0, view) == [Dispatch(job, "b")]
    broker = Broker("b", ["a"], DispatchPolicy(), none)
    terms = {v.site: v.terms for v in broker.explain(sharing, view, 1.0)}
    assert terms["a"] is not None
    assert (terms["a"].value, terms["a"].waits) == (0.0, False)
    assert terms["b"] is not None
    assert (terms["b"].value, terms["b"].waits) == (4.0, True)
    assert broker.handle(JobSubmitted(sharing), 1.0, view) == [Dispatch(sharing, "a")]
    again = Job("k", 2, 100.0, JobClass.MALLEABLE, 8)
    (state,) = [c.state for c in broker.candidates(again, view) if c.site == "a"]
    assert state == SiteState(8, 0, 0, 2, shrinkable=2)
    (state,) = [c.state for c in broker.candidates(Job("p", 1), view) if c.site == "a"]
    assert state == SiteState(8, 0, 0, 2)
