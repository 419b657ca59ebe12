"""scripts/experiments/exp_apples.py end to end, quick: the figures' shape, the claims and the exit
status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gbroker.sim.apples import METHODS, check_claims
from tests.conftest import ROOT

SCRIPT = [sys.executable, "-m", "scripts.experiments.exp_apples"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_quick_json_has_every_method_at_every_size_and_both_claims_hold(tmp_path: Path) -> None:
    png = tmp_path / "apples.png"
    out = run("--quick", "--seeds", "20", "--json", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["seeds"], report["iterations"]) == (20, 20)
    assert report["sizes"] == [1000, 1500, 2000]
    assert report["methods"] == list(METHODS)
    assert [row["size"] for row in report["results"]] == report["sizes"]
    for row in report["results"]:
        methods = row["methods"]
        assert list(methods) == list(METHODS)
        for name, figures in methods.items():
            assert len(figures["time"]["values"]) == 20, name
            assert figures["time"]["mean"] > 0
            assert figures["time"]["ci95"] > 0
        # blocked uses all 8 machines and predicts nothing; runtime AppLeS predicts every run
        assert methods["blocked"]["machines"]["values"] == [8.0] * 20
        assert methods["blocked"]["predicted"] is None
        assert len(methods["runtime AppLeS"]["predicted"]["values"]) == 20
        assert methods["runtime AppLeS, no selection"]["machines"]["values"] == [8.0] * 20
        assert 1 <= methods["runtime AppLeS"]["machines"]["mean"] <= 8
    claims = report["claims"]
    assert [c["claim"] for c in claims] == [
        "runtime AppLeS beats blocked at every size",
        "selection is never worse than using every machine",
    ]
    for claim in claims:
        assert claim["holds"] is True
        assert "mean(r) + ci95(r)" in claim["rule"]
        assert [s["size"] for s in claim["sizes"]] == report["sizes"]
        assert all(s["holds"] for s in claim["sizes"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stderr == f"wrote {png}\n"  # no progress off a terminal


def test_a_failing_claim_exits_non_zero_and_names_it_under_the_table() -> None:
    # r = selected / every machine - 1 > -1 always: a tolerance of -1 cannot be met
    out = run("--quick", "--seeds", "20", "--tolerance", "-1")
    assert out.returncode == 1
    assert out.stdout.splitlines()[0].split() == [
        "N", "blocked", "compile-time", "runtime,", "all", "runtime", "AppLeS", "predicted",
        "machines",
    ]  # fmt: skip
    assert "holds: runtime AppLeS beats blocked at every size" in out.stdout
    assert "FAILS: selection is never worse than using every machine" in out.stdout
    assert out.stderr.startswith(
        "claim failed: selection is never worse than using every machine (at N = 1000, 1500, 2000;"
    )
    assert "claim failed: runtime AppLeS beats blocked" not in out.stderr
    assert "Traceback" not in out.stderr


def crafted(blocked: list[float], runtime: list[float], every: list[float]) -> dict[str, object]:
    def figures(values: list[float]) -> dict[str, object]:
        return {"time": {"values": values}}

    methods = {
        "blocked": figures(blocked),
        "compile-time AppLeS": figures(blocked),
        "runtime AppLeS, no selection": figures(every),
        "runtime AppLeS": figures(runtime),
    }
    return {"results": [{"size": 1000, "methods": methods}]}


def test_the_claims_are_judged_on_paired_intervals() -> None:
    # runtime AppLeS slower than blocked in one of three seeds: mean -0.1, too wide to say
    first, second = check_claims(crafted([10, 10, 10], [5, 5, 17], [5, 5, 17]))
    assert not first.holds
    assert first.sizes[0]["holds"] is False
    assert second.holds  # selection equal to every machine: r = 0 <= 0.05
    # clearly faster than blocked, but selection 10% slower than every machine in each seed
    first, second = check_claims(crafted([10, 10, 10], [5.5, 5.5, 5.5], [5, 5, 5]))
    assert first.holds
    assert not second.holds
    assert check_claims(crafted([10, 10, 10], [5.5, 5.5, 5.5], [5, 5, 5]), 0.11)[1].holds


def test_bad_arguments() -> None:
    bad = run("--seeds", "0")
    assert bad.returncode == 2
    assert "argument --seeds: takes an integer >= 1, got 0" in bad.stderr
    assert "Traceback" not in bad.stderr
