"""Every benchmark stops what it started however it ends (scripts/orderly.py): SIGTERM (a
timeout), SIGHUP (a closed terminal) and SIGINT unwind it like an exception, and nothing it
started survives: no broker, launcher or job of its fleets, no munged, slurmctld, slurmd or job
step of its Slurm. Each run lives in the test's own directory, which every process it starts
names (command line or environment): that tells them apart from other runs on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return True


def _processes_of(under: Path) -> dict[int, str]:
    """Live processes (but this one) whose command line or environment names ``under``, with
    their command lines."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            mentions = cmdline + (proc / "environ").read_bytes()
        except OSError:
            continue
        if str(under).encode() in mentions and not _gone(int(proc.name)):
            found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def _names(processes: dict[int, str]) -> set[str]:
    return {Path(line.split()[0]).name for line in processes.values() if line}


def _until(
    condition: Callable[[], object], bench: subprocess.Popen[str], what: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert bench.poll() is None, f"it ended before {what}: {bench.communicate()}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.01)


def _stopped(bench: subprocess.Popen[str], under: Path, signum: int, group: bool) -> str:
    """Send ``signum`` (to the whole process group with ``group``, as ``timeout`` and a closed
    terminal do), wait for the script's end; its stderr. Kills what it left, whatever the
    verdict, and asserts that it left nothing."""
    try:
        if group:
            os.killpg(bench.pid, signum)
        else:
            bench.send_signal(signum)
        _, err = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    left = _processes_of(under)
    for pid in left:  # do not leave them to the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert left == {}, err
    assert bench.returncode == 128 + signum, err
    assert f"interrupted by {signal.Signals(signum).name}" in err
    return err


def test_a_signal_inside_an_asyncio_callback_still_stops_the_script(tmp_path: Path) -> None:
    """asyncio logs and drops any exception a callback raises but SystemExit and
    KeyboardInterrupt: a signal turned into another exception there would be lost, and the
    script would wait on, what it started running."""
    script = tmp_path / "busy.py"
    script.write_text(
        "import asyncio, time\nfrom scripts import orderly\n"
        "def busy():\n"
        "    time.sleep(0.01)  # the signal lands here, in a callback, not in a task\n"
        "    asyncio.get_running_loop().call_soon(busy)\n"
        "async def forever():\n"
        "    asyncio.get_running_loop().call_soon(busy)\n"
        "    await asyncio.Event().wait()\n"
        "def main():\n"
        "    with orderly.started(lambda: print('started', flush=True),\n"
        "                         lambda _: print('stopped', flush=True)):\n"
        "        asyncio.run(forever())\n"
        "orderly.run(main)\n"
    )
    busy = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # a script outside the checkout imports it
    )
    try:
        assert busy.stdout is not None
        assert busy.stdout.readline() == "started\n"
        busy.send_signal(signal.SIGTERM)
        out, err = busy.communicate(timeout=30)
    finally:
        if busy.poll() is None:
            busy.kill()
            busy.wait()
    assert busy.returncode == 128 + signal.SIGTERM, err
    assert out == "stopped\n"
    assert "busy.py: interrupted by SIGTERM; everything it started was stopped" in err


@pytest.mark.network
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_the_daemon_benchmark_stops_its_slurm(tmp_path: Path, signum: int) -> None:
    """The signal reaches the benchmark's whole process group (its sbatch clients too) while
    Slurm's jobs are submitted: asyncio is then busy with the clients' ends."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench.bench_daemon", "--quick", "--no-gbroker", "--dir",
         str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        _until(lambda: list(tmp_path.glob("gbroker-bench-*/slurm/*/*.out")), bench, "a job", 90)
        assert {"munged", "slurmctld", "slurmd"} <= _names(_processes_of(tmp_path))
    except BaseException:
        bench.kill()
        raise
    _stopped(bench, tmp_path, signum, group=True)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def temp_root() -> Iterator[Path]:
    """A directory to be a script's ``$TMPDIR``: short (Slurm's Unix sockets go in it, whose
    paths must stay under 108 bytes) and searchable by all (a root broker's jobs run as
    ``nobody``, who must reach their directories in it)."""
    path = Path(tempfile.mkdtemp(prefix="gbt-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.network
def test_the_cli_benchmark_stops_its_fleet_and_its_slurm(temp_root: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench.bench_cli", "--calls", "100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temp_root)},  # where it makes its directories
    )  # fmt: skip
    wanted = {"munged", "slurmctld", "slurmd", "gbroker launcher"}
    try:
        # Both systems up: Slurm's daemons, and the fleet's broker with its launchers.
        _until(
            lambda: wanted <= _names(_processes_of(temp_root)) | _titles(temp_root),
            bench,
            "Slurm and the fleet ran",
            90,
        )
    except BaseException:
        bench.kill()
        raise
    _stopped(bench, temp_root, signal.SIGTERM, group=False)
    assert list(temp_root.iterdir()) == []


def _titles(under: Path) -> set[str]:
    """``gbroker launcher`` if a launcher of a fleet under ``under`` runs (it sets its title)."""
    return {
        "gbroker launcher"
        for line in _processes_of(under).values()
        if line.startswith("gbroker launcher ")
    }


@pytest.mark.network
def test_the_launch_benchmark_stops_its_launchers(temp_root: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench.bench_launch", "--jobs", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temp_root)},  # its job root: under the test's directory
    )  # fmt: skip
    try:
        assert bench.stderr is not None
        # Once every launcher has started (one killed while it starts retires within 30 s).
        assert "launchers up" in bench.stderr.readline()
        assert _titles(temp_root)
    except BaseException:
        bench.kill()
        raise
    _stopped(bench, temp_root, signal.SIGTERM, group=False)
    assert list(temp_root.iterdir()) == []


def _namespace_of(pid: int) -> str:
    done = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return done.stdout.strip()


@pytest.mark.network
def test_the_netmon_accuracy_run_takes_its_namespaces_down(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "scripts.experiments.netmon_accuracy", "--rates", "50,100",
         "--period", "1", "--rounds", "50", "--transfers", "50", "--max-seconds", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip

    def workers() -> dict[int, str]:
        """Its workers (its children, each in a site's namespace) and their namespaces."""
        found = {}
        for proc in Path("/proc").iterdir():
            try:  # a process of the machine may end while it is read
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == bench.pid and b"--worker" in (proc / "cmdline").read_bytes():
                    found[int(proc.name)] = _namespace_of(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
        return found

    try:
        _until(lambda: len(workers()) == 2, bench, "both workers ran", 60)
        running = workers()
        prefixes = {namespace.rsplit("-", 1)[0] for namespace in running.values()}
        assert len(prefixes) == 1, running
        (prefix,) = prefixes
    except BaseException:
        bench.kill()
        raise
    _stopped(bench, tmp_path, signal.SIGHUP, group=False)
    assert all(_gone(pid) for pid in running)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"{prefix}-" not in listed.stdout  # every namespace of the run is gone
    bridge = subprocess.run(["ip", "link", "show", f"{prefix}br"], capture_output=True)
    assert bridge.returncode != 0  # and its bridge
