"""The ``gridengine`` back-end against a real private Grid Engine cell (its sge_qmaster and
sge_execd, started by gbroker.fleet.gridengine): a job runs as a Grid Engine job, and a job left
running by a broker that went away is settled by its token, adopted and reported once."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.fleet import gridengine as cells
from gbroker.site.backend import ExitResult, JobSpec
from gbroker.site.gridengine import GridEngineBackend, parse_qacct
from gbroker.site.spmd import MpiFlavour, Ranks

pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cell() -> Iterator[cells.Cell]:
    missing = cells.missing_tools()
    if missing:
        pytest.fail(f"Grid Engine missing ({missing}): run scripts/setup/ensure_gridengine.sh")
    base = Path(tempfile.mkdtemp(prefix="gbroker-ge-"))
    base.chmod(0o755)  # the jobs' owner (nobody) must reach their directories
    started = cells.start_cell(base / "cell", slots=4)
    try:
        yield started
    finally:
        cells.stop_cell(started, grace=5.0)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _backend(cell: cells.Cell) -> GridEngineBackend:
    return GridEngineBackend(
        cell.directory.parent / "jobs", site="ge", environment=cell.environment, interval=0.3
    )


async def _ended(results: list[ExitResult], timeout: float = 60.0) -> ExitResult:
    deadline = time.monotonic() + timeout
    while not results:
        assert time.monotonic() < deadline, "the job's end was never reported"
        await asyncio.sleep(0.1)
    return results[0]


def test_a_job_runs_as_a_grid_engine_job_on_its_slots(cell: cells.Cell) -> None:
    async def scenario() -> tuple[ExitResult, int, str]:
        backend = _backend(cell)
        results: list[ExitResult] = []
        spec = JobSpec(
            "job1", "/bin/sh", ("-c", 'echo "$JOB_ID $NSLOTS $GBROKER_JOB_ID"; exit 3'),
            launch_token="tok1",
        )  # fmt: skip
        await backend.start(spec, 2, results.append)
        handle = backend._runs["job1"].slurm_id
        assert handle is not None
        result = await _ended(results)
        await backend.aclose()
        return result, handle, (backend.job_dir("job1") / "stdout").read_text()

    result, handle, out = asyncio.run(scenario())
    assert result.exit_code == 3, result
    assert out.split() == [str(handle), "2", "job1"]


def test_a_job_left_running_is_settled_adopted_and_reported_once(cell: cells.Cell) -> None:
    async def scenario() -> tuple[list[ExitResult], int, int | None]:
        first = _backend(cell)
        spec = JobSpec("job2", "/bin/sh", ("-c", "sleep 3; exit 5"), launch_token="tok2")
        await first.start(spec, 1, lambda result: pytest.fail(f"reported by the first: {result}"))
        handle = first.running()["job2"].pid
        await first.aclose(detach=True)  # the broker goes; its job runs on in Grid Engine
        second = _backend(cell)
        record = await second.settle_launch("tok2")
        assert record is not None
        results: list[ExitResult] = []
        assert record.started_at is not None
        second.adopt("job2", record.pid or 0, 1, record.started_at, None, results.append, "tok2")
        await _ended(results)
        assert "job2" not in second.running()  # reported: nothing left to report again
        await second.aclose()
        return results, handle, record.pid

    results, handle, settled = asyncio.run(scenario())
    assert settled == handle
    assert [r.exit_code for r in results] == [5]


@pytest.fixture(scope="module")
def mpi_ranks() -> Iterator[Path]:
    """examples/mpi_ranks.c built for both MPIs, where every account can run it."""
    path = Path(tempfile.mkdtemp(prefix="gbroker-mpi-"))
    path.chmod(0o755)
    subprocess.run(["bash", str(ROOT / "examples" / "build_mpi_ranks.sh"), str(path)], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("flavour", [MpiFlavour.OPEN_MPI, MpiFlavour.MPICH])
def test_an_spmd_job_runs_as_its_ranks_on_the_slots_of_its_parallel_environment(
    cell: cells.Cell, mpi_ranks: Path, flavour: MpiFlavour
) -> None:
    """``-pe gbroker 4`` and the flavour's mpiexec in the script: mpiexec finds the slots
    (PE_HOSTFILE) and starts 4 ranks, each once."""
    job = f"mpi-{flavour.value}"

    async def scenario() -> tuple[ExitResult, int | None]:
        backend = _backend(cell)
        results: list[ExitResult] = []
        program = mpi_ranks / f"mpi_ranks.{flavour.value}"
        spec = JobSpec(
            job, str(program), launch_token=f"tok{flavour.value}", ranks=Ranks(flavour, 4)
        )
        await backend.start(spec, 4, results.append)
        handle = backend._runs[job].slurm_id
        result = await _ended(results)
        await backend.aclose()
        return result, handle

    result, handle = asyncio.run(scenario())
    directory = cell.directory.parent / "jobs" / job
    assert result.exit_code == 0, (result, (directory / "stderr").read_text())
    lines = (directory / "stdout").read_text().splitlines()
    assert sorted(lines) == [f"rank {i} of 4" for i in range(4)]
    accounted = subprocess.run(
        ["qacct", "-j", str(handle)],
        env={"PATH": "/usr/bin:/bin", **cell.environment},
        capture_output=True,
        text=True,
        check=True,
    )
    assert parse_qacct(accounted.stdout)[-1].job_id == handle  # a Grid Engine job of 4 slots
    assert "slots        4" in accounted.stdout


def test_qacct_records_are_read() -> None:
    text = (
        "==============================================================\n"
        "qname        gbroker.q\njobnumber    7\n"
        "start_time   Thu Nov 26 23:18:49 2026\nend_time     Thu Nov 26 23:18:52 2026\n"
        "failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit\n"
        "exit_status  137                  (Killed)\n"
    )
    (record,) = parse_qacct(text)
    assert (record.job_id, record.failed, record.exit_status) == (7, 37, 137)
    assert record.failed_reason.startswith("qmaster enforced h_rt")
    assert record.ended_at is not None
    assert record.started_at is not None
    assert record.ended_at - record.started_at == 3
