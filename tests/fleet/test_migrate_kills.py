"""A broker SIGKILLed at each step of a running job's move (issue 27), through the user's path:
the fleet, jobs and moves of tests/fleet/test_migrate.py (its own fleet here, so that the two
files run side by side), `gbroker fleet restart` after each kill.

Owner a, source and target b and c, a job holding 200 MB (so that each step lasts long enough to
be hit); the test asserts from the dead broker's journal that the kill landed in the step named.
Whatever the step, the job ends done once, having counted 1..40 once each, in order, and every
broker forgets the move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gbroker.fleet import control as fleet_control
from tests.fleet.test_migrate import COUNT, HEAVY, Fleet, busy_a, other
from tests.fleet.test_migrate import fleet as fleet  # the module's own fleet (a fixture)
from tests.harness import poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checkpoints need root (CI is root)")


STEPS: dict[str, tuple[str, Callable[[Fleet, str, str, str], bool]]] = {
    # step: (whose broker is killed, the condition that says the move is at that step)
    "asked": ("owner", lambda f, j, s, t: f.move_phase("a", j, "owner") == "asked"),
    "freezing": ("source", lambda f, j, s, t: f.move_phase(s, j, "out") == "freezing"),
    "frozen": ("source", lambda f, j, s, t: f.move_phase(s, j, "out") == "frozen"),
    "ready": ("owner", lambda f, j, s, t: f.move_phase("a", j, "owner") == "ready"),
    "fetching": (
        "target",
        lambda f, j, s, t: (
            f.move_phase(t, j, "in") is not None and f.hosted_phase(t, j) == "staging"
        ),
    ),
    "restoring": (  # the target journaled the launch; CRIU restores meanwhile
        "target",
        lambda f, j, s, t: (
            f.move_phase(t, j, "in") is not None and f.hosted_phase(t, j) == "launching"
        ),
    ),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_broker_killed_at_a_step_of_a_move_leaves_the_job_running_once(
    fleet: Fleet, step: str
) -> None:
    # Owner a, source and target b and c: the job counts on once, at one of them, whatever
    # step of the move the SIGKILL of one of the three brokers lands in.
    filler = busy_a(fleet)
    try:
        job_id, log = fleet.submit(HEAVY, f"killed-{step}")
        source = fleet.until_counting(job_id, log)
        assert source != "a"
        target = other(source)
        victim, at_step = STEPS[step]
        sites = {"owner": "a", "source": source, "target": target}
        moving = subprocess.Popen(
            [sys.executable, "-m", "gbroker", "migrate", job_id, "--to", target, "--no-wait"],
            env={**os.environ, "GBROKER_FLEET": str(fleet.directory)},
        )
        poll(lambda: at_step(fleet, job_id, source, target), f"the move at {step}")
        # What `gbroker fleet kill` does, from here: a command's start would miss short steps.
        pid = fleet_control.kill(fleet.directory, sites[victim])
        poll(lambda: not Path(f"/proc/{pid}").exists(), "the broker is gone", 10)
        # The dead broker's journal says where its part of the move stopped: at that step.
        assert at_step(fleet, job_id, source, target), f"the kill missed {step}"
        moving.wait(60)
        restarted = fleet.run("fleet", "restart", sites[victim])
        assert restarted.returncode == 0, restarted.stderr
        waited = fleet.run("wait", job_id, "--json", "--timeout", "180", timeout=240)
        end = json.loads(waited.stdout)
        assert end["state"] == "done", end
        assert end["site"] in (source, target)
        assert fleet.counted(log) == list(range(1, COUNT + 1))
        for site in ("a", "b", "c"):  # every broker is done with the move
            poll(
                lambda site=site: (
                    not fleet.journal(  # type: ignore[misc]
                        site, "SELECT role FROM moves WHERE job_id = ?", job_id
                    )
                ),
                f"{site} forgets the move",
            )
    finally:
        fleet.run("cancel", filler)


def test_a_target_lost_before_it_took_the_job_leaves_it_running_on_at_its_source(
    fleet: Fleet,
) -> None:
    # The target dies while fetching the bundle and stays down: once its lease is out (30 s),
    # the owner calls the move off (the target never took the grant, and now cannot), the
    # frozen copy resumes at the source, and the job ends there, having counted once.
    filler = busy_a(fleet)
    try:
        job_id, log = fleet.submit(HEAVY, "target-lost")
        source = fleet.until_counting(job_id, log)
        target = other(source)
        moved = fleet.run("migrate", job_id, "--to", target, "--no-wait")
        assert moved.returncode == 0, moved.stderr
        fetching = STEPS["fetching"][1]
        poll(lambda: fetching(fleet, job_id, source, target), "the target fetches")
        pid = fleet_control.kill(fleet.directory, target)
        poll(lambda: not Path(f"/proc/{pid}").exists(), "the target is gone", 10)
        waited = fleet.run("wait", job_id, "--json", "--timeout", "180", timeout=240)
        end = json.loads(waited.stdout)
        assert (end["state"], end["site"]) == ("done", source), end
        assert fleet.counted(log) == list(range(1, COUNT + 1))
        assert f"{target} was lost before it took the job" in end.get("move_error", "")
    finally:
        fleet.run("fleet", "restart", target)  # it forgets the job it never took
        fleet.run("cancel", filler)
    poll(
        lambda: not fleet.journal(target, "SELECT role FROM moves WHERE job_id = ?", job_id),
        "the target forgets the move",
    )
