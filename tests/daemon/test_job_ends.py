"""How a job's end reads when the site ended it (issue 24), through the CLI against a fleet
from `gbroker fleet up`: a cancelled running job gets its end time, its run time stops, and its
history names the site it ran at, whether it ran at its owner's site or another, and when the
cancel races the job's own end; a job killed at its wall-time limit, or by a limit of its site,
says so, with the signal that ended it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gbroker.cli.show import duration
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.fleet.one_site import until
from tests.harness import gbroker


def job_processes(job_id: str) -> list[int]:
    """Live processes whose environment says they are (part of) the job."""
    marker = f"GBROKER_JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    pids: dict[str, int]

    def status(self, job_id: str) -> dict[str, Any]:
        shown = gbroker("status", job_id, "--json", "--broker", self.urls["b"])
        assert shown.returncode == 0, shown.stderr
        answer: dict[str, Any] = json.loads(shown.stdout)
        return answer


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two sites: a of 1 core, b of 4; a job of 2 cores submitted to a runs at b."""
    home = tmp_path_factory.mktemp("ends")
    topology = home / "two.yaml"
    save_topology(Topology([SiteSpec("a", 1), SiteSpec("b", 4)], "full", name="two"), topology)
    directory = home / "fleet"
    up = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory))
    assert up.returncode == 0, up.stderr
    record = json.loads((directory / "fleet.json").read_text())
    sites = record["sites"]
    try:
        yield Fleet(
            directory,
            {name: m["url"] for name, m in sites.items()},
            {name: m["pid"] for name, m in sites.items()},
        )
    finally:
        down = gbroker("fleet", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr


def submit(fleet: Fleet, owner: str, text: str, tmp_path: Path) -> str:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    submitted = gbroker("submit", str(job), "--broker", fleet.urls[owner])
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def running(fleet: Fleet, job_id: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = fleet.status(job_id)
        return status if status["state"] == "running" and job_processes(job_id) else None

    status = until(f"{job_id} running", check)
    assert status["site"] == "b"
    return status


def ended(fleet: Fleet, job_id: str) -> dict[str, Any]:
    """Its status once its end time is known (a cancelled job's comes after the cancel)."""

    def check() -> dict[str, Any] | None:
        status = fleet.status(job_id)
        return status if status["ended_at"] is not None else None

    return until(f"{job_id}'s end time", check)


def last_history_row(fleet: Fleet, job_id: str) -> list[str]:
    shown = gbroker("history", job_id, "--broker", fleet.urls["a"])
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()[-1].split()


@pytest.mark.parametrize("owner", ["a", "b"], ids=["owner-elsewhere", "owner-runs-it"])
def test_a_cancelled_running_job_gets_its_end_time_and_names_its_site(
    fleet: Fleet, owner: str, tmp_path: Path
) -> None:
    job_id = submit(fleet, owner, "executable: /bin/sleep\narguments: ['60']\n"
                    "total_cpu_count: {exact: 2}\n", tmp_path)  # fmt: skip
    running(fleet, job_id)
    cancelled = gbroker("cancel", job_id, "--json", "--broker", fleet.urls["a"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    status = ended(fleet, job_id)
    assert status["state"] == "cancelled"
    assert status["site"] == "b"
    assert status["started_at"] <= status["ended_at"]
    assert status["exit_code"] == -signal.SIGTERM  # sleep dies of the SIGTERM
    assert status["error"] == (
        "cancelled by admin while it ran at b "
        "(stopped by a cancel: SIGTERM, and it ended within the 5 s grace period)"
    )
    assert job_processes(job_id) == []
    # Its run time has stopped: the same end wherever it is shown, for people too.
    listed = gbroker("jobs", "--json", "--broker", fleet.urls[owner])
    [row] = [j for j in json.loads(listed.stdout) if j["id"] == job_id]
    assert row["ended_at"] == status["ended_at"]
    card = gbroker("status", job_id, "--broker", fleet.urls["a"]).stdout
    ran = duration(status["ended_at"] - status["started_at"])
    assert ["ran", ran] in [line.split() for line in card.splitlines()]
    assert "exit code   -15 (SIGTERM)" in card
    assert last_history_row(fleet, job_id)[-2:] == ["cancelled", "b"]


def test_a_cancel_racing_the_jobs_own_end_still_gets_its_end(fleet: Fleet, tmp_path: Path) -> None:
    """The job ends at b while b's broker is stopped, and the cancel reaches its owner a
    meanwhile: whichever b then hears first, the kill or the end, the owner records the end
    (and says whether the job had ended on its own)."""
    job_id = submit(fleet, "a", "executable: /bin/sh\n"
                    "arguments: ['-c', 'until [ -e go ]; do sleep 0.05; done']\n"
                    "total_cpu_count: {exact: 2}\n", tmp_path)  # fmt: skip
    running(fleet, job_id)
    os.kill(fleet.pids["b"], signal.SIGSTOP)
    try:
        cancelled = gbroker("cancel", job_id, "--json", "--broker", fleet.urls["a"])
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["state"] == "cancelled"
        (fleet.directory / "b" / "jobs" / job_id / "go").touch()  # it ends, exit 0
        until("the job's own end", lambda: not job_processes(job_id))
    finally:
        os.kill(fleet.pids["b"], signal.SIGCONT)
    status = ended(fleet, job_id)
    assert status["state"] == "cancelled"
    assert status["site"] == "b"
    assert status["started_at"] <= status["ended_at"]
    assert status["exit_code"] == 0  # it ended on its own: a kill after that changes nothing
    assert status["error"].startswith("cancelled by admin while it ran at b")
    assert last_history_row(fleet, job_id)[-2:] == ["cancelled", "b"]


def test_an_owner_restarted_between_the_cancel_and_the_end_still_records_the_end(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The owner is killed while the cancelled job takes its grace period at b, and comes back
    after b has stopped it: b's end report, kept until its owner answers, reaches the restarted
    owner, which knows the cancelled job from its journal only."""
    script = 'trap "touch got-term" TERM; while :; do sleep 0.1; done'  # it outlives SIGTERM
    job = f"executable: /bin/sh\narguments: ['-c', '{script}']\ntotal_cpu_count: {{exact: 2}}\n"
    job_id = submit(fleet, "a", job, tmp_path)
    running(fleet, job_id)
    cancelled = gbroker("cancel", job_id, "--broker", fleet.urls["a"])
    assert cancelled.returncode == 0, cancelled.stderr
    got_term = fleet.directory / "b" / "jobs" / job_id / "got-term"
    until("the job's SIGTERM", got_term.exists)  # b is stopping it: SIGKILL in 5 s
    directory = str(fleet.directory)
    assert gbroker("fleet", "kill", "a", "--dir", directory).returncode == 0
    until("the job's end", lambda: not job_processes(job_id))
    restarted = gbroker("fleet", "restart", "a", "--dir", directory)
    assert restarted.returncode == 0, restarted.stderr
    fleet.urls["a"] = json.loads((fleet.directory / "fleet.json").read_text())["sites"]["a"]["url"]
    status = ended(fleet, job_id)
    assert (status["state"], status["site"]) == ("cancelled", "b")
    assert status["exit_code"] == -signal.SIGKILL
    assert status["error"] == (
        "cancelled by admin while it ran at b "
        "(stopped by a cancel: SIGTERM, then SIGKILL after the 5 s grace period)"
    )
    assert last_history_row(fleet, job_id)[-2:] == ["cancelled", "b"]


def test_a_job_killed_at_its_wall_time_limit_says_so(fleet: Fleet, tmp_path: Path) -> None:
    # One that ignores SIGTERM: SIGKILL after the grace period.
    stubborn = submit(fleet, "a", "executable: /bin/sh\n"
                      "arguments: ['-c', 'trap \"\" TERM; sleep 60']\n"
                      "total_cpu_count: {exact: 2}\nwall_time_limit: 1\n", tmp_path)  # fmt: skip
    waited = gbroker("wait", stubborn, "--broker", fleet.urls["a"])
    assert waited.returncode == 1, waited.stderr
    assert "state       failed" in waited.stdout
    assert "exit code   -9 (SIGKILL)" in waited.stdout
    why = "killed at its wall-time limit of 1 s: SIGTERM, then SIGKILL after the 5 s grace period"
    assert f"error       {why}" in waited.stdout
    status = fleet.status(stubborn)
    assert (status["exit_code"], status["error"]) == (-signal.SIGKILL, why)
    # One that goes at SIGTERM.
    polite = submit(fleet, "a", "executable: /bin/sleep\narguments: ['60']\n"
                    "total_cpu_count: {exact: 2}\nwall_time_limit: 1\n", tmp_path)  # fmt: skip
    waited = gbroker("wait", polite, "--json", "--broker", fleet.urls["a"])
    assert waited.returncode == 1, waited.stderr
    status = json.loads(waited.stdout)
    assert status["state"] == "failed"
    assert status["exit_code"] == -signal.SIGTERM
    assert status["error"] == (
        "killed at its wall-time limit of 1 s: SIGTERM, and it ended within the 5 s grace period"
    )


@pytest.fixture
def limited_site(tmp_path: Path) -> Iterator[str]:
    """`gbroker serve` of one site whose jobs may write no file beyond 1000 bytes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    topology = tmp_path / "one.yaml"
    save_topology(Topology([SiteSpec("solo", 2, http=url)], (), name="one"), topology)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbroker", "serve", "--site", "solo", "--topology", str(topology),
         "--data-dir", str(tmp_path / "data"), "--job-file-size", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        until("gbroker serve listening", listening, timeout=20)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_job_killed_by_its_sites_file_size_limit_says_so(
    limited_site: str, tmp_path: Path
) -> None:
    job = tmp_path / "big.yaml"
    job.write_text("executable: head\narguments: ['-c', '5000', '/dev/zero']\n")
    waited = gbroker("submit", str(job), "--wait", "--json", "--broker", limited_site)
    assert waited.returncode == 1, waited.stderr
    [status] = json.loads(waited.stdout)
    assert status["state"] == "failed"
    assert status["exit_code"] == -signal.SIGXFSZ
    assert status["error"] == (
        "killed by SIGXFSZ: it wrote beyond its file-size limit of 1000 bytes (RLIMIT_FSIZE)"
    )
