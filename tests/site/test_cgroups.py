"""A cgroup per job (issue 25): its cores, memory and process count held by the kernel, and
every process it forks killed with it; and a launcher that no job can kill.

Real processes and real cgroups: on this development host the v1 hierarchies (a hybrid host),
and in CI's cgroup v2 guest (tests/site/test_cgroup2_vm.py runs this file there) cgroup v2.
These tests need root, as cgroups do; CI runs as root.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import subprocess
import time
from pathlib import Path

import pytest

from gbroker.site import cgroups
from gbroker.site import executor as executor_module
from gbroker.site.backend import JobSpec, Limits
from gbroker.site.executor import Executor

from .test_executor import JOB_PYTHON, LIMIT, Reports, alive, sh, wait_for_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root (CI runs as root)")

CPUS = sorted(os.sched_getaffinity(0))
WAIT_FOR_GO = "until [ -e go ]; do sleep 0.02; done; "


def controller_file(group: cgroups.Group, controller: str, name: str) -> str:
    key = controller if group.version == 1 else ""
    return (Path(group.paths[key]) / name).read_text().strip()


def own_cgroups(pid: int) -> dict[str, str]:
    """``/proc/PID/cgroup`` as controller (v2: ``""``) to path."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            out[controller] = path
    return out


@pytest.fixture(params=["gbroker-exec", "forked"])
def start_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Jobs started through gbroker-exec (spawned), or without it (forked by the launcher)."""
    if request.param == "forked":
        monkeypatch.setattr(executor_module, "EXEC_HELPER", None)
    else:
        assert executor_module.EXEC_HELPER is not None, "scripts/setup/build_native.sh builds it"
    return str(request.param)


@pytest.mark.asyncio
async def test_a_jobs_cpuset_memory_and_pids_limits_are_applied(
    tmp_path: Path, start_path: str
) -> None:
    reports = Reports()
    limits = Limits(memory=256 << 20, processes=40)
    async with asyncio.timeout(LIMIT), Executor(tmp_path, default_limits=limits) as executor:
        assert executor.cgroups is not None, "this host offers cgroups: they must be used"
        if os.environ.get("GBROKER_CGROUP2_VM"):  # in tests/site/test_cgroup2_vm.py's guest
            assert executor.cgroups.version == 2
        await executor.start(sh("boxed", WAIT_FOR_GO + "cat /proc/self/cgroup"), 1, reports)
        pid = executor.running()["boxed"].pid
        group = executor.cgroup_of("boxed")
        assert group is not None
        assert pid in group.members()  # born there, not moved in later
        cpus = executor.cpus_of("boxed")
        assert controller_file(group, "cpuset", "cpuset.cpus") == ",".join(map(str, cpus)) or (
            len(cpus) == 1 and controller_file(group, "cpuset", "cpuset.cpus") == str(cpus[0])
        )
        memory = "memory.limit_in_bytes" if group.version == 1 else "memory.max"
        assert controller_file(group, "memory", memory) == str(256 << 20)
        assert controller_file(group, "pids", "pids.max") == "40"
        seen = own_cgroups(pid)
        name = "/" + group.name
        if group.version == 1:
            for controller in cgroups.V1_CONTROLLERS:
                assert seen[controller].endswith(name), (controller, seen)
        else:
            assert seen[""].endswith(name)
        (tmp_path / "boxed" / "go").touch()
        result = await reports.one()
    assert result.succeeded
    assert f"{name}\n" in (tmp_path / "boxed" / "stdout").read_text()
    assert not group.exists()  # removed once its launcher left


WIDEN = (
    "import os, json; mine = sorted(os.sched_getaffinity(0));"
    " error = None\n"
    "try: os.sched_setaffinity(0, range(os.cpu_count()))\n"
    "except OSError as exc: error = exc.errno\n"
    "print(json.dumps([mine, sorted(os.sched_getaffinity(0)), error]))"
)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to widen a job onto")
@pytest.mark.asyncio
async def test_a_job_cannot_widen_its_cores(tmp_path: Path) -> None:
    # Attack (issue 25): a 1-core job widened its affinity from {1} to {0, 1}.
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("hog", WAIT_FOR_GO + "true"), 1, reports)  # takes slot 0
        await executor.start(JobSpec("widen", JOB_PYTHON, ("-c", WIDEN)), 1, reports)
        (tmp_path / "hog" / "go").touch()
        await reports.wait_for(2)
    mine, after, _error = json.loads((tmp_path / "widen" / "stdout").read_text())
    assert mine == [CPUS[1]]
    assert after == [CPUS[1]]  # the cpuset holds, whatever the job asks


ESCAPE = "setsid env -i sleep 1000 & echo $! > escaped; " + WAIT_FOR_GO + "sleep 1000"


@pytest.mark.parametrize("how", ["cancel", "wall_time", "leader_exits"])
@pytest.mark.asyncio
async def test_nothing_a_job_forked_outlives_it(tmp_path: Path, how: str) -> None:
    # Attack (issue 25): a `setsid env -i sleep` outlived cancel and fleet down (processes
    # were found by their process group and environment; this one has neither).
    reports = Reports()
    script = ESCAPE if how != "leader_exits" else "setsid env -i sleep 1000 & echo $! > escaped"
    time_limit = 1.0 if how == "wall_time" else None
    executor = Executor(tmp_path, grace_period=0.5)
    async with asyncio.timeout(LIMIT), executor:
        await executor.start(sh("leaky", script, time_limit=time_limit), 1, reports)
        await wait_for_file(tmp_path / "leaky" / "escaped")
        escaped = int((tmp_path / "leaky" / "escaped").read_text())
        assert escaped  # the shell wrote it once it had forked
        if how == "cancel":
            executor.cancel("leaky")
        result = await reports.one()
    assert not alive(escaped)
    if how == "wall_time":
        assert result.timed_out
        assert result.ended_by is not None
        assert "wall-time limit of 1 s" in result.ended_by


FORKS = (
    "import os, sys\n"
    "pids = []\n"
    "for i in range(30):\n"
    "    try: pid = os.fork()\n"
    "    except OSError: print('refused at', i); sys.exit(3)\n"
    "    if pid == 0: os.read(os.open('/dev/zero', 0), 1); import time; time.sleep(30)\n"
    "    pids.append(pid)\n"
)


@pytest.mark.asyncio
async def test_the_process_limit_holds_for_the_whole_job_and_is_named(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        spec = JobSpec("forker", JOB_PYTHON, ("-c", FORKS), limits=Limits(processes=10))
        await executor.start(spec, 1, reports)
        result = await reports.one()
    assert result.exit_code == 3
    assert "refused at" in (tmp_path / "forker" / "stdout").read_text()
    assert result.ended_by is not None
    assert "process limit of 10 (cgroup pids.max)" in result.ended_by


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to grow a job onto")
@pytest.mark.asyncio
async def test_a_resize_moves_the_cpuset(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        assert executor.cgroups is not None
        await executor.start(sh("elastic", "sleep 100"), 1, reports)
        group = executor.cgroup_of("elastic")
        assert group is not None
        before = controller_file(group, "cpuset", "cpuset.cpus")
        executor.resize_slots("elastic", 2)
        cpus = executor.pin("elastic")
        after = controller_file(group, "cpuset", "cpuset.cpus")
        pid = executor.running()["elastic"].pid
        assert sorted(os.sched_getaffinity(pid)) == list(cpus)
        executor.cancel("elastic")
        await reports.one()
    assert before == str(CPUS[0])
    assert len(cpus) == 2
    assert after in (f"{cpus[0]}-{cpus[1]}", f"{cpus[0]},{cpus[1]}")


KILLER = (
    "import os, signal, time\n"
    "launcher = os.getppid()\n"
    "denied = 0\n"
    "deadline = time.monotonic() + 4\n"
    "while time.monotonic() < deadline:\n"
    "    try: os.kill(launcher, signal.SIGKILL)\n"
    "    except PermissionError: denied += 1\n"
    "    except ProcessLookupError: print('gone'); break\n"
    "print('denied', denied)\n"
)


@pytest.mark.asyncio
async def test_no_job_can_kill_its_launcher_even_while_it_spawns(
    tmp_path: Path, start_path: str
) -> None:
    # Attack (issue 25): while it spawned a job, the launcher took the job's uid as its real
    # one, so a job looping os.kill(launcher, SIGKILL) killed 21 launchers in 25 s and failed
    # other users' jobs with "the launcher has gone away".
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=1) as executor:
        await executor.start(JobSpec("killer", JOB_PYTHON, ("-c", KILLER)), 1, reports)
        launchers = executor.launcher_pids
        for i in range(60):  # spawned meanwhile, as the same account as the killer
            await executor.start(sh(f"victim{i}", "exit 0"), 1, reports)
        results = await reports.wait_for(61)
        assert executor.launcher_pids == launchers
    by_id = {r.job_id: r for r in results}
    assert all(by_id[f"victim{i}"].succeeded for i in range(60)), [
        r for r in results if not r.succeeded
    ]
    said = (tmp_path / "killer" / "stdout").read_text().split()
    assert said[0] == "denied"
    assert int(said[1]) > 0


def test_the_site_group_goes_with_its_executor(tmp_path: Path) -> None:
    async def run() -> cgroups.Tree | None:
        async with Executor(tmp_path) as executor:
            await executor.start(sh("brief", "true"), 1, Reports())
            await asyncio.sleep(0.2)
            return executor.cgroups

    tree = asyncio.run(run())
    assert tree is not None
    for path in tree.site.values():
        assert not os.path.exists(path)


@pytest.mark.asyncio
async def test_a_job_that_cannot_start_leaves_its_cgroup_to_the_next(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        assert executor.cgroups is not None
        await executor.start(JobSpec("nothing", "no-such-program-gb"), 1, reports)
        result = await reports.one()
        await executor.start(sh("later", "sleep 100"), 1, reports)
        later = executor.cgroup_of("later")
        assert later is not None
        # The launcher has one group: the failed start's, reused (nothing else made one).
        assert later.name.endswith("-1")
        executor.cancel("later")
        await reports.one()
    assert result.error is not None
    assert "no-such-program-gb" in result.error


@pytest.mark.asyncio
async def test_empty_groups_a_crash_left_are_swept_and_a_running_jobs_kept(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as first:
        assert first.cgroups is not None
        await first.start(sh("alive", "sleep 100"), 1, reports)
        leftover = first.cgroups.make("crashed", [CPUS[0]], None, None)  # as a crash leaves one
        assert leftover.exists()
        second = Executor(tmp_path)  # a restarted broker over the same root
        assert not leftover.exists()
        alive = first.cgroup_of("alive")
        assert alive is not None
        assert alive.exists()
        assert second.cgroups is not None
        first.cancel("alive")
        await reports.one()


def test_a_group_is_not_empty_while_a_killed_member_is_still_charged_to_it(
    tmp_path: Path,
) -> None:
    # A CI run: a job's orphans, killed at its end but not yet reaped by their new parent, left
    # its group's pids.current at the limit; the group went back to the pool as "empty" (no
    # member in cgroup.procs), and the next job's first forks were refused.
    site = cgroups.detect(str(tmp_path))
    group = site.make("orphans", [CPUS[0]], None, 10)
    try:
        sleeper = subprocess.Popen(["sleep", "100"])
        for path in group.joined():
            (Path(path) / "cgroup.procs").write_text(str(sleeper.pid))
        assert group.members() == [sleeper.pid]
        sleeper.kill()
        deadline = time.monotonic() + LIMIT
        while group.members():  # dead: out of cgroup.procs, a zombie we have not reaped yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert controller_file(group, "pids", "pids.current") == "1"
        assert not group.empty()
        sleeper.wait()
        assert controller_file(group, "pids", "pids.current") == "0"
        assert group.empty()
    finally:
        group.remove()
        site.remove()


def test_groups_made_under_the_launchers_umask_are_searchable_by_their_jobs(
    tmp_path: Path,
) -> None:
    # A fresh CI machine: the launcher (umask 077) made /sys/fs/cgroup/freezer/gbroker 0700,
    # and every CRIU dump, run as the job's account, failed: "Neither a cgroupv1
    # (freezer.state) or cgroupv2 (cgroup.freeze) control file found".
    old = os.umask(0o077)
    try:
        site = cgroups.detect(str(tmp_path))
        group = site.make("searchable", [CPUS[0]], None, None)
    finally:
        os.umask(old)
    try:
        for path in group.paths.values():
            for directory in (os.path.dirname(os.path.dirname(path)), os.path.dirname(path), path):
                assert os.stat(directory).st_mode & 0o777 == 0o755, directory
    finally:
        site.remove()


@pytest.mark.asyncio
async def test_a_job_nothing_limits_gets_a_share_of_the_host_never_none(tmp_path: Path) -> None:
    # The code before: a site given no --job-memory / --job-processes set no memory.max and no
    # pids.max at all: a 600 MiB job and a job of 100 forks both ended done (a fleet from a
    # plain `fleet up`), and nothing but the host's own limits held a fork bomb.
    from gbroker.site.executor import MIN_PROCESSES, PROCESSES_PER_CORE, host_memory

    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        assert executor.cgroups is not None
        share = host_memory() // len(CPUS) // mmap.PAGESIZE * mmap.PAGESIZE  # whole pages
        assert executor.memory_per_cpu == share
        await executor.start(sh("plain", WAIT_FOR_GO), 1, reports)
        group = executor.cgroup_of("plain")
        assert group is not None
        memory = "memory.limit_in_bytes" if group.version == 1 else "memory.max"
        assert int(controller_file(group, "memory", memory)) == share
        assert int(controller_file(group, "pids", "pids.max")) == max(
            MIN_PROCESSES, PROCESSES_PER_CORE
        )
        (tmp_path / "plain" / "go").touch()
        assert (await reports.one()).succeeded
        # What the job or the site sets wins over the share.
        own = JobSpec("own", "/bin/true", limits=Limits(memory=64 << 20, processes=7))
        assert executor.limits_for(own, 1) == Limits(memory=64 << 20, processes=7)
        assert executor.limits_for(sh("big", "true"), len(CPUS)).memory == min(
            host_memory(), share * len(CPUS)
        )
