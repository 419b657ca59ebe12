"""Dynamite's migration decider (SEEDS §002), against hand-computed cases, and its parser."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.dynamite import (
    MigrationPolicy,
    Move,
    RunningJob,
    SiteLoad,
    capacity,
    decide_migrations,
    migration_cost,
    parse_migration_policy,
    remaining_estimate,
)
from gbroker.core.model import SiteState
from gbroker.errors import InvalidInput

MB = 1_000_000


def one_mb_per_second(source: str, target: str, size: int) -> float:
    """NetMon's forecast on a 1 MB/s link: 10 MB take 10 s."""
    return size / MB


# T = 0.5, checkpoint and restore at 1 MB/s, C_j = 0.5 (free cores) + 0.5 (speed).
POLICY = MigrationPolicy(
    threshold=0.5, interval=60.0, min_remaining=100.0, checkpoint_rate=MB, restore_rate=MB
)
# A is full and slowed to 0.25 by background load: C_A = 0.5*0 + 0.5*0.25 = 0.125, L_A = 0.875.
SLOW = SiteLoad("A", SiteState(4, 0, running=2), speed=0.25)
# B is idle at full speed: C_B = 0.5*1 + 0.5*1 = 1.
FAST = SiteLoad("B", SiteState(4, 4), speed=1.0)
# j1: 2 cores, 1000 s left at A's speed; 10 MB: cost 10 (dump) + 10 (transfer) + 10 (restore).
# At B it runs 1000 * 0.25 = 250 s: it saves 750 s. j2: 500 s left, saves 375 s.
J1 = RunningJob("j1", "A", 2, started_at=0.0, remaining=1000.0, image_size=10 * MB)
J2 = RunningJob("j2", "A", 2, started_at=0.0, remaining=500.0, image_size=10 * MB)


def decide(
    sites: list[SiteLoad], jobs: list[RunningJob], policy: MigrationPolicy = POLICY
) -> list[Move]:
    return decide_migrations(policy, sites, jobs, one_mb_per_second, now=1000.0)


def test_capacity_and_cost_by_hand() -> None:
    assert capacity(SLOW.state, 0.25, 1.0, POLICY) == 0.125
    assert capacity(FAST.state, 1.0, 1.0, POLICY) == 1.0
    # Half free at half the fastest speed, a queue of 2 on 4 cores, all three coefficients 1/3.
    thirds = MigrationPolicy(0.5, 60.0, k_cores=1, k_speed=1, k_queue=1)
    assert capacity(SiteState(4, 2, queued=2), 0.5, 1.0, thirds) == pytest.approx(0.5)
    assert migration_cost(J1, "B", POLICY, one_mb_per_second) == 30.0
    # Behind 50 MB of images leaving A in the same decision: they share its uplink.
    assert migration_cost(J1, "B", POLICY, one_mb_per_second, ahead=50 * MB) == 80.0
    assert remaining_estimate(3600.0, 600.0, speed=0.5) == 6000.0
    assert remaining_estimate(3600.0, 4000.0) == 0.0
    assert remaining_estimate(None, 10.0) is None


def test_moves_repeat_until_none_qualifies() -> None:
    # First j1 (gain 720). Then A has 2 free of 4: C_A = 0.25 + 0.125, L_A = 0.625 > 0.5, and
    # B has 2 free: C_B = 0.25 + 0.5 = 0.75 > 0.5: j2 moves too (saves 375 for 40: its image
    # leaves A's uplink after j1's, so it arrives after 20 MB have crossed). Then A runs
    # nothing (it leaves the load room) and B is full (C_B = 0.5): the decision is done.
    moves = decide([SLOW, FAST], [J2, J1])
    assert moves == [Move("j1", "A", "B", 750.0, 30.0), Move("j2", "A", "B", 375.0, 40.0)]
    assert moves[0].load == 0.875
    assert moves[1].load == 0.625
    assert moves[0].capacity == 1.0
    assert moves[1].capacity == 0.75


def test_no_move_when_the_most_loaded_site_is_not_above_the_threshold() -> None:
    # L_A = 0.875: T = 0.875 is not exceeded (strictly); T = 0.87 is.
    at_threshold = MigrationPolicy(0.875, 60.0, 100.0, MB, MB)
    assert decide([SLOW, FAST], [J1], at_threshold) == []
    assert [m.job_id for m in decide([SLOW, FAST], [J1], MigrationPolicy(0.87, 60.0))] == ["j1"]


def test_no_move_when_the_freest_site_has_no_capacity_above_one_minus_t() -> None:
    # B full at full speed: C_B = 0.5, not > 1 - 0.5. (j1 would not fit there anyway.)
    full = SiteLoad("B", SiteState(4, 0, running=1), speed=1.0)
    assert decide([SLOW, full], [J1]) == []
    # Half free at full speed, T = 0.3: C_B = 0.75 > 0.7 but L_A = 0.875 > 0.3: j1 moves.
    half = SiteLoad("B", SiteState(4, 2, running=1), speed=1.0)
    low = MigrationPolicy(0.3, 60.0, 100.0, MB, MB)
    assert decide([SLOW, half], [J1], low) == [Move("j1", "A", "B", 750.0, 30.0)]


def test_no_move_when_the_cost_exceeds_the_saving() -> None:
    # 300 MB: 300 + 300 + 300 s against 750 saved (j1) and 375 (j2).
    big = [
        RunningJob("j1", "A", 2, 0.0, 1000.0, 300 * MB),
        RunningJob("j2", "A", 2, 0.0, 500.0, 300 * MB),
    ]
    assert decide([SLOW, FAST], big) == []
    # 250 MB: the cost equals j1's saving (750): still no move; a byte less and it moves.
    assert decide([SLOW, FAST], [RunningJob("j1", "A", 2, 0.0, 1000.0, 250 * MB)]) == []
    just = RunningJob("j1", "A", 2, 0.0, 1000.0, 250 * MB - 3)
    assert [m.job_id for m in decide([SLOW, FAST], [just])] == ["j1"]


def test_a_slow_link_prices_the_image_out() -> None:
    # The same 10 MB over a 10 kB/s link: 1000 s of transfer, more than j1 saves.
    def slow_link(source: str, target: str, size: int) -> float:
        return size / 10_000

    assert decide_migrations(POLICY, [SLOW, FAST], [J1], slow_link, 1000.0) == []


def test_short_jobs_and_jobs_moved_within_the_interval_stay() -> None:
    short = RunningJob("s", "A", 2, 0.0, remaining=99.0, image_size=0)
    assert decide([SLOW, FAST], [short]) == []
    # Moved 30 s ago with an interval of 60: it stays; moved 60 s ago: it may move again.
    recent = RunningJob("r", "A", 2, 0.0, 1000.0, 10 * MB, last_moved=970.0)
    assert decide([SLOW, FAST], [recent]) == []
    earlier = RunningJob("r", "A", 2, 0.0, 1000.0, 10 * MB, last_moved=940.0)
    assert [m.job_id for m in decide([SLOW, FAST], [earlier])] == ["r"]


def test_sites_left_without_a_fitting_target_leave_the_load_room() -> None:
    # A (speed 0.1, full): C_A = 0.05, L_A = 0.95. B (speed 0.2, 2 free of 4): C_B = 0.35,
    # L_B = 0.65. C (2 cores, idle, speed 1): C_C = 1. T = 0.6, so targets need C > 0.4.
    # j1 (saves 900) goes to C and fills it: C_C = 0.5. A (L 0.7) still is loaded, but j2 fits
    # no target (C is full, B's 0.35 is not > 0.4): A leaves the room; so does B (k1 fits
    # nowhere). One move.
    a = SiteLoad("A", SiteState(4, 0, running=2), speed=0.1)
    b = SiteLoad("B", SiteState(4, 2, running=1), speed=0.2)
    c = SiteLoad("C", SiteState(2, 2), speed=1.0)
    jobs = [
        RunningJob("j1", "A", 2, 0.0, 1000.0, 0),
        RunningJob("j2", "A", 2, 0.0, 900.0, 0),
        RunningJob("k1", "B", 2, 0.0, 1000.0, 0),
    ]
    policy = MigrationPolicy(0.6, 60.0, 100.0, MB, MB)
    assert decide([a, b, c], jobs, policy) == [Move("j1", "A", "C", 900.0, 0.0)]


def test_a_job_moved_in_a_decision_is_not_moved_again_from_its_new_site() -> None:
    # A (speed 0.1, full): L_A = 0.95. B (8 idle cores, speed 0.5): C_B = 0.5 + 0.25 = 0.75.
    # C (1 of 4 free, speed 1): C_C = 0.125 + 0.5 = 0.625. T = 0.3: targets need C > 0.7.
    # j (1 core) goes to B, the freest (saves 1000 - 1000*0.1/0.5 = 800). B is then loaded
    # (C_B = 0.6875, L_B = 0.3125 > 0.3) and C would be faster still for j, but j has moved.
    a = SiteLoad("A", SiteState(4, 0, running=1), speed=0.1)
    b = SiteLoad("B", SiteState(8, 8), speed=0.5)
    c = SiteLoad("C", SiteState(4, 1, running=1), speed=1.0)
    jobs = [RunningJob("j", "A", 1, 0.0, 1000.0, 0)]
    moves = decide([a, b, c], jobs, MigrationPolicy(0.3, 60.0, 100.0, MB, MB))
    assert moves == [Move("j", "A", "B", 800.0, 0.0)]
    # In the next decision C has emptied (C_C = 1): j, now at B, would gain there (200 s left
    # at 0.5, 100 s at 1), but it moved less than an interval ago: it stays.
    b_now = SiteLoad("B", SiteState(8, 7, running=1), speed=0.5)
    c_now = SiteLoad("C", SiteState(4, 4), speed=1.0)
    policy = MigrationPolicy(0.3, 60.0, 100.0, MB, MB)
    recent = [RunningJob("j", "B", 1, 0.0, 200.0, 0, last_moved=970.0)]
    assert decide([a, b_now, c_now], recent, policy) == []
    before = [RunningJob("j", "B", 1, 0.0, 200.0, 0, last_moved=940.0)]
    assert decide([a, b_now, c_now], before, policy) == [Move("j", "B", "C", 100.0, 0.0)]


def test_targets_must_fit_the_job_now_with_no_queue_and_not_drain() -> None:
    queued = SiteLoad("B", SiteState(4, 4, queued=1), speed=1.0)
    assert decide([SLOW, queued], [J1]) == []
    draining = SiteLoad("B", SiteState(4, 4, draining=True), speed=1.0)
    assert decide([SLOW, draining], [J1]) == []
    wide = RunningJob("w", "A", 4, 0.0, 1000.0, 0)
    small = SiteLoad("B", SiteState(8, 3), speed=1.0)  # C_B = 0.5*3/8 + 0.5 = 0.6875
    assert decide([SLOW, small], [wide]) == []
    # The next target by capacity takes it where the freest cannot.
    roomy = SiteLoad("C", SiteState(8, 4), speed=0.8)  # C_C = 0.25 + 0.4 = 0.65
    moves = decide([SLOW, small, roomy], [wide])
    assert [(m.job_id, m.target) for m in moves] == [("w", "C")]
    assert moves[0].saving == pytest.approx(1000.0 - 1000.0 * 0.25 / 0.8)


def test_unknown_speeds_count_as_nominal_and_no_gain_without_speed() -> None:
    # Both at speed 1 (one unknown): moving saves nothing, whatever the capacities.
    a = SiteLoad("A", SiteState(4, 0, running=2))
    b = SiteLoad("B", SiteState(4, 4), speed=1.0)
    jobs = [RunningJob("j1", "A", 2, 0.0, 1000.0, 0)]
    assert decide([a, b], jobs, MigrationPolicy(0.4, 60.0)) == []


def test_bad_inputs_name_their_field() -> None:
    with pytest.raises(InvalidInput, match=r"sites: expected each site once"):
        decide([SLOW, SLOW], [])
    with pytest.raises(InvalidInput, match=r"running_job\[j1\]\.site: expected one of the sites"):
        decide([FAST], [J1])
    with pytest.raises(InvalidInput, match=r"running_job\[x\]\.remaining"):
        RunningJob("x", "A", 1, 0.0, -1.0, 0)
    with pytest.raises(InvalidInput, match=r"site_load\[A\]\.speed: expected a speed > 0"):
        SiteLoad("A", SiteState(1, 1), speed=0.0)


# -- the parser of ``--migrate-running`` ---------------------------------------------------------


def test_parse_off_and_a_policy() -> None:
    assert parse_migration_policy("off") is None
    assert parse_migration_policy(" OFF ") is None
    policy = parse_migration_policy("threshold=0.7,interval=300")
    assert policy == MigrationPolicy(0.7, 300.0)
    full = parse_migration_policy(
        "threshold=0.6, interval=60, min_remaining=1800, checkpoint_rate=5e8,"
        " restore-rate=4e8, k_cores=1, k_speed=2, k_queue=0"
    )
    assert full == MigrationPolicy(0.6, 60.0, 1800.0, 5e8, 4e8, 1.0, 2.0, 0.0)
    assert parse_migration_policy(str(full)) == MigrationPolicy(0.6, 60.0, 1800.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "migrate_running: expected off, or threshold=T,interval=S[,key=value...], got ''"),
        ("on", "migrate_running: expected key=value pairs (off, or threshold=T,interval=S"),
        ("threshold=0.5", "migrate_running.interval: expected seconds > 0 (off, or threshold="),
        ("interval=5", "migrate_running.threshold: expected a number in (0, 1) (off, or"),
        (
            "threshold=1,interval=5",
            "migrate_running.threshold: expected a number in (0, 1), got 1.0",
        ),
        ("threshold=0,interval=5", "migrate_running.threshold: expected a number in (0, 1)"),
        (
            "threshold=abc,interval=5",
            "migrate_running.threshold: expected a number in (0, 1), got 'abc'",
        ),
        (
            "threshold=nan,interval=5",
            "migrate_running.threshold: expected a number in (0, 1), got 'nan'",
        ),
        ("threshold=0.5,interval=0", "migrate_running.interval: expected seconds > 0, got 0.0"),
        ("threshold=0.5,interval=inf", "migrate_running.interval: expected seconds > 0"),
        ("threshold=0.5,interval=5,speed=2", "migrate_running: expected a key among threshold,"),
        (
            "threshold=0.5,threshold=0.6,interval=5",
            "migrate_running.threshold: expected given once, got 'threshold=0.6'",
        ),
        (
            "threshold=0.5,interval=5,min_remaining=-1",
            "migrate_running.min_remaining: expected seconds >= 0, got -1.0",
        ),
        (
            "threshold=0.5,interval=5,checkpoint_rate=0",
            "migrate_running.checkpoint_rate: expected bytes per second > 0",
        ),
        (
            "threshold=0.5,interval=5,k_cores=0,k_speed=0",
            "migrate_running.k_cores: expected coefficients k_cores, k_speed, k_queue not all 0",
        ),
        ("threshold=0.5,,interval=5", "migrate_running: expected key=value pairs"),
    ],
)
def test_parse_errors_are_one_precise_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_migration_policy(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_every_policy_field_is_a_key() -> None:
    policy = MigrationPolicy(0.5, 60.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    text = ",".join(f"{name}={getattr(policy, name)}" for name in policy.__dataclass_fields__)
    assert parse_migration_policy(text) == policy


@given(
    threshold=st.floats(0.01, 0.99),
    interval=st.floats(0.001, 1e6),
)
def test_parse_round_trips_valid_policies(threshold: float, interval: float) -> None:
    text = f"threshold={threshold!r},interval={interval!r}"
    assert parse_migration_policy(text) == MigrationPolicy(threshold, interval)


@given(st.text(max_size=40))
def test_parse_never_fails_but_with_invalid_input(text: str) -> None:
    message = ""
    try:
        parse_migration_policy(text)
    except InvalidInput as exc:  # anything else escapes and fails the test
        message = str(exc)
    assert "\n" not in message


# -- properties ----------------------------------------------------------------------------------

SITES = st.lists(
    st.tuples(
        st.integers(1, 8),  # cores
        st.floats(0.0, 1.0),  # free fraction
        st.integers(0, 3),  # queued
        st.sampled_from([None, 0.1, 0.25, 0.5, 1.0, 2.0]),  # speed
    ),
    min_size=1,
    max_size=6,
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[SiteLoad], list[RunningJob], MigrationPolicy]:
    specs = draw(SITES)
    sites = []
    jobs = []
    for k, (cores, fraction, queued, speed) in enumerate(specs):
        free = math.floor(cores * fraction)
        name = f"s{k}"
        sites.append(SiteLoad(name, SiteState(cores, free, queued), speed))
        busy = cores - free
        n = 0
        while busy > 0:
            width = draw(st.integers(1, busy))
            remaining = draw(st.floats(0.0, 1e5))
            image = draw(st.integers(0, 10**9))
            moved = draw(st.sampled_from([None, 0.0, 990.0]))
            jobs.append(RunningJob(f"{name}j{n}", name, width, 0.0, remaining, image, moved))
            busy -= width
            n += 1
    threshold = draw(st.floats(0.05, 0.95))
    return sites, jobs, MigrationPolicy(threshold, 60.0, min_remaining=100.0)


@given(scenarios())
def test_every_move_qualifies_and_no_site_is_overcommitted(
    case: tuple[list[SiteLoad], list[RunningJob], MigrationPolicy],
) -> None:
    sites, jobs, policy = case
    moves = decide_migrations(policy, sites, jobs, one_mb_per_second, now=1000.0)
    assert len({m.job_id for m in moves}) == len(moves)  # once per decision
    by_id = {j.job_id: j for j in jobs}
    by_site = {s.site: s for s in sites}
    free = {s.site: s.state.free_cores for s in sites}
    for m in moves:
        job = by_id[m.job_id]
        target = by_site[m.target].state
        assert m.source == job.site != m.target
        assert m.saving > m.cost >= 0
        assert job.remaining >= policy.min_remaining
        assert job.last_moved is None or 1000.0 - job.last_moved >= policy.interval
        assert m.load > policy.threshold
        assert m.capacity > 1 - policy.threshold
        assert not target.draining
        assert target.queued == 0
        free[m.target] -= job.cores  # a source's cores are free only once its job is dumped
        assert free[m.target] >= 0
    # Deterministic: the same inputs in another order give the same moves.
    again = decide_migrations(policy, sites[::-1], jobs[::-1], one_mb_per_second, now=1000.0)
    assert again == moves


def test_no_job_moves_into_the_cores_another_job_of_the_decision_leaves() -> None:
    # A (full, speed 0.5): C_A = 0.25, L_A = 0.75. B (2 of 4 free, speed 0.1): C_B = 0.3,
    # L_B = 0.7. C (idle, speed 1): C_C = 1. T = 0.5. j (A's 4 cores) goes to C first; A then
    # counts its 4 cores as capacity (C_A = 0.75) but they are free only once j is dumped, so
    # B's k, which would save 800 s at A, stays this time (the simulator found this: its target
    # refused a restore into cores still held).
    a = SiteLoad("A", SiteState(4, 0, running=1), speed=0.5)
    b = SiteLoad("B", SiteState(4, 2, running=1), speed=0.1)
    c = SiteLoad("C", SiteState(4, 4), speed=1.0)
    jobs = [RunningJob("j", "A", 4, 0.0, 1000.0, 0), RunningJob("k", "B", 2, 0.0, 1000.0, 0)]
    assert decide([a, b, c], jobs) == [Move("j", "A", "C", 500.0, 0.0)]
