"""The GridWay 5.6.1 baseline in the simulator: one GridWay at the data site serves every stream,
each job once, and its limits show where they should."""

from __future__ import annotations

import random
from dataclasses import replace

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.gridway import GridWayPolicy
from gbroker.sim.grid import GridConfig, GridResult, GridSimulation
from gbroker.workloads.streams import paper_streams
from tests.sim.test_grid import PAPER, check_served_once_within_capacity


def run(
    policy: DispatchPolicy, rate: float, jobs: int, streams: int = 1, seed: int = 0
) -> tuple[GridSimulation, GridResult, int]:
    entries = list(PAPER.sites)[:streams] if streams > 1 else ["Xeon80"]
    arrivals = paper_streams(random.Random(seed), rate, jobs, entries, "Xeon80")
    sim = GridSimulation(PAPER, GridConfig(policy), seed=seed)
    return sim, sim.run(arrivals), len(arrivals)


def most_at_once(result: GridResult, site: str | None = None) -> int:
    """The most jobs running at once (at ``site``, or anywhere)."""
    events = []
    for r in result.records.values():
        if site is None or r.site == site:
            events += [(r.start, 1), (r.end, -1)]
    now = most = 0
    for _, delta in sorted(events):  # an end before a start at the same instant
        now += delta
        most = max(most, now)
    return most


GRIDWAY = DispatchPolicy(Algorithm.GRIDWAY)


def test_one_gridway_at_the_data_site_serves_six_streams_each_job_once() -> None:
    sim, result, arrived = run(GRIDWAY, 0.1, 60, streams=6)
    assert list(sim.brokers) == ["Xeon80"]  # every entry's jobs go to the one GridWay
    assert {r.entry for r in result.records.values()} == set(PAPER.sites)
    assert result.summary.jobs == arrived == 60
    check_served_once_within_capacity(PAPER, result)


def test_gridway_runs_no_more_than_max_running_user_jobs_at_once() -> None:
    # One user submits everything: MAX_RUNNING_USER = 30 caps GridWay at 30 jobs under load,
    # where the central baseline runs twice as many.
    _, gridway, _ = run(GRIDWAY, 0.6, 120)
    _, central, _ = run(DispatchPolicy(Algorithm.CENTRAL), 0.6, 120)
    assert most_at_once(gridway) == 30
    assert most_at_once(central) > 40
    assert gridway.summary.throughput < central.summary.throughput
    check_served_once_within_capacity(PAPER, gridway)


def test_a_per_resource_limit_of_one_runs_one_job_per_host_at_a_time() -> None:
    # MAX_RUNNING_RESOURCE = 1: a host takes a job only while GridWay uses none of its slots, so
    # no two of GridWay's jobs ever overlap at a site; the central baseline overlaps them.
    one = DispatchPolicy(Algorithm.GRIDWAY, gridway=GridWayPolicy(max_running_resource=1))
    _, gridway, arrived = run(one, 0.3, 40)
    _, central, _ = run(DispatchPolicy(Algorithm.CENTRAL), 0.3, 40)
    assert gridway.summary.jobs == arrived
    assert all(most_at_once(gridway, site) == 1 for site in PAPER.sites)
    assert max(most_at_once(central, site) for site in PAPER.sites) > 1
    assert gridway.summary.mean_wait > central.summary.mean_wait


def test_jobs_wait_for_gridway_s_scheduling_actions() -> None:
    # At light load the central baseline starts a job at once; GridWay holds it until its next
    # scheduling action (every 15 s, on its own clock) and then stages it: a job waits 0-15 s
    # for it, so the mean is several seconds more than central's.
    _, gridway, _ = run(GRIDWAY, 0.02, 30)
    _, central, _ = run(DispatchPolicy(Algorithm.CENTRAL), 0.02, 30)
    extra = gridway.summary.mean_wait - central.summary.mean_wait
    assert 3.0 < extra < 15.0
    assert all(r.start - r.arrival >= 0 for r in gridway.records.values())


def test_a_gridway_run_is_determined_by_its_seed() -> None:
    _, first, _ = run(GRIDWAY, 0.4, 50, seed=3)
    _, again, _ = run(GRIDWAY, 0.4, 50, seed=3)
    # The decision times are wall-clock measurements; everything else is the seed's.
    assert replace(first.summary, decision_time_mean=0, decision_time_p99=0) == replace(
        again.summary, decision_time_mean=0, decision_time_p99=0
    )
    assert [(r.site, r.start) for r in first.records.values()] == [
        (r.site, r.start) for r in again.records.values()
    ]
