"""A private Grid Engine cell (gbroker.fleet.gridengine) with its real sge_qmaster and
sge_execd: it takes jobs as Grid Engine does (``qsub -terse``, held and released, a parallel
environment's slots, run as their owner), and leaves nothing behind when stopped. Grid Engine
is installed by scripts/setup/ensure_gridengine.sh (scripts/test.sh runs it); missing, the test
fails.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.fleet import gridengine
from gbroker.fleet.gridengine import Cell, start_cell, stop_cell

pytestmark = pytest.mark.serial  # real daemons, each cell on ports of its own

NOBODY = 65534


def _world_searchable() -> Path:
    """A directory a job's owner (nobody) can reach: pytest's base temp is root's, 0700."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-ge-"))
    directory.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def cell() -> Iterator[Cell]:
    missing = gridengine.missing_tools()
    if missing:
        pytest.fail(f"Grid Engine missing ({missing}): run scripts/setup/ensure_gridengine.sh")
    base = _world_searchable()
    started = start_cell(base / "cell", slots=3)
    try:
        yield started
    finally:
        stop_cell(started, grace=5.0)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _as_nobody(cell: Cell, *argv: str, script: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        input=script,
        env={**os.environ, "PATH": f"{os.environ['PATH']}:/usr/sbin", **cell.environment},
        user=NOBODY if os.geteuid() == 0 else None,
        group=NOBODY if os.geteuid() == 0 else None,
        extra_groups=[] if os.geteuid() == 0 else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} was not written within {timeout} s")


def test_a_held_job_runs_once_released_on_its_slots_as_its_owner(cell: Cell) -> None:
    work = _world_searchable()
    os.chown(work, NOBODY, NOBODY)
    out = work / "out"
    submitted = _as_nobody(
        cell,
        "qsub", "-terse", "-h", "-N", "gbTOKEN1", "-pe", gridengine.PE, "2",
        "-wd", str(work), "-o", str(out), "-e", str(work / "err"), "-S", "/bin/sh",
        script='echo "$JOB_ID $NSLOTS $(id -u)"\n',
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit()
    listed = _as_nobody(cell, "qstat", "-xml", "-u", "*")
    assert f"<JB_job_number>{job_id}</JB_job_number>" in listed.stdout
    assert "<state>hqw</state>" in listed.stdout  # held: it does not run before qrls
    assert not out.exists()
    try:
        released = _as_nobody(cell, "qrls", job_id)
        assert released.returncode == 0, released.stderr
        assert _wait_for(out).split() == [job_id, "2", str(NOBODY)]
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


def test_stopping_a_cell_ends_its_daemons_and_its_jobs() -> None:
    base = _world_searchable()
    try:
        started = start_cell(base / "cell", slots=1)
        work = base / "work"
        work.mkdir(mode=0o777)
        work.chmod(0o777)
        submitted = _as_nobody(
            started, "qsub", "-terse", "-wd", str(work), "-o", str(work / "out"), "-j", "y",
            "-S", "/bin/sh", script="echo started\nsleep 300\n",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        _wait_for(work / "out")
        assert gridengine._pids(started), "the cell's daemons and its job should be running"
        stop_cell(started, grace=5.0)
        assert gridengine._pids(started) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_cell_refuses_a_directory_that_holds_one(cell: Cell) -> None:
    with pytest.raises(gridengine.GridEngineError, match="already holds a Grid Engine cell"):
        start_cell(cell.directory, slots=1)
