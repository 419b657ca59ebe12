"""Jobs inside their allocation: the user they run as, the CPUs they may use, their rlimits,
file permissions, and the launcher that forks them (reused, in its own session, gone when
idle). Real processes; these tests pass as root (CI: jobs then run as nobody) and as not."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from signal import SIGKILL, SIGXFSZ

import pytest

from gbroker.errors import InvalidInput
from gbroker.site import launcher
from gbroker.site.backend import JobSpec, Limits
from gbroker.site.executor import Executor

from .test_executor import (
    JOB_PYTHON,
    LIMIT,
    Reports,
    adopt,
    left_running,
    parent_of,
    sh,
    without_prlimit,
)

ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody")
JOB_UID = NOBODY.pw_uid if ROOT else os.geteuid()
"""Who a job runs as by default: nobody under a root broker, else the broker's own user."""

CPUS = sorted(os.sched_getaffinity(0))
RLIMITS = (
    "import json, resource as r; print(json.dumps([r.getrlimit(getattr(r, 'RLIMIT_' + n))"
    " for n in ('NOFILE', 'CPU', 'NPROC', 'FSIZE')]))"
)
SHOW = (
    "import json, os;"
    " print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['GBROKER_CPUS']]))"
)


def owner_and_mode(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


@pytest.mark.asyncio
async def test_a_job_runs_unprivileged_and_owns_its_files(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("who", "id -u; id -g; id -G; echo oops >&2"), 1, reports)
        result = await reports.one()
    assert result.succeeded
    uid, gid, groups = (tmp_path / "who" / "stdout").read_text().split("\n")[:3]
    assert int(uid) == JOB_UID
    if ROOT:
        assert int(uid) != 0
        assert int(gid) == NOBODY.pw_gid
        assert groups.split() == [gid]  # supplementary groups cleared
    job_dir = tmp_path / "who"
    assert owner_and_mode(job_dir) == (JOB_UID, 0o700)
    for name in ("stdout", "stderr"):
        assert owner_and_mode(job_dir / name) == (JOB_UID, 0o600)


@pytest.mark.asyncio
async def test_accounts_choose_who_a_job_runs_as_and_unknown_ones_are_refused(
    tmp_path: Path,
) -> None:
    reports = Reports()
    own = pwd.getpwuid(os.geteuid()).pw_name
    mapped = "daemon" if ROOT else own
    executor = Executor(tmp_path, accounts={"alice": mapped, "mallory": "no-such-account-gb"})
    assert executor.account_for("alice") == mapped
    assert executor.account_for("bob") is None
    async with asyncio.timeout(LIMIT), executor:
        await executor.start(sh("as-alice", "id -u", user=mapped), 1, reports)
        assert (await reports.one()).succeeded
        for user in ("no-such-account-gb", "root" if ROOT else "nobody"):
            with pytest.raises(InvalidInput, match=r"job\[refused\]\.user"):
                await executor.start(sh("refused", "true", user=user), 1, reports)
        assert executor.running() == {}
    assert int((tmp_path / "as-alice" / "stdout").read_text()) == pwd.getpwnam(mapped).pw_uid
    assert len(reports.results) == 1  # the refused starts were never reported


def test_root_is_refused_unless_allowed() -> None:
    if not ROOT:  # a broker that is not root runs jobs as itself; run_as is then moot
        assert Executor(Path("x"), run_as="root").run_as.uid == os.geteuid()
        return
    with pytest.raises(InvalidInput, match="run_as"):
        Executor(Path("x"), run_as="root")
    with pytest.raises(InvalidInput, match="run_as"):
        Executor(Path("x"), run_as="no-such-account-gb")
    assert Executor(Path("x"), run_as="root", allow_root=True).run_as.uid == 0


@pytest.mark.asyncio
async def test_each_job_is_bound_to_its_own_slots_cpus(tmp_path: Path) -> None:
    reports = Reports()
    site_cores = 2 * len(CPUS)  # a site may declare more cores than the host has
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=site_cores) as executor:
        wait = "until [ -e go ]; do sleep 0.02; done; "
        await executor.start(sh("first", wait + f'{JOB_PYTHON} -c "{SHOW}"'), 1, reports)
        await executor.start(sh("second", wait + f'{JOB_PYTHON} -c "{SHOW}"'), 1, reports)
        first, second = executor.cpus_of("first"), executor.cpus_of("second")
        # Slots 0 and 1 (the least used), on the host's first and second CPU (or the only one).
        assert first == (CPUS[0],)
        assert second == (CPUS[1 % len(CPUS)],)
        await executor.start(sh("wide", f'{JOB_PYTHON} -c "{SHOW}"'), site_cores - 2, reports)
        assert executor.cpus_of("wide") == tuple(CPUS)  # the other slots wrap round the host
        for name in ("first", "second"):
            (tmp_path / name / "go").touch()
        await reports.wait_for(3)
    assert all(r.succeeded for r in reports.results)
    for name, cpus in (("first", first), ("second", second), ("wide", tuple(CPUS))):
        seen, exported = json.loads((tmp_path / name / "stdout").read_text())
        assert tuple(seen) == cpus
        assert exported == ",".join(map(str, cpus))


@pytest.mark.asyncio
async def test_an_adopted_job_keeps_its_slots(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site_cores=4) as executor:
        await executor.start(sh("filler", "sleep 100"), 1, reports)  # holds slot 0 ...
        view = await left_running(tmp_path, sh("kept", "sleep 100"))  # ... its executor's too
        adopt(executor, view, reports)
        assert executor.cpus_of("kept") == (CPUS[0],)  # slot 0 again, as recorded
        await executor.start(sh("next", "sleep 100"), 2, reports)
        assert executor.cpus_of("next") == tuple(sorted({CPUS[1 % len(CPUS)], CPUS[2 % len(CPUS)]}))


@pytest.mark.parametrize("way", ["prlimit", "forked"])
@pytest.mark.asyncio
async def test_limits_are_applied_with_site_defaults_under_the_jobs_own(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = Reports()
    path = without_prlimit(monkeypatch) if way == "forked" else None
    defaults = Limits(memory=200 << 20, open_files=64, cpu_time=30, processes=50)
    grab = "import sys; b = bytearray(int(sys.argv[1]) << 20); print('got it')"
    executor = Executor(tmp_path, default_limits=defaults, path=path)
    async with asyncio.timeout(LIMIT), executor:
        await executor.start(JobSpec("greedy", JOB_PYTHON, ("-c", grab, "400")), 1, reports)
        await executor.start(
            JobSpec("allowed", JOB_PYTHON, ("-c", grab, "400"), limits=Limits(memory=1 << 30)),
            1,
            reports,
        )
        await executor.start(JobSpec("shown", JOB_PYTHON, ("-c", RLIMITS)), 1, reports)
        await executor.start(
            sh("writer", "head -c 300000 /dev/zero > big", limits=Limits(file_size=100_000)),
            1,
            reports,
        )
        await reports.wait_for(4)
    by_id = {r.job_id: r for r in reports.results}
    shown = json.loads((tmp_path / "shown" / "stdout").read_text())
    infinity = resource.RLIM_INFINITY
    if executor.cgroups is not None:  # memory and processes: the job's cgroup's, not rlimits
        greedy = by_id["greedy"]
        assert greedy.signal == SIGKILL  # the OOM killer, at the cgroup's memory.max
        assert greedy.ended_by == (
            "killed by the kernel at its memory limit of 200 MiB (cgroup memory.max)"
        )
        assert shown[2] != [50, 50]  # no RLIMIT_NPROC: pids.max (tests/site/test_cgroups.py)
        assert [shown[0], shown[1], shown[3]] == [[64, 64], [30, 31], [infinity, infinity]]
    else:
        assert by_id["greedy"].exit_code == 1  # MemoryError: beyond its address space
        assert "MemoryError" in (tmp_path / "greedy" / "stderr").read_text()
        assert shown == [
            [64, 64],
            [30, 31],
            [50, 50],
            [infinity, infinity],
        ]  # soft and hard (CPU: SIGXCPU first)
    assert by_id["allowed"].succeeded  # the job's own limit overrides the default
    # head is killed by SIGXFSZ (default disposition restored), its shell reports 128 + 25.
    assert by_id["writer"].exit_code == 128 + SIGXFSZ
    assert (tmp_path / "writer" / "big").stat().st_size == 100_000


def test_bad_limits_name_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"limits\.memory"):
        Limits(memory=0)
    with pytest.raises(InvalidInput, match=r"limits\.cpu_time"):
        Limits(cpu_time=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="limits"):
        JobSpec("x", "true", limits={"memory": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="site_cores"):
        Executor(Path("x"), site_cores=0)


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.asyncio
async def test_the_launcher_has_its_own_session_is_reused_and_ends_when_idle(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT):
        view = await left_running(tmp_path, sh("long", "until [ -e go ]; do sleep 0.02; done"))
        async with Executor(tmp_path) as executor:
            adopt(executor, view, reports)
            await executor.start(sh("short", "true"), 1, reports)
            launchers = executor.launcher_pids
            assert launchers
            for pid in launchers:  # beyond a broker's killpg
                assert os.getsid(pid) == pid != os.getsid(0)
            # The jobs' parent is the launcher that the first executor started: reused.
            assert parent_of(view.pid) == launchers[0]
            (tmp_path / "long" / "go").touch()
            await reports.wait_for(2)
        while any(_alive(pid) for pid in launchers):  # no jobs, no brokers: they leave
            await asyncio.sleep(0.01)
    assert all(r.succeeded for r in reports.results)
    assert not list(tmp_path.glob(".gbroker-launcher*.sock"))


@pytest.mark.asyncio
async def test_a_killed_launcher_is_replaced_and_its_jobs_polled(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("orphaned", "until [ -e go ]; do sleep 0.02; done"), 1, reports)
        (first,) = executor.launcher_pids  # one start at a time: launcher 0 takes it
        assert parent_of(executor.running()["orphaned"].pid) == first
        os.kill(first, SIGKILL)
        while executor.launcher_pids:  # until the executor has seen it go
            await asyncio.sleep(0.01)
        await executor.start(sh("after", "true"), 1, reports)  # a new launcher starts it
        assert executor.launcher_pids
        assert first not in executor.launcher_pids
        (tmp_path / "orphaned" / "go").touch()
        results = {r.job_id: r for r in await reports.wait_for(2)}
    assert results["after"].succeeded
    # Nobody was left to record the orphan's end: unknown, never made up.
    assert results["orphaned"].exit_code is None
    assert results["orphaned"].error is not None
    assert "unknown" in results["orphaned"].error


@pytest.mark.asyncio
async def test_a_launcher_of_another_protocol_is_retired_but_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    # An older launcher (another protocol number), still serving the root, with a job.
    script = Path(launcher.__file__).read_text()
    old = tmp_path / "old_launcher.py"
    old.write_text(script.replace("\nPROTOCOL = ", "\nPROTOCOL = -1 + ", 1))
    root = tmp_path / "jobs"
    root.mkdir()
    ready, ready_writer = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", str(old), str(root), str(ready_writer)],
        pass_fds=(ready_writer,),
        start_new_session=True,
    )
    os.close(ready_writer)
    assert os.read(ready, 16) == b"ok"
    os.close(ready)
    reports = Reports()
    try:
        async with asyncio.timeout(LIMIT):
            # The old launcher starts a job for an old executor (same requests at protocol 1).
            link_reader, link_writer = await asyncio.open_unix_connection(
                str(root / launcher.SOCKET_NAME)
            )
            hello = json.loads(await link_reader.readline())
            assert hello["version"] == launcher.PROTOCOL - 1
            request = {
                "op": "start", "id": 1, "job_id": "old", "argv": ["sh", "-c", "sleep 0.5; exit 3"],
                "env": {"PATH": os.environ["PATH"], "GBROKER_JOB_ID": "old",
                        "GBROKER_JOB_DIR": str(root / "old")},
                "job_dir": str(root / "old"), "cwd": None, "stdin": None, "stdout": "stdout",
                "stderr": "stderr", "uid": JOB_UID, "gid": os.getegid() if not ROOT else
                NOBODY.pw_gid, "cpus": [], "limits": {}, "token": "oldtok",
            }  # fmt: skip
            link_writer.write(json.dumps(request).encode() + b"\n")
            started = json.loads(await link_reader.readline())
            assert started["op"] == "started"
            link_writer.close()
            async with Executor(root) as executor:
                await executor.start(sh("new", "true"), 1, reports)  # a new launcher for it
                assert executor.launcher_pids
                assert process.pid not in executor.launcher_pids
                executor.adopt("old", started["pid"], 1, 1.0, None, reports, "oldtok")
                results = {r.job_id: r for r in await reports.wait_for(2)}
            # The retired launcher saw its job to the end, recorded it, and left.
            assert (results["old"].exit_code, results["old"].error) == (3, None)
            assert results["new"].succeeded
            while process.poll() is None:
                await asyncio.sleep(0.01)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_a_root_broker_warns_when_jobs_cannot_search_its_directory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Python opens a script by its absolute path: a job run as nobody under a directory it
    may not search fails to run `python3 script.py`; a root broker says so when it starts (a
    broker that is not root runs jobs as itself: nothing to say)."""
    home = Path(tempfile.mkdtemp(prefix="gbroker-search-"))  # /tmp: anyone may search it
    try:
        home.chmod(0o711)
        closed = home / "closed"
        closed.mkdir(mode=0o700)
        with caplog.at_level(logging.WARNING, logger="gbroker.daemon"):
            Executor(closed / "jobs")
        assert (f"who may not search {closed}" in caplog.text) is ROOT
        caplog.clear()
        opened = home / "open"
        opened.mkdir(mode=0o711)
        with caplog.at_level(logging.WARNING, logger="gbroker.daemon"):
            Executor(opened / "jobs")
        assert "may not search" not in caplog.text
    finally:
        shutil.rmtree(home)


@pytest.mark.asyncio
async def test_a_fifo_named_as_a_stream_fails_its_start_and_holds_no_launcher(
    tmp_path: Path,
) -> None:
    """A job's directory stays its account's between runs of the job: a FIFO there named as
    its stdout once held the launcher in open(2), and with it every start after it."""
    job_dir = tmp_path / "fifo"
    job_dir.mkdir(mode=0o700)
    os.mkfifo(job_dir / "stdout", 0o600)
    for path in (job_dir, job_dir / "stdout"):
        os.chown(path, JOB_UID, NOBODY.pw_gid if ROOT else os.getegid())
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, launchers=1) as executor:
        await executor.start(sh("fifo", "echo never"), 1, reports)
        failed = await reports.one()
        assert failed.exit_code is None
        assert failed.error is not None
        assert "stdout file 'stdout': not a regular file" in failed.error
        await executor.start(sh("after", "echo ran"), 1, reports)
        (_, ran) = await reports.wait_for(2)
        assert ran.succeeded
    assert (tmp_path / "after" / "stdout").read_text() == "ran\n"
