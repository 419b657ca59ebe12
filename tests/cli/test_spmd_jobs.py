"""SPMD jobs run as MPI ranks on a real fleet (`gbroker fleet up`, the `local` back-end): the
sample program examples/mpi_ranks.c, built by examples/build_mpi_ranks.sh with Open MPI and
MPICH, runs as 8 ranks that each print "rank i of 8" once; UNICORE's two SPMD documents run
as they are (and fail, saying why) and with the sample as their Executable (as N ranks); a
variation no site runs is refused at submission, naming the field. The MPIs come from
scripts/setup/ensure_mpi.sh (scripts/test.sh runs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import shared_data

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
UNICOREX = shared_data() / "jsdl" / "unicorex"
# Site a: 8 cores in 2 nodes, so it takes ProcessesPerHost 4 of 8 processes; b: one node.
TOPOLOGY = """name: spmd
neighbourhood: full
sites:
  - {name: a, cores: 8, nodes: 2}
  - {name: b, cores: 8}
"""


def gbroker(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


@pytest.fixture(scope="module")
def programs() -> Iterator[Path]:
    """The sample built for both MPIs, where a job's uid can run it (not under pytest's 0700
    temporary directories)."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-mpi-"))
    try:
        built = subprocess.run(
            ["bash", str(EXAMPLES / "build_mpi_ranks.sh"), str(directory)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert built.returncode == 0, built.stderr
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, str]]:
    """A fleet of the two sites; the environment that reaches it."""
    # In a directory jobs' accounts cannot search, as a user's 0700 home: Open MPI's ranks
    # change into their directory by its absolute path, so `fleet up` keeps the sites' job
    # directories where they can (gbroker.fleet.launch.reachable_jobs_root).
    where = Path(tempfile.mkdtemp(prefix="gbroker-spmd-fleet-"))
    where.chmod(0o700)
    (where / "spmd.yaml").write_text(TOPOLOGY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]
    env["GBROKER_FLEET"] = str(where / "fleet")
    up = gbroker(
        "fleet", "up", "--topology", str(where / "spmd.yaml"), "--dir", str(where / "fleet"),
        env=env,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield env
    finally:
        gbroker("fleet", "down", "--dir", str(where / "fleet"), env=env)
        shutil.rmtree(where, ignore_errors=True)


def run_job(env: dict[str, str], document: Path, *upload: Path) -> tuple[dict[str, object], str]:
    """Submit, wait for the end; the job's status and its standard output."""
    uploads = [arg for path in upload for arg in ("--upload", str(path))]
    submitted = gbroker("submit", str(document), *uploads, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    waited = gbroker("wait", job_id, "--json", "--timeout", "150", env=env)
    status = json.loads(waited.stdout)
    output = gbroker("output", job_id, env=env)
    if status["state"] != "done":  # what went wrong, for the assertion's message
        status["stderr"] = gbroker("output", job_id, "--stream", "stderr", env=env).stdout
    return status, output.stdout


def ranks_printed(stdout: str, size: int) -> None:
    """Every rank 0..size-1 said "rank i of size" exactly once, and nothing else was said."""
    assert sorted(stdout.splitlines()) == sorted(f"rank {i} of {size}" for i in range(size))


@pytest.mark.parametrize(
    ("variation", "flavour"), [("OpenMPI", "openmpi"), ("MPICH2", "mpich"), ("MPI", "openmpi")]
)
def test_an_mpi_job_runs_as_8_ranks(
    fleet: dict[str, str], programs: Path, tmp_path: Path, variation: str, flavour: str
) -> None:
    job = tmp_path / "ranks.yaml"
    job.write_text(
        (EXAMPLES / "mpi-ranks.yaml")
        .read_text()
        .replace("/usr/local/libexec/gbroker-examples/mpi_ranks.openmpi",
                 str(programs / f"mpi_ranks.{flavour}"))
        .replace("jsdl-spmd/OpenMPI", f"jsdl-spmd/{variation}")
    )  # fmt: skip
    status, stdout = run_job(fleet, job)
    assert status["state"] == "done", (status["error"], status.get("stderr"))
    ranks_printed(stdout, 8)


def test_the_shell_example_runs_as_4_ranks(fleet: dict[str, str]) -> None:
    status, stdout = run_job(fleet, EXAMPLES / "mpi-style.yaml")
    assert status["state"] == "done", (status["error"], status.get("stderr"))
    site = status["site"]
    assert sorted(stdout.splitlines()) == [f"rank {i} of 4 on site {site}" for i in range(4)]


@pytest.mark.parametrize("document", ["jsdl__spmd.jsdl", "jsdl__spmd2.jsdl"])
def test_unicore_spmd_documents_as_they_are_fail_for_their_missing_input(
    fleet: dict[str, str], document: str
) -> None:
    # Both read Input "stdin", which nothing stages: the site cannot start them, and says so
    # (their /bin/date -v would fail in each rank anyway: GNU date has no -v).
    status, _ = run_job(fleet, UNICOREX / document)
    assert status["state"] == "failed", status
    assert "stdin file 'stdin': No such file or directory" in str(status["error"])


@pytest.mark.parametrize(("document", "size"), [("jsdl__spmd.jsdl", 8), ("jsdl__spmd2.jsdl", 1)])
def test_unicore_spmd_documents_run_the_sample_as_their_ranks(
    fleet: dict[str, str], programs: Path, tmp_path: Path, document: str, size: int
) -> None:
    # The document as it is but its Executable, with the "stdin" it reads uploaded. spmd.jsdl:
    # 8 processes, 4 a host (2 hosts: only site a has 2 nodes); spmd2.jsdl: as many processes
    # as allocated CPUs, and it asks for none beyond the default one.
    text = (UNICOREX / document).read_text()
    assert "<jsdl-posix:Executable>/bin/date</jsdl-posix:Executable>" in text
    job = tmp_path / document
    job.write_text(text.replace("/bin/date", str(programs / "mpi_ranks.openmpi")))
    stdin = tmp_path / "stdin"
    stdin.write_text("")
    status, stdout = run_job(fleet, job, stdin)
    assert status["state"] == "done", (status["error"], status.get("stderr"))
    ranks_printed(stdout, size)
    if size == 8:
        assert status["site"] == "a"  # b is one node: not a candidate for 2 hosts


def test_a_variation_no_site_runs_is_refused_at_submission(
    fleet: dict[str, str], tmp_path: Path
) -> None:
    job = tmp_path / "pvm.yaml"
    job.write_text(
        "executable: /bin/true\nnumber_of_processes: 2\n"
        "spmd_variation: http://www.ogf.org/jsdl/2007/02/jsdl-spmd/PVM\n"
    )
    refused = gbroker("submit", str(job), env=fleet)
    assert refused.returncode != 0
    (line,) = refused.stderr.splitlines()
    assert "spmd_variation" in line
    assert "MPI, OpenMPI, MPICH2, MPICH, OpenMP, None" in line
    assert "jsdl-spmd/PVM" in line
