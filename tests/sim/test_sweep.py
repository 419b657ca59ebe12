"""Sweeps (gbroker.sim.sweep): the runs of an experiment here or on Dask distributed give the same
figures; a run that raises is reported by its configuration and seed; the cluster is closed.

The cluster tests start real Dask processes on the loopback: an embedded LocalCluster of two
worker processes, and a `dask scheduler` with a `dask worker` started as commands, as a user
would on a real cluster. Their runs are small (tens of jobs)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.sim import sweep as sweep_module
from gbroker.sim.experiment import run_experiment
from gbroker.sim.sweep import Run, RunFailed, Sweep, parse_where, resolve
from gbroker.topology import load_topology
from gbroker.workloads.streams import Arrival, paper_streams
from tests.conftest import ROOT

PAPER = ROOT / "topologies" / "paper-6.yaml"
# Measured wall times of the brokers' decisions: the only figures that differ from run to run.
TIMED = {"decision_time_mean", "decision_time_p99"}


def sim(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", "sim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


SWEEP = ("--topology", str(PAPER), "--algorithm", "dm", "--rate", "0.6", "--jobs", "40",
         "--seeds", "4", "--seed", "3", "--json")  # fmt: skip


def assert_same_figures(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Every field of two ``gbroker sim --json`` reports equal, seed by seed, but the timings."""
    assert a.keys() == b.keys()
    for key in a.keys() - TIMED:
        assert a[key] == b[key], key
    assert len(a["throughput"]["values"]) == 4


# Functions a cluster's workers run: module-level, so they unpickle by name.
def whose(k: int) -> tuple[int, int]:
    time.sleep(0.1 * (6 - k))  # the first runs take longest: they end after later ones
    return k, os.getpid()


def fail_at(k: int, bad: int) -> int:
    if k == bad:
        raise ValueError(f"no site for job {k}")
    return k


class FailOnSeed:
    """The paper's streams, except for the seed whose generator starts in ``state``: raises."""

    def __init__(self, seed: int) -> None:
        self.state = random.Random(seed).getstate()

    def __call__(self, rng: random.Random, entries: tuple[str, ...]) -> list[Arrival]:
        if rng.getstate() == self.state:
            raise ZeroDivisionError("the workload of this seed divides by zero")
        return paper_streams(rng, 0.3, 20, entries, "Xeon80")


def test_where_is_checked_and_the_default_starts_no_cluster_for_one_run() -> None:
    assert parse_where("serial") == "serial"
    assert parse_where("local:3") == "local:3"
    assert parse_where("tcp://10.1.2.3:8786") == "tcp://10.1.2.3:8786"
    for bad in ("", "locale", "local:0", "local:x", "10.1.2.3:8786", "tcp:/x"):
        with pytest.raises(InvalidInput, match="dask: expected serial, local, local:N"):
            parse_where(bad)
    assert resolve(None, 1) == "serial"
    assert resolve("serial", 8) == "serial"
    cores = sweep_module.usable_cores()
    assert resolve(None, 8) == (f"local:{min(cores, 8)}" if cores > 1 else "serial")
    # A sweep too small to repay a cluster's start stays here.
    assert resolve(None, 8, sweep_module.LOCAL_WORTH - 1) == "serial"
    assert resolve(None, 8, sweep_module.LOCAL_WORTH) == resolve(None, 8)
    assert resolve("local", 1) == "local:1"  # no more workers than runs
    assert resolve("tcp://h:1", 1) == "tcp://h:1"


def test_bad_dask_option_is_a_usage_error() -> None:
    done = sim(*SWEEP, "--dask", "localhost:8786")
    assert done.returncode == 2
    assert "argument --dask: expected serial, local, local:N" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_serial_sweep_runs_in_order_and_names_the_run_that_raised() -> None:
    runs = [Run(f"seed {k} of test", fail_at, (k, 2)) for k in range(4)]
    with Sweep("serial") as here:
        assert here.map(runs[:2]) == [0, 1]
        with pytest.raises(RunFailed) as failed:
            here.map(runs)
    assert str(failed.value).startswith("seed 2 of test failed: ValueError: no site for job 2")
    assert "(at test_sweep.py:" in str(failed.value)  # where, for a bug's report
    assert failed.value.name == "seed 2 of test"


def count_to(n: int, progress: Callable[[int], None] | None = None) -> int:
    for k in range(1, n + 1):
        if progress is not None:
            progress(k)
    return n


def test_a_serial_sweep_passes_ticks_within_runs() -> None:
    seen: list[int] = []
    runs = [Run(f"run {k}", count_to, (3,), size=3, ticks=True) for k in range(2)]
    assert Sweep().map(runs, seen.append) == [3, 3]
    assert seen == [1, 2, 3, 3, 4, 5, 6, 6]  # within each run, offset by the runs before


@pytest.fixture(scope="module")
def local2() -> Iterator[Sweep]:
    """One embedded cluster of two worker processes for the module's in-process tests."""
    with Sweep("local:2") as cluster:
        yield cluster
    assert cluster._client is None
    assert cluster._cluster is None


@pytest.mark.network
def test_a_local_cluster_runs_on_two_worker_processes_in_submission_order(
    local2: Sweep,
) -> None:
    runs = [Run(f"seed {k}", whose, (k,)) for k in range(6)]
    ended = [finished.index for finished in local2.as_completed(runs)]
    assert sorted(ended) == list(range(6))
    assert ended != list(range(6))  # they did not end in the order given ...
    seen: list[int] = []
    done = local2.map(runs, seen.append)
    assert [k for k, _ in done] == list(range(6))  # ... and come back in it
    pids = {pid for _, pid in done}
    assert len(pids) == 2
    assert os.getpid() not in pids
    assert seen == [1, 2, 3, 4, 5, 6]  # runs done


@pytest.mark.network
def test_a_run_that_raises_on_a_cluster_names_its_configuration_and_seed(local2: Sweep) -> None:
    topology = load_topology(PAPER)
    policy = DispatchPolicy(Algorithm.DLO)
    with pytest.raises(RunFailed) as failed:
        run_experiment(
            topology, policy, 0.3, 20, seeds=4, base_seed=5, workload=FailOnSeed(7), sweep=local2
        )
    assert str(failed.value).startswith(
        "seed 7 of paper-6 dlo λ=0.3 jobs=20 streams=1 failed: ZeroDivisionError: the workload "
        "of this seed divides by zero"
    )
    # The cluster is still usable: the other runs were cancelled, not left to run.
    assert local2.map([Run("after", fail_at, (1, 0))]) == [1]


@pytest.mark.network
def test_gbroker_sim_on_a_local_cluster_gives_the_serial_figures() -> None:
    serial = sim(*SWEEP, "--dask", "serial")
    assert serial.returncode == 0, serial.stderr
    local = sim(*SWEEP, "--dask", "local:2")
    assert local.returncode == 0, local.stderr
    assert local.stderr == ""  # no Dask logs in a pipe
    assert_same_figures(json.loads(local.stdout), json.loads(serial.stdout))


def _children(pid: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
        return children
    except psutil.NoSuchProcess:
        return []


@pytest.mark.network
def test_ctrl_c_closes_the_local_cluster() -> None:
    # A sweep long enough to be interrupted: 16 seeds of 3000 jobs (some 10 s on two workers).
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbroker", "sim", "--topology", str(PAPER), "--algorithm", "dlo",
         "--rate", "0.6", "--jobs", "3000", "--seeds", "16", "--dask", "local:2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) >= 2, "no worker processes started"
        # Ctrl-C to the whole group, as a terminal sends it, once a second until it ends (one
        # that comes while the cluster starts is lost; a person presses again).
        while proc.poll() is None and time.monotonic() < deadline:
            os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # 130: it caught the Ctrl-C; -SIGINT: a later one ended it as it exited (a shell says 130).
    assert proc.returncode in (130, -signal.SIGINT), err
    assert err == "gbroker sim: interrupted\n"  # no traceback, no Dask logs
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"worker processes left running: {alive}"


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[str]:
    """A `dask scheduler` and one `dask worker` (one process, one thread), started as commands
    on the loopback; yields the scheduler's address."""
    info = tmp_path / "scheduler.json"
    common = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", str(info), "--idle-timeout", "300s", *common],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(info.read_text())["address"]
        started.append(
            subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", address, "--nworkers", "1",
                 "--nthreads", "1", "--host", "127.0.0.1", *common],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=tmp_path,  # nothing of the checkout's on its path but the installed package
            )
        )  # fmt: skip
        yield address
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.network
def test_gbroker_sim_on_an_existing_scheduler_gives_the_serial_figures(scheduler: str) -> None:
    assert scheduler.startswith("tcp://127.0.0.1:")
    remote = sim(*SWEEP, "--dask", scheduler)
    assert remote.returncode == 0, remote.stderr
    serial = sim(*SWEEP, "--dask", "serial")
    assert serial.returncode == 0, serial.stderr
    assert_same_figures(json.loads(remote.stdout), json.loads(serial.stdout))


def test_a_scheduler_that_does_not_answer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setattr(sweep_module, "CONNECT_TIMEOUT", 1.0)
    with (
        pytest.raises(InvalidInput, match="a Dask scheduler that answers within 1 s"),
        Sweep(f"tcp://127.0.0.1:{port}"),
    ):
        pass


def test_a_worker_with_other_code_refuses_to_run() -> None:
    assert sweep_module._on_worker(sweep_module.code_digest(), fail_at, 1, 0)[0] == 1
    with pytest.raises(GBrokerError, match="imports other GBroker code"):
        sweep_module._on_worker("0" * 16, fail_at, 1, 0)
