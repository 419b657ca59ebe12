"""Sparrow and Slurm federation in the simulator: every job served once, inputs moved once."""

from __future__ import annotations

import random

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.malleable import MalleabilityPolicy, Policy
from gbroker.core.model import InputFile, Job
from gbroker.sim.grid import GridConfig, GridResult, GridSimulation
from gbroker.topology import Topology, load_topology
from gbroker.workloads.streams import Arrival, make_malleable, paper_streams
from tests.conftest import ROOT
from tests.sim.test_grid import PAPER, check_served_once_within_capacity, simulate

TORUS = load_topology(ROOT / "topologies" / "paper-6-torus.yaml")
MB = 1_000_000


def remote_input(result: GridResult, arrivals: list[Arrival]) -> int:
    """The bytes of the jobs' inputs that were not at the site each job ran at."""
    ran_at = {job_id: r.site for job_id, r in result.records.items()}
    return sum(f.size for a in arrivals for f in a.job.input_files if f.site != ran_at[a.job.id])


@pytest.mark.parametrize("algorithm", [Algorithm.SPARROW, Algorithm.FEDERATION])
@pytest.mark.parametrize("topology", [PAPER, TORUS], ids=["full", "torus"])
def test_a_short_run_serves_every_job_exactly_once(
    algorithm: Algorithm, topology: Topology
) -> None:
    policy = DispatchPolicy(algorithm)
    result, arrivals = simulate(topology, policy, 0.05, 150, seed=2, streams=6)
    assert len(result.records) == len(arrivals) == result.summary.jobs == 150
    check_served_once_within_capacity(topology, result)
    # Sparrow probes 2 sites per job; the federation places a sibling at each of S(i): 6 sites
    # on the full graph, 4 on the torus (3 neighbours and the origin).
    per_job = 2 if algorithm is Algorithm.SPARROW else (6 if topology is PAPER else 4)
    assert result.summary.dispatches == 150 * per_job
    # Only the placement granted its start moved its inputs: each job's once, where it ran.
    assert result.summary.file_bytes == remote_input(result, arrivals)


def test_staging_every_sibling_moves_a_copy_to_each() -> None:
    policy = DispatchPolicy(Algorithm.FEDERATION, stage_reservations=True)
    result, arrivals = simulate(PAPER, policy, 0.05, 60, seed=1, streams=6)
    check_served_once_within_capacity(PAPER, result)
    # The inputs sit at Xeon80: five of a job's six siblings stage a copy.
    assert result.summary.file_bytes == 5 * sum(f.size for a in arrivals for f in a.job.input_files)


def one_job(policy: DispatchPolicy) -> tuple[str, float, int]:
    """A 300 MB job entering L4001 on the idle testbed (inputs at Xeon80): where it ran, how
    long after its arrival it started, and the input bytes moved."""
    job = Job("L4001.1", 4, 100.0, input_files=(InputFile("in", 300 * MB, "Xeon80"),))
    sim = GridSimulation(PAPER, GridConfig(policy, netmon_period=0), seed=0)
    result = sim.run([Arrival(10.0, "L4001", job, 50.0)])
    record = result.records[job.id]
    return record.site, record.start - record.arrival, result.summary.file_bytes


def test_the_granted_sibling_holds_its_cores_while_its_input_arrives() -> None:
    # Deferred: L4001's own sibling claims first (its owner is itself, no latency), is granted,
    # and waits 1 ms + 300 MB / 125 MB/s = 2.401 s for its input before it starts.
    site, waited, moved = one_job(DispatchPolicy(Algorithm.FEDERATION))
    assert site == "L4001"
    assert waited == pytest.approx(0.001 + 300 * MB / 125e6, abs=1e-6)
    assert moved == 300 * MB
    # Staged at placement: five copies share Xeon80's uplink, and Xeon80's own sibling, with
    # its input at hand, queues first and wins (dispatch 1 ms, claim 1 ms, answer 1 ms).
    site, waited, moved = one_job(DispatchPolicy(Algorithm.FEDERATION, stage_reservations=True))
    assert site == "Xeon80"
    assert waited == pytest.approx(0.003, abs=1e-6)
    assert moved == 5 * 300 * MB


def test_dr_with_malleable_jobs_no_longer_crashes() -> None:
    # A malleable replica grown while its claim was out divided by a zero work rate.
    rng = random.Random(0)
    arrivals = make_malleable(paper_streams(rng, 0.4, 200, ["Xeon80"], "Xeon80"), 0.5, rng, 32)
    config = GridConfig(
        DispatchPolicy(Algorithm.DR, replicas=2), malleability=MalleabilityPolicy(Policy.FPSMA)
    )
    result = GridSimulation(PAPER, config, seed=0).run(arrivals)
    assert all(r.starts == 1 for r in result.records.values())
    assert result.summary.resizes > 0
