"""F(j) term by term (:func:`gbroker.core.ranking.explain`): what the fleet dashboard shows of a
decision. The terms are the paper's; they must add up to what the decisions rank by."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.model import SiteState
from gbroker.core.ranking import Candidate, explain, rank_sites


def test_explain_gives_each_term_of_the_papers_formula() -> None:
    candidates = [
        Candidate("idle", SiteState(8, 8), transfer_time=2.0, observed_at=1.0),
        Candidate("busy", SiteState(8, 2, queued=4), transfer_time=4.0, observed_at=1.0),
        Candidate("small", SiteState(2, 2), transfer_time=0.0, observed_at=1.0),  # infeasible
    ]
    idle, busy = explain(4, candidates)
    # idle starts at once: t_j/t_max only.
    assert (idle.site, idle.waits, idle.transfer, idle.free, idle.load) == (
        "idle", False, 0.5, 0.0, 0.0
    )  # fmt: skip
    # busy would wait: t_j/t_max + c_max/c_j + w_j/w_max = 4/4 + 8/2 + (4/8)/(4/8).
    assert (busy.waits, busy.transfer, busy.free, busy.load) == (True, 1.0, 4.0, 1.0)
    assert busy.value == 6.0
    assert busy.transfer_time == 4.0


def test_explain_of_no_feasible_site_is_empty() -> None:
    assert explain(16, [Candidate("small", SiteState(2, 2))]) == []


Row = tuple[int, int, int, float, float]


@given(
    st.lists(
        st.tuples(
            st.integers(1, 64),
            st.integers(0, 64),
            st.integers(0, 20),
            st.floats(0, 100, allow_nan=False),
            st.floats(0, 10, allow_nan=False),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 64),
)
def test_explain_agrees_with_rank_sites(rows: list[Row], rank: int) -> None:
    candidates = [
        Candidate(f"s{k}", SiteState(n, min(c, n), q), transfer_time=t, observed_at=at)
        for k, (n, c, q, t, at) in enumerate(rows)
    ]
    explained = explain(rank, candidates)
    ranked = rank_sites(rank, candidates)
    assert [e.site for e in explained] == [s.site for s in ranked]
    for terms, score in zip(explained, ranked, strict=True):
        assert terms.value == score.value
        assert terms.waits == score.waits
        total = terms.transfer + terms.free + terms.load
        assert abs(total - terms.value) <= 1e-9 * max(1.0, terms.value)
