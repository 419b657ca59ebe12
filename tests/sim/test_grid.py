"""The multi-site simulator end to end: every job served once, on a site that can hold it."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.model import Job
from gbroker.errors import InvalidInput
from gbroker.sim.grid import GridConfig, GridResult, GridSimulation
from gbroker.topology import LinkSpec, SiteSpec, Topology, full, load_topology, torus
from gbroker.workloads.streams import Arrival, paper_streams
from tests.conftest import ROOT

PAPER = load_topology(ROOT / "topologies" / "paper-6.yaml")


def simulate(
    topology: Topology,
    policy: DispatchPolicy,
    rate: float,
    jobs: int,
    seed: int = 0,
    streams: int = 1,
    **config: float,
) -> tuple[GridResult, list[Arrival]]:
    entries = list(topology.sites)[:streams] if streams > 1 else ["Xeon80"]
    data = next(iter(topology.data.values()), None)
    arrivals = paper_streams(random.Random(seed), rate, jobs, entries, data)
    sim = GridSimulation(topology, GridConfig(policy, **config), seed=seed)  # type: ignore[arg-type]
    return sim.run(arrivals), arrivals


def check_served_once_within_capacity(topology: Topology, result: GridResult) -> None:
    per_site: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for job_id, r in result.records.items():
        assert r.starts == 1, f"{job_id} started {r.starts} times"
        assert r.arrival <= r.start <= r.end, job_id
        assert r.site in topology.sites
        assert r.rank <= r.cores <= topology.sites[r.site].cores
        per_site[r.site] += [(r.start, r.cores), (r.end, -r.cores)]
    for site, events in per_site.items():
        used = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts
            used += delta
            assert used <= topology.sites[site].cores, site


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_algorithm_serves_every_job_once(algorithm: Algorithm) -> None:
    result, arrivals = simulate(PAPER, DispatchPolicy(algorithm, replicas=3), 0.4, 150)
    assert len(result.records) == len(arrivals) == result.summary.jobs
    check_served_once_within_capacity(PAPER, result)
    assert 0 < result.summary.utilization <= 1


@pytest.mark.parametrize(("algorithm", "replicas"), [("dr", 3), ("drm", 3), ("dr", 6)])
def test_thousands_of_replicated_jobs_never_start_twice(algorithm: str, replicas: int) -> None:
    # Slow links (200 ms latency) and stale monitoring widen every race between replicas: claims
    # arrive late, withdrawals cross starts. Exactly one replica of each job may still run.
    slow = Topology(
        PAPER.sites.values(),
        PAPER.neighbourhood,
        name="paper-6-slow",
        default_link=LinkSpec(125e6, 0.2),
        data=PAPER.data,
    )
    policy = DispatchPolicy(Algorithm(algorithm), replicas=replicas, interval=10.0)
    result, _ = simulate(slow, policy, 0.02, 2000, seed=3, streams=6, dcsmon_period=10.0)
    check_served_once_within_capacity(slow, result)
    assert result.summary.claims_denied > 0  # races did happen, and were refused
    assert result.summary.dispatches >= 2000 * min(replicas, 6)


def test_migration_moves_queued_jobs_and_pays_for_it_in_transfers() -> None:
    dlo, _ = simulate(PAPER, DispatchPolicy(Algorithm.DLO), 0.5, 300)
    dm, _ = simulate(PAPER, DispatchPolicy(Algorithm.DM, interval=30.0, epsilon=0.2), 0.5, 300)
    assert dlo.summary.withdrawals == 0
    assert dlo.summary.dispatches == 300
    assert dm.summary.withdrawals > 0
    assert dm.summary.dispatches == 300 + dm.summary.withdrawals  # each move is one more dispatch
    assert dm.summary.file_bytes > dlo.summary.file_bytes
    check_served_once_within_capacity(PAPER, dm)


def test_a_huge_epsilon_means_no_migration() -> None:
    result, _ = simulate(PAPER, DispatchPolicy(Algorithm.DM, epsilon=1e9), 0.5, 200)
    assert result.summary.withdrawals == 0


def test_central_scheduler_only_places_jobs_that_can_start() -> None:
    result, _ = simulate(PAPER, DispatchPolicy(Algorithm.CENTRAL, interval=10.0), 0.6, 200)
    check_served_once_within_capacity(PAPER, result)
    # Jobs wait in the central queue, not in the sites': dispatch happens only into free cores.
    assert result.summary.withdrawals == 0


def test_runs_are_determined_by_the_seed() -> None:
    policy = DispatchPolicy(Algorithm.DRM, replicas=2)
    first, _ = simulate(PAPER, policy, 0.4, 200, seed=11)
    second, _ = simulate(PAPER, policy, 0.4, 200, seed=11)
    other, _ = simulate(PAPER, policy, 0.4, 200, seed=12)
    strip = {"decision_time_mean", "decision_time_p99"}  # wall-clock measurements

    def figures(r: GridResult) -> dict[str, float]:
        return {k: v for k, v in vars_of(r).items() if k not in strip}

    assert figures(first) == figures(second)
    assert figures(first) != figures(other)


def vars_of(result: GridResult) -> dict[str, float]:
    s = result.summary
    return {name: getattr(s, name) for name in s.__slots__}


def test_staging_uses_the_links_and_local_data_costs_nothing() -> None:
    remote, _ = simulate(PAPER, DispatchPolicy(Algorithm.DLO), 0.3, 100)
    assert remote.summary.file_bytes > 0
    local = full(3, cores=16)
    arrivals = paper_streams(random.Random(1), 0.05, 50, ["s0"], "s0")
    config = GridConfig(DispatchPolicy(Algorithm.CLOSETOFILES), netmon_period=0)
    result = GridSimulation(local, config).run(arrivals)
    assert result.summary.file_bytes == 0  # close-to-files keeps every job with its data
    assert {r.site for r in result.records.values()} == {"s0"}


def test_netmon_probes_feed_the_forecaster() -> None:
    sim = GridSimulation(PAPER, GridConfig(DispatchPolicy(), netmon_period=60.0))
    arrivals = paper_streams(random.Random(2), 0.2, 100, ["Xeon80"], "Xeon80")
    result = sim.run(arrivals)
    assert result.summary.probe_bytes > 0
    table = sim.forecaster.table("Xeon80", "L4001")
    assert table is not None
    assert table.sizes == [1_000_000, 10_000_000]
    # ~0.08 s for 10 MB at 125 MB/s plus 1 ms latency, a little more while links are shared
    assert 0.08 <= sim.forecaster("Xeon80", "L4001", 10_000_000) < 1.0


def test_bad_workloads_are_rejected() -> None:
    sim = GridSimulation(torus(2, 2, cores=4))
    arrivals = paper_streams(random.Random(0), 0.1, 3, ["nowhere"], None)
    with pytest.raises(InvalidInput, match="entry"):
        sim.run(arrivals)
    with pytest.raises(InvalidInput, match="dcsmon_period"):
        GridConfig(dcsmon_period=-1)


def test_a_start_is_published_even_when_nothing_else_changes() -> None:
    # One job into an idle site, instant DCSMon: once it starts, neighbours must see the cores
    # it took (the start happens in the scheduling pass, after the instant's other events).
    topology = full(2, cores=8)
    sim = GridSimulation(topology, GridConfig(DispatchPolicy(), dcsmon_period=0.0, netmon_period=0))
    arrivals = paper_streams(random.Random(4), 1.0, 1, ["s0"], "s0")
    seen: list[int] = []
    original = sim._launch

    def launch_then_look(site: str, launch: object) -> None:
        original(site, launch)  # type: ignore[arg-type]
        sim.kernel.after(0.5, lambda _: seen.append(sim.board["s0"].latest.state.free_cores), None)

    sim._launch = launch_then_look  # type: ignore[method-assign]
    sim.run(arrivals)
    assert seen == [8 - arrivals[0].job.rank]


def test_a_broker_sees_a_publication_once_its_link_latency_has_passed() -> None:
    # Two neighbours of s0 at different latencies: each publication reaches s0 after its own
    # link's latency; until then s0 sees the one before (or nothing). s0 sees itself exactly.
    sites = [SiteSpec("s0", 8), SiteSpec("s1", 8), SiteSpec("s2", 8)]
    links = {("s1", "s0"): LinkSpec(125e6, 0.2), ("s2", "s0"): LinkSpec(125e6, 0.7)}
    topology = Topology(sites, "full", links=links)
    sim = GridSimulation(topology, GridConfig(DispatchPolicy(), dcsmon_period=1.0, netmon_period=0))
    view = sim.views["s0"]
    seen: dict[float, tuple[int | None, ...]] = {}

    def look(at: float) -> None:
        got = [view.get(site) for site in ("s0", "s1", "s2")]
        seen[at] = tuple(None if o is None else o.state.queued for o in got)

    def queue(site: str) -> None:
        sim.sites[site].accept(Job(f"at-{site}", 2), "s0")  # queued, never scheduled here
        sim._publish_later(site)

    sim.kernel.at(0.05, queue, "s0")
    sim.kernel.at(0.05, queue, "s1")
    sim.kernel.at(0.05, queue, "s2")
    for at in (0.0, 0.1, 0.5, 1.0, 1.1, 1.2, 1.5, 1.7, 2.0):
        sim.kernel.at(at, look, at, priority=3)  # after the publications of that instant
    sim.kernel.run(until=2.5)
    assert seen == {
        0.0: (0, None, None),  # the first publications (at 0) have not arrived yet
        0.1: (1, None, None),  # s0 sees its own queue at once
        0.5: (1, 0, None),  # s1's first arrives after 0.2 s
        1.0: (1, 0, 0),  # s2's after 0.7 s; both publish their queues at 1.0
        1.1: (1, 0, 0),
        1.2: (1, 1, 0),
        1.5: (1, 1, 0),
        1.7: (1, 1, 1),
        2.0: (1, 1, 1),
    }


def test_a_site_resizes_malleable_jobs_and_their_work_carries_over() -> None:
    """One 4-core site under FPSMA/PWA, as the single-site simulator's hand-computed case: A
    (malleable, 1-4 cores, 100 s of work on one core) starts on 4 at t=0; B (rigid, 2 cores,
    20 s) comes at 10. A shrinks to 2 so B starts at once; A grows back when B ends at 30 and
    ends at 35 (40% + 40% done, 20% left on 4 cores: 5 s)."""
    from gbroker.core.malleable import MalleabilityPolicy
    from gbroker.core.model import JobClass

    topology = Topology([SiteSpec("s", 4)], "full")
    arrivals = [
        Arrival(0.0, "s", Job("A", 1, 100.0, JobClass.MALLEABLE, 4), 100.0),
        Arrival(10.0, "s", Job("B", 2, 20.0), 20.0),
    ]
    config = GridConfig(
        malleability=MalleabilityPolicy("fpsma", "pwa"),  # type: ignore[arg-type]
        dcsmon_period=0.0,
        netmon_period=0.0,
    )
    result = GridSimulation(topology, config).run(arrivals)
    a, b = result.records["A"], result.records["B"]
    assert (a.start, a.cores, a.resizes) == (0.0, 4, 2)
    assert a.end == pytest.approx(35.0)
    assert (b.start, b.end) == (10.0, 30.0)
    assert a.core_seconds() == pytest.approx(4 * 10 + 2 * 20 + 4 * 5)
    assert result.summary.utilization == pytest.approx((100 + 40) / (4 * 35))
    rigid = GridSimulation(topology, GridConfig(dcsmon_period=0.0, netmon_period=0.0))
    held = rigid.run(arrivals)
    assert (held.records["A"].end, held.records["B"].start) == (25.0, 25.0)
