"""``scripts/experiments/netmon_accuracy.py`` end to end, in its smallest form: two shaped namespace
sites.

The figures of docs/NETMON.md come from longer runs; this keeps the script working (real
namespaces, tbf, NetMon's probes, real transfers) and checks the forecast it reports on a
steady link against the bar of 15%.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Alone, after the others (scripts/test.sh): it times transfers over shaped namespace links.
pytestmark = pytest.mark.serial

SCRIPT = [sys.executable, "-m", "scripts.experiments.netmon_accuracy"]


def test_the_accuracy_script_measures_forecasts_on_shaped_links() -> None:
    command = [*SCRIPT, "--rates", "50,100", "--period", "1",
               "--rounds", "1", "--change-rounds", "1", "--transfers", "3",
               "--max-seconds", "1", "--json"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT
    )
    report = json.loads(done.stdout)
    assert report["rates_mbit"] == {"a": 50.0, "b": 100.0}
    table = report["forecasters"]["table (paper, alpha=1)"]
    assert table["steady"]["n"] == 3
    assert table["steady"]["mean"] < 0.15, table
    assert {"ensemble", "table, alpha=0.5"} <= set(report["forecasters"])
    phases = {s["phase"] for s in report["samples"]}
    assert phases == {"steady", "dropped", "recovered", "competing"}
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"{report['netns_prefix']}-" not in out.stdout  # its namespaces are gone
