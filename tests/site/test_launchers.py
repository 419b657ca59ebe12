"""Several launchers per job root: starts in flight together are shared among them, each job's
end is heard from its own launcher (also by a new executor that adopts it), and a killed
launcher loses the word of its own jobs only."""

from __future__ import annotations

import array
import asyncio
import fcntl
import io
import os
import subprocess
import tempfile
from pathlib import Path
from signal import SIGKILL

import pytest

from gbroker.errors import InvalidInput
from gbroker.site import executor as executor_module
from gbroker.site import launcher
from gbroker.site.backend import RunningJob
from gbroker.site.executor import Executor

from .test_executor import LIMIT, Reports, parent_of, sh


def waiting(code: int) -> str:
    """A job that runs until its directory holds ``go``, then exits ``code``."""
    return f"until [ -e go ]; do sleep 0.02; done; exit {code}"


async def start_together(executor: Executor, reports: Reports, codes: dict[str, int]) -> None:
    """Start one waiting job per entry, all at once (their starts are in flight together)."""
    await asyncio.gather(
        *(executor.start(sh(job, waiting(code)), 1, reports) for job, code in codes.items())
    )


def release(root: Path, jobs: list[str]) -> None:
    for job in jobs:
        (root / job / "go").touch()


@pytest.fixture
def polled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of jobs the executor polled in /proc (it did not hear their end from a
    launcher); the polling itself is skipped."""
    seen: list[int] = []

    async def no_poll(run: object, pid: int, leader_starttime: int) -> None:
        seen.append(pid)

    monkeypatch.setattr(Executor, "_poll", staticmethod(no_poll))
    return seen


def test_the_number_of_launchers_is_checked() -> None:
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(InvalidInput, match="launchers"):
            Executor(Path("/nonexistent"), launchers=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_starts_in_flight_together_are_shared_among_the_launchers(
    tmp_path: Path, polled: list[int]
) -> None:
    reports = Reports()
    codes = {f"j{i}": i for i in range(6)}
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=2) as executor:
        await start_together(executor, reports, codes)
        launchers = executor.launcher_pids
        assert len(launchers) == 2
        parents = {job: parent_of(view.pid) for job, view in executor.running().items()}
        assert sorted(parents.values()) == sorted([*launchers] * 3)  # three each
        release(tmp_path, list(codes))
        results = {r.job_id: r for r in await reports.wait_for(len(codes))}
    assert polled == []  # every end heard from the launcher that started the job
    assert {job: (r.exit_code, r.error) for job, r in results.items()} == {
        job: (code, None) for job, code in codes.items()
    }


@pytest.mark.asyncio
async def test_one_start_at_a_time_goes_to_the_first_launcher(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=3) as executor:
        for i in range(3):
            await executor.start(sh(f"s{i}", "true"), 1, reports)
        await reports.wait_for(3)
        assert len(executor.launcher_pids) == 1  # the others were never needed
    assert [r.exit_code for r in reports.results] == [0, 0, 0]


@pytest.mark.asyncio
async def test_a_new_executor_hears_the_end_of_every_launchers_jobs(
    tmp_path: Path, polled: list[int]
) -> None:
    codes = {f"a{i}": 10 + i for i in range(4)}
    first = Executor(tmp_path, launchers=2)
    await start_together(first, Reports(), codes)
    views: dict[str, RunningJob] = dict(first.running())
    parents = {job: parent_of(view.pid) for job, view in views.items()}
    assert len(set(parents.values())) == 2
    await first.aclose(detach=True)  # the jobs run on, under their launchers
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=2) as executor:
        for job, view in views.items():
            executor.adopt(job, view.pid, view.cores, view.started_at, None, reports)
        # Until each job's launcher has said it watches the job for us (an end before that
        # would be read from the record instead: not what this test is about).
        while sum(len(link.exits) for link in executor._links if link) < len(codes):
            await asyncio.sleep(0.01)
        assert set(executor.launcher_pids) == set(parents.values())  # the same launchers
        release(tmp_path, list(codes))
        results = {r.job_id: r for r in await reports.wait_for(len(codes))}
    assert polled == []  # heard from each job's own launcher, none polled
    assert {job: (r.exit_code, r.error) for job, r in results.items()} == {
        job: (code, None) for job, code in codes.items()
    }


@pytest.mark.asyncio
async def test_a_killed_launcher_loses_the_end_of_its_own_jobs_only(tmp_path: Path) -> None:
    reports = Reports()
    codes = {f"k{i}": 20 + i for i in range(4)}
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=2) as executor:
        await start_together(executor, reports, codes)
        parents = {job: parent_of(view.pid) for job, view in executor.running().items()}
        killed = executor.launcher_pids[1]
        os.kill(killed, SIGKILL)
        while killed in executor.launcher_pids:  # until the executor has seen it go
            await asyncio.sleep(0.01)
        release(tmp_path, list(codes))
        results = {r.job_id: r for r in await reports.wait_for(len(codes))}
    for job, parent in parents.items():
        if parent == killed:  # nobody recorded its end: unknown, never made up
            assert results[job].exit_code is None
            assert "unknown" in (results[job].error or "")
        else:
            assert (results[job].exit_code, results[job].error) == (codes[job], None)
    assert sum(parent == killed for parent in parents.values()) == 2


def attribute_flags(path: Path) -> int | None:
    """The file's attribute flags (what ``lsattr`` shows), None where it has none."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("I", [0])
        fcntl.ioctl(fd, launcher._FS_IOC_GETFLAGS, flags, True)
    except OSError:
        return None
    finally:
        os.close(fd)
    return flags[0]


def file_system_type(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.asyncio
async def test_the_job_root_is_marked_a_top_of_directory_hierarchies_on_ext4(
    tmp_path: Path,
) -> None:
    """So that ext4 spreads the job directories over its block groups (launcher docstring)."""
    reports = Reports()
    root = tmp_path / "jobs"
    async with asyncio.timeout(LIMIT), Executor(root) as executor:
        await executor.start(sh("one", "true"), 1, reports)
        await reports.wait_for(1)
    flags = attribute_flags(root)
    if file_system_type(root) == "ext2/ext3":  # GNU stat's name for ext2, ext3 and ext4
        assert flags is not None
        assert flags & launcher.FS_TOPDIR_FL
        assert not (attribute_flags(root / "one") or 0) & launcher.FS_TOPDIR_FL  # the root only
        assert launcher.spread_subdirectories(str(root))  # marked already: still True
    else:  # no such flag there: the launcher starts jobs all the same
        assert flags is None or not flags & launcher.FS_TOPDIR_FL
    assert reports.results[0].succeeded


def test_marking_is_refused_quietly_where_the_file_system_has_no_such_flag(
    tmp_path: Path,
) -> None:
    shm = Path("/dev/shm")
    assert file_system_type(shm) == "tmpfs"
    directory = Path(tempfile.mkdtemp(dir=shm))
    try:
        assert launcher.spread_subdirectories(str(directory)) is False
    finally:
        directory.rmdir()
    assert launcher.spread_subdirectories(str(tmp_path / "missing")) is False


@pytest.mark.asyncio
async def test_an_adopted_job_that_shows_no_environment_yet_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process in the middle of its exec shows an empty /proc/<pid>/environ; the launcher (a
    vfork parent) resumes before the kernel has put the job's environment in place, so a
    successor adopting a job spawned an instant ago could see it empty. Read three times
    empty here, it is still the job's."""
    first = Executor(tmp_path)
    await first.start(sh("j", waiting(5)), 1, Reports())
    view = first.running()["j"]
    await first.aclose(detach=True)
    empty_reads = [view.pid] * 3
    real_open = open

    def open_(path: str, *args: object, **kwargs: object) -> object:
        if path == f"/proc/{view.pid}/environ" and empty_reads:
            empty_reads.pop()
            return io.BytesIO(b"")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(executor_module, "open", open_, raising=False)
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        # With its launch token, as a broker adopts (its journal has it): the end is the
        # launcher's record even when the job ends before the new watch reaches its launcher
        # (without one, a CI run heard "unknown" so).
        executor.adopt("j", view.pid, view.cores, view.started_at, None, reports, view.launch_token)
        assert "j" in executor.running()  # adopted, not taken for a stranger's group
        assert empty_reads == []
        release(tmp_path, ["j"])
        (result,) = await reports.wait_for(1)
    assert (result.exit_code, result.error) == (5, None)
