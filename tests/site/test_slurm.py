"""The Slurm back-end against a real single-node Slurm (munged, slurmctld, slurmd started here)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from gbroker.errors import InvalidInput
from gbroker.fleet import slurm as fleet_slurm
from gbroker.fleet.slurm import ClusterSpec, SlurmCluster
from gbroker.site.backend import ExitResult, JobSpec
from gbroker.site.batch import QueueRow
from gbroker.site.launcher import LAUNCHES
from gbroker.site.slurm import SlurmBackend, parse_sinfo_cpus, parse_squeue
from gbroker.site.spmd import MpiFlavour, Ranks

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
QUIET = ("--output=/dev/null", "--wrap=true")  # no slurm-N.out in the working directory


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    """Two nodes of 4 CPUs (two slurmds on this host)."""
    if fleet_slurm.missing_tools():
        subprocess.run(["bash", str(ROOT / "scripts" / "setup" / "ensure_slurm.sh")], check=True)
    directory = Path(tempfile.mkdtemp(prefix="gbroker-slurm-"))
    spec = ClusterSpec("test", 4, ("n1", "n2"), scheduler_parameters=fleet_slurm.PROMPT)
    slurm = SlurmCluster(directory / "cluster", spec)
    try:
        yield slurm.start()
    finally:
        slurm.stop(grace=5.0, cancel=True)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def root() -> Iterator[Path]:
    """Job directories where jobs' accounts can reach them (pytest's own are its user's)."""
    path = Path(tempfile.mkdtemp(prefix="gbroker-slurm-jobs-"))
    path.chmod(0o711)
    yield path / "jobs"
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def backend(cluster: SlurmCluster, root: Path) -> AsyncIterator[SlurmBackend]:
    async with SlurmBackend(root, site="s1", slurm_conf=cluster.conf, interval=0.3) as slurm:
        yield slurm


def squeue(cluster: SlurmCluster, *args: str) -> str:
    return subprocess.run(
        ["squeue", "--noheader", *args], env=cluster.env, capture_output=True, text=True, check=True
    ).stdout


async def ended(results: list[ExitResult], count: int = 1) -> list[ExitResult]:
    async with asyncio.timeout(TIMEOUT):
        while len(results) < count:
            await asyncio.sleep(0.05)
    return results


def test_squeue_lines_parse_with_another_users_comment_holding_the_separator() -> None:
    text = (
        "12|COMPLETED|2026-11-26T23:14:12|2026-11-26T23:14:13|768|None|gbroker:s1:abc|\n"
        "13|PENDING|N/A|N/A|0|JobHeldUser|mine|has|bars|\n"
        "14_1|RUNNING|N/A|N/A|0|None||\n"
        "garbage\n"
    )
    rows = parse_squeue(text)
    assert [r.slurm_id for r in rows] == [12, 13]
    assert rows[0].status == 768
    assert rows[0].comment == "gbroker:s1:abc"
    assert rows[0].started_at is not None
    assert rows[1].started_at is None
    assert rows[1].comment == "mine|has|bars"
    assert parse_sinfo_cpus("2/6/0/8\n") == (8, 6)
    assert parse_sinfo_cpus("") is None


@pytest.mark.asyncio
async def test_a_job_runs_in_slurm_with_its_cores_account_and_exit_status(
    backend: SlurmBackend,
) -> None:
    results: list[ExitResult] = []
    script = 'echo "$SLURM_JOB_ID $SLURM_CPUS_ON_NODE $(id -un) $GBROKER_CORES"; exit 3'
    spec = JobSpec("j1", "sh", ("-c", script), launch_token="tok1")
    await backend.start(spec, 2, results.append)
    running = backend.running_job("j1")
    assert running is not None  # start returned: Slurm runs it (or it ended: still shown)
    (result,) = await ended(results)
    assert result.exit_code == 3
    assert result.error is None
    assert not result.succeeded
    job_id, cpus, user, cores = (backend.job_dir("j1") / "stdout").read_text().split()
    assert int(job_id) == running.pid  # the handle is Slurm's job id
    assert (cpus, cores) == ("2", "2")
    assert user == ("nobody" if os.geteuid() == 0 else user)
    assert result.started_at <= result.ended_at
    assert backend.running_job("j1") is None


@pytest.mark.asyncio
async def test_the_wall_time_limit_holds_to_the_second_and_cancel_is_scancel(
    backend: SlurmBackend,
) -> None:
    results: list[ExitResult] = []
    await backend.start(
        JobSpec("slow", "sleep", ("60",), time_limit=1.5, launch_token="tok2"), 1, results.append
    )
    await backend.start(JobSpec("gone", "sleep", ("60",), launch_token="tok3"), 1, results.append)
    assert backend.cancel("gone")
    by_job = {r.job_id: r for r in await ended(results, 2)}
    assert by_job["slow"].timed_out
    assert "wall-time limit of 1.5 s" in (by_job["slow"].ended_by or "")
    assert by_job["slow"].ended_at - by_job["slow"].started_at < 10  # not Slurm's minutes
    assert by_job["gone"].cancelled
    assert "scancel" in (by_job["gone"].ended_by or "")


@pytest.mark.asyncio
async def test_a_restarted_broker_adopts_by_record_and_by_comment_and_voids_the_rest(
    cluster: SlurmCluster, root: Path
) -> None:
    conf = cluster.conf
    results: list[ExitResult] = []
    async with SlurmBackend(root, site="s2", slurm_conf=conf, interval=0.3) as first:
        await first.start(JobSpec("a", "sleep", ("2",), launch_token="toka"), 1, results.append)
        await first.aclose(detach=True)  # the broker goes; its job runs on in Slurm
    records = root / LAUNCHES
    # A broker killed between sbatch and the record's append: a held job, a record without id.
    held = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--comment=gbroker:s2:tokb", *QUIET],
        env=cluster.env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (records / "tokb").write_text(json.dumps({"job_id": "b", "submitting": True}) + "\n")
    # One killed before sbatch ran: a record and nothing in Slurm...
    (records / "tokc").write_text(json.dumps({"job_id": "c", "submitting": True}) + "\n")
    async with SlurmBackend(root, site="s2", slurm_conf=conf, interval=0.3) as second:
        record_a = await second.settle_launch("toka")
        record_b = await second.settle_launch("tokb")
        assert await second.settle_launch("tokc") is None
        assert await second.settle_launch("tokd") is None  # no record at all: never began
        assert record_a is not None
        assert record_a.pid is not None
        assert record_b is not None
        assert record_b.pid == int(held)
        # ...whose sbatch lands late: held, and cancelled, never run.
        late = subprocess.run(
            ["sbatch", "--parsable", "--hold", "--comment=gbroker:s2:tokc", *QUIET],
            env=cluster.env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert record_a.started_at is not None
        assert record_b.started_at is not None
        second.adopt("a", record_a.pid, 1, record_a.started_at, None, results.append, "toka")
        second.adopt("b", record_b.pid, 1, record_b.started_at, None, results.append, "tokb")
        by_job = {r.job_id: r for r in await ended(results, 2)}
        assert by_job["a"].exit_code == 0
        assert by_job["b"].exit_code == 0
        async with asyncio.timeout(TIMEOUT):
            while (state := squeue(cluster, "--states=all", "-j", late, "-o", "%T").strip()) != (
                "CANCELLED"
            ):
                assert state in ("PENDING", "CANCELLED")
                await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_capacity_counts_the_clusters_own_users(
    cluster: SlurmCluster, backend: SlurmBackend
) -> None:
    other = subprocess.run(
        ["sbatch", "--parsable", "-n", "7", "--output=/dev/null", "--wrap=sleep 30"],
        env=cluster.env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        backend.watch()
        async with asyncio.timeout(TIMEOUT):
            while (c := backend.capacity()) is None or c.running < 1 or c.free_cores > 1:
                await asyncio.sleep(0.1)
        assert c.total_cores == 8
        assert c.free_cores == 1
    finally:
        subprocess.run(["scancel", other], env=cluster.env, check=True)


@pytest.fixture(scope="module")
def mpi_ranks() -> Iterator[Path]:
    """examples/mpi_ranks.c built for both MPIs, where every account can run it."""
    path = Path(tempfile.mkdtemp(prefix="gbroker-mpi-"))
    path.chmod(0o755)
    subprocess.run(["bash", str(ROOT / "examples" / "build_mpi_ranks.sh"), str(path)], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("flavour", [MpiFlavour.OPEN_MPI, MpiFlavour.MPICH])
async def test_an_spmd_job_runs_as_its_ranks_through_mpiexec_in_the_allocation(
    backend: SlurmBackend, mpi_ranks: Path, flavour: MpiFlavour
) -> None:
    results: list[ExitResult] = []
    program = mpi_ranks / f"mpi_ranks.{flavour.value}"
    spec = JobSpec("mpi", str(program), launch_token="tokmpi", ranks=Ranks(flavour, 8))
    await backend.start(spec, 8, results.append)
    (result,) = await ended(results)
    assert result.exit_code == 0, (backend.job_dir("mpi") / "stderr").read_text()
    lines = (backend.job_dir("mpi") / "stdout").read_text().splitlines()
    assert sorted(lines) == sorted(f"rank {i} of 8" for i in range(8))


@pytest.mark.asyncio
async def test_a_job_held_to_a_host_runs_on_that_node_only(
    cluster: SlurmCluster, backend: SlurmBackend
) -> None:
    results: list[ExitResult] = []
    for i in range(3):
        spec = JobSpec(f"h{i}", "true", launch_token=f"tokh{i}", hosts=("n2",))
        await backend.start(spec, 1, results.append)
    assert [r.exit_code for r in await ended(results, 3)] == [0, 0, 0]
    listed = [line.split() for line in squeue(cluster, "--states=all", "-o", "%j %N").splitlines()]
    ran = {fields[0]: fields[1] for fields in listed if len(fields) == 2}
    assert {ran[f"gbroker-h{i}"] for i in range(3)} == {"n2"}


@pytest.mark.asyncio
async def test_a_host_the_cluster_lacks_fails_the_start_naming_it(backend: SlurmBackend) -> None:
    results: list[ExitResult] = []
    spec = JobSpec("nowhere", "true", launch_token="toknowhere", hosts=("x9",))
    await backend.start(spec, 1, results.append)
    (result,) = await ended(results)
    assert result.error is not None
    assert "job[nowhere].hosts: expected nodes of the cluster: n1, n2, got 'x9'" in result.error


@pytest.mark.asyncio
async def test_a_job_slurm_cannot_run_as_configured_fails_after_the_patience_not_never(
    root: Path, tmp_path: Path
) -> None:
    """Slurm keeps a job that its partition cannot give what it asks pending for ever
    (PartitionConfig); the site cancels it after its patience and says why. Driven by rows, as
    squeue would show them (no cluster needed: scancel's failure is only logged)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    results: list[ExitResult] = []
    async with SlurmBackend(root, site="s1", slurm_conf=conf) as slurm:
        slurm.hold_patience = 0.0
        slurm.adopt("wide", 7, 8, 1.0e9, None, results.append, "tokw")
        pending = QueueRow(7, "PENDING", None, None, 0, "PartitionConfig", "gbroker:s1:tokw")
        slurm._update(slurm._by_slurm[7], pending)
        await asyncio.sleep(0.01)
        slurm._update(slurm._by_slurm[7], pending)
        cancelled = QueueRow(7, "CANCELLED", None, 2.0e9, 15, "None", "gbroker:s1:tokw")
        slurm._update(slurm._by_slurm[7], cancelled)
        (result,) = await ended(results)
    assert result.error == (
        "Slurm would not let it run (for 0 s): Slurm cannot run it here (PartitionConfig)"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the job's account is the broker's own")
def test_the_job_directory_is_given_to_its_account_without_following_what_it_holds(
    tmp_path: Path,
) -> None:
    """A job's directory stays its account's between runs: it may hold a hard link to root's
    file (a host without fs.protected_hardlinks) or a link where its working directory goes.
    Preparing a run gives the directory to the account and makes the working directory as it,
    nothing more (no cluster needed: a job is prepared before sbatch)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    backend = SlurmBackend(tmp_path / "jobs", site="s1", slurm_conf=conf)
    account = backend.run_as
    job_dir = tmp_path / "jobs" / "s1.1"
    job_dir.mkdir(parents=True, mode=0o700)
    os.chown(job_dir, account.uid, account.gid)
    victim = tmp_path / "victim"
    victim.write_text("root's own")
    victim.chmod(0o600)
    os.link(victim, job_dir / "linked")
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (job_dir / "work").symlink_to(outside)
    os.lchown(job_dir / "work", account.uid, account.gid)
    with pytest.raises(InvalidInput, match="not links"):
        backend._prepare(JobSpec("s1.1", "true", working_directory="work/run"), account)
    assert victim.stat().st_uid == 0
    assert not (outside / "run").exists()
    fresh, work = backend._prepare(JobSpec("s1.2", "true", working_directory="a/b"), account)
    for made in (fresh, fresh / "a", work):
        assert (made.stat().st_uid, made.stat().st_gid) == (account.uid, account.gid)
    assert work == fresh / "a" / "b"
