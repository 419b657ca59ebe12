"""scripts/experiments/fig5_central.py end to end, small: every line of Fig. 5, the paired
comparisons against GridWay 5.6.1 and the other baselines, the CSV, the plot and GridWay's
sensitivity table."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = [sys.executable, "-m", "scripts.experiments.fig5_central"]


def test_every_line_and_gridways_sensitivity(tmp_path: Path) -> None:
    out = subprocess.run(
        [*SCRIPT, "--seeds", "1", "--jobs", "24", "--rates", "0.6",
         "--out", str(tmp_path), "--sensitivity"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    with (tmp_path / "fig5.csv").open() as f:
        rows = list(csv.DictReader(f))
    algorithms = {row["line"]: row["algorithm"] for row in rows}
    assert len(algorithms) == 12
    assert sorted(set(algorithms.values())) == ["central", "dm", "federation", "gridway", "sparrow"]
    assert all(int(row["double_starts"]) == 0 for row in rows)
    assert (tmp_path / "fig5.png").stat().st_size > 0
    text = out.stdout
    # GBroker against each baseline, paired over the seeds, six streams and one.
    for other in ("G' GridWay 5.6.1, six streams", "S' Sparrow d=2, six streams",
                  "F' federation, six streams", "C' central bound, six streams"):  # fmt: skip
        assert f"B(3 GBroker DM 2D torus, six streams) − B({other}):" in text
    assert "B(1 GBroker DM full graph, one stream) − B(G GridWay 5.6.1, one stream):" in text
    # The sensitivity table: one row per combination, and a verdict.
    table = text.split("GridWay's settings at Λ = 0.6 (six streams)", 1)[1]
    verdicts = [line for line in table.splitlines() if line.strip().endswith(("+", "−", "≈"))]
    assert len(verdicts) == 4 * 3 * 3 * 2 * 2  # intervals, chunks, resources, users, drivers
    assert "GridWay wins on throughput with:" in text or "No combination" in text
