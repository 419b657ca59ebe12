"""The simulator honours jobs' requirements and takes job arrays, through the same core as the
daemon: memory-hungry jobs of a Poisson stream never run where the memory is missing, a job no
site fits is rejected (and left out of the figures), and `gbroker sim --jsdl` runs a sweep."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.requirements import Requirements
from gbroker.errors import InvalidInput
from gbroker.jobs.mapping import from_mapping
from gbroker.jobs.sweep import JobArray, load_submission
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.topology import SiteSpec, Topology, load_topology, save_topology
from gbroker.workloads.streams import paper_streams
from gbroker.workloads.submissions import submission_arrivals
from tests.cli.test_candidate_hosts_cli import PINNED

FIXTURES = Path(__file__).parent.parent / "fixtures" / "jsdl"
PINNED_TOPOLOGY = FIXTURES.parent / "pinned-3.yaml"
GiB = 1 << 30
MEMORY = Requirements(individual_memory=2 * GiB)


def topology() -> Topology:
    return Topology(
        [
            SiteSpec("small", 64, memory_per_node=GiB),
            SiteSpec("big", 16, memory_per_node=8 * GiB),
            SiteSpec("medium", 32, memory_per_node=GiB),
        ],
        "full",
        name="memory",
    )


@pytest.mark.parametrize("algorithm", ["dlo", "dr", "dm", "worstfit", "random", "central"])
def test_memory_hungry_jobs_of_a_stream_run_only_where_the_memory_is(algorithm: str) -> None:
    arrivals = paper_streams(random.Random(3), 0.2, 120, ["small"], None)
    hungry = {a.job.id for k, a in enumerate(arrivals) if k % 3 == 0}
    arrivals = [
        dataclasses.replace(a, job=dataclasses.replace(a.job, requirements=MEMORY))
        if a.job.id in hungry
        else a
        for a in arrivals
    ]
    sim = GridSimulation(topology(), GridConfig(DispatchPolicy(Algorithm(algorithm))), seed=1)
    result = sim.run(arrivals)
    assert result.summary.jobs == 120
    assert result.summary.rejected == 0
    assert {result.records[j].site for j in hungry} == {"big"}
    others = {r.site for j, r in result.records.items() if j not in hungry}
    assert len(others) > 1  # the rest still spread over the grid


def test_a_job_no_site_fits_is_rejected_with_the_reason_and_left_out() -> None:
    fits = from_mapping({"executable": "x", "wall_time_limit": 10})
    greedy = dataclasses.replace(fits, individual_physical_memory=None, operating_system="WINNT")
    arrivals = submission_arrivals(fits, entry="small", at=1.0, job_id="small.1")
    arrivals += submission_arrivals(greedy, entry="small", at=1.0, job_id="small.2")
    result = GridSimulation(topology(), GridConfig(), seed=0).run(arrivals)
    assert result.records["small.1"].site
    rejected = result.records["small.2"]
    assert rejected.rejected.startswith("job[small.2].operating_system: expected a site")
    assert "no declared operating system" in rejected.rejected
    assert (result.summary.jobs, result.summary.rejected) == (1, 1)


def test_an_array_enters_as_its_elements_with_the_daemons_ids() -> None:
    array = load_submission(FIXTURES / "sweep_nested.jsdl")
    assert isinstance(array, JobArray)
    arrivals = submission_arrivals(array, entry="big", at=5.0, job_id="big.7", run_time=30)
    assert [a.job.id for a in arrivals] == [f"big.7_{i}" for i in range(1, 10)]
    assert {(a.time, a.entry, a.run_time) for a in arrivals} == {(5.0, "big", 30)}
    result = GridSimulation(topology(), GridConfig(), seed=0).run(arrivals)
    assert all(r.end == r.start + 30 for r in result.records.values())
    with pytest.raises(InvalidInput, match="a run time"):
        submission_arrivals(array, entry="big", at=0.0, job_id="big.8")


def test_gbroker_sim_jsdl_runs_a_sweep_and_says_what_no_site_takes(tmp_path: Path) -> None:
    path = tmp_path / "memory.yaml"
    save_topology(topology(), path)
    needs = tmp_path / "needs.yaml"
    needs.write_text(
        "executable: /bin/true\nwall_time_limit: 20\nname: n\n"
        "individual_physical_memory: {lower: 2147483648}\n"
        "sweep: {assignments: [{parameters: [name], values: [a, b, c]}]}\n"
    )
    impossible = tmp_path / "impossible.yaml"
    impossible.write_text("executable: /bin/true\nwall_time_limit: 20\ntotal_cpu_count: 128\n")
    command = [sys.executable, "-m", "gbroker", "sim", "--topology", str(path), "--algorithm"]
    done = subprocess.run(
        [*command, "dlo", "--jsdl", str(needs), "--jsdl", str(impossible), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["id"]: row for row in report["jobs"]}
    assert [rows[f"small.1_{i}"]["site"] for i in (1, 2, 3)] == ["big"] * 3
    assert rows["small.2"]["rejected"].startswith("job[small.2].rank")
    assert report["rejected"] == 1
    text = subprocess.run(
        [*command, "dlo", "--jsdl", str(needs), "--entry", "medium"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert text.splitlines()[0].startswith("medium.1_1               ran at big")
    missing = subprocess.run([*command, "dlo"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "--rate, --jobs" in missing.stderr


@pytest.mark.parametrize("algorithm", ["dlo", "dr", "dm", "random", "worstfit", "central"])
@pytest.mark.parametrize(("name", "site"), PINNED.items())
def test_a_pinned_job_runs_only_at_its_candidate_hosts_as_on_a_fleet(
    algorithm: str, name: str, site: str
) -> None:
    """The jobs and the topology of the fleet test (tests/cli/test_candidate_hosts_cli.py), each
    job 20 times from every site: the simulator places all 20 where the daemons do."""
    grid = load_topology(PINNED_TOPOLOGY)
    job = load_submission(FIXTURES / name)
    entries = list(grid.sites)
    arrivals = [
        arrival
        for k in range(20)
        for arrival in submission_arrivals(
            job, entry=entries[k % len(entries)], at=1.0 + k, job_id=f"j{k}", run_time=5
        )
    ]
    policy = DispatchPolicy(Algorithm(algorithm))
    result = GridSimulation(grid, GridConfig(policy), seed=2).run(arrivals)
    assert result.summary.jobs == 20
    assert {r.site for r in result.records.values()} == {site}


def test_a_pinned_job_on_the_papers_testbed_runs_at_p4_18() -> None:
    """The issue's job on topologies/paper-6.yaml (no site declares any property)."""
    job = from_mapping({"executable": "/bin/true", "candidate_hosts": ["P4-18"]})
    grid = load_topology(Path(__file__).parents[2] / "topologies" / "paper-6.yaml")
    entries = list(grid.sites)
    arrivals = [
        arrival
        for k in range(20)
        for arrival in submission_arrivals(
            job, entry=entries[k % len(entries)], at=1.0 + k, job_id=f"j{k}", run_time=5
        )
    ]
    result = GridSimulation(grid, GridConfig(), seed=2).run(arrivals)
    assert [r.site for r in result.records.values()] == ["P4-18"] * 20
