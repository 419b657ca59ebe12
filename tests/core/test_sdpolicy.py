"""SD-Policy's malleable backfill decision, against hand-computed cases (ICPP 2019, §3)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.sdpolicy import (
    Mate,
    NewJob,
    RuntimeModel,
    SdDecision,
    SdPolicy,
    Segment,
    average_slowdown,
    guest_cores,
    sd_backfill,
    speed,
)
from gbroker.errors import InvalidInput

# j asks 8 cores (min 4) for 100 s; by static backfill it would start at 300: static_end = 400.
# SharingFactor 0.5: it starts on G = 4 cores, runs 100 * 8/4 = 200 s: mall_end = 200 < 400.
JOB = NewJob("j", asked=8, min_cores=4, requested=100.0, static_start=300.0)
# A gives 4 of 8: increase 200 * 4/8 = 100, penalty (0 + 100 + 1000)/1000 = 1.1.
A = Mate("A", cores=8, min_cores=4, wait=0.0, requested=1000.0, extended=0.0, planned_end=900.0)
# B gives at most 2 of 4: increase 100, penalty (50 + 100 + 100)/100 = 2.5; it ends at 350.
B = Mate("B", cores=4, min_cores=2, wait=50.0, requested=100.0, extended=0.0, planned_end=250.0)
# C is at its minimum: it gives nothing.
C = Mate("C", cores=2, min_cores=2, wait=0.0, requested=100.0, extended=0.0, planned_end=500.0)
# D gives at most 3 of 6: increase 100, penalty (0 + 100 + 500)/500 = 1.2; it ends at 250.
D = Mate("D", cores=6, min_cores=1, wait=0.0, requested=500.0, extended=0.0, planned_end=150.0)
TEN = SdPolicy(10.0)


def test_the_mate_of_least_penalty_gives_what_is_needed() -> None:
    decision = sd_backfill(JOB, [B, C, D, A], 0.0, TEN, 10.0)
    assert decision == SdDecision("j", 4, {"A": 4}, {"A": 8.0}, {"A": 100.0}, {"A": 1.1}, 200, 400)


def test_two_mates_when_no_one_gives_enough_and_the_cheaper_gives_first() -> None:
    """Without A: D (1.2) gives its 3, B the last core: increase 200 * 1/4 = 50, penalty
    (50 + 50 + 100)/100 = 2.0. j's 8 nominal cores split 6 on D's cores, 2 on B's."""
    decision = sd_backfill(JOB, [B, D], 0.0, TEN, 10.0)
    assert decision is not None
    assert (decision.cores, decision.given) == (4, {"D": 3, "B": 1})
    assert decision.nominal == {"D": 6.0, "B": 2.0}
    assert decision.increases == {"D": pytest.approx(100.0), "B": pytest.approx(50.0)}
    assert decision.penalties == {"D": pytest.approx(1.2), "B": pytest.approx(2.0)}
    assert sd_backfill(JOB, [B, D], 0.0, SdPolicy(10.0, max_mates=1), 10.0) is None


def test_the_least_summed_penalty_wins_over_a_single_costly_mate() -> None:
    """One mate F covers all 4 cores but at penalty 6; D + G cost 1.2 + 1.1 = 2.3."""
    f = Mate("F", 8, 4, wait=500.0, requested=100.0, extended=0.0, planned_end=900.0)
    g = Mate("G", 2, 1, wait=0.0, requested=1000.0, extended=0.0, planned_end=900.0)
    # F: increase 200 * 4/8 = 100, p = (500 + 100 + 100)/100 = 7. G gives 1 of 2: increase
    # 200 * 1/2 = 100, p = (0 + 100 + 1000)/1000 = 1.1. D gives 3: 1.2.
    decision = sd_backfill(JOB, [f, g, D], 0.0, TEN, 10.0)
    assert decision is not None
    assert decision.given == {"G": 1, "D": 3}
    assert sum(decision.penalties.values()) == pytest.approx(2.3)


def test_max_slowdown_filters_mates_statically_or_by_the_running_average() -> None:
    assert sd_backfill(JOB, [A], 0.0, TEN, 1.1) is None  # p < MAX_SLOWDOWN, strictly
    assert sd_backfill(JOB, [A], 0.0, TEN, 1.15) is not None
    # The penalty counts what earlier shares already cost a mate.
    shared = Mate("A", 8, 4, wait=0.0, requested=1000.0, extended=100.0, planned_end=900.0)
    assert sd_backfill(JOB, [shared], 0.0, TEN, 1.15) is None  # (100 + 100 + 1000)/1000 = 1.2
    assert shared.slowdown == pytest.approx(1.1)
    # The dynamic cut-off is the mean of the running jobs' predicted slowdowns.
    assert average_slowdown([1.0, 1.5, 1.0]) == pytest.approx(3.5 / 3)
    assert average_slowdown([]) == math.inf
    assert sd_backfill(JOB, [A, B], 0.0, TEN, math.inf) is not None


def test_no_malleable_start_unless_it_ends_before_waiting_would() -> None:
    soon = NewJob("s", asked=8, min_cores=4, requested=100.0, static_start=100.0)  # ends 200
    assert sd_backfill(soon, [A], 0.0, TEN, 10.0) is None  # 200 is not < 200
    later = NewJob("s", asked=8, min_cores=4, requested=100.0, static_start=100.5)
    assert sd_backfill(later, [A], 0.0, TEN, 10.0) is not None
    small = NewJob("t", asked=2, min_cores=2, requested=100.0, static_start=300.0)
    assert sd_backfill(small, [A], 0.0, TEN, 10.0) is None  # it cannot run smaller
    unknown = NewJob("u", asked=8, min_cores=4, requested=math.inf, static_start=300.0)
    assert sd_backfill(unknown, [A], 0.0, TEN, 10.0) is None


def test_the_new_job_must_end_inside_every_mate_s_allocation() -> None:
    # D alone (3 cores) ends at 150 + 100 = 250 >= 200. Planned to end at 99, it would end at
    # 199 with its increase, before j: not a mate.
    early = Mate("D", 6, 1, wait=0.0, requested=500.0, extended=0.0, planned_end=99.0)
    wide = NewJob("w", asked=6, min_cores=3, requested=100.0, static_start=300.0)  # needs 3
    assert sd_backfill(wide, [early], 0.0, TEN, 10.0) is None
    edge = Mate("D", 6, 1, wait=0.0, requested=500.0, extended=0.0, planned_end=100.0)
    decision = sd_backfill(wide, [edge], 0.0, TEN, 10.0)
    assert decision is not None
    assert decision.given == {"D": 3}
    # What a mate really gives decides: E could give 2 (ends 120 + 100 = 220), but after D's 3
    # only 1 is needed, and giving 1 it ends at 120 + 50 = 170, before j's 200.
    e = Mate("E", 4, 2, wait=0.0, requested=100.0, extended=0.0, planned_end=120.0)
    assert sd_backfill(JOB, [D, e], 0.0, TEN, 10.0) is None


def test_a_later_job_s_mates_never_delay_the_head_s_reservation() -> None:
    # protect = the head's shadow time. D (planned 150) would end at 250.
    assert sd_backfill(JOB, [B, D], 0.0, TEN, 10.0, protect=160.0) is None
    assert sd_backfill(JOB, [A, D], 0.0, TEN, 10.0, protect=160.0) is not None  # A ends later
    # With the reservation at 260, D ends by it (250) but B, planned by 250, would end at 300.
    assert sd_backfill(JOB, [B, D], 0.0, TEN, 10.0, protect=260.0) is None
    assert sd_backfill(JOB, [B, D], 0.0, TEN, 10.0, protect=400.0) is not None


def test_the_runtime_models_agree_balanced_and_part_when_a_share_comes_back() -> None:
    # j asked 8 and got 4 of 8 on A's cores: half speed in both models.
    assert speed(RuntimeModel.IDEAL, [Segment("A", 8.0, 4)], 8) == 0.5
    assert speed(RuntimeModel.WORST, [Segment("A", 8.0, 4)], 8) == 0.5
    # D's share (6 nominal) came back whole, B's (2 nominal) is still half: Equation 5 counts
    # its 7 cores of 8, Equation 6 its least used share.
    parts = [Segment(None, 6.0, 6), Segment("B", 2.0, 1)]
    assert speed(RuntimeModel.IDEAL, parts, 8) == pytest.approx(7 / 8)
    assert speed(RuntimeModel.WORST, parts, 8) == 0.5
    assert speed(RuntimeModel.IDEAL, [Segment(None, 4.0, 5)], 4) == 1.0  # never above 1
    assert guest_cores(7, 1, 0.5) == 4  # ceil(3.5)
    assert guest_cores(8, 5, 0.5) == 5  # its minimum


def test_the_policy_is_validated_and_parsed() -> None:
    assert SdPolicy.parse("dynamic").max_slowdown is None
    assert SdPolicy.parse("inf").max_slowdown == math.inf
    assert SdPolicy.parse(" 5 ").max_slowdown == 5.0
    for bad in ("x", "0.5", "nan", ""):
        with pytest.raises(InvalidInput) as caught:
            SdPolicy.parse(bad)
        assert caught.value.field == "sd_policy.max_slowdown"
        assert "a number >= 1 (e.g. 10), inf, or dynamic" in str(caught.value)
    with pytest.raises(InvalidInput, match="sharing_factor"):
        SdPolicy(10.0, sharing_factor=1.0)
    with pytest.raises(InvalidInput, match="max_mates"):
        SdPolicy(10.0, max_mates=0)
    with pytest.raises(InvalidInput, match="runtime_model"):
        SdPolicy(10.0, runtime_model="best")  # type: ignore[arg-type]
    assert SdPolicy(10.0, runtime_model="worst").runtime_model is RuntimeModel.WORST  # type: ignore[arg-type]
    assert str(SdPolicy(None)) == (
        "MAX_SLOWDOWN dynamic, SharingFactor 0.5, m 2, ideal runtime model"
    )


mates = st.lists(
    st.builds(
        Mate,
        job_id=st.text("abcdefgh", min_size=1, max_size=3),
        cores=st.integers(1, 32),
        min_cores=st.integers(1, 8),
        wait=st.floats(0, 1000),
        requested=st.floats(1, 1000),
        extended=st.floats(0, 500),
        planned_end=st.floats(0, 3000),
    ).filter(lambda m: m.min_cores <= m.cores),
    max_size=7,
    unique_by=lambda m: m.job_id,
)


def brute_force(
    job: NewJob, found: list[Mate], policy: SdPolicy, cutoff: float, protect: float | None
) -> float | None:
    """The least summed penalty over every feasible set of mates, by exhaustive search and the
    paper's constraints read afresh: an independent check of sd_backfill's optimum."""
    cores = max(job.min_cores, math.ceil(policy.sharing_factor * job.asked))
    overlap = job.requested * job.asked / cores
    if cores >= job.asked or not 0 + overlap < job.static_start + job.requested:
        return None
    best = None
    for size in range(1, policy.max_mates + 1):
        for chosen in itertools.permutations(found, size):
            offers = [min(math.floor(0.5 * m.cores), m.cores - m.min_cores) for m in chosen]
            p_full = [(m.wait + m.extended + overlap * o / m.cores + m.requested) / m.requested
                      for m, o in zip(chosen, offers, strict=True)]  # fmt: skip
            if any(o <= 0 or p >= cutoff for o, p in zip(offers, p_full, strict=True)):
                continue
            keys = [(p, m.job_id) for p, m in zip(p_full, chosen, strict=True)]
            if keys != sorted(keys):
                continue  # the cheaper mate gives first
            left, total, ok = cores, 0.0, True
            for m, offer in zip(chosen, offers, strict=True):
                take = min(offer, left)
                end = m.planned_end + overlap * take / m.cores
                if take == 0 or end < overlap:
                    ok = False
                if protect is not None and m.planned_end <= protect < end:
                    ok = False
                total += (m.wait + m.extended + overlap * take / m.cores + m.requested) / (
                    m.requested
                )
                left -= take
            if ok and left == 0 and (best is None or total < best - 1e-9):
                best = total
    return best


@given(
    mates,
    st.integers(2, 40),
    st.integers(1, 40),
    st.floats(0, 3000),
    st.sampled_from([1.5, 5.0, 10.0, math.inf]),
    st.one_of(st.none(), st.floats(0, 3000)),
)
def test_a_decision_keeps_every_bound_and_is_the_least_penalty(
    found: list[Mate],
    asked: int,
    low: int,
    static_start: float,
    cutoff: float,
    protect: float | None,
) -> None:
    job = NewJob("j", asked, min(low, asked), 100.0, static_start)
    policy = SdPolicy(cutoff, candidates=64)
    decision = sd_backfill(job, found, 0.0, policy, cutoff, protect)
    expected = brute_force(job, found, policy, cutoff, protect)
    if decision is None:
        assert expected is None
        return
    by_id = {m.job_id: m for m in found}
    assert job.min_cores <= decision.cores < job.asked
    assert sum(decision.given.values()) == decision.cores
    assert len(decision.given) <= 2
    assert decision.mall_end < decision.static_end
    for job_id, cores in decision.given.items():
        mate = by_id[job_id]
        assert 0 < cores <= mate.cores * 0.5
        assert mate.cores - cores >= mate.min_cores
        assert decision.penalties[job_id] < cutoff
        assert mate.planned_end + decision.increases[job_id] >= decision.mall_end
    assert sum(decision.nominal.values()) == pytest.approx(job.asked)
    assert expected is not None
    assert sum(decision.penalties.values()) == pytest.approx(expected)
