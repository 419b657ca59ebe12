"""A fleet whose sites front Grid Engine cells (``manager: gridengine``): ``gbroker fleet up``
starts each site's own cell (gbroker.fleet.gridengine: its sge_qmaster and sge_execd) before
its broker and hands the broker the cell's environment, a job runs there as a Grid Engine job
and ends ``done`` once across its broker's SIGKILL and restart, and ``fleet down`` (or a failed
``up``) leaves no process of the cells. Real Grid Engine daemons from Debian's gridengine-*
packages, installed by scripts/setup/ensure_gridengine.sh (scripts/test.sh runs it); these tests
start them themselves. One fleet for the whole story: a cell takes seconds to start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from gbroker.fleet import gridengine
from gbroker.fleet.members import is_alive
from gbroker.site.gridengine import parse_qstat

pytestmark = [pytest.mark.serial, pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
GRIDENGINE_2 = ROOT / "topologies" / "gridengine-2.yaml"
SITES = ("oak", "elm")


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


def cell_processes(*roots: str) -> list[tuple[int, str]]:
    """Live processes of the cells under ``roots`` (a cell's directory, or a prefix of it): its
    daemons, their shepherds and its jobs, which all carry the cell's SGE_ROOT in their
    environment, or name it on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            name = (proc / "comm").read_bytes().strip().decode()
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        roots_of = [v[len(b"SGE_ROOT=") :] for v in environ if v.startswith(b"SGE_ROOT=")]
        ours = any(
            root.encode() in mentioned for root in roots for mentioned in (*roots_of, cmdline)
        )
        if ours and is_alive(int(proc.name)):
            found.append((int(proc.name), name))
    return found


def qstat(environment: dict[str, str]) -> dict[int, str]:
    """Each job of a cell and its state, as ``qstat`` says."""
    done = subprocess.run(
        ["qstat", "-xml", "-u", "*"],
        env={"PATH": os.environ["PATH"], **environment},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return {job.job_id: job.state for job in parse_qstat(done.stdout)}


@pytest.fixture(scope="module", autouse=True)
def _gridengine_installed() -> None:
    if gridengine.missing_tools():
        done = subprocess.run(["bash", str(ROOT / "scripts" / "setup" / "ensure_gridengine.sh")])
        assert done.returncode == 0, "scripts/setup/ensure_gridengine.sh failed"


def test_a_job_runs_in_its_sites_cell_and_ends_done_once_across_its_brokers_kill(
    tmp_path: Path,
) -> None:
    """The issue's "done when", for Grid Engine: `fleet up` starts a cell per site; `gbroker
    submit` of a job that prints $JOB_ID prints a Grid Engine job id; its site's broker SIGKILLed
    while the job runs, and restarted (with the cell's environment, from fleet.json), the job
    ends `done` once; `fleet down` leaves no process of the cells. The fleet lives under
    pytest's 0700 directory, as under a user's home."""
    directory = tmp_path / "fleet"
    runs = Path(tempfile.mkdtemp(prefix="gbroker-runs-"))  # where the job (nobody) writes
    runs.chmod(0o1777)
    record: dict[str, Any] = {}
    try:
        started = gbroker("fleet", "up", "--topology", str(GRIDENGINE_2), "--dir", str(directory))
        assert started.returncode == 0, started.stderr
        record = json.loads((directory / "fleet.json").read_text())
        cells = record["gridengine"]
        assert set(cells) == set(SITES)
        for site in SITES:
            shared = Path(cells[site]["shared"])
            assert shared.stat().st_mode & 0o777 == 0o711  # jobs' accounts reach it
            member = record["sites"][site]
            command = member["command"]
            at = command.index("--manager")
            assert command[at : at + 4] == [
                *("--manager", "gridengine", "--jobs-dir", str(shared / "jobs"))
            ]
            assert member["environment"]["SGE_ROOT"] == cells[site]["sge_root"]
            assert member["environment"]["SGE_CELL"] == gridengine.CELL
            assert qstat(member["environment"]) == {}  # its cell answers
        assert len({cells[site]["qmaster_port"] for site in SITES}) == 2  # a cell of its own each
        status = gbroker("fleet", "status", "--dir", str(directory))
        assert status.returncode == 0, status.stdout + status.stderr
        lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
        for site in SITES:
            assert "gridengine: 2 daemons up" in lines[site]
            assert f"{site}: SGE_ROOT={cells[site]['sge_root']}" in status.stdout

        job = tmp_path / "job.yaml"
        job.write_text(
            "name: ge-id\nexecutable: /bin/sh\narguments:\n  - -c\n"
            f"  - echo $JOB_ID >> {runs}/log; echo JOB_ID=$JOB_ID; sleep 6\n"
        )
        env = {**os.environ, "GBROKER_FLEET": str(directory)}
        submitted = gbroker("submit", str(job), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        def job_status() -> dict[str, Any]:
            shown = gbroker("status", job_id, "--json", env=env)
            assert shown.returncode == 0, shown.stderr
            return cast(dict[str, Any], json.loads(shown.stdout))

        _until(lambda: job_status()["state"] == "running", "the job did not start")
        _until(lambda: (runs / "log").exists(), "the job did not write its log")
        site = job_status()["site"]
        killed = gbroker("fleet", "kill", site, "--dir", str(directory))
        assert killed.returncode == 0, killed.stderr
        # The broker is gone; its job runs on in its cell.
        ge_id = int((runs / "log").read_text())
        # Running in its cell ("t", transferring, until the execd's word reaches the qmaster: a
        # CI run saw it just after the job had begun).
        cell = record["sites"][site]["environment"]
        _until(lambda: qstat(cell) == {ge_id: "r"}, "the job does not run in its cell", 4.0)
        restarted = gbroker("fleet", "restart", site, "--dir", str(directory))
        assert restarted.returncode == 0, restarted.stderr
        waited = gbroker("wait", job_id, "--json", env=env)
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["state"] == "done"
        output = gbroker("output", job_id, env=env)
        assert (runs / "log").read_text().splitlines() == [str(ge_id)]  # it ran once
        assert output.stdout == f"JOB_ID={ge_id}\n"
        after = json.loads((directory / "fleet.json").read_text())
        assert after["sites"][site]["environment"] == record["sites"][site]["environment"]
        assert after["gridengine"] == cells  # the broker's restart left its cell be

        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped the Grid Engine cells of elm, oak" in stopped.stdout
        assert cell_processes(*(cells[site]["shared"] for site in SITES)) == []
        for site in SITES:  # the cells' directories in /tmp went too
            assert not Path(cells[site]["shared"]).exists()
    finally:
        if (directory / "fleet.json").exists():
            gbroker("fleet", "down", "--dir", str(directory))
        shutil.rmtree(runs, ignore_errors=True)


def test_a_failed_fleet_up_leaves_no_grid_engine_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cells start first; when the brokers then fail (an option serve refuses), up stops
    the cells too, and removes their directories."""
    from gbroker import fleet
    from gbroker.fleet.members import FleetError

    cells: list[gridengine.SiteCell] = []
    start = gridengine.SiteCell.start

    def started(slots: int, deadline: float) -> gridengine.SiteCell:
        cells.append(start(slots, deadline))
        assert cell_processes(str(cells[-1].shared))  # it runs
        return cells[-1]

    monkeypatch.setattr(gridengine.SiteCell, "start", started)
    directory = tmp_path / "fleet"
    with pytest.raises(FleetError, match="exited during start-up"):
        fleet.up(GRIDENGINE_2, directory, serve_args=("--retain-days", "0"))
    assert len(cells) == 2
    assert cell_processes(*(str(cell.shared) for cell in cells)) == []
    assert [cell.shared.exists() for cell in cells] == [False, False]
    # The brokers had started, after their cells; up stops at the first one's refusal, which
    # may kill the other before it has said anything.
    logs = [(directory / f"{site}.log").read_text() for site in SITES]
    assert any("--retain-days" in log for log in logs), logs
    assert not (directory / "fleet.json").exists()


def test_a_grid_engine_site_of_a_local_fleet_is_one_host(tmp_path: Path) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text(
        "sites: [{name: a, cores: 4, nodes: 2, manager: gridengine}]\nneighbourhood: full\n"
    )
    done = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(tmp_path / "f"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gbroker fleet up: site[a].nodes: expected 1 for a Grid Engine site of a local fleet "
        "(its cell is one host: this one), got 2"
    ]


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_other_runtimes_refuse_a_grid_engine_site(tmp_path: Path, runtime: str) -> None:
    directory = tmp_path / "fleet"
    done = gbroker(
        "fleet", "up", "--topology", str(GRIDENGINE_2), "--dir", str(directory),
        "--runtime", runtime,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gbroker fleet up: site oak has manager: gridengine, and a {runtime} fleet cannot start "
        "its Grid Engine cell: only a local fleet (--runtime local) does"
    ]
    assert not (directory / "fleet.json").exists()
