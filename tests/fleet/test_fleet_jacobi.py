"""topologies/jacobi-3.yaml on a netns fleet (issue 28): three sites that differ in CPU share
(1, 0.5, 0.25) and access link, and examples/jacobi2d.py run there as jobs, through the user's
path (``gbroker fleet up --runtime netns``, ``gbroker submit --upload``, ``wait``, ``output``).

One rank of all rows at each site sees its site's cap (CPU time per second of computing); three
ranks, one per site, each given the rank table in its environment as a co-allocated job's
components will be, exchange their rows across the namespaces' shaped links and compute the
serial grid. The caps are hard limits (the kernel's), whatever else runs on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Its fleet takes the host's namespaces and times CPU use: alone, after the others.
pytestmark = pytest.mark.serial

SHARES = {"fast": 1.0, "half": 0.5, "quarter": 0.25}


def gbroker(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k != "GBROKER_FLEET"},
    )


def submit(cwd: Path, site: str, arguments: list[str], env: dict[str, str] | None = None) -> str:
    job = {
        "name": f"jacobi-{site}",
        "executable": "python3",
        "arguments": ["jacobi2d.py", *arguments],
        "environment": env or {},
        "total_cpu_count": {"exact": 1},
        "candidate_hosts": [site],
        "wall_time_limit": 120,
    }
    (cwd / "job.json").write_text(json.dumps(job))
    upload = str(ROOT / "examples" / "jacobi2d.py")
    submitted = gbroker("submit", "job.json", "--upload", upload, cwd=cwd)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def report(cwd: Path, job_id: str, site: str) -> dict[str, object]:
    waited = gbroker("wait", job_id, "--json", cwd=cwd)
    status = json.loads(waited.stdout)
    errors = gbroker("output", job_id, "--stream", "stderr", cwd=cwd).stdout
    assert (status["state"], status["site"]) == ("done", site), (status, errors)
    return dict(json.loads(gbroker("output", job_id, cwd=cwd).stdout))


def test_jacobi2d_runs_at_sites_that_differ_in_cpu_and_across_their_links(tmp_path: Path) -> None:
    topology = ROOT / "topologies" / "jacobi-3.yaml"
    up = gbroker("fleet", "up", "--runtime", "netns", "--topology", str(topology), cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    try:
        record = json.loads((tmp_path / ".gbroker-fleet" / "fleet.json").read_text())
        alone = {}
        for site in SHARES:
            job_id = submit(tmp_path, site, ["--n", "400", "--iterations", "300"])
            alone[site] = report(tmp_path, job_id, site)
        addresses = {m["name"]: m["address"] for m in record["netns"]["members"].values()}
        table = [
            {"rank": r, "site": s, "host": addresses[s], "port": 47100, "cores": 1}
            for r, s in enumerate(SHARES)
        ]
        ids = [
            submit(
                tmp_path,
                site,
                ["--n", "300", "--iterations", "50", "--rows", "160,90,50", "--check"],
                {"GBROKER_RANK": str(rank), "GBROKER_RANKS": json.dumps(table)},
            )
            for rank, site in enumerate(SHARES)
        ]
        ranks = [report(tmp_path, job_id, site) for job_id, site in zip(ids, SHARES, strict=True)]
    finally:
        down = gbroker("fleet", "down", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
    for site, share in SHARES.items():
        got = alone[site]
        assert got["site"] == site
        ratio = float(str(got["compute_cpu_seconds"])) / float(str(got["compute_seconds"]))
        if share < 1:  # the kernel's cap, with room for the quota's first, uncapped period
            assert ratio <= share + 0.15, (site, got)
    assert [r["rows"] for r in ranks] == [160, 90, 50]
    assert [r["site"] for r in ranks] == list(SHARES)
    assert ranks[0]["check"] == "ok", ranks[0]
