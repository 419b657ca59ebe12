"""Co-allocated jobs in the simulator: placed by KOALA's policies, started and ended together."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest

from gbroker.core.coalloc import CoAllocation, CoPolicy
from gbroker.core.model import InputFile, Job
from gbroker.errors import InvalidInput
from gbroker.sim.grid import GridConfig, GridResult, GridSimulation
from gbroker.topology import LinkSpec, SiteSpec, Topology
from gbroker.workloads.streams import Arrival

LATENCY = 0.01
POLL = 0.5  # a site told to wait for a component's mates asks again after this (the default)


def grid(*sites: tuple[str, int, float], latency: float = LATENCY) -> Topology:
    return Topology(
        [SiteSpec(name, cores, speed=speed) for name, cores, speed in sites],
        "full",
        name="test",
        default_link=LinkSpec(125e6, latency),
    )


def co(
    time: float,
    job_id: str,
    components: tuple[int, ...],
    run: float,
    entry: str = "A",
    files: tuple[InputFile, ...] = (),
    flexible: bool = False,
) -> Arrival:
    job = Job(job_id, sum(components), run, input_files=files)
    return Arrival(time, entry, job, run, components=components, flexible=flexible)


def plain(time: float, job_id: str, rank: int, run: float, entry: str = "A") -> Arrival:
    return Arrival(time, entry, Job(job_id, rank, run), run)


def simulate(topology: Topology, arrivals: list[Arrival], **coalloc: object) -> GridResult:
    config = GridConfig(
        dcsmon_period=0.0,
        netmon_period=0.0,
        coallocation=CoAllocation(**coalloc),  # type: ignore[arg-type]
    )
    return GridSimulation(topology, config).run(arrivals)


def test_a_co_allocated_job_spans_sites_and_its_components_end_together_at_the_slowest_speed() -> (
    None
):
    topology = grid(("A", 8, 1.0), ("B", 8, 0.5))
    # At 1 s the owner has heard from B (DCSMon's first word arrives one latency after 0).
    result = simulate(topology, [co(1.0, "j", (6, 6), 100.0)], policy=CoPolicy.WORST_FIT)
    r = result.records["j"]
    assert r.placement == (("A", 6), ("B", 6))
    assert r.site == "A+B"
    assert r.cores == 12
    assert r.starts == 1
    assert r.tries == 1
    # A's component claims at once and is told to wait; B's is dispatched (one latency),
    # claims (one back) and, the last, is granted with A's (one out). A's site hears of the
    # grant when it asks again, a poll after its first claim: the job starts then.
    assert r.start == pytest.approx(1.0 + POLL)
    assert r.end == pytest.approx(r.start + 100.0 / 0.5)  # B runs at half speed
    s = result.summary
    assert (s.jobs, s.coallocated, s.coalloc_failed, s.coalloc_sites) == (1, 1, 0, 2.0)
    assert s.mean_wait == pytest.approx(POLL)
    assert s.claim_timeouts == 0


def test_the_same_job_spans_two_sites_by_worst_fit_and_one_by_cluster_minimization() -> None:
    topology = grid(("A", 64, 1.0), ("B", 40, 1.0))
    arrivals = [co(1.0, "j", (16, 16, 16), 10.0)]
    wf = simulate(topology, arrivals, policy=CoPolicy.WORST_FIT)
    cm = simulate(topology, arrivals, policy=CoPolicy.CM)
    assert wf.records["j"].placement == (("A", 16), ("A", 16), ("B", 16))
    assert cm.records["j"].placement == (("A", 16), ("A", 16), ("A", 16))
    assert (wf.summary.coalloc_sites, cm.summary.coalloc_sites) == (2.0, 1.0)
    # Both start once the components told to wait ask again, a poll after they first claimed.
    assert cm.records["j"].start == pytest.approx(1.0 + POLL)
    assert wf.records["j"].start == pytest.approx(1.0 + POLL)


def test_close_to_files_runs_where_the_input_is() -> None:
    topology = grid(("A", 16, 1.0), ("B", 8, 1.0))
    files = (InputFile("data", 500_000_000, "B"),)
    arrivals = [co(1.0, "j", (4, 4), 10.0, files=files)]
    ctf = simulate(topology, arrivals, policy=CoPolicy.CLOSE_TO_FILES)
    wf = simulate(topology, arrivals, policy=CoPolicy.WORST_FIT)
    assert ctf.records["j"].placement == (("B", 4), ("B", 4))
    assert ctf.summary.file_bytes == 0
    assert wf.records["j"].placement == (("A", 4), ("A", 4))
    assert wf.summary.file_bytes == 500_000_000  # once to A, for both its components
    # The component without files claimed at 1 s and asks every poll; the one with them claims
    # once 0.5 GB crossed at 125 MB/s (after 5.01 s), granting both: the first hears at 5.5 s.
    assert wf.records["j"].start == pytest.approx(5.5)


def test_a_job_that_does_not_fit_waits_in_the_placement_queue_and_is_retried_each_interval() -> (
    None
):
    topology = grid(("A", 8, 1.0), ("B", 8, 1.0))
    arrivals = [plain(0.0, "busy", 8, 100.0), co(1.0, "j", (8, 4), 10.0)]
    result = simulate(topology, arrivals, policy=CoPolicy.WORST_FIT, interval=30.0)
    r = result.records["j"]
    # Tried at 1 s (A busy: 8 does not fit), at 31, 61, 91 s; A is free at 100 s: placed at 121,
    # started a poll later (A's component waits for B's).
    assert r.tries == 5
    assert r.start == pytest.approx(121.0 + POLL)
    assert sorted(r.placement) == [("A", 8), ("B", 4)]
    assert result.summary.placement_tries == 5.0


def test_a_job_fails_after_the_threshold_of_tries_and_never_runs() -> None:
    topology = grid(("A", 8, 1.0), ("B", 8, 1.0))
    arrivals = [
        plain(0.0, "busy", 8, 1000.0),
        plain(0.0, "busy2", 8, 1000.0, entry="B"),
        co(1.0, "j", (4, 4), 10.0),
        co(2.0, "later", (2,), 10.0),
    ]
    result = simulate(topology, arrivals, policy=CoPolicy.CM, interval=60.0, threshold=3)
    r = result.records["j"]
    assert r.failed == "no placement in 3 tries"
    assert r.tries == 3
    assert r.placement == ()
    s = result.summary
    assert s.coalloc_failed == 2
    assert s.rounds_out == 0  # failed by the threshold of tries, never placed
    assert s.jobs == 2  # the two ordinary jobs; the failed ones are left out of the figures
    assert s.placement_tries == 3.0


def test_components_that_never_all_get_their_cores_fail_the_job_after_its_rounds() -> None:
    # A's view of B is stale (DCSMon publishes every 100 s): B looks idle, but a long job took
    # it at 0.5 s. The co-allocated job's component at B queues behind it; A's holds its cores,
    # asks again every poll, and each round of 5 s times out: it queues again and claims again,
    # until the third round fails the job. None of it ever ran, and nothing is left held.
    topology = grid(("A", 8, 1.0), ("B", 8, 1.0))
    arrivals = [plain(0.5, "busy", 8, 1000.0, entry="B"), co(1.0, "j", (8, 4), 10.0)]
    config = GridConfig(
        dcsmon_period=100.0,
        netmon_period=0.0,
        coallocation=CoAllocation(CoPolicy.WORST_FIT, claim_timeout=5.0, rounds=3),
    )
    sim = GridSimulation(topology, config)
    result = sim.run(arrivals)
    r = result.records["j"]
    assert r.placement == (("A", 8), ("B", 4))
    assert r.failed == "its 2 components did not all get their cores within 5 s, 3 times"
    assert r.starts == 0
    assert math.isnan(r.start)
    s = result.summary
    assert (s.jobs, s.coalloc_failed, s.rounds_out, s.claim_timeouts) == (1, 1, 1, 3)
    for agent in sim.sites.values():
        assert not agent.hosted
        assert agent.state().free_cores == 8


def test_the_claim_poll_is_checked() -> None:
    with pytest.raises(InvalidInput) as info:
        GridConfig(claim_poll=0.0)
    assert info.value.field == "claim_poll"


def test_a_job_no_site_could_ever_hold_is_rejected_not_queued_forever() -> None:
    topology = grid(("A", 8, 1.0), ("B", 8, 1.0))
    result = simulate(topology, [co(1.0, "j", (12,), 10.0)], policy=CoPolicy.WORST_FIT)
    assert "cannot fit the sites of A's neighbourhood" in result.records["j"].rejected
    assert result.summary.rejected == 1
    # A flexible job of 12 fits two empty sites of 8 under FCM: split [8, 4].
    flexible = co(1.0, "f", (12,), 10.0, flexible=True)
    fcm = simulate(topology, [flexible], policy=CoPolicy.FCM)
    assert fcm.records["f"].placement == (("A", 8), ("B", 4))


def test_components_must_sum_to_the_jobs_rank() -> None:
    topology = grid(("A", 8, 1.0))
    bad = Arrival(0.0, "A", Job("j", 5, 1.0), 1.0, components=(2, 2))
    with pytest.raises(InvalidInput) as info:
        GridSimulation(topology).run([bad])
    assert info.value.field == "arrival[j].components"


def check_within_capacity(topology: Topology, result: GridResult) -> None:
    per_site: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in result.records.values():
        if r.rejected or r.failed:
            continue
        assert r.starts == 1
        assert r.arrival <= r.start <= r.end
        for site, cores in r.placement or ((r.site, r.cores),):
            per_site[site] += [(r.start, cores), (r.end, -cores)]
    for site, events in per_site.items():
        used = 0
        for _, delta in sorted(events):  # ends before starts at the same instant
            used += delta
            assert used <= topology.sites[site].cores, site


@pytest.mark.parametrize("policy", list(CoPolicy))
def test_a_busy_mixed_stream_on_stale_views_runs_every_job_once_within_capacity(
    policy: CoPolicy,
) -> None:
    # Five DAS-3-like sites seen through 10 s DCSMon periods and 50 ms links: owners place on
    # stale idle counts, so some placements find the cores gone and their claims time out,
    # round after round of 5 s: the components queue again where they are, and a job whose
    # rounds run out fails (the owner's broker decides, as the daemon's does).
    topology = grid(*((f"S{k}", n, 1.0) for k, n in enumerate((34, 16, 28, 18, 12))), latency=0.05)
    rng = random.Random(7)
    arrivals: list[Arrival] = []
    t = 0.0
    for n in range(150):
        t += rng.expovariate(1 / 8.0)
        entry = f"S{rng.randrange(5)}"
        run = rng.uniform(30, 300)
        if rng.random() < 0.6:
            parts = tuple(rng.randint(1, 12) for _ in range(rng.randint(1, 4)))
            arrivals.append(
                co(t, f"c{n}", parts, run, entry=entry, flexible=policy is CoPolicy.FCM)
            )
        else:
            arrivals.append(plain(t, f"p{n}", rng.randint(1, 8), run, entry))
    config = GridConfig(
        dcsmon_period=10.0,
        netmon_period=0.0,
        coallocation=CoAllocation(policy, interval=20.0, claim_timeout=5.0),
    )
    sim = GridSimulation(topology, config, seed=1)
    result = sim.run(arrivals)
    check_within_capacity(topology, result)
    for agent in sim.sites.values():  # no component left holding cores, none left queued
        assert not agent.hosted
        assert not agent.staging
        assert agent.state().free_cores == agent.state().total_cores
    s = result.summary
    co_jobs = sum(1 for a in arrivals if a.components)
    assert s.jobs + s.coalloc_failed == 150  # no threshold: every job ran but for rounds out
    assert s.coallocated + s.coalloc_failed == co_jobs
    assert s.claim_timeouts > 0  # stale views did misplace some, and they queued again
    assert s.rounds_out == s.coalloc_failed
    for r in result.records.values():
        if r.failed:
            assert r.failed.endswith("within 5 s, 10 times")
            assert r.starts == 0
    for r in result.records.values():
        if r.placement:
            assert sum(c for _, c in r.placement) == r.rank
