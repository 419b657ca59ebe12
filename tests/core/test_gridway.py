"""The GridWay 5.6.1 model (gbroker/core/gridway.py), held to hand-computed cases of GridWay's
own rules. Each test names the rule it checks, as file:line of GridWay's 5.6.1 tree. Pure and
synchronous: a hand-made view of the hosts and ticks at the times the model asks for."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    Dispatch,
    DispatchPolicy,
    JobFinished,
    JobQueued,
    JobStarted,
    JobSubmitted,
    Tick,
    Withdraw,
    WithdrawAnswered,
)
from gbroker.core.gridway import (
    Bind,
    GridWay,
    GridWayDecision,
    GridWayPolicy,
    Information,
    Migrate,
    estimated_time,
    host_priorities,
    job_priorities,
)
from gbroker.core.model import Job, Observation, SiteState
from gbroker.errors import InvalidInput


def obs(total: int, free: int) -> Observation:
    return Observation(SiteState(total, free), 0.0)


class Harness:
    """One GridWay over hand-made hosts, ticked at every time it asks for."""

    def __init__(self, policy: GridWayPolicy | None = None, **sites: tuple[int, int]) -> None:
        self.view = {name: obs(*cores) for name, cores in sites.items()}
        self.gw = GridWay(policy or GridWayPolicy(), list(sites))
        self.now = 0.0

    def until(self, t: float) -> list[tuple[float, GridWayDecision]]:
        """Tick to ``t`` (included); every decision with its time."""
        out: list[tuple[float, GridWayDecision]] = []
        while (at := self.gw.next_tick(self.now)) <= t:
            self.now = at
            out += [(at, d) for d in self.gw.tick(at, self.view)]
        self.now = t
        return out

    def show(self, site: str, total: int, free: int) -> None:
        self.view[site] = obs(total, free)

    def submit(self, job_id: str, np: int = 1, fits: set[str] | None = None) -> None:
        self.gw.submit(job_id, np, fits, self.now)


def sites_of(decisions: list[tuple[float, GridWayDecision]]) -> list[str]:
    out = []
    for _, d in decisions:
        assert isinstance(d, Bind)
        out.append(d.site)
    return out


# -- clocks and the information manager ---------------------------------------------------------


def test_timers_run_on_their_own_grids() -> None:
    # gw_im.c:289 (the IM timer every 5 s), gw_dm.c:465 with gw_action.c:303 (the DM timer every
    # SCHEDULING_INTERVAL, a full interval first); gw_host_pool.c:270 with gw_im_actions.c:146-159
    # (a host discovered at one IM tick is monitored at the next).
    h = Harness(A=(16, 16))
    assert h.gw.next_tick(0.0) == 5.0
    h.until(5.0)
    assert h.gw.snapshot("A") == (0, 0, None)  # discovered, not monitored yet
    assert h.gw.next_tick(5.0) == 10.0
    h.until(10.0)
    assert h.gw.snapshot("A") == (16, 16, 10.0)
    assert [h.gw.next_tick(t) for t in (10.0, 12.0, 15.0)] == [15.0, 15.0, 15.0]
    h.submit("j", 4)
    assert sites_of(h.until(15.0)) == ["A"]  # the first scheduling action, at 15 s
    assert h.gw.next_tick(15.0) == 20.0
    h.until(31.0)
    h.submit("k")  # held until the next action, at 45 s
    assert h.until(45.0) == [(45.0, Bind("k", "A"))]


def test_timers_missed_while_idle_are_caught_up_on_their_grid() -> None:
    # The driver need not tick a GridWay that holds no job: a job arriving at 401 s is scheduled
    # at the next multiple of SCHEDULING_INTERVAL (405 s), not at once, and the host due for
    # monitoring since 190 s is monitored at the first tick (what it showed then, unchanged).
    h = Harness(A=(16, 16))
    h.until(10.0)
    h.now = 401.0
    h.submit("j")
    assert h.gw.next_tick(401.0) == 405.0
    assert h.until(405.0) == [(405.0, Bind("j", "A"))]
    assert h.gw.snapshot("A") == (16, 16, 405.0)


def test_a_host_freed_after_its_monitoring_is_not_seen_until_the_next() -> None:
    # gw_host_pool.c:329-330 (a host is monitored again MONITORING_INTERVAL = 180 s after its
    # last monitoring) and gw_rm_host_match.c:93-100 (slots = min(the snapshot's free count,
    # nodes - used slots)): A showed 0 free cores at its monitoring at 10 s; they are free from
    # 20 s on, but GridWay binds the job only after the monitoring at 190 s, at 195 s.
    h = Harness(A=(16, 0))
    h.until(10.0)
    h.submit("j", 4)
    h.until(19.0)
    h.show("A", 16, 16)
    assert h.until(185.0) == []
    assert h.gw.snapshot("A") == (0, 16, 10.0)
    assert h.until(195.0) == [(195.0, Bind("j", "A"))]
    assert h.gw.snapshot("A") == (16, 16, 190.0)


def test_the_static_driver_takes_every_core_free_whatever_the_load() -> None:
    # gw_im_mad_static reports its host file's QUEUE_FREENODECOUNT, not the load: with every
    # core free in it, slots = nodes - GridWay's used slots (gw_rm_host_match.c:93-100).
    h = Harness(GridWayPolicy(information=Information.STATIC), A=(16, 0))
    h.until(10.0)
    assert h.gw.snapshot("A") == (16, 16, 10.0)
    h.submit("j", 4)
    assert h.until(15.0) == [(15.0, Bind("j", "A"))]


def test_a_host_the_view_no_longer_shows_is_cleared() -> None:
    # gw_im_listener.c:216-222, gw_host.c:231-268: a failed monitoring clears the host's free
    # count, so it gets no job.
    h = Harness(A=(16, 16))
    h.until(10.0)
    del h.view["A"]
    h.until(190.0)
    h.submit("j")
    assert h.until(300.0) == []
    assert h.gw.snapshot("A") == (0, 16, 190.0)


def test_discovery_adds_hosts_only_every_discovery_interval() -> None:
    # gw_im_actions.c:146-153: hosts are looked for every DISCOVERY_INTERVAL (300 s); B appears
    # at 20 s, is discovered at 305 s and monitored at 310 s.
    h = Harness(A=(16, 16))
    h.gw = GridWay(GridWayPolicy(), ["A", "B"])
    h.until(20.0)
    h.view["B"] = obs(8, 8)
    h.until(300.0)
    assert h.gw.snapshot("B") is None
    h.until(305.0)
    assert h.gw.snapshot("B") == (0, 0, None)
    h.until(310.0)
    assert h.gw.snapshot("B") == (8, 8, 310.0)


# -- the scheduler's order of jobs and hosts -----------------------------------------------------


def test_job_priority_by_hand() -> None:
    # gw_scheduler_jobs.c:732-856. WT weight 1, SH weight 1, waits 10, 40, 20 s: nWT = 0.25, 1,
    # 0.5, sorted (stable, descending) to jobs 1, 2, 0. SH with U = 4 past dispatches and T = 3
    # listed: max_share = max(1, (4 + 3 - 1) // 5) = 1; in that order the shares are
    # 1 - 4 // 5 = 1, 1 - 5 // 5 = 0, 0, so the totals are 2, 0.5, 0.25: order 1, 2, 0.
    assert job_priorities([10.0, 40.0, 20.0], 4, 1.0, 1.0) == [1, 2, 0]
    # The shipped weights (WT 0, SH 1): every nWT is 0 and SH falls along the list: first come,
    # first served. 12 jobs, U = 3: max_share = 14 // 5 = 2; shares 2, 2, 1 x 5, 0 x 5.
    assert job_priorities([5.0] * 12, 3, 0.0, 1.0) == list(range(12))
    assert job_priorities([], 0, 0.0, 1.0) == []


@settings(max_examples=200, deadline=None)
@given(
    waits=st.lists(st.floats(0, 1e5), max_size=30),
    past=st.integers(0, 500),
    wt=st.floats(0, 10),
    sh=st.floats(0, 10),
)
def test_one_user_s_shares_never_reorder_the_waiting_time_order(
    waits: list[float], past: int, wt: float, sh: float
) -> None:
    # gw_scheduler_jobs.c:843-855: the share term is handed out in the order of the first sort,
    # falling, so with one user the second sort keeps the first's order.
    assert job_priorities(waits, past, wt, sh) == job_priorities(waits, past, wt, 0.0)


def test_host_priority_by_hand() -> None:
    # gw_scheduler_hosts.c:296-348: RP·1 + RA·0 + UG·nUG; T = 100, 0 (no estimate), 50:
    # T_min = 50, T_max = 100, so nUG = 0.5, 50/100 = 0.5, 1.
    assert host_priorities([100.0, 0.0, 50.0], 1.0) == [1.5, 1.5, 2.0]
    assert host_priorities([0.0, 0.0], 1.0) == [1.0, 1.0]  # nobody has an estimate: all 0
    assert host_priorities([100.0, 50.0], 0.0) == [1.0, 1.0]  # UG_WEIGHT 0: not estimated
    # gw_scheduler_hosts.c:227-239: T = T_last without history, T_hist without a last job,
    # else 0.75 T_hist + 0.25 T_last.
    assert estimated_time(0.0, 80.0) == 80.0
    assert estimated_time(80.0, 0.0) == 80.0
    assert estimated_time(100.0, 200.0) == 125.0


def test_the_host_whose_last_job_took_least_comes_first() -> None:
    # gw_scheduler_jobs.c:181-183 (T_last on a job's success), gw_scheduler_hosts.c:266-350.
    # j1 ran at A for 100 s, j2 at B for 50 s: B (2.0) before A (1.5) and C (1.5, no estimate,
    # T_min/T_max = 0.5), A before C by host id. j3 goes to B; j4 (np 8) does not fit B's
    # 8 - 1 slots left this round and goes to A.
    h = Harness(A=(8, 8), B=(8, 8), C=(8, 8))
    h.until(10.0)
    h.submit("j1", fits={"A"})
    h.submit("j2", fits={"B"})
    assert sites_of(h.until(15.0)) == ["A", "B"]
    h.until(65.0)
    h.gw.finished("j2", "B", True, 65.0)
    h.until(115.0)
    h.gw.finished("j1", "A", True, 115.0)
    h.submit("j3", 8)
    h.submit("j4", 8)
    assert h.until(120.0) == [(120.0, Bind("j3", "B")), (120.0, Bind("j4", "A"))]


# -- dispatch: the chunk, the limits, the two passes -------------------------------------------


def test_no_more_than_a_chunk_per_action() -> None:
    # gw_scheduler.c:82-89: DISPATCH_CHUNK = 15 dispatches per action (limits lifted here).
    policy = GridWayPolicy(max_running_resource=0, max_running_user=0)
    h = Harness(policy, A=(100, 100), B=(100, 100), C=(100, 100))
    h.until(10.0)
    for k in range(20):
        h.submit(f"j{k}")
    assert len(h.until(15.0)) == 15
    assert len(h.until(30.0)) == 5
    # 0: as many as there are jobs.
    policy = GridWayPolicy(dispatch_chunk=0, max_running_resource=0, max_running_user=0)
    h = Harness(policy, A=(100, 100))
    h.until(10.0)
    for k in range(40):
        h.submit(f"j{k}")
    assert len(h.until(15.0)) == 40


def test_the_per_resource_limit_counts_used_slots_and_this_round_s_dispatches() -> None:
    # gw_scheduler.c:113-115: a host is passed over once its used slots plus this action's
    # dispatches there reach MAX_RUNNING_RESOURCE = 10. Twelve np=1 jobs: A takes 10, B 2.
    h = Harness(A=(32, 32), B=(32, 32))
    h.until(10.0)
    for k in range(12):
        h.submit(f"j{k}")
    assert sites_of(h.until(15.0)) == ["A"] * 10 + ["B"] * 2
    # One np=8 job at A: 8 used slots, so A takes two more jobs (8 + 0, 8 + 1 < 10), not three.
    h = Harness(A=(32, 32), B=(32, 32))
    h.until(10.0)
    h.submit("big", 8, fits={"A"})
    assert sites_of(h.until(15.0)) == ["A"]
    assert h.gw.used_slots("A") == 8
    for k in range(4):
        h.submit(f"j{k}")
    assert sites_of(h.until(30.0)) == ["A", "A", "B", "B"]


def test_a_round_can_overcommit_a_host() -> None:
    # gw_scheduler.c:124: free slots = the host's slots less this round's dispatches there,
    # counted in jobs: 8 free slots take an np=8 job, then an np=7 one (8 - 1 >= 7); np=8 again
    # does not fit (8 - 2 < 8). The second job waits in A's queue (early binding).
    h = Harness(A=(8, 8))
    h.until(10.0)
    h.submit("a", 8)
    h.submit("b", 7)
    h.submit("c", 8)
    assert h.until(15.0) == [(15.0, Bind("a", "A")), (15.0, Bind("b", "A"))]
    assert h.gw.used_slots("A") == 15
    assert h.gw.listed() == ["c"]


def test_the_user_limit_caps_running_jobs_at_30() -> None:
    # gw_scheduler.c:94-96, gw_dm_action_dispatch.c:95, gw_dm_state_zombie.c:88: a user's jobs
    # dispatched and not done, plus this round's, stop at MAX_RUNNING_USER = 30.
    policy = GridWayPolicy(dispatch_chunk=0, max_running_resource=0)
    h = Harness(policy, A=(100, 100), B=(100, 100))
    h.until(10.0)
    for k in range(35):
        h.submit(f"j{k}")
    first = h.until(15.0)
    assert len(first) == 30
    assert h.gw.running == 30
    assert h.until(30.0) == []
    for _, d in first[:2]:
        assert isinstance(d, Bind)
        h.gw.finished(d.job_id, d.site, True, h.now)
    assert [d.job_id for _, d in h.until(45.0)] == ["j30", "j31"]


def test_new_jobs_go_before_rescheduled_ones() -> None:
    # gw_scheduler.c:55-57, 105-107: a first pass over jobs never scheduled, then one over
    # rescheduled jobs, under one chunk. j1 timed out at A (at 45 s) and waits on the list for
    # a host; j2 comes after it. When B shows free cores (its monitoring at 190 s), the chunk of
    # 1 goes to j2 at 195 s, and j1 moves at the next action.
    policy = GridWayPolicy(dispatch_chunk=1, suspension_timeout=20.0)
    h = Harness(policy, A=(4, 4), B=(4, 0))
    h.until(10.0)
    h.submit("j1")
    assert h.until(15.0) == [(15.0, Bind("j1", "A"))]
    h.gw.queued("j1", "A", 16.0)
    assert h.until(45.0) == []  # timed out at 45 s: 29 > 20; B has no slot
    assert h.gw.listed() == ["j1"]
    h.now = 50.0
    h.submit("j2")
    assert h.gw.listed() == ["j1", "j2"]
    h.show("B", 4, 4)
    assert h.until(195.0) == [(195.0, Bind("j2", "B"))]
    assert h.until(210.0) == [(210.0, Migrate("j1", "A", "B"))]


# -- early binding, suspension timeouts, bans ----------------------------------------------------


def test_a_job_bound_on_a_wrong_view_waits_there_then_moves_and_bans_the_host() -> None:
    # Early binding (gw_dm_action_dispatch.c:63-103): A's snapshot (10 s) shows 16 free cores,
    # which others took at 12 s; the job is bound to A and waits in its queue from 15 s.
    # gw_dm_action_schedule.c:115-161: at the action when it has waited more than
    # SUSPENSION_TIMEOUT = 600 s (at 630 s: 615 s; at 615 s it was 600 s, not more) it is
    # rescheduled, and
    # A fails: banned for 0.1 FR_MAX_BANNED = 360 s (gw_scheduler_jobs.c:95-99), to 990 s. It
    # moves to B in that action (the second pass); A's slots are freed once it is cancelled there.
    h = Harness(A=(16, 16), B=(16, 16))
    h.until(10.0)
    h.show("A", 16, 0)
    h.now = 12.0
    h.submit("j1", 4)
    assert h.until(15.0) == [(15.0, Bind("j1", "A"))]
    h.gw.queued("j1", "A", 15.0)
    assert h.until(615.0) == []
    assert h.until(630.0) == [(630.0, Migrate("j1", "A", "B"))]
    assert h.gw.banned_until("A") == 990.0
    assert (h.gw.used_slots("A"), h.gw.used_slots("B")) == (4, 4)  # B's at once, A's on cancel
    h.gw.withdrawn("j1", "A", True, 631.0)
    assert (h.gw.used_slots("A"), h.gw.used_slots("B")) == (0, 4)
    # The ban: a job that only A fits is not bound while now <= 990 s
    # (gw_scheduler_jobs.c:265); A is free again from 700 s and seen so at 730 s.
    h.submit("j3", 1, fits={"A"})
    h.until(700.0)
    h.show("A", 16, 16)
    assert h.until(990.0) == []
    assert h.until(1005.0) == [(1005.0, Bind("j3", "A"))]


def test_a_rescheduled_job_skips_the_hosts_it_was_at() -> None:
    # gw_scheduler_jobs.c:290-313: a job rescheduled after a suspension timeout gets no host of
    # its history, banned or not. Only A: it has none, so the scheduler gives up on it
    # (SCHEDULE_JOB FAILED, gw_dm_action_schedule.c:220-238) and it waits on at A; the next
    # action finds it over the timeout again and fails A again, 15 s after the first failure:
    # a ban of int(3600 (1 - exp(-15/650))) = 82 s from 60 s, which *shortens* the first one
    # (to 405 s) to 142 s (gw_scheduler_jobs.c:100-116).
    policy = GridWayPolicy(suspension_timeout=20.0)
    h = Harness(policy, A=(4, 4))
    h.until(10.0)
    h.submit("j1")
    assert h.until(15.0) == [(15.0, Bind("j1", "A"))]
    h.gw.queued("j1", "A", 16.0)
    assert h.until(45.0) == []
    assert h.gw.banned_until("A") == 405.0
    assert h.gw.listed() == []
    assert h.until(60.0) == []
    assert h.gw.banned_until("A") == 142.0
    # A success clears the ban (gw_scheduler_jobs.c:178-179).
    h.gw.started("j1", "A", 61.0)
    h.gw.finished("j1", "A", True, 70.0)
    assert h.gw.banned_until("A") == -math.inf
    # Without bans (FR_MAX_BANNED = 0) the history alone keeps it from A.
    h = Harness(GridWayPolicy(suspension_timeout=20.0, fr_max_banned=0.0), A=(4, 4))
    h.until(10.0)
    h.submit("j1")
    h.until(15.0)
    h.gw.queued("j1", "A", 16.0)
    assert h.until(60.0) == []
    assert h.gw.banned_until("A") == -math.inf


def test_repeated_failures_lengthen_the_ban() -> None:
    # gw_scheduler_jobs.c:100-116: t s after the first failure, int(3600 (1 - exp(-t/650))):
    # 513 s at t = 100; nothing new within 10 s.
    h = Harness(A=(4, 4))
    h.until(10.0)
    for k in range(3):
        h.submit(f"f{k}")
    assert sites_of(h.until(15.0)) == ["A"] * 3
    h.gw.finished("f0", "A", False, 20.0)
    assert h.gw.banned_until("A") == 20.0 + 360.0
    h.gw.finished("f1", "A", False, 25.0)  # 5 s later: no new ban
    assert h.gw.banned_until("A") == 380.0
    h.gw.finished("f2", "A", False, 120.0)
    assert h.gw.banned_until("A") == 120.0 + 513.0


def test_a_job_that_starts_before_it_moves_stays() -> None:
    # Our simplification (module docstring): GridWay would cancel it and start it again at the
    # new host. Started while on the list again (B had no slot), it leaves the list.
    policy = GridWayPolicy(suspension_timeout=20.0)
    h = Harness(policy, A=(4, 4), B=(4, 0))
    h.until(10.0)
    h.submit("j1")
    h.until(15.0)
    h.gw.queued("j1", "A", 16.0)
    assert h.until(45.0) == []
    assert h.gw.listed() == ["j1"]
    h.gw.started("j1", "A", 46.0)
    assert h.gw.listed() == []
    # Started while its cancel is under way: the cancel fails, the target's slots come back.
    h = Harness(policy, A=(4, 4), B=(4, 4))
    h.until(10.0)
    h.submit("j1")
    h.until(15.0)
    h.gw.queued("j1", "A", 16.0)
    assert h.until(45.0) == [(45.0, Migrate("j1", "A", "B"))]
    assert (h.gw.used_slots("A"), h.gw.used_slots("B")) == (1, 1)
    h.gw.started("j1", "A", 46.0)
    h.gw.withdrawn("j1", "A", False, 46.0)
    assert (h.gw.used_slots("A"), h.gw.used_slots("B")) == (1, 0)
    h.gw.finished("j1", "A", True, 100.0)
    assert (h.gw.used_slots("A"), h.gw.running) == (0, 0)


# -- the job pool --------------------------------------------------------------------------------


def test_a_full_pool_refuses_submissions_and_they_are_retried() -> None:
    # gw_job_pool.c:365-405, gw_dm_action_allocate.c:67-75: NUMBER_OF_JOBS jobs at most; a
    # submission beyond fails, and its submitter tries again once a job ends.
    h = Harness(GridWayPolicy(number_of_jobs=2), A=(1, 1))
    h.until(10.0)
    for k in range(4):
        h.submit(f"j{k}")
    assert h.gw.listed() == ["j0", "j1"]
    assert h.gw.waiting_outside() == ["j2", "j3"]
    assert h.until(15.0) == [(15.0, Bind("j0", "A"))]
    h.gw.finished("j0", "A", True, 20.0)
    assert h.gw.listed() == ["j1", "j2"]
    assert h.gw.waiting_outside() == ["j3"]
    assert GridWayPolicy().number_of_jobs == 200


# -- the owner broker running it ----------------------------------------------------------------


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


def test_the_broker_holds_jobs_for_gridway_and_carries_out_its_decisions() -> None:
    policy = DispatchPolicy(Algorithm.GRIDWAY, gridway=GridWayPolicy(suspension_timeout=20.0))
    broker = Broker("X", ["A"], policy, no_transfer)
    view = {"X": obs(4, 4), "A": obs(4, 4)}
    assert broker.handle(JobSubmitted(Job("j1", 2)), 11.0, view) == []  # held
    assert broker.needs_tick
    assert broker.next_tick(11.0) == 15.0
    ticks = {}
    now = 11.0
    while (now := broker.next_tick(now)) <= 30.0:
        ticks[now] = broker.handle(Tick(), now, view)
    # Discovered at 15 s (the first tick), monitored at 20 s, bound at the action at 30 s.
    assert ticks == {15.0: [], 20.0: [], 25.0: [], 30.0: [Dispatch(Job("j1", 2), "X")]}
    broker.handle(JobQueued("j1", "X"), 31.0, view)
    while (now := broker.next_tick(now)) <= 60.0:
        out = broker.handle(Tick(), now, view)
        assert out == ([Withdraw("j1", "X")] if now == 60.0 else []), now
    assert broker.handle(WithdrawAnswered("j1", "X", True), 61.0, view) == [
        Dispatch(Job("j1", 2), "A")
    ]
    broker.handle(JobQueued("j1", "A"), 62.0, view)
    broker.handle(JobStarted("j1", "A"), 62.0, view)
    broker.handle(JobFinished("j1", "A"), 100.0, view)
    assert not broker.needs_tick
    assert broker.jobs == {}


def test_the_broker_refuses_a_job_no_host_can_hold() -> None:
    broker = Broker("X", ["A"], DispatchPolicy(Algorithm.GRIDWAY), no_transfer)
    with pytest.raises(InvalidInput, match=r"job\[big\]\.rank"):
        broker.handle(JobSubmitted(Job("big", 9)), 1.0, {"X": obs(4, 4), "A": obs(8, 8)})


# -- the policy's checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("scheduling_interval", 0, "seconds > 0"),
        ("monitoring_interval", math.inf, "seconds > 0"),
        ("discovery_interval", -1.0, "seconds > 0"),
        ("number_of_jobs", 0, "an integer >= 1"),
        ("dispatch_chunk", -1, "an integer >= 0"),
        ("dispatch_chunk", 1.5, "an integer >= 0"),
        ("max_running_user", True, "an integer >= 0"),
        ("max_running_resource", -2, "an integer >= 0"),
        ("wt_weight", -0.1, "a weight >= 0"),
        ("ug_weight", math.nan, "a weight >= 0"),
        ("suspension_timeout", -5.0, "seconds >= 0"),
        ("fr_max_banned", "1h", "seconds >= 0"),
        ("fr_banned_c", 0.0, "seconds > 0"),
        ("information", "mds", "one of dynamic, static"),
    ],
)
def test_each_setting_is_checked(field: str, value: object, expected: str) -> None:
    with pytest.raises(InvalidInput, match=rf"^gridway\.{field}: expected {expected}") as caught:
        GridWayPolicy(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == f"gridway.{field}"


def test_a_dispatch_policy_carries_gridway_settings_only() -> None:
    with pytest.raises(InvalidInput, match=r"^gridway: expected GridWay's settings"):
        DispatchPolicy(Algorithm.GRIDWAY, gridway={"dispatch_chunk": 1})  # type: ignore[arg-type]


def test_the_defaults_are_the_shipped_values() -> None:
    # etc/gwd.conf:30,50-52; etc/sched.conf:40-41,94,108,144,193,216-217;
    # etc/job_template.default:138.
    assert GridWayPolicy() == GridWayPolicy(
        scheduling_interval=15.0,
        discovery_interval=300.0,
        monitoring_interval=180.0,
        number_of_jobs=200,
        dispatch_chunk=15,
        max_running_user=30,
        max_running_resource=10,
        wt_weight=0.0,
        sh_weight=1.0,
        ug_weight=1.0,
        suspension_timeout=600.0,
        fr_max_banned=3600.0,
        fr_banned_c=650.0,
        information="dynamic",  # type: ignore[arg-type]
    )


# -- invariants over random runs ---------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    hosts=st.lists(st.tuples(st.integers(1, 32), st.integers(0, 32)), min_size=1, max_size=4),
    ranks=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=60),
    chunk=st.integers(0, 6),
    per_resource=st.integers(0, 12),
    per_user=st.integers(0, 12),
    ends=st.lists(st.integers(0, 10_000), max_size=200),
)
def test_an_action_keeps_the_chunk_and_the_limits(
    hosts: list[tuple[int, int]],
    ranks: list[int],
    chunk: int,
    per_resource: int,
    per_user: int,
    ends: list[int],
) -> None:
    # gw_scheduler.c:89 (the chunk), 94-96 (the user), 113-115 (the host): however the jobs
    # come and end, an action never dispatches more than the chunk, never to a host whose used
    # slots plus the round's dispatches there had reached the limit, never past the user's.
    names = [f"h{k}" for k in range(len(hosts))]
    policy = GridWayPolicy(
        dispatch_chunk=chunk, max_running_resource=per_resource, max_running_user=per_user
    )
    sites = {n: (total, min(free, total)) for n, (total, free) in zip(names, hosts, strict=True)}
    h = Harness(policy, **sites)
    biggest = max(total for total, _ in hosts)
    for k, rank in enumerate(ranks):
        if rank <= biggest:
            h.gw.submit(f"j{k}", rank, None, 1.0)
    rank_of = {f"j{k}": rank for k, rank in enumerate(ranks)}
    bound: list[Bind] = []
    endings = iter(ends)
    for _ in range(40):
        at = h.gw.next_tick(h.now)
        used = {n: h.gw.used_slots(n) for n in names}
        running = h.gw.running
        decisions = h.gw.tick(at, h.view)
        h.now = at
        if chunk:
            assert len(decisions) <= chunk
        per_host = {n: sum(1 for d in decisions if getattr(d, "site", "") == n) for n in names}
        for n, count in per_host.items():
            if per_resource and count:
                assert used[n] + count - 1 < per_resource, (n, used[n], count)
        if per_user:
            assert running + len(decisions) <= per_user
        for d in decisions:
            assert isinstance(d, Bind)  # jobs start at once here: nothing times out
            h.gw.queued(d.job_id, d.site, at)
            h.gw.started(d.job_id, d.site, at)
            bound.append(d)
        for d in list(bound):  # some bound jobs end
            if next(endings, 1) % 3 == 0:
                h.gw.finished(d.job_id, d.site, True, at)
                bound.remove(d)
        # GridWay's used slots are its bound jobs' cores, exactly (gw_host.c:360-375).
        for n in names:
            assert h.gw.used_slots(n) == sum(rank_of[d.job_id] for d in bound if d.site == n)
