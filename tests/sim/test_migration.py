"""Running-job migration in the simulator: Dynamite's decider, checkpoint, transfer, restore, by
hand-computed timelines; and sites that slow down when background load arrives."""

from __future__ import annotations

import math

import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.dynamite import MigrationPolicy
from gbroker.core.localsched import QueuePolicy
from gbroker.core.model import Job
from gbroker.errors import InvalidInput
from gbroker.sim.grid import GridConfig, GridResult, GridSimulation
from gbroker.topology import LinkSpec, SiteSpec, Topology
from gbroker.workloads.streams import Arrival

MB = 1_000_000
# Two sites of 4 cores on 1 MB/s links without latency: NetMon's forecast (no probes) is the
# default bandwidth, 10 MB in 10 s, and so is the network model's transfer.
TWO = Topology([SiteSpec("A", 4), SiteSpec("B", 4)], "full", default_link=LinkSpec(1 * MB, 0.0))
# T = 0.5, checked every 60 s, dump and restore at 1 MB/s.
POLICY = MigrationPolicy(0.5, 60.0, min_remaining=100.0, checkpoint_rate=MB, restore_rate=MB)
SLOWDOWN = ((100.0, "A", 0.25),)  # background load takes A to a quarter of its speed at 100 s


def run(
    image: int,
    migration: MigrationPolicy | None,
    speed_changes: tuple[tuple[float, str, float], ...] = SLOWDOWN,
) -> GridResult:
    # One job of 4 cores that runs 1000 s at speed 1 and asked for exactly that; it enters at A
    # and starts there (F ties: the lower site id).
    job = Job("j", 4, requested_time=1000.0)
    config = GridConfig(
        DispatchPolicy(Algorithm.DLO),
        queue_policy=QueuePolicy.FCFS,
        dcsmon_period=0.0,
        netmon_period=0.0,
        migration=migration,
        speed_changes=speed_changes,
    )
    arrivals = [Arrival(0.0, "A", job, 1000.0, image_size=image)]
    return GridSimulation(TWO, config).run(arrivals)


def test_a_slowed_site_carries_its_running_job_over_at_the_new_speed() -> None:
    # 100 s at speed 1 (a tenth of the work), then 900 s of work at 0.25: 3600 s more.
    result = run(10 * MB, None)
    record = result.records["j"]
    assert (record.site, record.start, record.end) == ("A", 0.0, 3700.0)
    assert result.summary.migrations == 0


def test_the_decider_moves_the_job_off_the_slowed_site_and_it_ends_earlier() -> None:
    # At 60 s A is full at speed 1: C_A = 0.5, L_A = 0.5, not > T. At 120 s (A at 0.25 since
    # 100 s) the job has done 0.1 + 20/4000 = 0.105: it estimates (1 - 0.105) * 1000 / 0.25 =
    # 3580 s left at A, 895 at B: it saves 2685 s for 10 + 10 + 10. Frozen at 120, dumped at
    # 130, at B at 140, restored at 150, it ends 895 s later.
    result = run(10 * MB, POLICY)
    record = result.records["j"]
    assert record.site == "B"
    assert record.end == pytest.approx(1045.0)
    assert (record.migrations, record.last_moved, record.starts) == (1, 120.0, 1)
    assert record.downtime == pytest.approx(30.0)
    s = result.summary
    assert s.migrations == 1
    assert s.image_bytes == 10 * MB
    assert s.migration_downtime == pytest.approx(120.0)  # 30 s on 4 cores
    assert s.work_moved == pytest.approx(0.895 * 1000.0 * 4)
    assert s.probe_bytes == 0


def test_an_image_too_large_for_the_link_stays() -> None:
    # 2 GB: 2000 s to dump, to move and to restore, against 2685 saved: no move.
    result = run(2000 * MB, POLICY)
    assert result.records["j"].end == 3700.0
    assert result.summary.migrations == 0


def test_no_slowdown_no_move_and_the_same_timeline_as_without_the_decider() -> None:
    moved = run(10 * MB, POLICY, speed_changes=())
    still = run(10 * MB, None, speed_changes=())
    assert moved.records["j"].end == still.records["j"].end == 1000.0
    assert moved.summary.migrations == 0


def test_speed_changes_name_a_site_and_a_positive_speed() -> None:
    with pytest.raises(InvalidInput, match=r"speed_changes\[0\]\.site: expected a site"):
        GridSimulation(TWO, GridConfig(speed_changes=((1.0, "Z", 0.5),)))
    with pytest.raises(InvalidInput, match=r"speed_changes\[0\]\.speed: expected a relative"):
        GridConfig(speed_changes=((1.0, "A", 0.0),))
    with pytest.raises(InvalidInput, match=r"speed_changes\[0\]\.time"):
        GridConfig(speed_changes=((math.nan, "A", 1.0),))
