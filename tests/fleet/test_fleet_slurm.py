"""A fleet whose sites front Slurm clusters (``manager: slurm``): ``gbroker fleet up`` starts
each site's own munged, slurmctld and slurmds (gbroker.fleet.slurm) before its broker, ``fleet
status`` shows them, a broker's restart leaves them be, and ``fleet down`` (or a failed ``up``)
leaves no process of theirs. Real Slurm daemons from Debian's slurm-wlm, installed by
scripts/setup/ensure_slurm.sh (scripts/test.sh runs it); these tests start them themselves.

They do not run jobs through Slurm: the Slurm back-end of a site's broker is
gbroker/site/slurm.py's (its own tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from gbroker.fleet import slurm as fleet_slurm
from gbroker.fleet.members import is_alive
from tests.conftest import shared_data

pytestmark = [pytest.mark.serial, pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
SLURM_3 = ROOT / "topologies" / "slurm-3.yaml"
NODES = {"alpha": ["node1"], "beta": ["node1", "node2"], "gamma": ["node1", "node2"]}
SLURM_NAMES = {b"munged", b"slurmctld", b"slurmd", b"slurmstepd"}


def gbroker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _until(ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def slurm_processes(*under: Path) -> list[tuple[int, str]]:
    """Live munge and Slurm processes whose command line or environment mentions one of
    ``under`` (a fleet's directory, its clusters' shared ones; a job step names its cluster's
    slurm.conf in its environment only)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "comm").read_bytes().strip()
            mentions = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        ours = any(str(path).encode() in mentions for path in under)
        if name in SLURM_NAMES and ours and is_alive(int(proc.name)):
            found.append((int(proc.name), name.decode()))
    return found


def sinfo(conf: str) -> dict[str, str]:
    """Each node of the cluster of ``conf`` and its state, as ``sinfo`` says."""
    done = subprocess.run(
        [fleet_slurm.tool("sinfo"), "-h", "-N", "-o", "%N %T"],
        env={**os.environ, "SLURM_CONF": conf},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split() for line in done.stdout.splitlines())


@pytest.fixture(scope="module", autouse=True)
def _slurm_installed() -> None:
    if fleet_slurm.missing_tools():
        done = subprocess.run(["bash", str(ROOT / "scripts" / "setup" / "ensure_slurm.sh")])
        assert done.returncode == 0, "scripts/setup/ensure_slurm.sh failed"


@pytest.fixture
def slurm_fleet(tmp_path: Path) -> Iterator[Path]:
    """``fleet up`` of topologies/slurm-3.yaml; down again at the end, whatever happened."""
    directory = tmp_path / "fleet"
    started = gbroker("fleet", "up", "--topology", str(SLURM_3), "--dir", str(directory))
    try:
        assert started.returncode == 0, started.stderr
        yield directory
    finally:
        if (directory / "fleet.json").exists():
            gbroker("fleet", "down", "--dir", str(directory))


def test_fleet_up_starts_a_cluster_per_slurm_site_and_down_stops_them(slurm_fleet: Path) -> None:
    record = json.loads((slurm_fleet / "fleet.json").read_text())
    assert set(record["slurm"]) == {"alpha", "beta", "gamma"}
    for site, nodes in NODES.items():
        conf = record["slurm"][site]["conf"]
        # Beside its sockets, where jobs' accounts can read it (srun in a job does).
        shared = Path(record["slurm"][site]["sockets"])
        assert conf == str(shared / "slurm.conf")
        assert sinfo(conf) == dict.fromkeys(nodes, "idle")
        # Its broker was told to use it, and to keep its job directories there too.
        command = record["sites"][site]["command"]
        at = command.index("--manager")
        assert command[at : at + 6] == [
            *("--manager", "slurm", "--slurm-conf", conf),
            *("--jobs-dir", str(shared / "jobs")),
        ]
    # A cluster of its own each: three slurmctlds, on three ports.
    ports = {
        line.split("=", 1)[1]
        for site in NODES
        for line in Path(record["slurm"][site]["conf"]).read_text().splitlines()
        if line.startswith("SlurmctldPort=")
    }
    assert len(ports) == 3
    clusters = [Path(record["slurm"][site]["sockets"]) for site in NODES]
    names = sorted(name for _, name in slurm_processes(slurm_fleet, *clusters))
    assert names == ["munged"] * 3 + ["slurmctld"] * 3 + ["slurmd"] * 5

    status = gbroker("fleet", "status", "--dir", str(slurm_fleet))
    assert status.returncode == 0, status.stdout + status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    assert "slurm: 3 daemons up" in lines["alpha"]
    assert "slurm: 4 daemons up" in lines["beta"]
    assert f"gamma: SLURM_CONF={record['slurm']['gamma']['conf']}" in status.stdout
    rows = json.loads(gbroker("fleet", "status", "--json", "--dir", str(slurm_fleet)).stdout)
    managers = {row["name"]: row.get("manager") for row in rows["members"]}
    assert managers == {"mqtt": None, "alpha": "slurm", "beta": "slurm", "gamma": "slurm"}

    # A job left in a cluster is cancelled with it.
    beta = record["slurm"]["beta"]["conf"]
    submitted = subprocess.run(
        [fleet_slurm.tool("sbatch"), "--parsable", "-N2", "--output=/dev/null", "--wrap=sleep 300"],
        env={**os.environ, "SLURM_CONF": beta},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert submitted.returncode == 0, submitted.stderr
    _until(
        lambda: any(n == "slurmstepd" for _, n in slurm_processes(slurm_fleet, *clusters)),
        "no job ran",
    )

    stopped = gbroker("fleet", "down", "--dir", str(slurm_fleet))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped the Slurm clusters of alpha, beta, gamma, 1 job in them cancelled" in (
        stopped.stdout
    )
    assert slurm_processes(slurm_fleet, *clusters) == []
    for site in NODES:  # the clusters' short socket directories in /tmp went too
        assert not Path(record["slurm"][site]["sockets"]).exists()


def test_a_job_runs_in_its_sites_slurm_and_ends_done_once_across_its_brokers_kill(
    slurm_fleet: Path, tmp_path: Path
) -> None:
    """The issue's "done when": `gbroker submit` of a job that prints $SLURM_JOB_ID prints a
    Slurm job id; its site's broker SIGKILLed while the job runs, and restarted, the job ends
    `done` once. Jobs live on in Slurm while a site's broker is down: its cluster is not
    restarted. The fleet lives under pytest's 0700 directory, as under a user's home."""
    runs = Path(tempfile.mkdtemp(prefix="gbroker-runs-"))  # where the job (nobody) writes
    runs.chmod(0o1777)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: slurm-id\nexecutable: /bin/sh\narguments:\n  - -c\n"
        f"  - echo $SLURM_JOB_ID >> {runs}/log; echo SLURM_JOB_ID=$SLURM_JOB_ID; sleep 6\n"
    )
    env = {**os.environ, "GBROKER_FLEET": str(slurm_fleet)}
    try:
        submitted = gbroker("submit", str(job), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        def status() -> dict[str, Any]:
            shown = gbroker("status", job_id, "--json", env=env)
            assert shown.returncode == 0, shown.stderr
            return cast(dict[str, Any], json.loads(shown.stdout))

        _until(lambda: status()["state"] == "running", "the job did not start")
        site = status()["site"]
        record = json.loads((slurm_fleet / "fleet.json").read_text())
        before = record["slurm"][site]["daemons"]
        conf = record["slurm"][site]["conf"]
        killed = gbroker("fleet", "kill", site, "--dir", str(slurm_fleet))
        assert killed.returncode == 0, killed.stderr
        # The broker is gone; its job runs on in its cluster.
        queue = subprocess.run(
            [fleet_slurm.tool("squeue"), "-h", "-o", "%i %T"],
            env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert queue.stdout.split() == [(runs / "log").read_text().strip(), "RUNNING"]
        restarted = gbroker("fleet", "restart", site, "--dir", str(slurm_fleet))
        assert restarted.returncode == 0, restarted.stderr
        waited = gbroker("wait", job_id, "--json", env=env)
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["state"] == "done"
        output = gbroker("output", job_id, env=env)
        slurm_job = (runs / "log").read_text().splitlines()
        assert len(slurm_job) == 1  # it ran once
        assert output.stdout == f"SLURM_JOB_ID={slurm_job[0]}\n"
        assert slurm_job[0].isdigit()
        record = json.loads((slurm_fleet / "fleet.json").read_text())
        assert record["slurm"][site]["daemons"] == before
        assert all(is_alive(daemon["pid"]) for daemon in before)
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def test_a_failed_fleet_up_leaves_no_slurm_daemon(tmp_path: Path) -> None:
    """The clusters start first; when the brokers then fail (an option serve refuses), up
    stops the clusters too."""
    from gbroker import fleet
    from gbroker.fleet.members import FleetError

    directory = tmp_path / "fleet"
    shared = Path(tempfile.gettempdir())
    before = set(shared.glob("gbroker-slurm-*"))
    with pytest.raises(FleetError, match="exited during start-up"):
        fleet.up(SLURM_3, directory, serve_args=("--retain-days", "0"))
    made = set(shared.glob("gbroker-slurm-*")) - before
    assert made == set()  # the clusters' shared directories went with them
    # No daemon names the fleet (munged's key) or a shared directory it made (slurm.conf).
    assert slurm_processes(directory) == []
    others = [pid for path in before for pid, _ in slurm_processes(path)]
    assert sorted(pid for pid, _ in slurm_processes(shared / "gbroker-slurm-")) == sorted(others)
    assert (directory / "slurm" / "gamma" / "state").is_dir()  # they had started
    assert not (directory / "fleet.json").exists()


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_other_runtimes_refuse_a_slurm_site(tmp_path: Path, runtime: str) -> None:
    directory = tmp_path / "fleet"
    done = gbroker(
        "fleet", "up", "--topology", str(SLURM_3), "--dir", str(directory), "--runtime", runtime
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gbroker fleet up: site alpha has manager: slurm, and a {runtime} fleet cannot start its "
        "Slurm cluster: only a local fleet (--runtime local) does"
    ]
    assert slurm_processes(directory) == []


@pytest.mark.parametrize(("document", "size"), [("jsdl__spmd.jsdl", 8), ("jsdl__spmd2.jsdl", 1)])
def test_the_unicore_spmd_documents_run_as_their_ranks_across_a_clusters_nodes(
    slurm_fleet: Path, tmp_path: Path, document: str, size: int
) -> None:
    """The held-out SPMD documents with the sample for their Executable (and the "stdin" they
    read uploaded): spmd.jsdl's 8 processes, 4 a host, need two nodes (beta or gamma, never
    alpha), and run as 8 ranks of one Slurm allocation across them; spmd2.jsdl's one."""
    programs = Path(tempfile.mkdtemp(prefix="gbroker-mpi-"))
    try:
        built = subprocess.run(
            ["bash", str(ROOT / "examples" / "build_mpi_ranks.sh"), str(programs)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
        text = (shared_data() / "jsdl" / "unicorex" / document).read_text()
        job = tmp_path / document
        job.write_text(text.replace("/bin/date", str(programs / "mpi_ranks.openmpi")))
        (tmp_path / "stdin").write_text("")
        env = {**os.environ, "GBROKER_FLEET": str(slurm_fleet)}
        submitted = gbroker("submit", str(job), "--upload", str(tmp_path / "stdin"), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        waited = gbroker("wait", job_id, "--json", "--timeout", "150", env=env)
        status = json.loads(waited.stdout)
        stderr = gbroker("output", job_id, "--stream", "stderr", env=env).stdout
        assert status["state"] == "done", (status.get("error"), stderr)
        output = gbroker("output", job_id, env=env).stdout
        assert sorted(output.splitlines()) == sorted(f"rank {i} of {size}" for i in range(size))
        if size == 8:
            assert status["site"] in ("beta", "gamma")  # alpha is one node
    finally:
        shutil.rmtree(programs, ignore_errors=True)
