"""A fleet whose sites front Slurm clusters (``manager: slurm``): ``gbroker fleet up`` starts
each site's own munged, slurmctld and slurmds (gbroker.fleet.slurm) before its broker, ``fleet
status`` shows them, a broker's restart leaves them be, and ``fleet down`` (or a failed ``up``)
leaves no process of theirs. Real Slurm daemons from Debian's slurm-wlm, installed by
scripts/ensure_slurm.sh (scripts/test.sh runs it); these tests start them themselves.

They do not run jobs through Slurm: the Slurm back-end of a site's broker is
gbroker/site/slurm.py's (its own tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gbroker.fleet import slurm as fleet_slurm
from gbroker.fleet.members import is_alive

pytestmark = [pytest.mark.serial, pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
SLURM_3 = ROOT / "topologies" / "slurm-3.yaml"
NODES = {"alpha": ["node1"], "beta": ["node1", "node2"], "gamma": ["node1", "node2"]}
SLURM_NAMES = {b"munged", b"slurmctld", b"slurmd", b"slurmstepd"}


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args], capture_output=True, text=True, timeout=180
    )


def _until(ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def slurm_processes(under: Path) -> list[tuple[int, str]]:
    """Live munge and Slurm processes whose command line or environment mentions ``under``
    (a job step names its cluster's slurm.conf in its environment only)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "comm").read_bytes().strip()
            mentions = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if name in SLURM_NAMES and str(under).encode() in mentions and is_alive(int(proc.name)):
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
        done = subprocess.run(["bash", str(ROOT / "scripts" / "ensure_slurm.sh")])
        assert done.returncode == 0, "scripts/ensure_slurm.sh failed"


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
        assert conf == str(slurm_fleet / "slurm" / site / "slurm.conf")
        assert sinfo(conf) == dict.fromkeys(nodes, "idle")
        # Its broker was told to use it.
        command = record["sites"][site]["command"]
        at = command.index("--manager")
        assert command[at : at + 4] == ["--manager", "slurm", "--slurm-conf", conf]
    # A cluster of its own each: three slurmctlds, on three ports.
    ports = {
        line.split("=", 1)[1]
        for site in NODES
        for line in Path(record["slurm"][site]["conf"]).read_text().splitlines()
        if line.startswith("SlurmctldPort=")
    }
    assert len(ports) == 3
    names = sorted(name for _, name in slurm_processes(slurm_fleet))
    assert names == ["munged"] * 3 + ["slurmctld"] * 3 + ["slurmd"] * 5

    status = gbroker("fleet", "status", "--dir", str(slurm_fleet))
    assert status.returncode == 0, status.stdout + status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    assert "slurm: 3 daemons up" in lines["alpha"]
    assert "slurm: 4 daemons up" in lines["beta"]
    assert f"gamma: SLURM_CONF={slurm_fleet / 'slurm' / 'gamma' / 'slurm.conf'}" in status.stdout
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
    _until(lambda: any(n == "slurmstepd" for _, n in slurm_processes(slurm_fleet)), "no job ran")

    stopped = gbroker("fleet", "down", "--dir", str(slurm_fleet))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped the Slurm clusters of alpha, beta, gamma, 1 job in them cancelled" in (
        stopped.stdout
    )
    assert slurm_processes(slurm_fleet) == []
    for site in NODES:  # the clusters' short socket directories in /tmp went too
        assert not Path(record["slurm"][site]["sockets"]).exists()


def test_a_restarted_broker_keeps_its_cluster(slurm_fleet: Path) -> None:
    """Jobs live on in Slurm while a site's broker is down: its cluster is not restarted."""
    before = json.loads((slurm_fleet / "fleet.json").read_text())["slurm"]["beta"]["daemons"]
    killed = gbroker("fleet", "kill", "beta", "--dir", str(slurm_fleet))
    assert killed.returncode == 0, killed.stderr
    restarted = gbroker("fleet", "restart", "beta", "--dir", str(slurm_fleet))
    assert restarted.returncode == 0, restarted.stderr
    record = json.loads((slurm_fleet / "fleet.json").read_text())
    assert record["slurm"]["beta"]["daemons"] == before
    assert all(is_alive(daemon["pid"]) for daemon in before)
    assert sinfo(record["slurm"]["beta"]["conf"]) == {"node1": "idle", "node2": "idle"}
    assert "--slurm-conf" in record["sites"]["beta"]["command"]


def test_a_failed_fleet_up_leaves_no_slurm_daemon(tmp_path: Path) -> None:
    """The clusters start first; when the brokers then fail (an option serve refuses), up
    stops the clusters too."""
    from gbroker import fleet
    from gbroker.fleet.members import FleetError

    directory = tmp_path / "fleet"
    with pytest.raises(FleetError, match="exited during start-up"):
        fleet.up(SLURM_3, directory, serve_args=("--retain-days", "0"))
    assert slurm_processes(directory) == []
    assert (directory / "slurm" / "gamma" / "slurm.conf").exists()  # they had started
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
