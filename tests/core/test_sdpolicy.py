"""SD-Policy's malleable backfill decision, against hand-computed cases (ICPP 2019, §3)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.sdpolicy import (
    Candidate,
    Mate,
    SdDecision,
    SdPolicy,
    average_slowdown,
    sd_backfill,
)
from gbroker.errors import InvalidInput

# Asks 8 cores (min 2) for 100 s; by static backfill it would start at 300: static_end = 400.
JOB = Candidate("j", asked=8, min_cores=2, requested=100.0, static_start=300.0)
A = Mate("A", cores=8, min_cores=2, wait=0.0, requested=1000.0, planned_end=900.0)
B = Mate("B", cores=4, min_cores=1, wait=50.0, requested=100.0, planned_end=150.0)
C = Mate("C", cores=2, min_cores=2, wait=0.0, requested=100.0, planned_end=500.0)
D = Mate("D", cores=6, min_cores=1, wait=0.0, requested=500.0, planned_end=50.0)


def test_the_mate_of_least_penalty_gives_what_is_needed() -> None:
    """SharingFactor 0.5: j runs on 4 cores, 100 * 8/4 = 200 s, so mall_end = 200 < 400. With
    1 core free it needs 3. Overlap 200 s. A gives up to 4: increase 200 * 4/4 = 200, penalty
    (0 + 200 + 1000)/1000 = 1.2. D gives 3: (0 + 200 + 500)/500 = 1.4. B gives 2: (50 + 200 +
    100)/100 = 3.5. C is at its minimum. A alone covers 3 at the least penalty."""
    decision = sd_backfill(JOB, 1, [B, C, D, A], 0.0, SdPolicy(10.0))
    assert decision == SdDecision("j", 4, {"A": 3}, 200.0, 400.0, {"A": 1.2})


def test_two_mates_when_no_one_gives_enough_and_the_cheapest_pair_wins() -> None:
    wide = Candidate("w", asked=14, min_cores=2, requested=100.0, static_start=300.0)
    # 7 cores needed (none free): A (4) + D (3) = 7, penalties 1.2 + 1.4; A + B = 6 is too few.
    decision = sd_backfill(wide, 0, [A, B, D], 0.0, SdPolicy(10.0))
    assert decision is not None
    assert (decision.cores, decision.given) == (7, {"A": 4, "D": 3})
    assert decision.penalties == {"A": pytest.approx(1.2), "D": pytest.approx(1.4)}
    assert sd_backfill(wide, 0, [A, B, D], 0.0, SdPolicy(10.0, max_mates=1)) is None


def test_max_slowdown_filters_mates_statically_or_by_the_running_average() -> None:
    assert sd_backfill(JOB, 1, [A, B, D], 0.0, SdPolicy(1.2)) is None  # p < 1.2: none
    assert sd_backfill(JOB, 1, [A, B, D], 0.0, SdPolicy(1.3)) is not None  # A at 1.2
    # Dynamic: the mean of (wait + req)/req = (1 + 1.5 + 1)/3 = 1.1667: every mate is above it.
    assert average_slowdown([A, B, D], 0.0) == pytest.approx((1 + 1.5 + 1) / 3)
    assert sd_backfill(JOB, 1, [A, B, D], 0.0, SdPolicy(None)) is None
    waited = Mate("W", 8, 2, wait=5000.0, requested=1000.0, planned_end=900.0)  # slowdown 6
    decision = sd_backfill(JOB, 1, [A, waited], 0.0, SdPolicy(None))  # mean 3.5: A is under
    assert decision is not None
    assert decision.given == {"A": 3}
    assert sd_backfill(JOB, 1, [A, B], 0.0, SdPolicy(math.inf)) is not None


def test_no_malleable_start_unless_it_ends_before_waiting_would() -> None:
    soon = Candidate("s", asked=8, min_cores=2, requested=100.0, static_start=50.0)  # ends 150
    assert sd_backfill(soon, 1, [A], 0.0, SdPolicy(10.0)) is None
    small = Candidate("t", asked=2, min_cores=2, requested=100.0, static_start=300.0)
    assert sd_backfill(small, 0, [A], 0.0, SdPolicy(10.0)) is None  # cannot be smaller


def test_the_new_job_must_end_inside_every_mate_s_allocation() -> None:
    # D ends at 50 + its increase 200 = 250 >= 200: eligible. Ending earlier it is not.
    early = Mate("E", cores=6, min_cores=1, wait=0.0, requested=500.0, planned_end=-0.5)
    assert sd_backfill(JOB, 1, [early], 0.0, SdPolicy(10.0)) is None
    edge = Mate("E", cores=6, min_cores=1, wait=0.0, requested=500.0, planned_end=0.0)
    decision = sd_backfill(JOB, 1, [edge], 0.0, SdPolicy(10.0))
    assert decision is not None
    assert decision.given == {"E": 3}


def test_free_cores_enough_at_the_smaller_size_need_no_mate() -> None:
    decision = sd_backfill(JOB, 5, [A], 0.0, SdPolicy(10.0))
    assert decision is not None
    assert (decision.cores, decision.given) == (4, {})


def test_the_policy_is_validated_and_parsed() -> None:
    assert SdPolicy.parse("dynamic").max_slowdown is None
    assert SdPolicy.parse("inf").max_slowdown == math.inf
    assert SdPolicy.parse("5").max_slowdown == 5.0
    for bad, field in (("x", "sd_policy"), ("0.5", "sd_policy.max_slowdown")):
        with pytest.raises(InvalidInput) as caught:
            SdPolicy.parse(bad)
        assert caught.value.field == field
    with pytest.raises(InvalidInput, match="sharing_factor"):
        SdPolicy(10.0, sharing_factor=1.0)
    with pytest.raises(InvalidInput, match="max_mates"):
        SdPolicy(10.0, max_mates=0)


mates = st.lists(
    st.builds(
        Mate,
        job_id=st.text("abcdefgh", min_size=1, max_size=3),
        cores=st.integers(1, 32),
        min_cores=st.integers(1, 8),
        wait=st.floats(0, 1000),
        requested=st.floats(1, 1000),
        planned_end=st.floats(0, 2000),
    ),
    max_size=6,
    unique_by=lambda m: m.job_id,
)


@given(mates, st.integers(0, 16), st.integers(2, 40), st.floats(0, 1000))
def test_a_decision_never_takes_a_mate_below_its_minimum_nor_breaks_the_cutoff(
    found: list[Mate], free: int, asked: int, static_start: float
) -> None:
    job = Candidate("j", asked=asked, min_cores=1, requested=100.0, static_start=static_start)
    decision = sd_backfill(job, free, found, 0.0, SdPolicy(5.0))
    if decision is None:
        return
    by_id = {m.job_id: m for m in found}
    assert decision.mall_end < decision.static_end
    assert len(decision.given) <= 2
    assert free + sum(decision.given.values()) >= decision.cores
    for job_id, cores in decision.given.items():
        mate = by_id[job_id]
        assert 0 < cores <= mate.cores * 0.5
        assert mate.cores - cores >= mate.min_cores
        assert decision.penalties[job_id] < 5.0
