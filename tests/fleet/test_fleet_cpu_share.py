"""Sites that differ in CPU (issue 28): a topology site's ``cpu_share`` caps the CPU time of
every job there, through the user's path: ``gbroker fleet up`` of a topology whose site ``slow``
has ``cpu_share: 0.25``, a 1-core CPU-bound job submitted with ``gbroker submit`` to each site.

The job spins for 2 s of wall time and prints the CPU time it got per second of wall time. At
``slow`` it gets a quarter of a core at most; at ``fast`` (no share) what the machine has to give
(more: the comparison is relative, as other work may share the machine's CPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

# It times CPU use: alone, after the others (scripts/test.sh).
pytestmark = pytest.mark.serial

SPIN = """\
import json, time
wall, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() - wall < 2.0:
    pass
print(json.dumps((time.process_time() - cpu) / (time.perf_counter() - wall)))
"""


def test_a_sites_cpu_share_caps_its_jobs_cpu_time(tmp_path: Path) -> None:
    sites = [SiteSpec("slow", 1, cpu_share=0.25), SiteSpec("fast", 1)]
    save_topology(Topology(sites, "full", name="shares"), tmp_path / "shares.yaml")
    up = gbroker("fleet", "up", "--topology", "shares.yaml", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    try:
        seen = {}
        for site in ("slow", "fast"):
            job = {
                "name": f"spin-{site}",
                "executable": "python3",
                "arguments": ["-c", SPIN],
                "total_cpu_count": {"exact": 1},
                "candidate_hosts": [site],
                "wall_time_limit": 60,
            }
            (tmp_path / f"{site}.json").write_text(json.dumps(job))
            submitted = gbroker("submit", f"{site}.json", cwd=tmp_path)
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            waited = gbroker("wait", job_id, "--json", cwd=tmp_path)
            status = json.loads(waited.stdout)
            errors = gbroker("output", job_id, "--stream", "stderr", cwd=tmp_path).stdout
            assert (status["state"], status["site"]) == ("done", site), (status, errors)
            output = gbroker("output", job_id, cwd=tmp_path)
            seen[site] = json.loads(output.stdout)
        log = (tmp_path / ".gbroker-fleet" / "slow.log").read_text()
        assert "site slow: jobs' CPU time capped at 0.25 of each core" in log
    finally:
        down = gbroker("fleet", "down", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
    assert seen["slow"] <= 0.5, seen  # held near 0.25 by the kernel, whatever else runs
    assert seen["fast"] > seen["slow"], seen
