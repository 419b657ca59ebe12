"""KOALA's malleability policies and the sizes a job accepts: hand-computed cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.malleable import (
    Malleability,
    MalleabilityPolicy,
    Member,
    Policy,
    Resize,
    SizeKind,
    SizeRule,
    grow,
    shrink,
)
from gbroker.errors import InvalidInput

ANY = SizeRule()
POW2 = SizeRule(SizeKind.POWER2)


# -- the sizes a job accepts --------------------------------------------------------------------


def test_size_rules_parse_and_print() -> None:
    assert SizeRule.parse("any") == ANY
    assert SizeRule.parse("power2") == POW2
    assert SizeRule.parse("multiple:4") == SizeRule(SizeKind.MULTIPLE, step=4)
    assert SizeRule.parse("12, 2,4,4") == SizeRule(SizeKind.LISTED, listed=(2, 4, 12))
    for text in ("any", "power2", "multiple:4", "2,4,12"):
        assert str(SizeRule.parse(text)) == text
    for bad, field in (("multiple:x", "sizes"), ("multiple:0", "sizes.step"), ("2,x", "sizes")):
        with pytest.raises(InvalidInput) as caught:
            SizeRule.parse(bad)
        assert caught.value.field == field
    with pytest.raises(InvalidInput, match="core counts >= 1"):
        SizeRule(SizeKind.LISTED, listed=(0, 2))
    with pytest.raises(InvalidInput, match="1 to 1024 sizes"):
        SizeRule(SizeKind.LISTED, listed=tuple(range(1, 2000)))


@pytest.mark.parametrize(
    ("rule", "lo", "hi", "largest", "smallest"),
    [
        (ANY, 2, 7, 7, 2),
        (POW2, 3, 31, 16, 4),
        (POW2, 5, 7, None, None),
        (SizeRule(SizeKind.MULTIPLE, step=3), 2, 11, 9, 3),
        (SizeRule(SizeKind.LISTED, listed=(2, 6, 10)), 3, 9, 6, 6),
        (SizeRule(SizeKind.LISTED, listed=(2, 6, 10)), 7, 9, None, None),
        (ANY, 5, 4, None, None),
    ],
)
def test_the_largest_and_smallest_accepted_sizes(
    rule: SizeRule, lo: int, hi: int, largest: int | None, smallest: int | None
) -> None:
    assert rule.largest(lo, hi) == largest
    assert rule.smallest(lo, hi) == smallest


def test_what_a_job_takes_of_an_offer_as_koala_s_ft_does() -> None:
    """FT accepts powers of two: offered 5 more at 8 it stays at 8, offered 8 more it takes 16;
    asked to give back 3 of 16 it goes to 8 (it gives back more than asked); its minimum 2
    stops it below."""
    assert POW2.take(8, 13, 2, 32) == 8
    assert POW2.take(8, 16, 2, 32) == 16
    assert POW2.take(8, 40, 2, 32) == 32  # not above its maximum
    assert POW2.take(16, 13, 2, 32) == 8
    assert POW2.take(4, 1, 2, 32) == 2
    assert POW2.take(2, 0, 2, 32) == 2  # at its minimum: it stays
    assert ANY.take(10, 7, 2, 46) == 7  # GADGET2 takes any size
    assert ANY.take(10, 1, 2, 46) == 2
    listed = SizeRule(SizeKind.LISTED, listed=(4, 12))
    assert listed.take(12, 8, 4, 12) == 4  # no accepted size in [4, 8] above 4


def test_a_malleability_declaration_is_validated_naming_the_field() -> None:
    assert Malleability().scheduler_may_resize
    assert not Malleability(initiative="application").scheduler_may_resize  # type: ignore[arg-type]
    for kwargs, field in (
        ({"initiative": "user"}, "malleability.initiative"),
        ({"obligation": "maybe"}, "malleability.obligation"),
        ({"deadline": 0}, "malleability.deadline"),
        ({"reconfiguration_cost": -1}, "malleability.reconfiguration_cost"),
    ):
        with pytest.raises(InvalidInput) as caught:
            Malleability(**kwargs)
        assert caught.value.field == field
    assert MalleabilityPolicy("egs", "pwa", 4).policy is Policy.EGS  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="reserve"):
        MalleabilityPolicy(reserve=-1)


# -- KOALA's policies, hand-computed -----------------------------------------------------------


def jobs(*specs: tuple[str, float, int, int, int]) -> list[Member]:
    """(id, started, cores, min, max), GADGET2-like: any size."""
    return [Member(i, t, n, lo, hi) for i, t, n, lo, hi in specs]


THREE = jobs(("early", 1.0, 4, 2, 10), ("middle", 2.0, 4, 2, 6), ("late", 3.0, 4, 2, 46))


def test_fpsma_grows_the_earliest_started_first_until_the_amount_is_used() -> None:
    # early takes 6 (to its max 10), middle the 2 left it can (to 6), late nothing is left.
    assert grow(Policy.FPSMA, THREE, 8) == [Resize("early", 4, 10), Resize("middle", 4, 6)]
    assert grow(Policy.FPSMA, THREE, 3) == [Resize("early", 4, 7)]
    assert grow(Policy.FPSMA, THREE, 0) == []


def test_fpsma_shrinks_the_latest_started_first() -> None:
    # late gives 2 (to its minimum), then middle the 1 still wanted.
    assert shrink(Policy.FPSMA, THREE, 3) == [Resize("late", 4, 2), Resize("middle", 4, 3)]
    assert shrink(Policy.FPSMA, THREE, 100) == [
        Resize("late", 4, 2),
        Resize("middle", 4, 2),
        Resize("early", 4, 2),
    ]


def test_egs_splits_equally_with_the_remainder_to_the_least_recently_started() -> None:
    # 8 over 3: 2 each, the remainder 2 as a bonus to early and middle; middle takes 2 of 3.
    assert grow(Policy.EGS, THREE, 8) == [
        Resize("early", 4, 7),
        Resize("middle", 4, 6),
        Resize("late", 4, 6),
    ]
    # 2 over 3: nothing each, a bonus of 1 to early and middle.
    assert grow(Policy.EGS, THREE, 2) == [Resize("early", 4, 5), Resize("middle", 4, 5)]


def test_egs_takes_the_remainder_from_the_most_recently_started() -> None:
    assert shrink(Policy.EGS, THREE, 4) == [
        Resize("late", 4, 2),
        Resize("middle", 4, 3),
        Resize("early", 4, 3),
    ]
    assert shrink(Policy.EGS, THREE, 1) == [Resize("late", 4, 3)]


def test_ft_like_jobs_answer_offers_in_powers_of_two() -> None:
    ft = [Member("ft1", 1.0, 4, 2, 32, POW2), Member("ft2", 2.0, 8, 2, 32, POW2)]
    # FPSMA offers 6 to ft1 (4 -> 8 takes 4), then the 2 left to ft2 (8 -> 10: no power of 2).
    assert grow(Policy.FPSMA, ft, 6) == [Resize("ft1", 4, 8)]
    # Asked for 3, ft2 goes to 4 (gives back 4, more than asked): done.
    assert shrink(Policy.FPSMA, ft, 3) == [Resize("ft2", 8, 4)]


def test_ties_in_start_time_are_broken_by_job_id() -> None:
    tied = jobs(("b", 1.0, 2, 1, 8), ("a", 1.0, 2, 1, 8))
    assert grow(Policy.FPSMA, tied, 3) == [Resize("a", 2, 5)]
    assert shrink(Policy.FPSMA, tied, 1) == [Resize("b", 2, 1)]


# -- properties --------------------------------------------------------------------------------

RULES = st.one_of(
    st.just(ANY),
    st.just(POW2),
    st.integers(1, 6).map(lambda k: SizeRule(SizeKind.MULTIPLE, step=k)),
    st.lists(st.integers(1, 64), min_size=1, max_size=6).map(
        lambda sizes: SizeRule(SizeKind.LISTED, listed=tuple(sizes))
    ),
)


@st.composite
def members(draw: st.DrawFn) -> list[Member]:
    out = []
    for k in range(draw(st.integers(1, 6))):
        rule = draw(RULES)
        lo = draw(st.integers(1, 16))
        hi = draw(st.integers(lo, 64))
        cores = draw(st.integers(lo, hi))
        out.append(Member(f"j{k}", draw(st.floats(0, 100)), cores, lo, hi, rule))
    return out


def check(resizes: list[Resize], before: list[Member]) -> dict[str, int]:
    by_id = {m.job_id: m for m in before}
    assert len({r.job_id for r in resizes}) == len(resizes)  # one resize per job at most
    after = {m.job_id: m.cores for m in before}
    for r in resizes:
        m = by_id[r.job_id]
        assert r.old == m.cores != r.cores
        assert m.min_cores <= r.cores <= m.max_cores
        assert m.sizes.accepts(r.cores)
        after[r.job_id] = r.cores
    return after


@given(members(), st.integers(0, 200), st.sampled_from(Policy))
def test_growth_never_exceeds_the_amount_nor_a_job_s_bounds_or_sizes(
    before: list[Member], amount: int, policy: Policy
) -> None:
    resizes = grow(policy, before, amount)
    check(resizes, before)
    assert all(r.delta > 0 for r in resizes)
    assert sum(r.delta for r in resizes) <= amount


@given(members(), st.integers(0, 200), st.sampled_from(Policy))
def test_shrinking_never_takes_a_job_below_its_minimum_nor_to_a_size_it_refuses(
    before: list[Member], amount: int, policy: Policy
) -> None:
    resizes = shrink(policy, before, amount)
    check(resizes, before)
    assert all(r.delta < 0 for r in resizes)


@given(members(), st.integers(1, 200))
def test_fpsma_frees_what_is_asked_as_far_as_the_jobs_can_give_it(
    before: list[Member], amount: int
) -> None:
    freed = -sum(r.delta for r in shrink(Policy.FPSMA, before, amount))
    can_give = sum(m.can_give for m in before)
    assert freed <= can_give
    assert (freed > 0) == (can_give > 0)
    flexible = [Member(m.job_id, m.started, m.cores, m.min_cores, m.max_cores) for m in before]
    # Jobs that take any size give exactly what is asked, down to their minimums.
    freed = -sum(r.delta for r in shrink(Policy.FPSMA, flexible, amount))
    assert freed == min(amount, sum(m.cores - m.min_cores for m in flexible))
    grown = sum(r.delta for r in grow(Policy.FPSMA, flexible, amount))
    assert grown == min(amount, sum(m.max_cores - m.cores for m in flexible))
