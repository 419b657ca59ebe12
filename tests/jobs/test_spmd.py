"""SPMD jobs' variations, processes, threads and hosts (gbroker.jobs.description): which
variations a site runs (the rest refused at submission, naming the field), and what
ProcessesPerHost asks of a site."""

from __future__ import annotations

import pytest

from gbroker.core.requirements import Need, SiteProperties, unmet
from gbroker.jobs.description import (
    SPMD_VARIATION_PREFIX,
    JobDescription,
    JsdlError,
    SpmdLauncher,
)
from gbroker.jobs.documents import loads_job_description
from gbroker.jobs.mapping import from_mapping

SPMD_XML = """<?xml version="1.0"?>
<jsdl:JobDefinition xmlns:jsdl="http://schemas.ggf.org/jsdl/2005/11/jsdl"
  xmlns:jsdl-posix="http://schemas.ggf.org/jsdl/2005/11/jsdl-posix"
  xmlns:jsdl-spmd="http://schemas.ogf.org/jsdl/2007/02/jsdl-spmd">
 <jsdl:JobDescription><jsdl:Application><jsdl-spmd:SPMDApplication>
  <jsdl-posix:Executable>/bin/mpi</jsdl-posix:Executable>
  <jsdl-spmd:SPMDVariation>{variation}</jsdl-spmd:SPMDVariation>
  <jsdl-spmd:NumberOfProcesses>8</jsdl-spmd:NumberOfProcesses>
 </jsdl-spmd:SPMDApplication></jsdl:Application></jsdl:JobDescription>
</jsdl:JobDefinition>
"""


@pytest.mark.parametrize(
    ("given", "canonical", "launcher"),
    [
        (f"{SPMD_VARIATION_PREFIX}OpenMPI", "OpenMPI", SpmdLauncher.OPEN_MPI),
        (f"{SPMD_VARIATION_PREFIX}MPI", "MPI", SpmdLauncher.MPI),
        (f"{SPMD_VARIATION_PREFIX}MPICH2", "MPICH2", SpmdLauncher.MPICH),
        ("http://schemas.ogf.org/jsdl/2007/02/jsdl-spmd/MPICH", "MPICH", SpmdLauncher.MPICH),
        ("openmp", "OpenMP", SpmdLauncher.THREADS),
        ("None", "None", SpmdLauncher.THREADS),
    ],
)
def test_the_variations_a_site_runs_are_read_in_any_spelling(
    given: str, canonical: str, launcher: SpmdLauncher
) -> None:
    desc = from_mapping({"executable": "/bin/mpi", "spmd_variation": given})
    assert desc.spmd_variation == SPMD_VARIATION_PREFIX + canonical
    assert desc.spmd_launcher is launcher


def test_no_variation_is_a_program_that_starts_its_processes_itself() -> None:
    desc = from_mapping({"executable": "/bin/mpi", "number_of_processes": 4})
    assert desc.spmd_launcher is None
    assert desc.spmd_environment(4)["GBROKER_SPMD_PROCESSES"] == "4"


@pytest.mark.parametrize("name", ["PVM", "LAM-MPI", "MPICH1", "POE", "IntelMPI", "OpenMPl"])
def test_a_variation_no_site_runs_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/mpi", "spmd_variation": SPMD_VARIATION_PREFIX + name})
    assert caught.value.field == "<mapping>: spmd_variation"
    message = str(caught.value)
    assert "MPI, OpenMPI, MPICH2, MPICH, OpenMP, None" in message
    assert SPMD_VARIATION_PREFIX + name in message


def test_a_jsdl_variation_no_site_runs_names_its_element() -> None:
    with pytest.raises(JsdlError) as caught:
        loads_job_description(
            SPMD_XML.format(variation=f"{SPMD_VARIATION_PREFIX}PVM"), document="j"
        )
    assert "SPMDApplication/SPMDVariation" in str(caught.value)
    assert "OpenMPI" in str(caught.value)


def test_processes_and_threads_from_the_allocation() -> None:
    # UNICORE's jsdl__spmd.jsdl: 8 processes, 4 a host, threads from the allocation: 2 hosts
    # share the 8 cores, 4 each, so t = 4 // 4 = 1 (not 8 // 4 = 2: N x t would be 16 CPUs on
    # 8 cores, and a Slurm site of two 4-CPU nodes could not give it).
    desc = from_mapping(
        {"executable": "/bin/mpi", "number_of_processes": 8, "processes_per_host": 4,
         "threads_from_allocation": True, "spmd_variation": "OpenMPI"}
    )  # fmt: skip
    assert (desc.spmd_processes(8), desc.spmd_threads(8)) == (8, 1)
    assert desc.spmd_threads(16) == 2  # 16 cores: 8 a host, 2 for each of its 4
    # jsdl__spmd2.jsdl: processes from the allocation, 2 threads each.
    desc2 = from_mapping(
        {"executable": "/bin/mpi", "processes_from_allocation": True, "threads_per_process": 2,
         "spmd_variation": "OpenMPI"}
    )  # fmt: skip
    assert (desc2.spmd_processes(3), desc2.spmd_threads(3)) == (3, 2)


def test_processes_per_host_ask_for_that_many_nodes() -> None:
    desc = from_mapping(
        {"executable": "/bin/mpi", "number_of_processes": 8, "processes_per_host": 3,
         "spmd_variation": "MPI"}
    )  # fmt: skip
    assert desc.spmd_nodes() == 3  # ceil(8 / 3)
    job = desc.to_job("j", "a")
    assert job.requirements is not None
    assert job.requirements.nodes == 3
    one_node = SiteProperties(cores=16)
    (problem,) = unmet(job.requirements, "a", one_node, rank=8)
    assert problem.need is Need.NODES
    assert unmet(job.requirements, "b", SiteProperties(cores=16, nodes=4), rank=8) == []
    # A TotalResourceCount larger than the hosts asked for stands.
    more = JobDescription(
        executable="/bin/mpi", number_of_processes=8, processes_per_host=4,
        total_resource_count=from_mapping(
            {"executable": "x", "total_resource_count": {"exact": 5}}
        ).total_resource_count,
    )  # fmt: skip
    assert more.to_job("j", "a").requirements.nodes == 5  # type: ignore[union-attr]
