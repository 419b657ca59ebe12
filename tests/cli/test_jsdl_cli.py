"""Issue 13's "done when", through the `gbroker` command and a live fleet of broker processes
(`gbroker fleet up`, its embedded MQTT broker, sites declaring memory, an OS, file systems):

- a 100-element sweep runs 100 jobs with the right arguments;
- a job needing more memory than some sites have never goes there (and `gbroker explain` says
  why), and one no site can run is refused naming the requirement and the best site's value;
- a FileSystem-relative output lands where the site says;
- a staging-only job stages (and `gbroker output --file` returns what it staged out);
- an unsupported URI, and an unsupported application kind, are refused at submission.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gbroker.client.gclient import Client
from gbroker.core.requirements import FileSystemSpec
from gbroker.topology import SiteSpec, Topology, save_topology
from tests import harness

FIXTURES = Path(__file__).parent.parent / "fixtures" / "jsdl"
GiB = 1 << 30

pytestmark = pytest.mark.network


def gbroker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """The harness's, with fleets' time to answer; never a traceback."""
    done = harness.gbroker(*args, timeout=180, check=check)
    assert "Traceback" not in done.stderr
    return done


def scratch(root: Path, site: str) -> str:
    mount = root / site
    mount.mkdir()
    os.chmod(mount, 0o1777)  # as /tmp: jobs run as nobody under a root broker
    return str(mount)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Sites a (256 MiB per node), b (4 GiB per node, a SCRATCH file system) and c (512 MiB
    per node, a SCRATCH file system), all LINUX; the URL of a, and where SCRATCH lives."""
    home = tmp_path_factory.mktemp("jsdl-cli")
    fs = Path(tempfile.mkdtemp(prefix="gbroker-fs-"))
    os.chmod(fs, 0o755)
    topology = home / "grid.yaml"
    sites = [
        SiteSpec("a", 4, memory_per_node=256 << 20, operating_system="LINUX"),
        SiteSpec(
            "b",
            4,
            memory_per_node=4 * GiB,
            operating_system="LINUX",
            file_systems=(FileSystemSpec("SCRATCH", scratch(fs, "b"), "temporary", 10 * GiB),),
        ),
        SiteSpec(
            "c",
            4,
            memory_per_node=512 << 20,
            operating_system="LINUX",
            file_systems=(FileSystemSpec("SCRATCH", scratch(fs, "c"), "temporary", 10 * GiB),),
        ),
    ]
    save_topology(Topology(sites, "full", name="grid"), topology)
    directory = home / "fleet"
    gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory), check=True)
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield record["sites"]["a"]["url"], fs
    finally:
        gbroker("fleet", "down", "--dir", str(directory), check=True)
        shutil.rmtree(fs, ignore_errors=True)


def test_a_100_element_sweep_runs_100_jobs_with_the_right_arguments(
    fleet: tuple[str, Path],
) -> None:
    broker, _ = fleet
    submitted = gbroker("submit", str(FIXTURES / "sweep_echo_100.jsdl"), "--broker", broker)
    assert submitted.returncode == 0, submitted.stderr
    array_id = submitted.stdout.strip()
    waited = gbroker("wait", array_id, "--broker", broker, "--timeout", "150", "--json", check=True)
    status = json.loads(waited.stdout)
    assert (status["size"], status["state"], status["counts"]) == (100, "done", {"done": 100})
    # Without --json, for people (docs/JSDL.md shows it): the array's state and counts.
    table = gbroker("wait", array_id, "--broker", broker, check=True).stdout.split()
    assert table[table.index("jobs") : table.index("jobs") + 3] == ["jobs", "100:", "100"]
    listed = json.loads(gbroker("jobs", "--array", array_id, "--broker", broker, "--json").stdout)
    assert sorted(j["id"] for j in listed) == sorted(f"{array_id}_{i}" for i in range(1, 101))
    assert {j["site"] for j in listed} <= {"a", "b", "c"}
    element = gbroker("output", f"{array_id}_42", "--broker", broker, check=True)
    assert element.stdout == "value 42\n"

    async def outputs() -> list[bytes]:
        async with Client(broker) as client:
            return [await client.output(f"{array_id}_{i}") for i in range(1, 101)]

    assert asyncio.run(outputs()) == [f"value {i}\n".encode() for i in range(1, 101)]


def test_memory_requirements_keep_jobs_off_sites_that_lack_it(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    broker, _ = fleet
    job = tmp_path / "needs.yaml"
    job.write_text("executable: /bin/true\nindividual_physical_memory: {lower: 800000000}\n")
    ids = [
        gbroker("submit", str(job), "--broker", broker, check=True).stdout.strip() for _ in range(6)
    ]
    for job_id in ids:
        status = json.loads(gbroker("wait", job_id, "--broker", broker, "--json").stdout)
        assert (status["state"], status["site"]) == ("done", "b")  # a, c: too little memory
    explained = gbroker("explain", ids[0], "--broker", broker, check=True).stdout
    lines = {line.split()[0]: line for line in explained.splitlines()[1:] if line.startswith("  ")}
    assert "best" in lines["b"]
    assert "not a candidate: individual_physical_memory" in lines["a"]
    assert "site a has 256 MiB memory per node" in lines["a"]
    assert "site c has 512 MiB memory per node" in lines["c"]
    # Described, not submitted: the same answer for the file itself.
    dry = json.loads(gbroker("explain", str(job), "--broker", broker, "--json", check=True).stdout)
    assert [c["site"] for c in dry["candidates"] if c["feasible"]] == ["b"]
    # More memory than any site has: refused at submission with the best site's value.
    job.write_text("executable: /bin/true\nindividual_physical_memory: {lower: 8589934592}\n")
    refused = gbroker("submit", str(job), "--broker", broker)
    assert refused.returncode == 2
    assert "400" in refused.stderr
    assert "individual_physical_memory: expected a site of the fleet with >= 8 GiB" in (
        refused.stderr
    )
    assert "4 GiB memory per node at site b" in refused.stderr


def test_a_file_system_relative_output_lands_where_the_site_says(
    fleet: tuple[str, Path],
) -> None:
    broker, fs = fleet
    done = gbroker(
        "submit", str(FIXTURES / "filesystems.jsdl"), "--broker", broker, "--wait", "--json",
        check=True,
    )  # fmt: skip
    [status] = json.loads(done.stdout)
    job_id, site = status["id"], status["site"]
    assert site in ("b", "c")  # a declares no SCRATCH
    out = fs / site / "results" / "out.txt"
    assert out.read_text() == "lines from the scratch file system\n"
    printed = gbroker("output", job_id, "--broker", broker, check=True)
    assert printed.stdout == "lines from the scratch file system\n"


def test_a_staging_only_job_stages_in_and_out(fleet: tuple[str, Path]) -> None:
    broker, _ = fleet
    done = gbroker(
        "submit", str(FIXTURES / "staging_only.jsdl"), "--broker", broker, "--wait", check=True
    )
    job_id = done.stdout.splitlines()[0]
    stored = gbroker("output", job_id, "--file", "report.txt", "--broker", broker, check=True)
    assert stored.stdout == "first part\nsecond part\n"
    missing = gbroker("output", job_id, "--file", "nope.txt", "--broker", broker)
    assert missing.returncode == 2
    assert "gbroker:store" in missing.stderr


def test_unsupported_uris_and_application_kinds_are_refused_at_submission(
    fleet: tuple[str, Path],
) -> None:
    broker, _ = fleet
    refused = gbroker("submit", str(FIXTURES / "unsupported_uris.jsdl"), "--broker", broker)
    assert refused.returncode == 2
    assert "JobDefinition/JobDescription/DataStaging[1]/Source/URI" in refused.stderr
    assert "not ftp:" in refused.stderr
    refused = gbroker("submit", str(FIXTURES / "mpi_application.jsdl"), "--broker", broker)
    assert refused.returncode == 2
    assert "Application/MPIApplication" in refused.stderr
    assert "urn:gridsam:mpi" in refused.stderr


def test_an_array_is_cancelled_as_a_whole(fleet: tuple[str, Path], tmp_path: Path) -> None:
    broker, _ = fleet
    job = tmp_path / "sleepers.yaml"
    job.write_text(
        "executable: /bin/sleep\narguments: ['60']\nname: s\n"
        "sweep: {assignments: [{parameters: [name], values: [s1, s2, s3, s4]}]}\n"
    )
    array_id = gbroker("submit", str(job), "--broker", broker, check=True).stdout.strip()
    cancelled = gbroker("cancel", array_id, "--broker", broker, "--json", check=True)
    cancelled = json.loads(cancelled.stdout)
    assert cancelled["counts"] == {"cancelled": 4}
    shown = gbroker("status", f"{array_id}_3", "--broker", broker, "--json", check=True)
    status = json.loads(shown.stdout)
    assert status["state"] == "cancelled"


# Issue 24, JSDL: what a broker honours or refuses of a description, through `gbroker submit`.

JSDL = 'xmlns="http://schemas.ggf.org/jsdl/2005/11/jsdl"'
POSIX = 'xmlns:posix="http://schemas.ggf.org/jsdl/2005/11/jsdl-posix"'
HPCPA = 'xmlns:hpcpa="http://schemas.ggf.org/jsdl/2006/07/jsdl-hpcpa"'


def jsdl_job(application: str, resources: str = "") -> str:
    return (
        f'<?xml version="1.0"?>\n<JobDefinition {JSDL} {POSIX} {HPCPA}><JobDescription>'
        f"<Application>{application}</Application><Resources>{resources}</Resources>"
        "</JobDescription></JobDefinition>\n"
    )


def posix_app(inner: str, executable: str = "/bin/pwd") -> str:
    return (
        f"<posix:POSIXApplication><posix:Executable>{executable}</posix:Executable>{inner}"
        "</posix:POSIXApplication>"
    )


def submitted_output(broker: str, job: Path) -> tuple[dict[str, Any], str]:
    """Submit ``job`` with gbroker, wait for it; its status and its standard output."""
    done = gbroker("submit", str(job), "--broker", broker, "--wait", "--json", check=True)
    [status] = json.loads(done.stdout)
    assert status["state"] == "done", status
    return status, gbroker("output", status["id"], "--broker", broker, check=True).stdout


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (jsdl_job(posix_app(""), "<TotalCPUCont><Exact>64</Exact></TotalCPUCont>"),
         "Resources/TotalCPUCont: expected an element JSDL defines in Resources (did you mean "
         "TotalCPUCount?)"),
        (jsdl_job(posix_app(""), "<FileSystem name='SCRATCH'><MountSource>nfs:/s</MountSource>"
                                 "</FileSystem>"),
         "FileSystem[1]/MountSource: expected no MountSource"),
        (jsdl_job(posix_app("<posix:UserName>root</posix:UserName>")),
         "POSIXApplication/UserName: expected no UserName"),
        (jsdl_job(posix_app(""), "<OperatingSystem><OperatingSystemType><OperatingSystemName>"
                                 "Linux</OperatingSystemName></OperatingSystemType>"
                                 "</OperatingSystem>"),
         "OperatingSystemName: expected a value of JSDL's OperatingSystemName (did you mean "
         "LINUX?)"),
    ],
)  # fmt: skip
def test_unknown_unhonoured_and_misspelt_jsdl_is_refused_at_submission(
    fleet: tuple[str, Path], tmp_path: Path, document: str, said: str
) -> None:
    broker, _ = fleet
    job = tmp_path / "job.jsdl"
    job.write_text(document)
    refused = gbroker("submit", str(job), "--broker", broker)
    assert refused.returncode == 2
    assert "400" in refused.stderr
    assert said in refused.stderr
    checked = gbroker("jsdl", "check", str(job))  # and check says the same, offline
    assert checked.returncode == 1
    assert said in checked.stdout


def test_a_cpu_time_limit_is_the_jobs_cpu_rlimit(fleet: tuple[str, Path], tmp_path: Path) -> None:
    broker, _ = fleet
    job = tmp_path / "cpu.jsdl"
    app = posix_app(
        "<posix:Argument>-c</posix:Argument><posix:Argument>ulimit -t</posix:Argument>"
        "<posix:CPUTimeLimit>7</posix:CPUTimeLimit>",
        executable="/bin/sh",
    )
    job.write_text(jsdl_job(app))
    _, output = submitted_output(broker, job)
    assert output == "7\n"  # it was read and dropped: "unlimited"


def test_an_empty_working_directory_of_a_file_system_is_its_mount_point(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    broker, fs = fleet
    job = tmp_path / "spool.jsdl"
    job.write_text(jsdl_job(posix_app('<posix:WorkingDirectory filesystemName="SCRATCH"/>')))
    status, output = submitted_output(broker, job)
    assert status["site"] in ("b", "c")  # a declares no SCRATCH
    assert output == f"{os.path.realpath(fs / status['site'])}\n"
    # The same in YAML: the working directory left empty, naming the file system.
    yaml_job = tmp_path / "spool.yaml"
    yaml_job.write_text(
        "executable: /bin/pwd\nworking_directory: ''\n"
        "filesystem_names: {working_directory: SCRATCH}\n"
    )
    status, output = submitted_output(broker, yaml_job)
    assert output == f"{os.path.realpath(fs / status['site'])}\n"


def test_an_absolute_working_directory_is_taken_inside_the_job_directory(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    broker, _ = fleet
    job = tmp_path / "hpcp.jsdl"
    hpcp = (
        "<hpcpa:HPCProfileApplication><hpcpa:Executable>/bin/pwd</hpcpa:Executable>"
        "<hpcpa:WorkingDirectory>/scratch/run</hpcpa:WorkingDirectory>"
        "</hpcpa:HPCProfileApplication>"
    )
    job.write_text(jsdl_job(hpcp))
    status, output = submitted_output(broker, job)
    assert output.endswith(f"/{status['id']}/scratch/run\n")  # in the job's own directory


def test_check_judges_a_job_as_the_fleets_brokers_would(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    """`gbroker jsdl check` finds the fleet as `gbroker submit` does (here: the one this module
    brought up) and matches the job's requirements to its sites, as a broker does."""
    broker, _ = fleet
    job = tmp_path / "big.yaml"
    job.write_text("executable: /bin/true\ntotal_cpu_count: 64\n")
    checked = gbroker("jsdl", "check", str(job))
    assert checked.returncode == 1
    said = "total_cpu_count: expected a site of the fleet with 64 cores, got '4 cores at site"
    assert f"  refused     {said}" in checked.stdout
    refused = gbroker("submit", str(job), "--broker", broker)
    assert refused.returncode == 2
    assert said in refused.stderr


def test_candidate_hosts_choose_the_sites_a_job_may_run_at(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    broker, _ = fleet
    job = tmp_path / "hosts.yaml"
    job.write_text("executable: /bin/true\ncandidate_hosts: [c]\n")
    for _ in range(3):  # a, b and c would all do; only c is a candidate
        done = gbroker("submit", str(job), "--broker", broker, "--wait", "--json", check=True)
        [status] = json.loads(done.stdout)
        assert (status["state"], status["site"]) == ("done", "c")
    job.write_text("executable: /bin/true\ncandidate_hosts: ['*.example.org']\n")
    refused = gbroker("submit", str(job), "--broker", broker)
    assert refused.returncode == 2
    assert "candidate_hosts: expected a site of the fleet with the name *.example.org" in (
        refused.stderr
    )


def test_an_spmd_job_is_told_its_processes_threads_and_flavour(
    fleet: tuple[str, Path], tmp_path: Path
) -> None:
    broker, _ = fleet
    job = tmp_path / "spmd.yaml"
    job.write_text(
        "executable: /bin/sh\n"
        "arguments: ['-c', 'echo $GBROKER_SPMD_PROCESSES $GBROKER_SPMD_PROCESSES_PER_HOST "
        "$GBROKER_SPMD_THREADS_PER_PROCESS $OMP_NUM_THREADS $GBROKER_SPMD_VARIATION']\n"
        "number_of_processes: 2\nprocesses_per_host: 2\nthreads_per_process: 2\n"
        "spmd_variation: http://www.ogf.org/jsdl/2007/02/jsdl-spmd/MPICH2\n"
    )
    _, output = submitted_output(broker, job)
    # Started as its 2 ranks by MPICH's mpiexec: each is told.
    assert output == "2 2 2 2 http://www.ogf.org/jsdl/2007/02/jsdl-spmd/MPICH2\n" * 2
