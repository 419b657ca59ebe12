"""The simulator carries out every command of the core (gbroker.core.events): none is dropped.

A cancel (GridSimulation.cancel, the daemon's ``gbroker cancel``) makes the owner's broker
withdraw the job where it waits and kill it where it runs (``Kill``); a black-hole notice
(``SiteExcluded``) is counted, as the daemon counts it; an ``Abandon`` with no simulated cause is
refused aloud."""

from __future__ import annotations

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.events import Abandon, GangGranted, SiteExcluded
from gbroker.core.model import InputFile, Job
from gbroker.errors import InternalError, InvalidInput
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.topology import LinkSpec, SiteSpec, Topology
from gbroker.workloads.streams import Arrival

MB = 1_000_000
ONE = Topology([SiteSpec("s", 4)], "full")


def test_a_running_job_cancelled_is_killed_at_its_site_and_frees_its_cores() -> None:
    sim = GridSimulation(ONE, GridConfig(DispatchPolicy(Algorithm.DLO)))
    sim.cancel("A", at=20.0)
    result = sim.run(
        [Arrival(0.0, "s", Job("A", 4, 100.0), 100.0), Arrival(1.0, "s", Job("B", 4, 10.0), 10.0)]
    )
    a, b = result.records["A"], result.records["B"]
    assert (a.cancelled, a.killed) == (True, True)
    assert (a.start, a.end) == (0.0, 20.0)  # stopped at the cancel, not at its own end (100)
    assert (b.start, b.end) == (20.0, 30.0)  # on the cores the kill gave back
    assert result.summary.jobs == 1  # a cancelled job is out of the figures
    assert not sim.sites["s"].hosted


def test_a_waiting_job_cancelled_is_withdrawn_and_never_starts() -> None:
    sim = GridSimulation(ONE, GridConfig(DispatchPolicy(Algorithm.DLO)))
    sim.cancel("B", at=5.0)
    result = sim.run(
        [Arrival(0.0, "s", Job("A", 4, 100.0), 100.0), Arrival(1.0, "s", Job("B", 4, 10.0), 10.0)]
    )
    b = result.records["B"]
    assert (b.cancelled, b.killed, b.starts) == (True, False, 0)
    assert result.summary.withdrawals == 1
    assert result.summary.jobs == 1
    assert result.records["A"].end == 100.0


def test_a_granted_job_cancelled_while_its_files_come_stops_as_it_would_launch() -> None:
    # Federation siblings are queued without their files and fetch them once granted; the file
    # lives at a site too small for the job, so whichever sibling wins fetches it for 50 s.
    topology = Topology(
        [SiteSpec("s0", 4), SiteSpec("s1", 4), SiteSpec("data", 1)],
        "full",
        default_link=LinkSpec(1 * MB, 0.0),
    )
    job = Job("A", 4, 100.0, input_files=(InputFile("in", 50 * MB, "data"),))
    # No probes, and every publication at once: the run ends with the job's last event.
    config = GridConfig(DispatchPolicy(Algorithm.FEDERATION), dcsmon_period=0.0, netmon_period=0.0)
    sim = GridSimulation(topology, config)
    sim.cancel("A", at=10.0)
    result = sim.run([Arrival(0.0, "s0", job, 100.0)])
    a = result.records["A"]
    assert (a.cancelled, a.killed, a.starts) == (True, True, 0)  # its processes never ran
    assert all(not agent.hosted for agent in sim.sites.values())  # its cores were given back
    assert sim.kernel.now == pytest.approx(50.0)  # its files came in 50 s; it did not run 100


def test_a_cancel_is_refused_for_a_job_that_has_not_arrived() -> None:
    sim = GridSimulation(ONE, GridConfig(DispatchPolicy(Algorithm.DLO)))
    sim.cancel("B", at=0.5)
    with pytest.raises(InvalidInput, match="cancel"):
        sim.run(
            [
                Arrival(0.0, "s", Job("A", 4, 10.0), 10.0),
                Arrival(1.0, "s", Job("B", 4, 10.0), 10.0),
            ]
        )


def test_a_black_hole_notice_is_counted_and_a_gang_grant_needs_nothing_durable() -> None:
    sim = GridSimulation(ONE, GridConfig(DispatchPolicy(Algorithm.DLO)))
    sim._carry_out("s", [SiteExcluded("s", 300.0, 5, 5, 1.0, 0.0), GangGranted("g", ())])
    assert sim.sites_excluded == 1


def test_an_abandon_of_a_job_of_its_own_is_refused_aloud() -> None:
    # Only a lost site or a refused dispatch abandons a job, and the simulator has neither.
    sim = GridSimulation(ONE, GridConfig(DispatchPolicy(Algorithm.DLO)))
    sim.run([Arrival(0.0, "s", Job("A", 4, 10.0), 10.0)])
    with pytest.raises(InternalError, match="abandoned"):
        sim._carry_out("s", [Abandon("A", "its site s was lost and no other fits it")])
