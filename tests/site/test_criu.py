"""CRIU checkpoints and restores of running jobs at a ``local`` site (issue 27, part 1).

Real CRIU (scripts/ensure_criu.sh builds it; never skipped), real processes, two executors over
two roots on this host, as two sites of a fleet are: a job checkpointed at A, its directory
copied to B, restored there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from gbroker.core.limits import NOTHING
from gbroker.site import criu
from gbroker.site.checkpoints import CheckpointError
from gbroker.site.executor import Executor, JobSpec, Limits

from .test_executor import JOB_PYTHON, Reports

LIMIT = 60.0

COUNT = "import time\nfor i in range(1, 41):\n    print(i, flush=True)\n    time.sleep(0.05)\n"


@pytest.fixture(scope="module", autouse=True)
def criu_here() -> str:
    assert os.geteuid() == 0, "CRIU checkpoints need root (CI runs as root)"
    found = criu.find_criu()
    missing = "no working criu: run scripts/ensure_criu.sh (scripts/test.sh does)"
    assert found is not None, missing
    assert criu.criu_works(found), missing
    return found


def counting(job_id: str, token: str | None = None) -> JobSpec:
    return JobSpec(job_id, JOB_PYTHON, ("-c", COUNT), launch_token=token)


async def until(condition: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def numbers(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def started_counting(executor: Executor, job_id: str, at_least: int = 5) -> None:
    out = executor.job_dir(job_id) / "stdout"
    await until(lambda: len(numbers(out)) >= at_least, f"{job_id} to count to {at_least}")


async def move(a: Executor, b: Executor, job_id: str, image: Path, token: str) -> Reports:
    """Checkpoint at A, copy the directory, restore at B, release at A."""
    image.mkdir()
    taken = await a.checkpoint(job_id, image)
    assert taken.kind == "criu"
    assert taken.size > 0
    assert taken.job_dir == a.job_dir(job_id)
    assert a.running_job(job_id) is not None  # frozen, still holding its cores
    shutil.copytree(a.job_dir(job_id), b.job_dir(job_id))
    there = Reports()
    await b.restore(counting(job_id, token), image, 1, there)
    assert b.running_job(job_id) is not None
    await a.release(job_id)
    assert a.running_job(job_id) is None
    return there


@pytest.mark.asyncio
async def test_a_job_moves_to_another_root_and_counts_on_there(tmp_path: Path) -> None:
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
    ):
        assert a.checkpoints == ("criu", "application")
        here = Reports()
        await a.start(counting("count"), 1, here)
        await started_counting(a, "count")
        there = await move(a, b, "count", tmp_path / "image", "tokenb1")
        result = await there.one()
        assert result.exit_code == 0, result
        assert result.error is None
        at_b = numbers(b.job_dir("count") / "stdout")
        at_a = numbers(a.job_dir("count") / "stdout")
        assert at_b == list(range(1, 41))
        assert 5 <= len(at_a) < 40
        assert at_a == at_b[: len(at_a)]
        assert here.results == []  # released: nothing is said at A


@pytest.mark.asyncio
async def test_a_resumed_job_counts_on_where_it_was(tmp_path: Path) -> None:
    async with asyncio.timeout(LIMIT), Executor(tmp_path / "a") as a:
        here = Reports()
        await a.start(counting("count"), 1, here)
        await started_counting(a, "count")
        (tmp_path / "image").mkdir()
        await a.checkpoint("count", tmp_path / "image")
        await a.resume("count")
        result = await here.one()
        assert result.exit_code == 0
        assert numbers(a.job_dir("count") / "stdout") == list(range(1, 41))


@pytest.mark.asyncio
async def test_criu_refusing_a_dump_leaves_the_job_running(tmp_path: Path) -> None:
    """A job with an established TCP connection: CRIU will not dump one without
    --tcp-established (its peer, here the test, is not checkpointed with it)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    address = server.getsockname()
    async with asyncio.timeout(LIMIT), Executor(tmp_path / "a") as a:
        here = Reports()
        code = f"import socket, time\ns = socket.create_connection({address!r})\n" + COUNT
        await a.start(JobSpec("sock", JOB_PYTHON, ("-c", code)), 1, here)
        await started_counting(a, "sock")
        image = tmp_path / "image"
        image.mkdir()
        with pytest.raises(CheckpointError, match=r"criu dump.*TCP"):
            await a.checkpoint("sock", image)
        assert a.running_job("sock") is not None
        result = await here.one()
        assert result.exit_code == 0
        assert numbers(a.job_dir("sock") / "stdout") == list(range(1, 41))
    server.close()


@pytest.mark.asyncio
async def test_a_restored_job_moves_again(tmp_path: Path) -> None:
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
        Executor(tmp_path / "c", site="c") as c,
    ):
        here = Reports()
        await a.start(counting("count"), 1, here)
        await started_counting(a, "count", 3)
        at_b = await move(a, b, "count", tmp_path / "image1", "tokenb2")
        await started_counting(b, "count", len(numbers(a.job_dir("count") / "stdout")) + 3)
        at_c = await move(b, c, "count", tmp_path / "image2", "tokenc2")
        result = await at_c.one()
        assert result.exit_code == 0, result
        assert numbers(c.job_dir("count") / "stdout") == list(range(1, 41))
        assert here.results == []
        assert at_b.results == []


@pytest.mark.asyncio
async def test_a_restore_under_a_used_token_is_refused(tmp_path: Path) -> None:
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
    ):
        await a.start(counting("count"), 1, Reports())
        await started_counting(a, "count")
        there = await move(a, b, "count", tmp_path / "image", "tokenonce")
        assert (await there.one()).exit_code == 0
        again = Reports()
        with pytest.raises(CheckpointError, match="used already"):
            await b.restore(counting("count", "tokenonce"), tmp_path / "image", 1, again)
        record = await b.settle_launch("tokenonce")
        assert record is not None
        assert record.pid is not None
        assert again.results == []


BUSY = (
    "import resource, time\n"
    "while True:\n"
    "    began = time.process_time()\n"
    "    while 0 <= time.process_time() - began < 0.05:\n"
    "        pass\n"
    "    print(resource.getrlimit(resource.RLIMIT_CPU)[0], flush=True)\n"
)


@pytest.mark.asyncio
async def test_a_checkpoint_says_what_the_job_used_and_its_restore_gets_what_is_left(
    tmp_path: Path,
) -> None:
    # Issue 35: CRIU restores the job's rlimits, not its CPU time; its RLIMIT_CPU at the
    # target is what is left of its limit, and its wall-time limit too (the job prints its
    # RLIMIT_CPU as it runs).
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
    ):
        spec = JobSpec("busy", JOB_PYTHON, ("-c", BUSY), time_limit=120, limits=Limits(cpu_time=60))
        began = time.time()
        await a.start(spec, 1, Reports())
        await started_counting(a, "busy", at_least=25)  # 1.25 s of CPU at least
        (tmp_path / "image").mkdir()
        taken = await a.checkpoint("busy", tmp_path / "image")
        assert 1.25 <= taken.cpu_time <= taken.ran_for + 0.1  # one core: no more than it ran
        assert taken.ran_for <= time.time() - began
        used = NOTHING.then(taken.ran_for, taken.cpu_time)
        shutil.copytree(a.job_dir("busy"), b.job_dir("busy"))
        there = Reports()
        moved = dataclasses.replace(spec, launch_token="tokenb3", used=used)
        await b.restore(moved, tmp_path / "image", 1, there)
        await a.release("busy")
        out = b.job_dir("busy") / "stdout"
        left = math.ceil(60 - taken.cpu_time)
        assert left < 60
        await until(lambda: out.read_text().split()[-1:] == [str(left)], f"RLIMIT_CPU {left}")
        view = b.running_job("busy")
        assert view is not None
        assert view.deadline == pytest.approx(view.started_at + 120 - taken.ran_for)
        b.cancel("busy")
        assert (await there.one()).cancelled
