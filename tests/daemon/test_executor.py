"""The executor with real processes: files, environment, exit codes, groups killed, limits."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from signal import SIGKILL, SIGTERM
from typing import Any

import pytest

from gbroker.daemon.executor import Executor, ExitResult, JobSpec, StopReason
from gbroker.errors import InternalError, InvalidInput

LIMIT = 20.0  # seconds any one test may take; they take well under one


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
            JobSpec("plain", sys.executable, ("-c", dump), {"MY_VAR": "x y"}), 4, reports
        )
        await executor.start(
            JobSpec(
                "own",
                sys.executable,
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
        assert len(group_members(pgid)) == 3  # sh and its two sleeps
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
        script = "echo $$ > leader; sleep 100 & echo $! > orphan; exit 0"
        await executor.start(sh("leaver", script), 1, reports)
        result = await reports.one()
        pgid = int((tmp_path / "leaver" / "leader").read_text())
        orphan = int((tmp_path / "leaver" / "orphan").read_text())
        assert await group_gone(pgid)
    assert result.succeeded  # the job itself ended on its own
    assert orphan not in group_members(pgid)


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
        (job_dir / "run.sh").chmod(0o755)
        await executor.start(JobSpec("runs", str(job_dir / "run.sh")), 1, reports)
        await reports.wait_for(2)
    by_id = {r.job_id: r for r in reports.results}
    assert by_id["noexec"].error is not None
    assert "Permission denied" in by_id["noexec"].error
    assert by_id["runs"].succeeded


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
