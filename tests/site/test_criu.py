"""CRIU checkpoints and restores of running jobs at a ``local`` site (issue 27, part 1).

Real CRIU (scripts/setup/ensure_criu.sh builds it; never skipped), real processes, two executors
over two roots on this host, as two sites of a fleet are: a job checkpointed at A, its directory
copied to B, restored there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import pwd
import socket
import time
from pathlib import Path

import pytest

from gbroker.core.limits import NOTHING
from gbroker.site import bundles, criu
from gbroker.site.backend import JobSpec, Limits
from gbroker.site.checkpoints import CheckpointError
from gbroker.site.executor import Executor

from .test_bundles import searchable_tmp
from .test_executor import JOB_PYTHON, Reports

LIMIT = 60.0

COUNT = "import time\nfor i in range(1, 41):\n    print(i, flush=True)\n    time.sleep(0.05)\n"


@pytest.fixture(scope="module", autouse=True)
def criu_here() -> str:
    assert os.geteuid() == 0, "CRIU checkpoints need root (CI runs as root)"
    found = criu.find_criu()
    missing = "no working criu: run scripts/setup/ensure_criu.sh (scripts/test.sh does)"
    assert found is not None, missing
    assert criu.criu_works(found), missing
    return found


_tmp_path = pytest.fixture(name="tmp_path")(searchable_tmp)  # the jobs' accounts reach it


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


async def move(a: Executor, b: Executor, job_id: str, moving: Path, token: str) -> Reports:
    """Checkpoint at A, bundle the image and the directory, unpack at B, restore there,
    release at A (as gbroker.daemon.moving does)."""
    moving.mkdir(mode=0o700)
    (moving / bundles.IMAGE).mkdir(mode=0o700)
    taken = await a.checkpoint(job_id, moving / bundles.IMAGE)
    assert taken.kind == "criu"
    assert taken.size > 0
    assert taken.job_dir == a.job_dir(job_id)
    assert a.running_job(job_id) is not None  # frozen, still holding its cores
    bundle = moving / "bundle.tar"
    await bundles.pack(bundle, taken.image, taken.job_dir, taken.account, 1 << 30)
    image = bundles.unpack(bundle, moving, 1 << 30)
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
            await b.restore(counting("count", "tokenonce"), tmp_path / "image" / "image", 1, again)
        record = await b.settle_launch("tokenonce")
        assert record is not None
        assert record.pid is not None
        assert again.results == []


def job_process(executor: Executor, job_id: str) -> int:
    """A restored job's own pid on the host (its handle is its init's)."""
    running = executor.running_job(job_id)
    assert running is not None
    children = Path(f"/proc/{running.pid}/task/{running.pid}/children").read_text().split()
    return int(children[0])


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


@pytest.mark.asyncio
async def test_a_restored_job_has_its_accounts_ids_and_no_capability(tmp_path: Path) -> None:
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
    ):
        await a.start(counting("count"), 1, Reports())
        await started_counting(a, "count")
        there = await move(a, b, "count", tmp_path / "moving", "tokencaps")
        facts = status(job_process(b, "count"))
        nobody = pwd.getpwnam("nobody")
        assert facts["Uid"].split() == [str(nobody.pw_uid)] * 4
        assert facts["Gid"].split() == [str(nobody.pw_gid)] * 4
        assert facts["Groups"] == ""
        for key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(facts[key], 16) == 0, (key, facts[key])
        assert (await there.one()).exit_code == 0


# Holds a file open outside its directory, read-only and append-only, then reads and appends.
HOLDS = """
import sys, time
read = open(sys.argv[1])
append = open(sys.argv[2], "a")
for i in range(1, 41):
    print(i, flush=True)
    time.sleep(0.05)
print(read.read(), flush=True)
append.write("appended\\n")
"""


@pytest.mark.asyncio
async def test_a_file_swapped_for_a_link_to_roots_is_never_opened_at_the_restore(
    tmp_path: Path,
) -> None:
    """While the job is frozen, a process of its user replaces the files it holds open with
    links to root's files; the restore (as the job's account) cannot open them: refused, the
    job runs on where it was, and never reads or writes root's files."""
    nobody = pwd.getpwnam("nobody")
    outside = tmp_path / "outside"  # its user's own directory, outside its job directory
    outside.mkdir()
    os.chown(outside, nobody.pw_uid, nobody.pw_gid)
    for name in ("read", "append"):
        (outside / name).write_text("x" * 13 + "\n")  # the size of root's, for CRIU's check
        os.chown(outside / name, nobody.pw_uid, nobody.pw_gid)
    (outside / "read").chmod(0o600)  # modes as the targets', so that CRIU's check passes
    secret, owned = tmp_path / "secret", tmp_path / "owned"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    owned.write_text("root's file\n")
    owned.chmod(0o644)
    async with (
        asyncio.timeout(LIMIT),
        Executor(tmp_path / "a", site="a") as a,
        Executor(tmp_path / "b", site="b") as b,
    ):
        here = Reports()
        program = ("-c", HOLDS, str(outside / "read"), str(outside / "append"))
        await a.start(JobSpec("holds", JOB_PYTHON, program), 1, here)
        await started_counting(a, "holds")
        moving = tmp_path / "moving"
        moving.mkdir(mode=0o700)
        (moving / bundles.IMAGE).mkdir(mode=0o700)
        taken = await a.checkpoint("holds", moving / bundles.IMAGE)
        for name, target in (("read", secret), ("append", owned)):
            (outside / name).unlink()
            os.symlink(target, outside / name)
        await bundles.pack(
            moving / "bundle.tar", taken.image, taken.job_dir, taken.account, 1 << 30
        )
        image = bundles.unpack(moving / "bundle.tar", moving, 1 << 30)
        with pytest.raises(CheckpointError, match="Permission denied"):
            await b.restore(JobSpec("holds", JOB_PYTHON, program), image, 1, Reports())
        assert b.running_job("holds") is None
        await a.resume("holds")
        result = await here.one()
        assert result.exit_code == 0, result
    assert "root's secret" not in (a.job_dir("holds") / "stdout").read_text()
    assert owned.read_text() == "root's file\n"
    assert secret.read_text() == "root's secret\n"


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
        moving = tmp_path / "moving"
        moving.mkdir(mode=0o700)
        (moving / bundles.IMAGE).mkdir(mode=0o700)
        taken = await a.checkpoint("busy", moving / bundles.IMAGE)
        assert 1.25 <= taken.cpu_time <= taken.ran_for + 0.1  # one core: no more than it ran
        assert taken.ran_for <= time.time() - began
        used = NOTHING.then(taken.ran_for, taken.cpu_time)
        await bundles.pack(
            moving / "bundle.tar", taken.image, taken.job_dir, taken.account, 1 << 30
        )
        image = bundles.unpack(moving / "bundle.tar", moving, 1 << 30)
        there = Reports()
        moved = dataclasses.replace(spec, launch_token="tokenb3", used=used)
        await b.restore(moved, image, 1, there)
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
