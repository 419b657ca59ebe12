""":mod:`gbroker.jobs.description`: a description's checks and bounds, the paths a job uses kept
inside its directory, and the job made from it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from gbroker.jobs.description import JobDescription, JsdlError, RangeValue
from gbroker.jobs.documents import load_job_description, summary
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from tests.jobs.jsdl_documents import DATA, FIXTURES, OPENMPI, _job, descriptions, jsdl_schema


@settings(max_examples=60, deadline=None)
@given(descriptions())
def test_every_description_makes_a_job(desc: JobDescription) -> None:
    job = desc.to_job("j", "home")
    assert job.rank >= 1
    assert job.max_rank >= job.rank
    assert [f.name for f in job.input_files] == [e.file_name for e in desc.stage_in]
    assert [f.site for f in job.input_files] == [e.site or "home" for e in desc.stage_in]
    assert summary(desc)


def test_a_description_at_every_bound_is_a_job_and_packs() -> None:
    import msgpack

    from gbroker.jobs.description import MAX_CORES, MAX_CPU_SECONDS, MAX_FILE_BYTES, MAX_SECONDS

    desc = from_mapping(
        {
            "executable": "/bin/x",
            "min_cores": MAX_CORES,
            "max_cores": MAX_CORES,
            "wall_time_limit": MAX_SECONDS,
            "cpu_time_limit": MAX_CPU_SECONDS,
            "total_cpu_time": {"upper": MAX_CPU_SECONDS},
            "staging": [{"file_name": "in", "source": "http://x/in", "size": MAX_FILE_BYTES}],
        }
    )
    job = desc.to_job("s0.1", "s0")
    assert (job.rank, job.requested_time) == (MAX_CORES, MAX_SECONDS)
    assert msgpack.unpackb(msgpack.packb(to_mapping(desc))) == to_mapping(desc)


_BAD_PATHS = [
    ("../../../../x", "a relative path inside the job directory"),
    ("a/../../x", "a relative path inside the job directory"),
    ("/tmp/x", "a relative path inside the job directory"),
    ("a\x00b", "text without control characters"),
    ("x" * 256, "a relative path inside the job directory"),
    ("/".join(["x" * 200] * 6), "a relative path inside the job directory"),
]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        *((key, value, why) for key in ("input", "output", "error") for value, why in _BAD_PATHS),
        # An absolute WorkingDirectory is taken inside the job directory (below); not these.
        *(("working_directory", value, why) for value, why in _BAD_PATHS if value != "/tmp/x"),
    ],
)
def test_paths_the_job_uses_are_confined_to_its_directory(
    key: str, value: str, expected: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", key: value})
    assert caught.value.path == key
    assert caught.value.expected.startswith(expected)
    assert len(str(caught.value)) < 500


@pytest.mark.parametrize(("value", "expected"), [*_BAD_PATHS, (".", "a file name")])
def test_staging_file_names_are_confined_to_the_job_directory(value: str, expected: str) -> None:
    staging = [{"file_name": "a"}, {"file_name": "b"}, {"file_name": value, "source": "http://x"}]
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", "staging": staging})
    assert caught.value.path == "staging[2].file_name"
    assert caught.value.expected.startswith(expected)


def test_paths_are_normalised_and_dev_null_input_is_no_input() -> None:
    desc = from_mapping(
        {
            "executable": "/bin/x",
            "input": "/dev/null",
            "output": "./out//run.log",
            "working_directory": ".",
            "staging": [{"file_name": "data/./in.txt", "source": "http://x/in"}],
        }
    )
    assert (desc.input, desc.output, desc.working_directory) == (None, "out/run.log", ".")
    assert desc.staging[0].file_name == "data/in.txt"
    assert parse_jsdl(to_jsdl(desc)) == desc


# ---------------------------------------------------------------------------------------------
# What real grids write beyond programs and cores: requirements, file systems, staging-only
# jobs, and other middleware's application kinds


def test_the_requirements_fixture_reads_into_the_cores_requirements() -> None:
    from gbroker.core.requirements import Requirements

    desc = load_job_description(FIXTURES / "requirements.jsdl")
    assert desc.exclusive_execution is True
    assert (desc.operating_system, desc.cpu_architecture) == ("LINUX", "x86_64")
    assert desc.individual_physical_memory == RangeValue.at_least(800_000_000)
    assert desc.total_resource_count == RangeValue.exact(2)
    job = desc.to_job("a.1", "a")
    assert job.requirements == Requirements(
        operating_system="LINUX",
        cpu_architecture="x86_64",
        exclusive_execution=True,
        cores_per_node=2,
        nodes=2,
        individual_memory=800_000_000,
    )
    assert parse_jsdl(to_jsdl(desc)) == desc
    assert from_mapping(json.loads(json.dumps(to_mapping(desc)))) == desc
    jsdl_schema().validate(to_jsdl(desc))
    assert "needs       memory per node >= 763 MiB" in summary(desc)


def test_spmd_counts_are_given_to_the_program_that_starts_the_processes() -> None:
    spmd = load_job_description(DATA / "unicorex" / "jsdl__spmd.jsdl")
    assert spmd.spmd_environment(8) == {
        "GBROKER_SPMD_PROCESSES": "8",
        "GBROKER_SPMD_PROCESSES_PER_HOST": "4",
        # actualIndividualCPUCount: 2 hosts share the 8 cores; a host's 4 among its 4 processes
        "GBROKER_SPMD_THREADS_PER_PROCESS": "1",
        "OMP_NUM_THREADS": "1",
        "GBROKER_SPMD_VARIATION": OPENMPI,
    }
    spmd2 = load_job_description(DATA / "unicorex" / "jsdl__spmd2.jsdl")
    assert spmd2.spmd_environment(6)["GBROKER_SPMD_PROCESSES"] == "6"  # one per core
    assert spmd2.spmd_environment(6)["OMP_NUM_THREADS"] == "2"
    assert parse_jsdl(_job()).spmd_environment(4) == {}
