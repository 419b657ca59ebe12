"""The shared test harness (tests/harness.py) as a new fleet test uses it: five lines."""

from __future__ import annotations

from pathlib import Path

from tests.harness import ONE_SITE, Fleet


def test_a_job_runs_on_a_fleet_of_one_site(tmp_path: Path) -> None:
    with Fleet(ONE_SITE, tmp_path) as fleet:
        job_id = fleet.submit({"executable": "/bin/true"})
        assert fleet.wait(job_id)["state"] == "done"
        assert fleet.status(job_id)["site"] == "solo"
