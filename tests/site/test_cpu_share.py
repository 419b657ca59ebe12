"""A site's CPU share (a topology site's ``cpu_share``): every job's CPU time capped at the share
of its cores by its cgroup's cpu controller (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``).

The executor test needs root, as cgroups do (CI runs as root), and the cpu controller, which this
development host (v1 hierarchies) and CI's cgroup v2 guest both offer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gbroker.errors import InvalidInput
from gbroker.site import cgroups
from gbroker.site.backend import JobSpec
from gbroker.site.executor import Executor

from .test_executor import JOB_PYTHON, Reports

SPIN = (
    "import json, os, time\n"
    "while not os.path.exists('go'): time.sleep(0.02)\n"
    "wall, cpu = time.perf_counter(), time.process_time()\n"
    "while time.perf_counter() - wall < 1.5: pass\n"
    "print(json.dumps((time.process_time() - cpu) / (time.perf_counter() - wall)))\n"
)


def test_a_quota_is_the_share_of_the_cores_per_period() -> None:
    assert cgroups.CPU_PERIOD == 100_000
    assert cgroups.cpu_quota(0.25, 1) == 25_000
    assert cgroups.cpu_quota(0.5, 4) == 200_000  # two CPUs' time over the job's four cores
    assert cgroups.cpu_quota(0.3, 3, period=10_000) == 9_000
    assert cgroups.cpu_quota(0.001, 1) == cgroups.MIN_CPU_QUOTA  # the kernel's least
    assert cgroups.cpu_quota(1.0, 8) is None  # a whole share: the cpuset holds it already
    with pytest.raises(ValueError, match="cpu_share"):
        cgroups.cpu_quota(0.0, 1)


def test_an_executor_refuses_a_share_out_of_range(tmp_path: Path) -> None:
    for share in (0, 1.5, -1, True):
        with pytest.raises(InvalidInput, match="cpu_share: expected a share of the cores"):
            Executor(tmp_path, cpu_share=share, confine=False)


def quota_file(group: cgroups.Group) -> str:
    if group.version == 2:
        return (Path(group.paths[""]) / "cpu.max").read_text().split()[0]
    return (Path(group.paths[cgroups.CPU]) / "cpu.cfs_quota_us").read_text().strip()


@pytest.mark.asyncio
async def test_a_jobs_cpu_time_is_capped_at_the_sites_share(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(60), Executor(tmp_path, cpu_share=0.25) as executor:
        assert executor.cgroups is not None, "this host has cgroups"
        assert executor.cgroups.cpu, executor.cgroups.cpu_unavailable
        assert "CPU time capped at 0.25 of each core" in executor.confinement
        await executor.start(JobSpec("spin", JOB_PYTHON, ("-c", SPIN)), 1, reports)
        group = executor.cgroup_of("spin")
        assert group is not None
        assert quota_file(group) == "25000"  # 0.25 of one core, per 100 ms
        (tmp_path / "spin" / "go").touch()
        result = await reports.one()
    assert result.succeeded, (tmp_path / "spin" / "stderr").read_text()
    ratio = json.loads((tmp_path / "spin" / "stdout").read_text())
    assert ratio <= 0.5, ratio  # the kernel held it near 0.25 (whatever else runs here)


@pytest.mark.asyncio
async def test_a_resize_moves_the_cap_with_the_cores(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(60), Executor(tmp_path, cpu_share=0.5) as executor:
        await executor.start(JobSpec("elastic", "sleep", ("100",)), 1, reports)
        group = executor.cgroup_of("elastic")
        assert group is not None
        before = quota_file(group)
        executor.resize_slots("elastic", 2)
        executor.pin("elastic")
        after = quota_file(group)
        executor.cancel("elastic")
        await reports.one()
    assert (before, after) == ("50000", "100000")  # half of one core, then of two
