"""The executor with real processes: files, environment, exit codes, groups killed, limits, and
jobs that outlive their executor and are adopted by the next."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from signal import SIGKILL, SIGTERM, SIGUSR1, SIGXCPU
from typing import Any

import pytest

from gbroker.core.limits import Used
from gbroker.errors import InternalError, InvalidInput
from gbroker.site.backend import ExitResult, JobSpec, Limits, RunningJob, StopReason
from gbroker.site.executor import Executor

LIMIT = 20.0  # seconds any one test may take; they take well under one


def _runnable_by_anyone(path: str) -> bool:
    """Whether an unprivileged user could execute ``path`` (every directory searchable)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))


JOB_PYTHON = next(
    p
    for p in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3")
    if p and _runnable_by_anyone(p)
)
"""A Python a job may run: under a root broker jobs run as nobody, who may not reach ours."""


class Reports:
    """An ``on_exit`` that remembers every report and lets a test wait for them."""

    def __init__(self) -> None:
        self.results: list[ExitResult] = []
        self._changed = asyncio.Event()

    def __call__(self, result: ExitResult) -> None:
        self.results.append(result)
        self._changed.set()

    async def wait_for(self, count: int) -> list[ExitResult]:
        while len(self.results) < count:
            self._changed.clear()
            await self._changed.wait()
        return self.results

    async def one(self) -> ExitResult:
        (result,) = await self.wait_for(1)
        return result


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # After the command name in parentheses: state, ppid, pgrp, ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def alive(pid: int) -> bool:
    """Whether a process exists and has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def parent_of(pid: int) -> int:
    """The parent process of ``pid``, from /proc."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def group_gone(pgid: int) -> bool:
    """Wait (briefly) until no live process is left in the group; the kernel needs a moment."""
    for _ in range(200):
        if not group_members(pgid):
            return True
        await asyncio.sleep(0.01)
    return False


async def wait_for_file(path: Path) -> None:
    while not path.exists() or not path.read_text():
        await asyncio.sleep(0.01)


def sh(job_id: str, script: str, **kwargs: Any) -> JobSpec:
    return JobSpec(job_id, "sh", ("-c", script), **kwargs)


@pytest.mark.asyncio
async def test_streams_go_to_files_and_the_exit_code_is_recorded(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site="s1") as executor:
        spec = sh("j1", "echo out; echo err >&2; exit 3")
        before = time.time()
        await executor.start(spec, 1, reports)
        result = await reports.one()
    assert result.job_id == "j1"
    assert (result.exit_code, result.signal, result.error) == (3, None, None)
    assert not result.timed_out
    assert not result.cancelled
    assert not result.succeeded
    assert before <= result.started_at <= result.ended_at <= time.time()
    assert (tmp_path / "j1" / "stdout").read_text() == "out\n"
    assert (tmp_path / "j1" / "stderr").read_text() == "err\n"


@pytest.mark.asyncio
async def test_named_streams_stdin_from_a_file_and_both_streams_in_one(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        executor.job_dir("j2").mkdir(parents=True)
        (executor.job_dir("j2") / "in.txt").write_text("hello\n")  # staged before the start
        spec = sh("j2", "cat; echo oops >&2", stdin="in.txt", stdout="log/all", stderr="log/all")
        await executor.start(spec, 1, reports)
        result = await reports.one()
    assert result.succeeded
    assert (tmp_path / "j2" / "log" / "all").read_text() == "hello\noops\n"
    assert not (tmp_path / "j2" / "stdout").exists()


@pytest.mark.asyncio
async def test_the_environment_is_clean_and_carries_the_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GBROKER_TEST_DAEMON_SECRET", "do not leak")
    reports = Reports()
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    async with asyncio.timeout(LIMIT), Executor(tmp_path, site="s7") as executor:
        await executor.start(
            JobSpec("plain", JOB_PYTHON, ("-c", dump), {"MY_VAR": "x y"}), 4, reports
        )
        await executor.start(
            JobSpec(
                "own",
                JOB_PYTHON,
                ("-c", dump),
                {"OMP_NUM_THREADS": "2", "GBROKER_CORES": "999", "HOME": "/elsewhere"},
            ),
            3,
            reports,
        )
        await reports.wait_for(2)
    assert all(r.succeeded for r in reports.results)
    plain = json.loads((tmp_path / "plain" / "stdout").read_text())
    assert plain["GBROKER_JOB_ID"] == "plain"
    assert plain["GBROKER_CORES"] == "4"
    assert plain["OMP_NUM_THREADS"] == "4"
    assert plain["GBROKER_SITE"] == "s7"
    assert plain["GBROKER_JOB_DIR"] == str(tmp_path / "plain")
    assert plain["HOME"] == str(tmp_path / "plain")
    assert plain["MY_VAR"] == "x y"
    assert plain["PATH"] == os.environ["PATH"]
    assert "GBROKER_TEST_DAEMON_SECRET" not in plain
    own = json.loads((tmp_path / "own" / "stdout").read_text())
    assert own["OMP_NUM_THREADS"] == "2"  # the job's choice stands
    assert own["GBROKER_CORES"] == "3"  # the allocation is the site's fact, not the job's
    assert own["HOME"] == "/elsewhere"


@pytest.mark.asyncio
async def test_every_job_gets_the_application_library_last_on_its_path() -> None:
    """gbroker.app, copied read-only once per root (GBROKER_APP_PATH), last on PYTHONPATH: a
    job with nothing installed imports it (python -S: no site-packages), a job's own copy
    comes first, and a job with a full GBroker of its own still reaches the rest of it."""
    import gbroker.app.malleable

    root = Path(tempfile.mkdtemp(prefix="gbroker-applib-"))  # not pytest's 0700 directory:
    root.chmod(0o711)  # under a root broker, jobs run as nobody
    own = root / "own"
    (own / "gbroker" / "app").mkdir(parents=True)
    for name in ("gbroker/__init__.py", "gbroker/app/__init__.py"):
        (own / name).write_text("")
    (own / "gbroker" / "app" / "malleable.py").write_text("MINE = True\n")
    full = root / "full"
    (full / "gbroker" / "client").mkdir(parents=True)
    for name in ("gbroker/__init__.py", "gbroker/client/__init__.py"):
        (full / name).write_text("")
    for path in (own, *own.rglob("*"), full, *full.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    show = (
        "import json, os, gbroker.app.malleable as m; print(json.dumps([m.__file__, "
        "os.environ.get('PYTHONPATH'), os.environ.get('GBROKER_APP_PATH')]))"
    )
    reports = Reports()
    try:
        async with asyncio.timeout(LIMIT), Executor(root / "jobs") as executor:
            await executor.start(JobSpec("bare", JOB_PYTHON, ("-S", "-c", show)), 1, reports)
            await executor.start(
                JobSpec("own", JOB_PYTHON, ("-S", "-c", show), {"PYTHONPATH": str(own)}),
                1,
                reports,
            )
            # A GBroker of the job's own installed (in its site-packages: after the path).
            both = (
                f"import sys; sys.path.append({str(full)!r}); "
                "import gbroker.app.malleable as m, gbroker.client as c; print(c.__file__)"
            )
            await executor.start(JobSpec("full", JOB_PYTHON, ("-S", "-c", both)), 1, reports)
            await reports.wait_for(3)
        errors = {
            r.job_id: (root / "jobs" / r.job_id / "stderr").read_text() for r in reports.results
        }
        assert all(r.succeeded for r in reports.results), errors
        [library] = (root / "jobs" / ".gbroker-app").iterdir()
        module = library / "gbroker" / "app" / "malleable.py"
        assert module.read_bytes() == Path(gbroker.app.malleable.__file__).read_bytes()
        assert module.stat().st_mode & 0o777 == 0o444
        assert library.stat().st_mode & 0o777 == 0o555
        bare = json.loads((root / "jobs" / "bare" / "stdout").read_text())
        assert bare == [str(module), str(library), str(library)]
        mine = json.loads((root / "jobs" / "own" / "stdout").read_text())
        assert mine == [
            str(own / "gbroker" / "app" / "malleable.py"),
            f"{own}:{library}",
            str(library),
        ]
        client = full / "gbroker" / "client" / "__init__.py"
        assert (root / "jobs" / "full" / "stdout").read_text() == f"{client}\n"
    finally:
        for directory, _, _ in os.walk(root):
            os.chmod(directory, 0o755)
        shutil.rmtree(root, ignore_errors=True)  # the launcher may be removing its socket


@pytest.mark.asyncio
async def test_the_working_directory_is_the_job_directory(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("here", "pwd -P; touch made-here"), 1, reports)
        await executor.start(sh("sub", "pwd -P", working_directory="a/b"), 1, reports)
        await reports.wait_for(2)
    assert all(r.succeeded for r in reports.results)
    assert (tmp_path / "here" / "stdout").read_text().strip() == str((tmp_path / "here").resolve())
    assert (tmp_path / "here" / "made-here").exists()
    sub = (tmp_path / "sub" / "a" / "b").resolve()
    assert (tmp_path / "sub" / "stdout").read_text().strip() == str(sub)


@pytest.mark.asyncio
async def test_cancel_kills_the_whole_group_grandchildren_included(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        spec = sh("big", "sleep 100 & sleep 100 & echo up > ready; wait")
        await executor.start(spec, 2, reports)
        await wait_for_file(tmp_path / "big" / "ready")
        pgid = executor.running()["big"].pid
        assert os.getpgid(pgid) == pgid  # the leader leads its own group
        assert os.getpgid(pgid) != os.getpgid(0)  # which is not ours
        assert len(group_members(pgid)) == 3  # sh (the leader) and its two sleeps
        assert executor.cancel("big")
        assert executor.cancel("big")  # asking twice is harmless
        result = await reports.one()
        assert await group_gone(pgid)
    assert result.cancelled
    assert not result.timed_out
    assert (result.exit_code, result.signal) == (None, SIGTERM)
    assert result.signal_name == "SIGTERM"
    assert not executor.cancel("big")  # no longer running


@pytest.mark.asyncio
async def test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace_period(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, grace_period=0.3) as executor:
        # An ignored signal stays ignored across fork and exec: the whole group shrugs off TERM.
        spec = sh("stubborn", "trap '' TERM; sleep 100 & echo up > ready; wait")
        await executor.start(spec, 1, reports)
        await wait_for_file(tmp_path / "stubborn" / "ready")
        pgid = executor.running()["stubborn"].pid
        asked = time.monotonic()
        executor.cancel("stubborn")
        assert executor.running()["stubborn"].stopping is StopReason.CANCELLED
        result = await reports.one()
        waited = time.monotonic() - asked
        assert await group_gone(pgid)
    assert result.cancelled
    assert result.signal == SIGKILL
    assert waited >= 0.3


@pytest.mark.asyncio
async def test_the_time_limit_stops_the_group_and_marks_it_timed_out(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        spec = sh("slow", "sleep 100 & sleep 100; wait", time_limit=0.3)
        await executor.start(spec, 1, reports)
        view = executor.running()["slow"]
        assert view.deadline == pytest.approx(view.started_at + 0.3)
        result = await reports.one()
        assert await group_gone(view.pid)
    assert result.timed_out
    assert not result.cancelled
    assert result.signal == SIGTERM
    assert 0.3 <= result.ended_at - result.started_at < 5.0


@pytest.mark.asyncio
async def test_what_the_leader_leaves_behind_dies_with_it(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        script = "sleep 100 & echo $! > orphan; cat /proc/$!/stat > orphan.stat; exit 0"
        await executor.start(sh("leaver", script), 1, reports)
        pgid = executor.running()["leaver"].pid
        result = await reports.one()
        orphan = int((tmp_path / "leaver" / "orphan").read_text())
        orphan_stat = (tmp_path / "leaver" / "orphan.stat").read_text()
        assert int(orphan_stat.rsplit(")", 1)[1].split()[2]) == pgid  # it was in the group ...
        assert await group_gone(pgid)  # ... and went with it
    assert result.succeeded  # the job itself ended on its own
    assert not alive(orphan)


@pytest.mark.asyncio
async def test_a_missing_executable_is_reported_not_raised(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(JobSpec("ghost", "no-such-program-gbroker"), 1, reports)
        assert "ghost" not in executor.running()
        result = await reports.one()
    assert result.exit_code is None
    assert result.signal is None
    assert result.error is not None
    assert "no-such-program-gbroker" in result.error
    assert "No such file or directory" in result.error
    assert not result.succeeded


@pytest.mark.asyncio
async def test_a_staged_file_without_execute_permission_is_reported(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        job_dir = executor.job_dir("noexec")
        job_dir.mkdir(parents=True)
        (job_dir / "run.sh").write_text("#!/bin/sh\necho hi\n")
        (job_dir / "run.sh").chmod(0o644)
        await executor.start(JobSpec("noexec", "./run.sh"), 1, reports)
        await reports.one()
        (job_dir / "run.sh").chmod(0o755)
        await executor.start(JobSpec("noexec", "./run.sh"), 1, reports)
        failed, runs = await reports.wait_for(2)
    assert failed.error is not None
    assert "Permission denied" in failed.error
    assert runs.succeeded


@pytest.mark.asyncio
async def test_a_missing_stdin_file_is_reported(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(JobSpec("nostdin", "cat", stdin="absent.txt"), 1, reports)
        result = await reports.one()
    assert result.error is not None
    assert "stdin file 'absent.txt'" in result.error


@pytest.mark.parametrize(
    "job_id", ["", ".", "..", "../escape", "a/b", "/abs", "a\\b", "nul\0", "x" * 256]
)
def test_job_ids_that_are_not_one_directory_name_are_rejected(job_id: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        JobSpec(job_id, "true")
    assert raised.value.field == "job_id"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("executable", ""),
        ("arguments", "-c"),
        ("arguments", ("ok", 3)),
        ("environment", {"A=B": "x"}),
        ("environment", {"A": 1}),
        ("working_directory", "../out"),
        ("stdin", "/etc/passwd"),
        ("stdout", "a/../../b"),
        ("stderr", "."),
        ("time_limit", 0),
        ("time_limit", -1.0),
        ("time_limit", float("nan")),
        ("time_limit", True),
    ],
)
def test_bad_spec_values_are_rejected_naming_the_field(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {"job_id": "j", "executable": "true", field: value}
    with pytest.raises(InvalidInput) as raised:
        JobSpec(**kwargs)
    assert raised.value.field.split(".")[0].split("[")[0] == field


def test_spec_values_are_normalized_and_frozen() -> None:
    spec = JobSpec("j", "prog", ["a", "b"], {"X": "1"}, stdout="./out//log")  # type: ignore[arg-type]
    assert spec.arguments == ("a", "b")
    assert spec.stdout == "out/log"
    with pytest.raises(TypeError):
        spec.environment["X"] = "2"  # type: ignore[index]


@pytest.mark.asyncio
async def test_bad_start_values_raise_before_anything_happens(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        for cores in (0, -1, True, 1.5):
            with pytest.raises(InvalidInput, match="cores"):
                await executor.start(JobSpec("j", "true"), cores, reports)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="job_id"):
            executor.job_dir("../x")
        await executor.start(sh("dup", "sleep 100"), 1, reports)
        with pytest.raises(InvalidInput, match="already running"):
            await executor.start(sh("dup", "true"), 1, reports)
        assert set(executor.running()) == {"dup"}
    with pytest.raises(InvalidInput, match="grace_period"):
        Executor(tmp_path, grace_period=-1)
    assert [r.job_id for r in reports.results] == ["dup"]  # only the one that started
    assert not (tmp_path / "j").exists()


@pytest.mark.asyncio
async def test_twenty_concurrent_jobs_are_each_reported_exactly_once(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await asyncio.gather(
            *(
                executor.start(sh(f"job-{i}", f"sleep 0.0{i % 10}; exit {i}"), 1, reports)
                for i in range(20)
            )
        )
        await reports.wait_for(20)
        await asyncio.sleep(0.1)  # a duplicate report would have arrived by now
    assert len(reports.results) == 20
    assert sorted((r.job_id, r.exit_code) for r in reports.results) == sorted(
        (f"job-{i}", i) for i in range(20)
    )
    assert executor.running() == {}


@pytest.mark.asyncio
async def test_aclose_stops_everything_and_leaves_no_process(tmp_path: Path) -> None:
    reports = Reports()
    executor = Executor(tmp_path, grace_period=1.0)
    async with asyncio.timeout(LIMIT):
        for i in range(3):
            await executor.start(sh(f"long-{i}", "sleep 100 & sleep 100 & wait"), 1, reports)
        await executor.start(sh("short", "exit 0"), 1, reports)
        groups = [view.pid for view in executor.running().values()]
        await executor.aclose()
        assert len(reports.results) == 4  # every job reported before aclose returns
        for pgid in groups:
            assert await group_gone(pgid)
    assert executor.running() == {}
    assert all(r.cancelled for r in reports.results if r.job_id.startswith("long"))
    with pytest.raises(InternalError):
        await executor.start(sh("late", "true"), 1, reports)
    await executor.aclose()  # closing twice is harmless


@pytest.mark.asyncio
async def test_a_caller_cancelled_during_start_does_not_lose_the_job(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        starting = asyncio.create_task(executor.start(sh("kept", "exit 5"), 1, reports))
        await asyncio.sleep(0)  # start() has accepted the job and is waiting for the spawn
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        result = await reports.one()
    assert result.exit_code == 5


@pytest.mark.asyncio
async def test_a_job_cancelled_while_it_is_being_spawned_is_stopped_once_it_exists(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        starting = asyncio.create_task(executor.start(sh("early", "exec sleep 100"), 1, reports))
        await asyncio.sleep(0)  # accepted, not yet spawned
        assert "early" not in executor.running()
        assert executor.cancel("early")
        await starting
        result = await reports.one()
    assert result.cancelled
    assert result.signal == SIGTERM


@pytest.mark.asyncio
async def test_a_failing_callback_goes_to_the_loop_handler_and_harms_nothing(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    reports = Reports()

    def broken(result: ExitResult) -> None:
        raise RuntimeError("driver bug")

    on_exit: Callable[[ExitResult], None] = broken
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("a", "true"), 1, on_exit)
        await executor.start(sh("b", "true"), 1, reports)
        await reports.one()
        while not seen:
            await asyncio.sleep(0.01)
    assert isinstance(seen[0]["exception"], RuntimeError)
    assert "'a'" in seen[0]["message"]


# -- the launcher's record of a job's end -----------------------------------------------------

FORGED = ".gbroker-exit"
"""Where the launcher once recorded a job's end, in the job's own directory: a job could forge
it. Tests write it to show that nothing reads it any more."""


def exit_record(root: Path, token: str) -> dict[str, Any]:
    """The end line of a launch record (the launcher's, in the root's records directory)."""
    lines = (root / ".gbroker-launches" / token).read_text().splitlines()
    record: dict[str, Any] = json.loads(lines[1])
    return record


@pytest.mark.parametrize(
    ("script", "cancel", "expected"),
    [
        ("exit 0", False, (0, None)),
        ("exit 3", False, (3, None)),
        ("kill -USR1 $$", False, (None, SIGUSR1)),  # the job, not its supervisor, gets it
        ("echo up > ready; sleep 100 & wait", True, (None, SIGTERM)),
    ],
    ids=["success", "failure", "signal", "cancelled"],
)
@pytest.mark.asyncio
async def test_the_launch_record_holds_what_the_result_says(
    tmp_path: Path, script: str, cancel: bool, expected: tuple[int | None, int | None]
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("j", script, launch_token="tokj"), 1, reports)
        pgid = executor.running()["j"].pid
        if cancel:
            await wait_for_file(tmp_path / "j" / "ready")
            executor.cancel("j")
        result = await reports.one()
    assert (result.exit_code, result.signal) == expected
    assert result.cancelled is cancel
    record = exit_record(tmp_path, "tokj")
    assert (record["exit_code"], record["signal"]) == expected
    assert record["pid"] == pgid  # written by this run's launcher, the group's leader's parent
    assert not (tmp_path / "j" / FORGED).exists()  # nothing in the job's directory


FORGE = f"""printf '{{"exit_code": 0, "signal": null, "pid": %d}}\\n' $$ > {FORGED}; exit 7"""


@pytest.mark.asyncio
async def test_a_job_cannot_forge_how_it_ended(tmp_path: Path) -> None:
    # Attack (issue 25): a job wrote {"exit_code": 0} where the launcher once recorded its
    # end, then exited 7, and was recorded "done, 0". Its end comes from the launcher only.
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("liar", FORGE), 1, reports)
        result = await reports.one()
    assert json.loads((tmp_path / "liar" / FORGED).read_text())["exit_code"] == 0  # it tried
    assert (result.exit_code, result.succeeded) == (7, False)


@pytest.mark.asyncio
async def test_a_job_cannot_forge_its_end_while_no_launcher_watches(tmp_path: Path) -> None:
    # The same, once its launcher is gone: its end is unknown, never the job's word.
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("liar", WAIT_FOR_GO + FORGE))
        kill_launcher(tmp_path)
        (tmp_path / "liar" / "go").touch()
        while alive(view.pid):
            await asyncio.sleep(0.01)
        adopt(executor, view, reports)
        result = await reports.one()
    assert (tmp_path / "liar" / FORGED).exists()
    assert (result.exit_code, result.succeeded) == (None, False)
    assert result.error is not None
    assert "unknown" in result.error


def without_prlimit(monkeypatch: pytest.MonkeyPatch) -> str:
    """Have the next launcher find no prlimit(1) (on its PATH, which is ours): jobs with
    rlimits are then forked by it. Returns the PATH for jobs."""
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", "/nonexistent-gbroker")
    return path


# A job without rlimits is spawned (posix_spawn); one with them through prlimit(1), or forked
# by the launcher if it has no prlimit.
@pytest.mark.parametrize("way", ["spawned", "prlimit", "forked"])
@pytest.mark.asyncio
async def test_the_job_gets_its_environment_and_default_signals_not_the_launchers(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = Reports()
    limits = Limits() if way == "spawned" else Limits(open_files=512)
    path = without_prlimit(monkeypatch) if way == "forked" else None
    async with asyncio.timeout(LIMIT), Executor(tmp_path, path=path) as executor:
        # LANG=C makes Python coerce the locale and add LC_CTYPE to its own environment.
        script = ("-c", "env; exec cat /proc/self/status")
        spec = JobSpec("env", "sh", script, {"LANG": "C"}, limits=limits)
        await executor.start(spec, 1, reports)
        assert (await reports.one()).succeeded
    out = (tmp_path / "env" / "stdout").read_text().splitlines()
    assert "LANG=C" in out
    # Nothing of the launcher's Python; the site's application library is on the path.
    assert [line for line in out if line.startswith(("LC_", "PYTHON"))] == [
        f"PYTHONPATH={next((tmp_path / '.gbroker-app').iterdir())}"
    ]
    (ignored_mask,) = [int(line.split()[1], 16) for line in out if line.startswith("SigIgn:")]
    # Only signals with a name: glibc's posix_spawn leaves its own internal ones (32, 33)
    # ignored, and glibc takes them back as it needs them.
    named = set(signal.Signals)
    ignored = {n for n in range(1, 65) if ignored_mask & (1 << (n - 1))} & named
    supervisors = {
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGPIPE,
        signal.SIGXFSZ,
    }
    assert not ignored & supervisors


@pytest.mark.asyncio
async def test_without_pidfds_the_executor_polls_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("polled", "sleep 100 & echo $! > orphan; exit 4"), 1, reports)
        pgid = executor.running()["polled"].pid
        result = await reports.one()
        assert await group_gone(pgid)  # the leftovers still go with the leader
    assert result.exit_code == 4


@pytest.mark.parametrize("adopted", [False, True], ids=["started", "adopted"])
@pytest.mark.asyncio
async def test_the_grace_period_lets_a_job_that_traps_sigterm_clean_up(
    tmp_path: Path, adopted: bool
) -> None:
    reports = Reports()
    script = "trap 'sleep 0.3; echo bye > cleaned; exit 4' TERM; echo up > ready; sleep 100 & wait"
    async with asyncio.timeout(LIMIT), Executor(tmp_path, grace_period=10.0) as executor:
        if adopted:
            view = await left_running(tmp_path, sh("tidy", script))
            adopt(executor, view, reports)
        else:
            await executor.start(sh("tidy", script), 1, reports)
        await wait_for_file(tmp_path / "tidy" / "ready")
        asked = time.monotonic()
        executor.cancel("tidy")
        result = await reports.one()
        waited = time.monotonic() - asked
    assert (tmp_path / "tidy" / "cleaned").read_text() == "bye\n"
    assert result.cancelled
    assert (result.exit_code, result.signal, result.error) == (4, None, None)
    assert 0.3 <= waited < 5.0  # the job ended itself, well before the SIGKILL


# -- adoption: jobs that outlive their executor -------------------------------------------------

WAIT_FOR_GO = "echo up > ready; until [ -e go ]; do sleep 0.02; done; "


async def left_running(root: Path, spec: JobSpec, cores: int = 1) -> RunningJob:
    """Start a job with an executor of its own, which then leaves with ``aclose(detach=True)``."""
    reports = Reports()
    first = Executor(root)
    await first.start(spec, cores, reports)
    view = first.running()[spec.job_id]
    await first.aclose(detach=True)
    assert first.running() == {}
    assert group_members(view.pid)  # the job runs on ...
    await asyncio.sleep(0.05)
    assert reports.results == []  # ... and its first executor says nothing about it
    return view


def launcher_pid(root: Path) -> int:
    """The pid of the launcher serving ``root``, found by its command line (its title)."""
    wanted = str(root.absolute()).encode()
    for entry in Path("/proc").iterdir():
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv = raw.split(b"\0")
        if raw.rstrip(b"\0") == b"gbroker launcher " + wanted or (
            any(a.endswith(b"launcher.py") for a in argv) and wanted in argv
        ):
            return int(entry.name)
    raise AssertionError(f"no launcher for {root}")


def kill_launcher(root: Path) -> None:
    """SIGKILL the launcher of ``root``: its jobs go on without anyone to record their end."""
    os.kill(launcher_pid(root), SIGKILL)


def adopt(
    executor: Executor, view: RunningJob, on_exit: Callable[[ExitResult], None], **kwargs: Any
) -> None:
    arguments: dict[str, Any] = {
        "job_id": view.job_id,
        "pgid": view.pid,
        "cores": view.cores,
        "started_at": view.started_at,
        "time_limit": None,
        "on_exit": on_exit,
        "launch_token": view.launch_token,
    }
    arguments.update(kwargs)
    executor.adopt(**arguments)


@pytest.mark.asyncio
async def test_a_job_left_running_is_adopted_and_reported_once(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("kept", WAIT_FOR_GO + "exit 7"), cores=3)
        adopt(executor, view, reports)
        assert executor.running()["kept"] == RunningJob(
            "kept", view.pid, 3, view.started_at, None, None, view.launch_token
        )
        with pytest.raises(InvalidInput, match="already running"):
            adopt(executor, view, reports)
        with pytest.raises(InvalidInput, match="already running"):
            await executor.start(sh("kept", "true"), 1, reports)
        (tmp_path / "kept" / "go").touch()
        result = await reports.one()
        assert await group_gone(view.pid)
        await asyncio.sleep(0.5)  # a second report would have come by now
    assert len(reports.results) == 1
    assert (result.exit_code, result.signal, result.error) == (7, None, None)
    assert result.started_at == view.started_at
    assert result.ended_at == exit_record(tmp_path, view.launch_token or "")["ended_at"]
    assert not executor.cancel("kept")


BROKER = """
import asyncio, json, sys
from pathlib import Path
from gbroker.site.backend import JobSpec
from gbroker.site.executor import Executor

async def main():
    executor = Executor(Path(sys.argv[1]))
    spec = JobSpec("orphan", "sh", ("-c", sys.argv[2]))
    await executor.start(spec, 2, print)
    view = executor.running()["orphan"]
    print(json.dumps([view.pid, view.started_at, view.launch_token]), flush=True)
    await asyncio.sleep(100)

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_the_jobs_of_a_killed_broker_are_adopted_by_its_successor(tmp_path: Path) -> None:
    broker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BROKER, str(tmp_path), WAIT_FOR_GO + "exit 5",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    reports = Reports()
    try:
        async with asyncio.timeout(LIMIT):
            assert broker.stdout is not None
            pgid, started_at, token = json.loads(await broker.stdout.readline())
            broker.kill()  # SIGKILL: no goodbye; its jobs are orphans now
            await broker.wait()
            assert group_members(pgid)
            async with Executor(tmp_path) as executor:
                executor.adopt("orphan", pgid, 2, started_at, None, reports, token)
                (tmp_path / "orphan" / "go").touch()
                result = await reports.one()
    finally:
        if broker.returncode is None:
            broker.kill()
            await broker.wait()
    assert (result.exit_code, result.signal, result.error) == (5, None, None)
    assert result.started_at == started_at
    assert await group_gone(pgid)


@pytest.mark.asyncio
async def test_a_job_that_ended_unwatched_is_reported_from_its_record(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("done", WAIT_FOR_GO + "exit 9"))
        assert view.launch_token is not None
        record = tmp_path / ".gbroker-launches" / view.launch_token
        (tmp_path / "done" / "go").touch()
        while len(record.read_text().splitlines()) < 2:
            await asyncio.sleep(0.01)
        assert await group_gone(view.pid)
        adopt(executor, view, reports)
        assert reports.results == []  # never from inside adopt()
        assert executor.running() == {}
        assert not executor.cancel("done")
        result = await reports.one()
    assert (result.exit_code, result.signal, result.error) == (9, None, None)
    assert result.started_at == view.started_at
    assert result.ended_at == exit_record(tmp_path, view.launch_token)["ended_at"]


# -- launch records: a start's token, its start and its end ------------------------------------


def launch_lines(root: Path, token: str) -> list[dict[str, Any]]:
    text = (root / ".gbroker-launches" / token).read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.asyncio
async def test_a_started_jobs_record_holds_its_start_then_its_end_and_no_exit_file(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(sh("t", "exit 4", launch_token="tok1"), 1, reports)
        pgid = executor.running()["t"].pid
        result = await reports.one()
        start, end = launch_lines(tmp_path, "tok1")
        settled = await executor.settle_launch("tok1")
    cgroup = start.pop("cgroup")  # the name of its cgroup, where the host has them
    assert cgroup is None or cgroup.startswith("l")
    assert start == {"job_id": "t", "pid": pgid, "started_at": result.started_at}
    assert isinstance(end.pop("cpu_time"), float)  # the leader's: whether RLIMIT_CPU ended it
    assert end == {
        "exit_code": 4, "signal": None, "pid": pgid, "ended_at": result.ended_at, "limits": {}
    }  # fmt: skip
    assert not (tmp_path / "t" / FORGED).exists()  # no file created for the end
    # A restarted broker settling the token sees the start, the end line notwithstanding.
    assert settled is not None
    assert (settled.pid, settled.started_at, settled.error) == (pgid, result.started_at, None)


@pytest.mark.asyncio
async def test_a_token_settled_first_is_void_and_its_start_is_refused(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        assert await executor.settle_launch("late") is None  # it never began ...
        await executor.start(sh("v", "echo ran > ran"), 1, reports)  # (the launcher is up)
        await reports.one()
        await executor.start(sh("w", "echo ran > ran", launch_token="late"), 1, reports)
        result = (await reports.wait_for(2))[1]
        assert await executor.settle_launch("late") is None  # ... and never will
    assert result.exit_code is None
    assert result.error is not None
    assert "launch record" in result.error
    assert not (tmp_path / "w" / "ran").exists()
    assert launch_lines(tmp_path, "late") == [{"void": True}]


@pytest.mark.asyncio
async def test_a_job_that_ended_unwatched_is_reported_from_its_launch_record(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        spec = sh("rec", WAIT_FOR_GO + "exit 6", launch_token="tok2")
        view = await left_running(tmp_path, spec)
        (tmp_path / "rec" / "go").touch()
        while len(launch_lines(tmp_path, "tok2")) < 2:
            await asyncio.sleep(0.01)
        assert await group_gone(view.pid)
        adopt(executor, view, reports, launch_token="tok2")
        result = await reports.one()
    _start, end = launch_lines(tmp_path, "tok2")
    assert (result.exit_code, result.signal, result.error) == (6, None, None)
    assert result.ended_at == end["ended_at"]
    assert result.started_at == view.started_at


@pytest.mark.asyncio
async def test_an_end_line_of_another_group_is_not_taken_for_the_jobs_end(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("odd", "sleep 100", launch_token="tok3"))
        kill_launcher(tmp_path)  # nobody records its end ...
        os.killpg(view.pid, SIGKILL)
        assert await group_gone(view.pid)
        forged = {"exit_code": 0, "signal": None, "pid": view.pid + 1, "ended_at": time.time()}
        with (tmp_path / ".gbroker-launches" / "tok3").open("a") as record:
            record.write(json.dumps(forged) + "\n")  # ... and a line not this group's
        adopt(executor, view, reports, launch_token="tok3")
        result = await reports.one()
    assert (result.exit_code, result.signal) == (None, None)
    assert result.error is not None
    assert "unknown" in result.error


@pytest.mark.asyncio
async def test_a_short_jobs_end_is_heard_from_the_launcher_never_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ends at once has its end in the same read as its start: that word must reach
    its watcher (it was dropped, and each such job was polled in /proc and read from disk)."""
    polled: list[int] = []

    async def no_poll(run: object, pid: int, leader_starttime: int) -> None:
        polled.append(pid)

    monkeypatch.setattr(Executor, "_poll", staticmethod(no_poll))
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        await executor.start(JobSpec("warm", "true"), 1, reports)  # the launcher is up
        for i in range(5):
            starting = asyncio.create_task(executor.start(JobSpec(f"t{i}", "true"), 1, reports))
            for _ in range(5):  # until the start request is on its way
                await asyncio.sleep(0)
            # A busy broker's loop stalls: the job's start and its end then arrive together.
            time.sleep(0.3)
            await starting
        results = await reports.wait_for(6)
        for link in executor._links:
            assert link is None or link.exits == {}  # every watcher took its job's end
    assert polled == []
    assert all(result.exit_code == 0 for result in results)


@pytest.mark.asyncio
async def test_forgotten_launch_records_are_removed(tmp_path: Path) -> None:
    reports = Reports()
    records = tmp_path / ".gbroker-launches"
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        for i in range(5):
            await executor.start(sh(f"f{i}", "true", launch_token=f"tok{i}"), 1, reports)
        await reports.wait_for(5)
        for i in range(4):
            executor.forget_launch(f"tok{i}")
        while len(list(records.iterdir())) > 1:  # removed soon, off the event loop's thread
            await asyncio.sleep(0.01)
        executor.forget_launch("tok4")
    assert list(records.iterdir()) == []  # and what is left goes before aclose returns


def test_adopt_refuses_a_malformed_token(tmp_path: Path) -> None:
    async def attempt() -> None:
        async with Executor(tmp_path) as executor:
            view = RunningJob("x", 12345, 1, time.time(), None, None)
            adopt(executor, view, Reports(), launch_token="../../etc")

    with pytest.raises(InvalidInput, match="launch_token"):
        asyncio.run(attempt())


@pytest.mark.asyncio
async def test_a_job_whose_end_was_not_recorded_is_reported_as_unknown(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("lost", "sleep 100"))
        kill_launcher(tmp_path)  # the OOM killer, say, while no broker was watching ...
        os.killpg(view.pid, SIGKILL)  # ... and then the job
        assert await group_gone(view.pid)
        # A record that is not this group's (an earlier run's, say) must not pass for its end.
        stale = {"exit_code": 0, "signal": None, "pid": view.pid + 1}
        (tmp_path / "lost" / FORGED).write_text(json.dumps(stale))
        adopt(executor, view, reports)
        assert reports.results == []
        result = await reports.one()
    assert (result.exit_code, result.signal) == (None, None)
    assert result.error is not None
    assert "unknown" in result.error
    assert "broker was down" in result.error
    assert not result.succeeded


@pytest.mark.asyncio
async def test_leftovers_of_a_job_whose_leader_ended_unwatched_are_killed(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(
            tmp_path, sh("leaky", WAIT_FOR_GO + "sleep 100 & echo $! > orphan; exit 2")
        )
        kill_launcher(tmp_path)  # nobody is left to see the leader end, or to kill the rest
        (tmp_path / "leaky" / "go").touch()
        await wait_for_file(tmp_path / "leaky" / "orphan")
        orphan = int((tmp_path / "leaky" / "orphan").read_text())
        while alive(view.pid):
            await asyncio.sleep(0.01)
        assert alive(orphan)
        adopt(executor, view, reports)
        result = await reports.one()
        assert await group_gone(view.pid)
    assert not alive(orphan)
    assert result.exit_code is None
    assert result.error is not None
    assert "unknown" in result.error


@pytest.mark.parametrize(
    "environment",
    [{}, {"GBROKER_JOB_ID": "victim", "GBROKER_JOB_DIR": "/another/site/jobs/victim"}],
    ids=["stranger", "same-job-id-elsewhere"],
)
@pytest.mark.asyncio
async def test_a_process_group_that_is_not_the_jobs_is_never_signalled(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    # The pgid on record now leads someone else's group: the pid was reused after a reboot,
    # or the group is the same job's at another site's broker on this machine.
    stranger = subprocess.Popen(
        ["sleep", "100"], start_new_session=True, env={"PATH": os.defpath, **environment}
    )
    reports = Reports()
    try:
        async with asyncio.timeout(LIMIT), Executor(tmp_path, grace_period=0.0) as executor:
            # Its time limit passed long ago: adopted, it would be stopped at once.
            executor.adopt("victim", stranger.pid, 1, time.time() - 60, 1.0, reports)
            assert executor.running() == {}
            assert not executor.cancel("victim")
            result = await reports.one()
            await asyncio.sleep(0.3)  # anything sent to the stranger would have arrived by now
        assert stranger.poll() is None  # alive and well, after aclose too
    finally:
        stranger.kill()
        stranger.wait()
    assert (result.exit_code, result.signal) == (None, None)
    assert result.error is not None
    assert "unknown" in result.error
    assert not result.timed_out


@pytest.mark.asyncio
async def test_an_adopted_job_can_be_cancelled(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("stop-me", "sleep 100 & sleep 100 & wait"))
        adopt(executor, view, reports)
        assert executor.cancel("stop-me")
        assert executor.running()["stop-me"].stopping is StopReason.CANCELLED
        result = await reports.one()
        assert await group_gone(view.pid)
    assert result.cancelled
    assert (result.exit_code, result.signal, result.error) == (None, SIGTERM, None)


@pytest.mark.asyncio
async def test_an_adopted_job_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path, grace_period=0.3) as executor:
        script = "trap '' TERM; sleep 100 & echo up > ready; wait"
        view = await left_running(tmp_path, sh("stubborn", script))
        await wait_for_file(tmp_path / "stubborn" / "ready")
        adopt(executor, view, reports)
        asked = time.monotonic()
        executor.cancel("stubborn")
        result = await reports.one()
        waited = time.monotonic() - asked
        assert await group_gone(view.pid)
    # The launcher, the job's parent, recorded the SIGKILL too.
    assert exit_record(tmp_path, view.launch_token or "")["signal"] == SIGKILL
    assert result.cancelled
    assert (result.exit_code, result.signal, result.error) == (None, SIGKILL, None)
    assert waited >= 0.3


@pytest.mark.asyncio
async def test_the_time_limit_of_an_adopted_job_counts_from_its_start(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        fresh = await left_running(tmp_path, sh("fresh", "sleep 100"))
        late = await left_running(tmp_path, sh("late", "sleep 100"))
        adopted_at = time.time()
        adopt(executor, fresh, reports, started_at=adopted_at, time_limit=0.5)
        adopt(executor, late, reports, started_at=adopted_at - 60, time_limit=1.0)
        assert executor.running()["fresh"].deadline == adopted_at + 0.5
        await reports.wait_for(2)
    by_id = {r.job_id: r for r in reports.results}
    assert all(r.timed_out and r.signal == SIGTERM for r in reports.results)
    assert by_id["late"].ended_at - adopted_at < 0.5  # already past: stopped at once
    # Recorded by the supervisor: file times are a clock tick coarse (a few ms).
    assert by_id["fresh"].ended_at - adopted_at >= 0.5 - 0.02
    assert by_id["late"].ended_at < by_id["fresh"].ended_at


@pytest.mark.asyncio
async def test_aclose_detaching_leaves_running_jobs_but_finishes_stopping_ones(
    tmp_path: Path,
) -> None:
    reports = Reports()
    executor = Executor(tmp_path)
    async with asyncio.timeout(LIMIT):
        await executor.start(sh("stays", "sleep 100"), 1, reports)
        await executor.start(sh("goes", "sleep 100"), 1, reports)
        stays = executor.running()["stays"].pid
        executor.cancel("goes")
        await executor.aclose(detach=True)
        try:
            assert [(r.job_id, r.cancelled) for r in reports.results] == [("goes", True)]
            assert executor.running() == {}
            assert not executor.cancel("stays")
            with pytest.raises(InternalError):
                await executor.start(sh("late", "true"), 1, reports)
            with pytest.raises(InternalError):
                executor.adopt("late", stays, 1, time.time(), None, reports)
            await executor.aclose()  # closing again is harmless and stops nothing
            await asyncio.sleep(0.2)
            assert group_members(stays)
            assert len(reports.results) == 1
        finally:
            os.killpg(stays, SIGKILL)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_id", "a/b"),
        ("pgid", 0),
        ("pgid", 1),
        ("pgid", True),
        ("pgid", "123"),
        ("cores", 0),
        ("started_at", float("nan")),
        ("started_at", None),
        ("time_limit", 0),
        ("time_limit", float("inf")),
    ],
)
@pytest.mark.asyncio
async def test_bad_adopt_values_raise_naming_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    reports = Reports()
    arguments: dict[str, Any] = {
        "job_id": "j",
        "pgid": os.getpgid(0),
        "cores": 1,
        "started_at": time.time(),
        "time_limit": None,
        "on_exit": reports,
        field: value,
    }
    async with Executor(tmp_path) as executor:
        with pytest.raises(InvalidInput) as raised:
            executor.adopt(**arguments)
        await asyncio.sleep(0.05)
    assert field in raised.value.field
    assert reports.results == []


def test_a_launcher_no_broker_reaches_leaves_the_root_and_ends(tmp_path: Path) -> None:
    """A broker that dies between starting its launcher and connecting must not leave the
    launcher waiting forever (one was found idle, hours later, after a test run)."""
    from gbroker.site import launcher

    ready_read, ready_write = os.pipe()
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import launcher; "
        "launcher.IDLE_RETIRE = 0.3; sys.exit(launcher.main(sys.argv[1:]))"
    )
    here = str(Path(launcher.__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", script, here, str(tmp_path), str(ready_write)],
        pass_fds=(ready_write,),
    )
    os.close(ready_write)
    try:
        assert os.read(ready_read, 16) == b"ok"
        assert (tmp_path / launcher.SOCKET_NAME).exists()
        assert child.wait(timeout=10) == 0  # nobody came: it retired and ended
    finally:
        os.close(ready_read)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not (tmp_path / launcher.SOCKET_NAME).exists()


@pytest.mark.asyncio
async def test_a_job_held_to_a_host_takes_its_slots_from_that_hosts_share(tmp_path: Path) -> None:
    """A site declaring hosts shares its core slots among them in runs; a job whose candidate
    hosts hold it to some takes its slots there, and a host the site lacks is refused."""
    reports = Reports()
    hosts = ("x01", "x02", "x03")
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path, site="s1", site_cores=8, hosts=hosts) as executor,
    ):
        assert executor.host_slots == {"x01": range(3), "x02": range(3, 6), "x03": range(6, 8)}
        await executor.start(sh("held", "sleep 30", hosts=("x03",)), 2, reports)
        await executor.start(sh("free", "sleep 30"), 2, reports)
        assert executor.slots_of("held") == (6, 7)
        assert executor.slots_of("free") == (0, 1)  # the least used, anywhere
        with pytest.raises(InvalidInput, match=r"job\[odd\]\.hosts: expected hosts of s1"):
            await executor.start(sh("odd", "true", hosts=("x09",)), 1, reports)
        for job in ("held", "free"):
            executor.cancel(job)
        assert {r.job_id for r in await reports.wait_for(2)} == {"held", "free"}


# A job moved here (issue 35): its limits are its own in all; it gets what is left of them.


@pytest.mark.asyncio
async def test_a_moved_job_gets_what_is_left_of_its_wall_time_limit(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        moved = Used(wall=59.7, cpu=0.0, moves=2)
        await executor.start(sh("moved", "sleep 100", time_limit=60, used=moved), 1, reports)
        view = executor.running()["moved"]
        assert view.deadline == pytest.approx(view.started_at + 0.3)
        result = await reports.one()
    assert result.timed_out
    assert 0.3 <= result.ended_at - result.started_at < 5.0
    assert result.ended_by is not None
    assert re.match(
        r"killed at its wall-time limit of 60 s \(60\.\d s used, over 2 moves\): ", result.ended_by
    )


@pytest.mark.asyncio
async def test_a_moved_job_with_none_of_a_limit_left_is_stopped_at_once_for_it(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        wall = Used(wall=61.0, cpu=0.0, moves=1)
        cpu = Used(wall=1.0, cpu=5.0, moves=3)
        began = time.time()
        await executor.start(sh("wall", "sleep 100", time_limit=60, used=wall), 1, reports)
        limits = Limits(cpu_time=5)
        await executor.start(sh("cpu", "sleep 100", limits=limits, used=cpu), 1, reports)
        ended = {r.job_id: r for r in await reports.wait_for(2)}
    assert all(r.ended_at - began < 4.0 and r.signal == SIGTERM for r in ended.values())
    assert ended["wall"].timed_out
    assert ended["wall"].ended_by is not None
    assert ended["wall"].ended_by.startswith(
        "killed at its wall-time limit of 60 s (61.0 s used, over 1 move): SIGTERM"
    )
    assert not ended["cpu"].timed_out
    assert not ended["cpu"].cancelled
    assert ended["cpu"].ended_by is not None
    assert ended["cpu"].ended_by.startswith(
        "killed at its CPU-time limit of 5 s (5.0 s used, over 3 moves): SIGTERM"
    )


@pytest.mark.asyncio
async def test_a_moved_job_gets_what_is_left_of_its_cpu_time_limit(tmp_path: Path) -> None:
    # 0.2 s of its 5 s left: RLIMIT_CPU is whole seconds, rounded up to 1; SIGXCPU ends it.
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        spec = sh(
            "busy",
            "ulimit -t; while :; do :; done",
            limits=Limits(cpu_time=5),
            used=Used(wall=9.0, cpu=4.8, moves=1),
        )
        await executor.start(spec, 1, reports)
        result = await reports.one()
    assert (tmp_path / "busy" / "stdout").read_text().split() == ["1"]
    assert result.signal == SIGXCPU
    assert result.ended_by is not None
    assert re.match(
        r"killed by SIGXCPU: it used up its CPU-time limit of 5 s \(RLIMIT_CPU; 5\.\d s used, "
        r"over 1 move\)",
        result.ended_by,
    )


@pytest.mark.asyncio
async def test_an_adopted_moved_job_keeps_to_what_was_left_of_its_limit(tmp_path: Path) -> None:
    reports = Reports()
    async with asyncio.timeout(LIMIT), Executor(tmp_path) as executor:
        view = await left_running(tmp_path, sh("moved", "sleep 100"))
        now = time.time()
        moved = Used(wall=9.5, cpu=1.0, moves=1)
        adopt(executor, view, reports, started_at=now, time_limit=10.0, used=moved)
        assert executor.running()["moved"].deadline == pytest.approx(now + 0.5)
        result = await reports.one()
    assert result.timed_out
    assert result.ended_by is not None
    assert result.ended_by.startswith("killed at its wall-time limit of 10 s (10.")
    assert "s used, over 1 move): SIGTERM" in result.ended_by
