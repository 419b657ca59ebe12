"""F(j) exactly as ARCHITECTURE §2, every branch and every degenerate case."""

from __future__ import annotations

import math
import random

import pytest

from gbroker.core.model import InputFile, SiteState
from gbroker.core.ranking import (
    Candidate,
    best_sites,
    choose_site,
    rank_sites,
    staging_time,
)
from gbroker.errors import InvalidInput


def cand(site: str, n: int, c: int, q: int = 0, t: float = 0.0, seen: float = 0.0) -> Candidate:
    return Candidate(site, SiteState(n, c, q), transfer_time=t, observed_at=seen)


def scores(rank: int, *cands: Candidate) -> dict[str, float]:
    return {s.site: s.value for s in rank_sites(rank, list(cands))}


def test_site_that_can_start_scores_transfer_term_only() -> None:
    got = scores(2, cand("a", 8, 4, t=10.0), cand("b", 8, 8, t=40.0))
    assert got == {"a": pytest.approx(0.25), "b": pytest.approx(1.0)}


def test_waiting_for_cores_adds_free_and_load_terms() -> None:
    # a: c=1 < r=2 -> waits; b: c=8, q=0 -> starts. t_max=40, c_max=8, w_max=max(2/8, 0)=0.25
    got = scores(2, cand("a", 8, 1, q=2, t=10.0), cand("b", 8, 8, t=40.0))
    assert got["a"] == pytest.approx(10 / 40 + 8 / 1 + (2 / 8) / 0.25)
    assert got["b"] == pytest.approx(1.0)


def test_queued_jobs_make_a_site_wait_even_with_free_cores() -> None:
    # a has enough free cores but a queue: F takes the waiting branch.
    got = scores(1, cand("a", 4, 4, q=4, t=0.0), cand("b", 8, 2, q=0, t=0.0))
    # t_max = 0 -> transfer term 0; c_max = 4; w_max = 4/4 = 1
    assert got["a"] == pytest.approx(0 + 4 / 4 + 1.0)
    assert got["b"] == pytest.approx(0.0)
    best = choose_site(1, [cand("a", 4, 4, q=4), cand("b", 8, 2)])
    assert best is not None
    assert best.site == "b"
    assert not best.waits


def test_start_now_scores_at_most_one_and_waiting_at_least_one() -> None:
    ranked = rank_sites(4, [cand("a", 8, 8, t=5.0), cand("b", 8, 2, t=1.0), cand("c", 8, 6, q=1)])
    by_site = {s.site: s for s in ranked}
    assert by_site["a"].value <= 1.0
    assert not by_site["a"].waits
    assert by_site["b"].value >= 1.0
    assert by_site["b"].waits
    assert by_site["c"].waits


def test_zero_free_cores_is_a_large_finite_penalty() -> None:
    got = scores(1, cand("a", 4, 0, t=1.0), cand("b", 4, 1, q=3, t=1.0), cand("c", 4, 3, q=1))
    # c_max = 3: site a pays c_max + 1 = 4, worse than any site with a free core (3/1 = 3 at most)
    assert math.isfinite(got["a"])
    assert got["a"] == pytest.approx(1.0 + 4.0 + 0.0)
    assert got["b"] == pytest.approx(1.0 + 3.0 + 1.0)
    assert got["a"] > 1.0 + 3.0  # the free-cores term of a exceeds b's


def test_no_free_core_anywhere_makes_the_free_term_zero() -> None:
    got = scores(1, cand("a", 4, 0, q=2, t=2.0), cand("b", 4, 0, q=1, t=4.0))
    # c_max = 0 -> term 0; w_max = 0.5
    assert got == {"a": pytest.approx(0.5 + 0 + 1.0), "b": pytest.approx(1.0 + 0 + 0.5)}
    assert all(math.isfinite(v) for v in got.values())


def test_zero_maxima_make_their_terms_zero() -> None:
    # t_max = 0 (all files local) and w_max = 0 (no queues); a waits only for cores.
    got = scores(4, cand("a", 8, 2), cand("b", 8, 8))
    assert got == {"a": pytest.approx(8 / 2), "b": pytest.approx(0.0)}


def test_sites_too_small_for_the_job_are_not_feasible() -> None:
    assert set(scores(16, cand("small", 8, 8), cand("big", 32, 0))) == {"big"}
    assert rank_sites(64, [cand("small", 8, 8)]) == []
    assert choose_site(64, [cand("small", 8, 8)]) is None


def test_ties_break_on_fresher_data_then_lower_site_id() -> None:
    tied = [cand("b", 8, 8, seen=5.0), cand("a", 8, 8, seen=5.0), cand("c", 8, 8, seen=9.0)]
    assert [s.site for s in rank_sites(1, tied)] == ["c", "a", "b"]
    best = choose_site(1, tied)
    assert best is not None
    assert best.site == "c"


def test_choose_site_agrees_with_full_ranking() -> None:
    cands = [cand(f"s{k}", 8, (k * 3) % 9, q=k % 3, t=float(k % 4)) for k in range(12)]
    best = choose_site(2, cands)
    assert best == rank_sites(2, cands)[0]


def test_bad_rank_and_bad_transfer_time_are_rejected() -> None:
    with pytest.raises(InvalidInput, match="rank"):
        rank_sites(0, [cand("a", 4, 4)])
    with pytest.raises(InvalidInput, match="transfer_time"):
        Candidate("a", SiteState(4, 4), transfer_time=float("nan"))


def test_staging_time_sums_remote_files_only() -> None:
    files = [InputFile("in1", 100, "x"), InputFile("in2", 300, "y"), InputFile("in3", 50, "z")]

    def forecast(src: str, dst: str, size: int) -> float:
        return size / 10.0

    assert staging_time(files, "z", forecast) == pytest.approx(40.0)
    assert staging_time([], "z", forecast) == 0.0


def test_staging_time_of_one_file_matches_the_general_sum() -> None:
    def forecast(src: str, dst: str, size: int) -> float:
        return size / 7.0 + (1.0 if dst == "y" else 0.5)

    for file in (InputFile("in", 100, "x"), InputFile("in", 0, "y")):
        for site in ("x", "y", "z"):
            # The tuple of one file takes a short path; a list takes the general one.
            assert staging_time((file,), site, forecast) == staging_time([file], site, forecast)
    assert staging_time((InputFile("in", 100, "x"),), "x", forecast) == 0


@pytest.mark.parametrize("seed", range(40))
def test_best_sites_from_rows_is_rank_sites_order(seed: int) -> None:
    # Random neighbourhoods with frequent ties in F and in freshness, every branch of F.
    rng = random.Random(seed)
    cands = [
        cand(
            f"s{k}",
            n := rng.choice((4, 8, 16)),
            rng.choice((0, n // 2, n)),
            q=rng.choice((0, 0, 1, 3)),
            t=rng.choice((0.0, 0.0, 1.5, 4.0)),
            seen=rng.choice((0.0, 5.0)),
        )
        for k in rng.sample(range(20), rng.randint(1, 8))
    ]
    rows = [(c.site, c.state, c.transfer_time, c.observed_at) for c in cands]
    rank = rng.choice((1, 2, 8, 16, 32))
    ranked = [s.site for s in rank_sites(rank, cands)]
    for how_many in (1, 2, 3, 9):
        assert best_sites(rank, rows, how_many) == ranked[:how_many]


def test_best_sites_rejects_a_bad_rank_and_finds_nothing_infeasible() -> None:
    rows = [("a", SiteState(4, 4), 0.0, 0.0)]
    with pytest.raises(InvalidInput, match="rank"):
        best_sites(0, rows)
    assert best_sites(8, rows) == []
    assert best_sites(8, rows, how_many=2) == []
