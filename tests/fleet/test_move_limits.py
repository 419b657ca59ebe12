"""A running job's limits survive its moves (issue 35), through the user's path: the fleet and
jobs of tests/fleet/test_migrate.py (its own fleet here), moves by `gbroker migrate`.

A job asks for a wall-time limit (or a CPU-time limit) and is moved while it runs; what it used
at each site counts against the limit at the next, so it ends at its limit in all, not a whole
limit after its last move. Each job stamps its log with the time (or its CPU time) every tenth
of a second: its run time is its first stamp to its last, less the gap of each move (the
longest gap between two stamps while `gbroker migrate` ran), whatever the length of a move.
Real CRIU and root, as test_migrate.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from typing import Any

import pytest

from tests.fleet.test_migrate import Fleet
from tests.fleet.test_migrate import fleet as fleet  # the module's own fleet (a fixture)
from tests.harness import poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checkpoints need root (CI is root)")

WALL_LIMIT = 20
CPU_LIMIT = 10
MOVES = 3  # of a job with a wall-time limit; 2 of one with a CPU-time limit (two busy jobs
# side by side on a small machine spend it fast, while each other's moves take time)

# A plain program: CRIU moves it.
STAMPS = """
import sys, time
log = sys.argv[1]
while True:
    with open(log, "a") as f:
        f.write(f"{time.time():.3f}\\n")
    time.sleep(0.1)
"""

# The same, saving its own state (nothing but that it ran): started again after each move.
OWN_STAMPS = """
import sys, time
from gbroker.app import malleable
log = sys.argv[1]
malleable.serve(on_checkpoint=lambda: b"-")
while True:
    malleable.safe_point()
    with open(log, "a") as f:
        f.write(f"{time.time():.3f}\\n")
    time.sleep(0.1)
"""

# Busy, stamping the CPU time it used in all (its process's CPU time starts anew at a restore:
# CRIU restores no CPU time).
CPU = """
import sys, time
log = sys.argv[1]
total, last = 0.0, time.process_time()
while True:
    began = time.process_time()
    while 0 <= time.process_time() - began < 0.1:
        pass
    now = time.process_time()
    total += now - last if now >= last else now
    last = now
    with open(log, "a") as f:
        f.write(f"{total:.3f}\\n")
"""

# The same, saving what it used before in its state: started again after each move.
OWN_CPU = """
import sys, time
from gbroker.app import malleable
log = sys.argv[1]
state = malleable.restored()
before = 0.0 if state is None else float(state)
malleable.serve(on_checkpoint=lambda: str(before + time.process_time()).encode())
while True:
    malleable.safe_point()
    began = time.process_time()
    while time.process_time() - began < 0.1:
        pass
    with open(log, "a") as f:
        f.write(f"{before + time.process_time():.3f}\\n")
"""


def stamps(fleet: Fleet, log: str) -> list[float]:
    path = fleet.logs / log
    return [float(s) for s in path.read_text().split()] if path.exists() else []


def moved_around(
    fleet: Fleet, jobs: dict[str, tuple[str, str]], after: float, moves: int = MOVES
) -> dict[str, list[tuple[float, float]]]:
    """Move each job ``moves`` times, in turns, once it has run ``after`` (its stamps' seconds
    of wall or CPU time) where it is; each move's (began, ended) by job."""
    windows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in jobs}
    for _ in range(moves):
        for kind, (job_id, log) in jobs.items():
            before = stamps(fleet, log)
            since = before[-1] if before else None

            def ran(log: str = log, since: float | None = since) -> bool:
                times = stamps(fleet, log)
                return bool(times) and times[-1] - (times[0] if since is None else since) >= after

            poll(ran, f"{kind} runs")
            site = fleet.status(job_id)["site"]
            target = "c" if site == "b" else "b"
            began = time.time()
            moved = fleet.run("migrate", job_id, "--to", target)
            assert moved.returncode == 0, f"{kind}: {moved.stderr}"
            windows[kind].append((began, time.time()))
    return windows


def run_time(times: list[float], windows: list[tuple[float, float]]) -> float:
    """First stamp to last, less each move's gap: the longest between two stamps in its window."""
    gaps = list(itertools.pairwise(times))
    frozen = sum(max(b - a for a, b in gaps if a < ended and b > began) for began, ended in windows)
    return times[-1] - times[0] - frozen


def ended(fleet: Fleet, job_id: str) -> dict[str, Any]:
    waited = fleet.run("wait", job_id, "--json", "--timeout", "120", timeout=180)
    end: dict[str, Any] = json.loads(waited.stdout)
    assert end["state"] == "failed", end
    return end


def test_a_job_moved_three_times_ends_at_its_wall_time_limit_in_all(fleet: Fleet) -> None:
    # By CRIU and by its own saved state, side by side; the site of the CRIU job's last move
    # is killed and restarted meanwhile: it adopts the job with what it used before.
    jobs = {}
    for kind, program in (("criu", STAMPS), ("own_state", OWN_STAMPS)):
        job_id, log = fleet.submit(program, f"wall-{kind}", wall_time=WALL_LIMIT)
        jobs[kind] = (job_id, log.name)
    windows = moved_around(fleet, jobs, after=1.5)
    status = fleet.status(jobs["criu"][0])  # what it used so far, as `gbroker status` shows it
    card = fleet.run("status", jobs["criu"][0]).stdout
    for command in ("kill", "restart"):
        done = fleet.run("fleet", command, status["site"])
        assert done.returncode == 0, done.stderr
    ends = {kind: ended(fleet, job_id) for kind, (job_id, _) in jobs.items()}
    ran = {kind: run_time(stamps(fleet, log), windows[kind]) for kind, (_, log) in jobs.items()}
    print({kind: f"ran {ran[kind]:.1f} s: {ends[kind]['error']}" for kind in jobs})
    for kind in jobs:
        assert WALL_LIMIT - 2 <= ran[kind] <= WALL_LIMIT + 2, f"{kind} ran {ran[kind]:.1f} s"
        error = ends[kind]["error"]
        assert f"killed at its wall-time limit of {WALL_LIMIT} s" in error, error
        assert f"s used, over {MOVES} moves" in error, error
    assert status.get("limits") == {"wall_time": WALL_LIMIT, "cpu_time": None}, status
    used = status["used"]
    assert used["moves"] == MOVES, status
    assert 0 < used["before_moves"]["wall_time"] < used["wall_time"] < WALL_LIMIT, status
    assert re.search(r"limits +wall time 20s *\n", card), card
    assert re.search(rf"used +[\d.]+s of wall time, over {MOVES} moves \(", card), card


def test_a_job_moved_twice_ends_at_its_cpu_time_limit_in_all(fleet: Fleet) -> None:
    jobs = {}
    for kind, program in (("criu", CPU), ("own_state", OWN_CPU)):
        job_id, log = fleet.submit(program, f"cpu-{kind}", cpu_time=CPU_LIMIT)
        jobs[kind] = (job_id, log.name)
    moved_around(fleet, jobs, after=1.0, moves=2)
    ends = {kind: ended(fleet, job_id) for kind, (job_id, _) in jobs.items()}
    used = {kind: stamps(fleet, log)[-1] for kind, (_, log) in jobs.items()}
    print({kind: f"used {used[kind]:.1f} s of CPU: {ends[kind]['error']}" for kind in jobs})
    for kind in jobs:
        assert CPU_LIMIT - 1.5 <= used[kind] <= CPU_LIMIT + 1.5, f"{kind} used {used[kind]:.1f} s"
        error = ends[kind]["error"]
        assert f"CPU-time limit of {CPU_LIMIT} s" in error, error
        assert "s used, over 2 moves" in error, error
