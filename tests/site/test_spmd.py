"""The argv of an SPMD job's ranks (gbroker.site.spmd): placement and each launcher's line,
computed by hand."""

from __future__ import annotations

import pytest

from gbroker.errors import InvalidInput
from gbroker.site.spmd import (
    LauncherMissing,
    MpiFlavour,
    Ranks,
    batch_argv,
    installed_launchers,
    local_argv,
    rank_cpus,
    sbatch_options,
)

BOTH = {MpiFlavour.OPEN_MPI: "/usr/bin/mpiexec.openmpi", MpiFlavour.MPICH: "/usr/bin/mpiexec.mpich"}
PROGRAM = ["./a.out", "-v"]


def test_one_host_one_core_each_in_slot_order() -> None:
    assert rank_cpus(Ranks(MpiFlavour.MPICH, 4), [4, 5, 6, 7]) == ((4,), (5,), (6,), (7,))


def test_processes_per_host_split_the_cores_into_hosts() -> None:
    # 8 ranks, 4 a host: 2 hosts of cores 0-3 and 4-7.
    ranks = Ranks(MpiFlavour.OPEN_MPI, 8, per_host=4)
    assert ranks.hosts == 2
    assert rank_cpus(ranks, range(8)) == tuple((c,) for c in range(8))
    # 5 ranks, 2 a host: 3 hosts; 6 cores give groups [0,1], [2,3], [4,5]; the last host has 1.
    assert rank_cpus(Ranks(MpiFlavour.MPICH, 5, per_host=2), range(6)) == (
        (0,), (1,), (2,), (3,), (4,),
    )  # fmt: skip


def test_threads_widen_each_rank_and_wrap_inside_its_host() -> None:
    # 4 ranks of 2 threads, 2 a host, on 8 cores: host 0 = 0-3, host 1 = 4-7.
    ranks = Ranks(MpiFlavour.OPEN_MPI, 4, per_host=2, threads=2)
    assert rank_cpus(ranks, range(8)) == ((0, 1), (2, 3), (4, 5), (6, 7))
    # 8 ranks, 4 a host, 2 threads, on 8 cores: 4 ranks x 2 on 4 cores wrap around the host.
    wide = Ranks(MpiFlavour.OPEN_MPI, 8, per_host=4, threads=2)
    assert rank_cpus(wide, range(8)) == (
        (0, 1), (2, 3), (0, 1), (2, 3), (4, 5), (6, 7), (4, 5), (6, 7),
    )  # fmt: skip


def test_more_cores_than_the_host_has_repeat_cpus() -> None:
    # A site of 8 cores on a host of 2 CPUs: slots 0..7 are CPUs 0,1,0,1,...
    assert rank_cpus(Ranks(MpiFlavour.MPICH, 8), [0, 1] * 4) == ((0,), (1,)) * 4
    # More hosts than cores: each host gets one of them.
    assert rank_cpus(Ranks(MpiFlavour.MPICH, 3, per_host=1), [7, 9]) == ((7,), (9,), (7,))


def test_mpich_binds_with_hydra_user_lists() -> None:
    ranks = Ranks(MpiFlavour.MPICH, 4, per_host=2, threads=2)
    assert local_argv(ranks, PROGRAM, range(8), BOTH) == [
        "/usr/bin/mpiexec.mpich", "-launcher", "fork", "-wdir", "/proc/self/cwd", "-n", "4",
        "-bind-to", "user:0+1,2+3,4+5,6+7", "./a.out", "-v",
    ]  # fmt: skip


def test_open_mpi_runs_isolated_each_rank_under_taskset() -> None:
    ranks = Ranks(MpiFlavour.OPEN_MPI, 3)
    assert local_argv(ranks, PROGRAM, [2, 3, 5], BOTH, taskset="/usr/bin/taskset") == [
        "/usr/bin/mpiexec.openmpi", "--mca", "plm", "isolated", "--allow-run-as-root",
        "--host", "localhost:3", "--bind-to", "none",
        "-n", "1", "/usr/bin/taskset", "-c", "2", "./a.out", "-v", ":",
        "-n", "1", "/usr/bin/taskset", "-c", "3", "./a.out", "-v", ":",
        "-n", "1", "/usr/bin/taskset", "-c", "5", "./a.out", "-v",
    ]  # fmt: skip


def test_the_default_mpi_is_open_mpi_else_mpich() -> None:
    ranks = Ranks(MpiFlavour.DEFAULT, 2)
    assert local_argv(ranks, PROGRAM, [0, 1], BOTH)[0] == "/usr/bin/mpiexec.openmpi"
    only_mpich = {MpiFlavour.MPICH: "/opt/mpiexec.mpich"}
    assert local_argv(ranks, PROGRAM, [0, 1], only_mpich)[0] == "/opt/mpiexec.mpich"


def test_a_missing_launcher_is_named() -> None:
    with pytest.raises(LauncherMissing) as caught:
        local_argv(Ranks(MpiFlavour.OPEN_MPI, 2), PROGRAM, [0], {MpiFlavour.MPICH: "/x"})
    assert caught.value.field == "spmd_variation"
    assert "mpiexec.openmpi" in str(caught.value)
    with pytest.raises(LauncherMissing, match=r"mpiexec\.openmpi or mpiexec\.mpich"):
        local_argv(Ranks(MpiFlavour.DEFAULT, 2), PROGRAM, [0], {})


def test_installed_launchers_are_those_found() -> None:
    found = installed_launchers(lambda name: f"/bin/{name}" if "mpich" in name else None)
    assert found == {MpiFlavour.MPICH: "/bin/mpiexec.mpich"}


def test_batch_line_and_allocation_for_slurm() -> None:
    ranks = Ranks(MpiFlavour.MPICH, 8, per_host=4, threads=2)
    assert batch_argv(ranks, PROGRAM) == ["mpiexec.mpich", "-n", "8", "./a.out", "-v"]
    assert sbatch_options(ranks) == ["--ntasks=8", "--cpus-per-task=2", "--ntasks-per-node=4"]
    default = Ranks(MpiFlavour.DEFAULT, 2)
    assert batch_argv(default, PROGRAM)[0] == "mpiexec.openmpi"
    assert sbatch_options(default) == ["--ntasks=2", "--cpus-per-task=1"]
    # One process of 2 threads, "4 a host": one a node (4 x 2 CPUs a node was BadConstraints
    # on a node of 4, and Slurm kept the job pending for ever).
    one = Ranks(MpiFlavour.OPEN_MPI, 1, per_host=4, threads=2)
    assert sbatch_options(one) == ["--ntasks=1", "--cpus-per-task=2", "--ntasks-per-node=1"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"processes": 0}, "ranks.processes"), ({"threads": True}, "ranks.threads"),
     ({"per_host": -1}, "ranks.per_host")],
)  # fmt: skip
def test_ranks_check_their_counts(fields: dict[str, int], field: str) -> None:
    values = {"processes": 2, **fields}
    with pytest.raises(InvalidInput) as caught:
        Ranks(MpiFlavour.MPICH, **values)
    assert caught.value.field == field
