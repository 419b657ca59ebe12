"""The core against references written independently of it (issue 10, item 7).

F(j) is written here again from ARCHITECTURE §2, term by term, without calling
:mod:`gbroker.core.ranking`; hypothesis compares the two over arbitrary neighbourhoods, with the
boundary cases computed by hand pinned as ``@example``s. The owner's one-grant rule is checked
on a restored owner, the path by which a restart could otherwise grant a second site.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    ClaimAnswer,
    ClaimRequested,
    DispatchPolicy,
)
from gbroker.core.model import Job, SiteState
from gbroker.core.ranking import Candidate, rank_sites


def reference_f(rank: int, sites: list[tuple[str, int, int, int, float]]) -> dict[str, float]:
    """F(j) for each feasible site of (name, n_j, c_j, q_j, t_j), from the formula alone.

    S(i) = {j : n_j >= r}. F(j) = t_j/t_max + c_max/c_j + w_j/w_max if c_j < r or q_j > 0,
    else t_j/t_max; a zero maximum makes its term 0; c_j = 0 makes c_max/c_j the finite
    penalty c_max + 1 (ARCHITECTURE §2 leaves the value to us, not its finiteness).
    """
    feasible = [s for s in sites if s[1] >= rank]
    if not feasible:
        return {}
    t_max = max(s[4] for s in feasible)
    c_max = max(s[2] for s in feasible)
    w_max = max(s[3] / s[1] for s in feasible)

    def ratio(x: float, top: float) -> float:
        return 0.0 if top == 0 else x / top

    out = {}
    for name, n, c, q, t in feasible:
        value = ratio(t, t_max)
        if c < rank or q > 0:  # the job would wait
            if c_max == 0:
                free_term = 0.0
            elif c == 0:
                free_term = c_max + 1.0
            else:
                free_term = c_max / c
            value += free_term + ratio(q / n, w_max)
        out[name] = value
    return out


site = st.tuples(
    st.integers(1, 16),  # n_j
    st.integers(0, 16),  # c_j (clipped to n_j below)
    st.integers(0, 5),  # q_j
    st.sampled_from([0.0, 0.5, 1.0, 3.0]),  # t_j
    st.integers(0, 16),  # busy cores shrinking would free (clipped below)
)


@given(rank=st.integers(1, 8), rows=st.lists(site, min_size=1, max_size=6))
# Hand-computed boundaries: free == rank starts at once (F = t_j/t_max = 0 here, not >= 1);
# free == rank - 1 waits; a queue makes even a free site wait; c_j = 0 with c_max = 0.
# c_j counts the cores shrinking would free: 1 free + 3 shrinkable start a 4-core job now.
@example(rank=4, rows=[(8, 4, 0, 0.0, 0), (8, 3, 0, 0.0, 0)])
@example(rank=2, rows=[(4, 2, 1, 0.0, 0), (4, 1, 0, 1.0, 0)])
@example(rank=1, rows=[(2, 0, 0, 0.0, 0), (2, 0, 3, 0.0, 0)])
@example(rank=4, rows=[(8, 1, 0, 0.0, 3), (8, 3, 0, 0.0, 0)])
def test_f_matches_the_formula_written_out(
    rank: int, rows: list[tuple[int, int, int, float, int]]
) -> None:
    states = {}
    for i, (n, c, q, _, k) in enumerate(rows):
        free = min(c, n)
        states[f"s{i}"] = SiteState(n, free, q, shrinkable=min(k, n - free))
    # The formula's c_j: free cores and those shrinking would free, as the site publishes them.
    sites = [
        (name, s.total_cores, s.free_cores + s.shrinkable, s.queued, rows[i][3])
        for i, (name, s) in enumerate(states.items())
    ]
    expected = reference_f(rank, sites)
    scores = rank_sites(rank, [Candidate(s, states[s], t) for s, _, _, _, t in sites])
    assert {score.site: score.value for score in scores} == expected
    for score in scores:  # waiting is exactly "c_j < r or q_j > 0"
        _, _, c, q, _ = next(s for s in sites if s[0] == score.site)
        assert score.waits == (c < rank or q > 0)


def test_hand_computed_f_values_at_the_start_or_wait_boundary() -> None:
    # r = 4. a: 4 free of 8, nothing queued: starts now, F = 0/1 = 0. b: 3 free: waits,
    # F = 0 + c_max/c_b + 0 = 8/3. c: 8 free, 2 queued on 8 cores: waits, F = 0 + 8/8 + 1 = 2.
    scores = rank_sites(
        4,
        [
            Candidate("a", SiteState(8, 4, 0)),
            Candidate("b", SiteState(8, 3, 0)),
            Candidate("c", SiteState(8, 8, 2)),
        ],
    )
    assert [(s.site, s.value, s.waits) for s in scores] == [
        ("a", 0.0, False),
        ("c", 2.0, True),
        ("b", 8 / 3, True),
    ]


def test_a_restored_owner_grants_no_second_claim() -> None:
    """A restarted owner restores a job granted to c: b's claim is denied, c's repeat granted."""
    broker = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.DR, replicas=2), lambda *_: 0.0)
    job = Job("a.1", 2)
    broker.restore(job, 0.0, {"b": True, "c": True}, "c", 10.0)
    assert broker.handle(ClaimRequested("a.1", "b"), 11.0, {}) == [
        ClaimAnswer("a.1", "b", granted=False)
    ]
    assert broker.handle(ClaimRequested("a.1", "c"), 11.0, {}) == [
        ClaimAnswer("a.1", "c", granted=True)
    ]
