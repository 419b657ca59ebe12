"""The simulated grid with SD-Policy sites: F(j) at the brokers sees what SD-Policy's mates
would give (``SiteState.shareable``), for the jobs that may share, as the daemon's brokers do
(the same core: ``LocalScheduler.state``, ``Broker``)."""

from __future__ import annotations

from gbroker.core.dispatch import DispatchPolicy
from gbroker.core.model import InputFile, Job, JobClass
from gbroker.core.sdpolicy import SdPolicy
from gbroker.sim.grid import GridConfig, GridSimulation
from gbroker.topology import LinkSpec, SiteSpec, Topology

MB = 1 << 20
TWO = Topology([SiteSpec("a", 2), SiteSpec("b", 2)], "full", default_link=LinkSpec(1 * MB, 0.0))


def run(sd: SdPolicy | None, guest: Job) -> dict[str, tuple[str, float, int]]:
    """M (1..2 cores) runs at a from 0, R (2 cores, rigid) at b from 1; at 10 ``guest``, whose
    1 MB input is at b, enters b. Each job's (site, start, cores)."""
    from gbroker.workloads.streams import Arrival

    mate = Job("M", 1, 1000.0, JobClass.MALLEABLE, 2)
    arrivals = [
        Arrival(0.0, "a", mate, 500.0),
        Arrival(1.0, "b", Job("R", 2, 1000.0), 500.0),
        Arrival(10.0, "b", guest, 30.0),
    ]
    config = GridConfig(DispatchPolicy(), dcsmon_period=1.0, sd_policy=sd)
    result = GridSimulation(TWO, config).run(arrivals)
    return {job: (r.site, r.start, r.cores) for job, r in result.records.items()}


def test_a_guest_goes_where_a_mate_would_give_it_cores_and_starts_at_once() -> None:
    """At 10 both sites are full. At a, SD-Policy's mate M would give one core to a job that
    may share: F(a) = t_a/t_max = 1 (it starts at once), F(b) = c_max/c_b = 1 + 1 (it waits).
    The guest goes to a, starts as soon as its input is there (1 s later), on M's core. A
    rigid job of the same size waits at b, where its input is (F(b) = 0 < F(a) = 1: neither
    site has a core for it), until R ends; and so does the guest without SD-Policy."""
    files = (InputFile("in", 1 * MB, "b"),)
    guest = Job("G", 1, 60.0, JobClass.MALLEABLE, 2, files)
    shared = run(SdPolicy(10.0), guest)
    assert shared["M"][0] == "a"
    assert shared["R"][0] == "b"
    site, start, cores = shared["G"]
    assert (site, cores) == ("a", 1)
    assert 10.0 < start < 12.0
    rigid = run(SdPolicy(10.0), Job("G", 1, 60.0, input_files=files))
    assert rigid["G"][0] == "b"
    assert rigid["G"][1] >= 501.0
    static = run(None, guest)
    assert static["G"][0] == "b"
    assert static["G"][1] >= 501.0
