"""KOALA's placement policies for co-allocated jobs: hand-computed cases, bad input, invariants."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.coalloc import (
    CoAllocation,
    CoPolicy,
    Offer,
    Placed,
    PlacementFailed,
    PlacementQueue,
    place,
)
from gbroker.errors import InvalidInput

WF, CTF, CM, FCM = CoPolicy.WORST_FIT, CoPolicy.CLOSE_TO_FILES, CoPolicy.CM, CoPolicy.FCM


def offers(**free: int) -> list[Offer]:
    return [Offer(site, n, 128) for site, n in free.items()]


# -- Worst-Fit ------------------------------------------------------------------------------------


def test_worst_fit_puts_each_component_where_most_cores_are_idle_at_that_moment() -> None:
    # A 64, B 40: 16 -> A (48 left); 16 -> A (48 > 40; 32 left); 16 -> B (40 > 32).
    assert place([16, 16, 16], offers(A=64, B=40), WF) == [("A", 16), ("A", 16), ("B", 16)]


def test_worst_fit_places_the_largest_component_first_and_answers_in_the_order_given() -> None:
    # 8 first -> A (10, 2 left); then 5 -> B (6); then 2 -> A? B has 1, A 2: A.
    got = place([2, 8, 5], offers(A=10, B=6), WF)
    assert got == [("A", 2), ("A", 8), ("B", 5)]


def test_worst_fit_fails_when_the_component_does_not_fit_the_emptiest_site() -> None:
    assert place([20], offers(A=16, B=12), WF) is None
    # 10 -> A (6 left); 10 -> B? 12 > 6: B (2 left); 10 -> nowhere.
    assert place([10, 10, 10], offers(A=16, B=12), WF) is None


def test_ties_break_on_the_site_name() -> None:
    assert place([4], offers(B=8, A=8), WF) == [("A", 4)]
    assert place([4], offers(B=8, A=8), CM) == [("A", 4)]
    assert place([4], [Offer("B", 8, 8, 1.0), Offer("A", 8, 8, 1.0)], CTF) == [("A", 4)]


# -- Cluster Minimization -------------------------------------------------------------------------


def test_cluster_minimization_fills_the_fullest_site_before_opening_another() -> None:
    # Same request, same offers as Worst-Fit's first case: CM keeps all three on A (one site).
    assert place([16, 16, 16], offers(A=64, B=40), CM) == [("A", 16), ("A", 16), ("A", 16)]


def test_cluster_minimization_is_first_fit_decreasing_over_the_sites_by_idle_cores() -> None:
    # Sites by idle cores: C 20, A 12, B 9. 12 -> C (8 left); 8 -> C (0); 6 -> A (6); 5 -> B?
    # A has 6: A (first fit in that order).
    got = place([5, 12, 6, 8], offers(A=12, B=9, C=20), CM)
    assert got == [("A", 5), ("C", 12), ("A", 6), ("C", 8)]
    # Worst-Fit spreads the same job over three sites: 12 -> C (8 left); 8 -> A (12; 4 left);
    # 6 -> B (9; 3 left); 5 -> C (8).
    wf = place([5, 12, 6, 8], offers(A=12, B=9, C=20), WF)
    assert wf == [("C", 5), ("C", 12), ("B", 6), ("A", 8)]
    assert len({s for s, _ in got}) == 2
    assert len({s for s, _ in wf}) == 3


def test_cluster_minimization_fails_when_no_first_fit_exists() -> None:
    assert place([7, 7], offers(A=8, B=6), CM) is None


# -- Close-to-Files -------------------------------------------------------------------------------


def test_close_to_files_prefers_the_site_its_files_reach_soonest_among_those_that_fit() -> None:
    sites = [Offer("A", 64, 128, staging=10.0), Offer("B", 40, 128, staging=0.0)]
    # 16 -> B (24 left); 16 -> B (8 left); 16 -> A: B no longer fits it.
    assert place([16, 16, 16], sites, CTF) == [("B", 16), ("B", 16), ("A", 16)]
    assert place([16, 16, 16], sites, WF) == [("A", 16), ("A", 16), ("B", 16)]


def test_close_to_files_skips_a_near_site_that_is_too_small_and_breaks_ties_on_idle_cores() -> None:
    sites = [Offer("A", 4, 8, 0.0), Offer("B", 30, 64, 5.0), Offer("C", 40, 64, 5.0)]
    # 8: A too small; B and C both 5 s away: C has more idle cores.
    assert place([8], sites, CTF) == [("C", 8)]


# -- Flexible Cluster Minimization ----------------------------------------------------------------


def test_fcm_splits_a_flexible_job_over_the_fewest_sites_fullest_first() -> None:
    assert place([10], offers(A=6, B=3, C=8), FCM, flexible=True) == [("C", 8), ("A", 2)]
    # The same total given as other components splits the same way.
    assert place([4, 3, 3], offers(A=6, B=3, C=8), FCM, flexible=True) == [("C", 8), ("A", 2)]
    assert place([8], offers(A=6, B=3, C=8), FCM, flexible=True) == [("C", 8)]


def test_fcm_starts_a_flexible_job_that_no_fixed_placement_fits() -> None:
    for policy in (WF, CTF, CM):
        assert place([10], offers(A=6, B=3, C=8), policy) is None
    assert place([10], offers(A=6, B=3, C=8), FCM) is None  # fixed: placed as CM


def test_fcm_fails_only_when_the_idle_cores_do_not_add_up() -> None:
    assert place([18], offers(A=6, B=3, C=8), FCM, flexible=True) is None
    assert place([17], offers(A=6, B=3, C=8), FCM, flexible=True) == [
        ("C", 8),
        ("A", 6),
        ("B", 3),
    ]


def test_fcm_with_fixed_components_places_them_as_cm() -> None:
    assert place([16, 16, 16], offers(A=64, B=40), FCM) == place(
        [16, 16, 16], offers(A=64, B=40), CM
    )


def test_flexible_is_ignored_by_the_fixed_policies() -> None:
    assert place([16, 16, 16], offers(A=64, B=40), WF, flexible=True) == [
        ("A", 16),
        ("A", 16),
        ("B", 16),
    ]


def test_no_offers_fit_nothing() -> None:
    for policy in CoPolicy:
        assert place([1], [], policy) is None
        assert place([1], [], policy, flexible=True) is None


def test_the_policy_may_be_named_by_its_value() -> None:
    assert place([16, 16, 16], offers(A=64, B=40), "cm") == [("A", 16)] * 3  # type: ignore[arg-type]


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("components", "field"),
    [
        ([], "components"),
        ([4, 0], "components[1]"),
        ([-2], "components[0]"),
        ([True], "components[0]"),
        ([2.5], "components[0]"),
        ("12", "components"),
    ],
)
def test_bad_components_name_the_field(components: object, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        place(components, offers(A=8), WF)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Offer("A", -1, 8), "offer[A].free"),
        (lambda: Offer("A", 9, 8), "offer[A].free"),
        (lambda: Offer("A", 0, 0), "offer[A].total"),
        (lambda: Offer("", 1, 8), "offer.site"),
        (lambda: Offer("A", 1, 8, staging=-1.0), "offer[A].staging"),
        (lambda: Offer("A", 1, 8, staging=float("nan")), "offer[A].staging"),
    ],
)
def test_bad_offers_name_the_field(build: object, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field


def test_a_site_offered_twice_and_an_unknown_policy_are_refused() -> None:
    with pytest.raises(InvalidInput) as info:
        place([1], [Offer("A", 1, 8), Offer("A", 2, 8)], WF)
    assert info.value.field == "offers[1].site"
    with pytest.raises(InvalidInput) as info:
        place([1], offers(A=8), "best-fit")  # type: ignore[arg-type]
    assert info.value.field == "policy"
    assert "worst-fit, close-to-files, cm, fcm" in str(info.value)


# -- invariants -----------------------------------------------------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[int], list[Offer]]:
    components = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
    n = draw(st.integers(0, 6))
    sites = []
    for k in range(n):
        total = draw(st.integers(1, 64))
        free = draw(st.integers(0, total))
        staging = draw(st.floats(0, 100, allow_nan=False))
        sites.append(Offer(f"s{k}", free, total, staging))
    return components, sites


@given(requests(), st.sampled_from(list(CoPolicy)), st.booleans())
def test_a_placement_never_exceeds_a_sites_idle_cores_and_sums_to_the_request(
    request: tuple[list[int], list[Offer]], policy: CoPolicy, flexible: bool
) -> None:
    components, sites = request
    got = place(components, sites, policy, flexible=flexible)
    idle = {o.site: o.free for o in sites}
    if got is None:
        if policy is FCM and flexible:  # FCM fails exactly when the idle cores fall short
            assert sum(idle.values()) < sum(components)
        return
    used = Counter[str]()
    for site, cores in got:
        assert cores >= 1
        used[site] += cores
    assert all(used[s] <= idle[s] for s in used)
    assert sum(cores for _, cores in got) == sum(components)
    if not (policy is FCM and flexible):  # one entry per component, in the order given
        assert [cores for _, cores in got] == components


# -- the owner's placement queue -----------------------------------------------------------------
# (The components' claims, once placed, are the owner's Broker's: tests/core/test_gangs.py.)


def test_coallocation_settings_are_checked() -> None:
    for kwargs, field in (
        ({"policy": "best-fit"}, "coalloc.policy"),
        ({"interval": 0.0}, "coalloc.interval"),
        ({"threshold": -1}, "coalloc.threshold"),
        ({"claim_timeout": -5.0}, "coalloc.claim_timeout"),
        ({"rounds": 0}, "coalloc.rounds"),
        ({"rounds": True}, "coalloc.rounds"),
    ):
        with pytest.raises(InvalidInput) as info:
            CoAllocation(**kwargs)
        assert info.value.field == field
    assert CoAllocation(policy="fcm").policy is FCM  # type: ignore[arg-type]
    assert CoAllocation(interval=30.0).timeout == 30.0
    assert CoAllocation(interval=30.0, claim_timeout=5.0).timeout == 5.0


def test_a_job_that_fits_now_is_placed_at_once_and_leaves_the_queue() -> None:
    queue = PlacementQueue(CoAllocation(CM))
    assert queue.submit("j", [16, 8], offers(A=20, B=10)) == Placed("j", (("A", 16), ("B", 8)), 1)
    assert not queue
    assert queue.tries("j") == 0


def test_a_job_that_does_not_fit_waits_in_the_queue_and_fails_after_the_threshold() -> None:
    queue = PlacementQueue(CoAllocation(WF, threshold=3))
    assert queue.submit("big", [12], offers(A=8)) is None  # try 1
    assert queue.submit("small", [4], offers(A=8)) == Placed("small", (("A", 4),), 1)
    assert list(queue.queue) == ["big"]
    assert queue.scan(lambda _: offers(A=8)) == []  # try 2
    assert queue.tries("big") == 2
    assert queue.scan(lambda _: offers(A=8)) == [PlacementFailed("big", 3)]
    assert not queue
    assert queue.tries("big") == 0  # forgotten


def test_without_a_threshold_a_job_waits_as_long_as_it_takes() -> None:
    queue = PlacementQueue(CoAllocation(WF))
    queue.submit("big", [12], offers(A=8))
    for _ in range(50):
        assert queue.scan(lambda _: offers(A=8)) == []
    assert queue.scan(lambda _: offers(A=12)) == [Placed("big", (("A", 12),), 52)]


def test_a_scan_places_head_first_and_the_cores_it_gives_are_gone_for_the_next() -> None:
    queue = PlacementQueue(CoAllocation(WF))
    queue.submit("a", [6], offers(A=0))
    queue.submit("b", [6], offers(A=0))
    assert list(queue.queue) == ["a", "b"]
    # Both see A with 10 idle: a takes 6, so b sees 4 and waits.
    assert queue.scan(lambda _: offers(A=10)) == [Placed("a", (("A", 6),), 2)]
    assert list(queue.queue) == ["b"]
    assert queue.tries("b") == 2


def test_a_queued_job_id_is_taken_once_and_bad_components_are_named() -> None:
    queue = PlacementQueue(CoAllocation(WF))
    queue.submit("j", [4], offers(A=2))
    with pytest.raises(InvalidInput) as info:
        queue.submit("j", [1], offers(A=4))
    assert info.value.field == "job.id"
    with pytest.raises(InvalidInput) as info:
        queue.submit("k", [0], offers(A=4))
    assert info.value.field == "components[0]"


def test_a_flexible_job_is_split_by_fcm_into_components_of_its_own() -> None:
    queue = PlacementQueue(CoAllocation(FCM))
    assert queue.submit("f", [10], offers(A=6, B=3, C=8), flexible=True) == Placed(
        "f", (("C", 8), ("A", 2)), 1
    )
