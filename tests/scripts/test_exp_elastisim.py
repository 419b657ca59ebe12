"""scripts/experiments/exp_elastisim.py on ElastiSim's own workload: every policy, the JSON and
the Gantt chart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, shared_data

ELASTISIM = shared_data() / "elastisim"


@pytest.mark.slow
def test_the_experiment_script_prints_every_policy_and_draws_the_gantt_chart(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.experiments.exp_elastisim",
            "--data",
            str(ELASTISIM),
            "--json",
            "--gantt",
            str(tmp_path / "g.png"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    figures = json.loads(out.stdout)
    assert set(figures) == {
        "FCFS, held rigid",
        "FCFS + malleability (ElastiSim's example)",
        "FCFS + FPSMA/PRA",
        "FCFS + EGS/PRA",
        "FCFS + FPSMA/PWA",
        "FCFS + EGS/PWA",
    }
    assert figures["FCFS, held rigid"]["resizes"] == 0
    assert all(f["jobs"] == 500 for f in figures.values())
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
