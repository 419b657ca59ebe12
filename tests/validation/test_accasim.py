"""Validation against the peer simulator AccaSim 1.1.3 (issue 2, point 5).

The published peer figures for KTH-SP2 are in ../shared/data/README.md. FCFS agrees within 3% (in
fact to 0.0004%). Our EASY is textbook EASY, and AccaSim's is not. Each difference is one of the
four rules written down in ``accasim_model.py``, and these tests show it in three ways:
- each rule on a tiny hand-built trace, run through the real AccaSim and through ours;
- our core and driver with those rules added reproduce AccaSim's published figures;
- with those rules, every one of the 28,475 KTH jobs starts when the real AccaSim starts it.

The hand-built traces end with an arrival after the interesting instant: with no event left
but queued jobs, AccaSim steps its clock by one second (event_class.py:509), a fifth rule that
never matters on a real trace.

The real AccaSim runs as a subprocess (scripts/experiments/peer_accasim.py). ``bash
scripts/test.sh`` installs it (the ``peer`` extra), so these tests run in CI and are never skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gbroker.core.localsched import LocalScheduler
from gbroker.sim.replay import ReplayResult, replay
from gbroker.workloads.swf import SwfTrace, read_swf
from tests.conftest import ROOT, shared_data
from tests.validation.accasim_model import AccaSimEasy, AccaSimFifo

PEER = ROOT / "scripts" / "experiments" / "peer_accasim.py"
KTH = shared_data() / "swf" / "KTH-SP2-1996-2.1-cln.swf.gz"

# ../shared/data/README.md: AccaSim 1.1.3 on KTH-SP2, FirstFit, whole trace.
PUBLISHED = {
    "fcfs": {"jobs": 28475, "avg_wait": 389853.73, "avg_bsld": 7518.80, "utilization": 0.6988},
    "easy": {"jobs": 28475, "avg_wait": 6094.66, "avg_bsld": 81.26, "utilization": 0.6992},
}
MODELS: dict[str, type[LocalScheduler]] = {"fcfs": AccaSimFifo, "easy": AccaSimEasy}


def run_peer(trace: Path, policy: str, record: Path) -> dict[str, float]:
    command = [sys.executable, str(PEER), str(trace), "--policy", policy, "--single-node"]
    done = subprocess.run(
        [*command, "--record", str(record)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"AccaSim failed (is the peer extra installed?):\n{done.stderr}"
    report: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def peer_starts(record: Path) -> dict[int, int]:
    starts = {}
    for line in record.read_text().splitlines():
        job, _submit, start, _end, _procs = line.split(",")
        starts[int(job)] = int(start)
    return starts


def figures(result: ReplayResult) -> dict[str, float]:
    s = result.summary
    return {
        "jobs": s.jobs,
        "avg_wait": s.avg_wait,
        "avg_bsld": s.avg_bounded_slowdown,
        "utilization": s.utilization,
    }


def write_swf(path: Path, cores: int, jobs: Sequence[tuple[int, int, int, int]]) -> Path:
    """jobs: (submit, processors, run time, requested time), numbered from 1."""
    lines = [f"; MaxProcs: {cores}", f"; MaxNodes: {cores}"]
    for n, (submit, procs, run, req) in enumerate(jobs, start=1):
        lines.append(f"{n} {submit} -1 {run} {procs} -1 -1 {procs} {req} -1 1 1 1 -1 -1 -1 -1 -1")
    path.write_text("\n".join(lines) + "\n")
    return path


# -- each rule on a hand-built trace, through the real AccaSim --------------------------------

HAND_BUILT = {
    # Rule 1: AccaSim backfills a long job into cores the head has reserved. At t=2 the head (8
    # cores) waits for job 1 to end at 100 (2 cores to spare then); job 3 (3 cores, 500 s) fits
    # now. AccaSim starts it and the head slips to 502; EASY keeps job 3 back, the head starts at
    # 100 and job 3 follows it.
    "reservation not enforced": (
        10,
        [(0, 6, 100, 100), (1, 8, 100, 100), (2, 3, 500, 500)],
        "easy",
        {"ours": [0, 100, 200], "accasim": [0, 502, 2]},
    ),
    # Rule 2: job 1 asks 100 s but ends at 10. The head (5 cores) fits from then on; AccaSim does
    # not try it before its reservation time 100, and then only at the next event (job 3 at 150).
    "head not tried before its reservation": (
        10,
        [(0, 8, 10, 100), (1, 5, 10, 100), (150, 1, 10, 10)],
        "easy",
        {"ours": [0, 10, 150], "accasim": [0, 150, 150]},
    ),
    # Rule 4: job 2 runs 0 s and starts at 10 with job 1's cores; job 3 needs all 4 cores. We end
    # job 2 at 10 and start job 3 at once; AccaSim dispatches again only at the next event (20).
    "zero-length job": (
        4,
        [(0, 4, 10, 10), (5, 2, 0, 10), (5, 4, 10, 10), (20, 1, 10, 10)],
        "fcfs",
        {"ours": [0, 10, 10, 20], "accasim": [0, 10, 20, 30]},
    ),
}


@pytest.mark.parametrize("case", sorted(HAND_BUILT))
def test_each_semantic_difference_on_the_real_peer(case: str, tmp_path: Path) -> None:
    cores, jobs, policy, expected = HAND_BUILT[case]
    trace = write_swf(tmp_path / "case.swf", cores, jobs)
    record = tmp_path / "peer.csv"
    run_peer(trace, policy, record)
    accasim = peer_starts(record)
    assert [accasim[n] for n in range(1, len(jobs) + 1)] == expected["accasim"]

    swf = read_swf(trace)
    assert replay(swf.jobs, cores, policy).start == expected["ours"]
    model = replay(swf.jobs, cores, policy, scheduler_factory=MODELS[policy])
    assert model.start == expected["accasim"]


# -- the whole KTH-SP2 trace ------------------------------------------------------------------


@pytest.fixture(scope="module")
def kth() -> SwfTrace:
    assert KTH.exists(), f"validation data missing: {KTH}"
    return read_swf(KTH)


def test_reader_keeps_the_jobs_accasim_keeps(kth: SwfTrace) -> None:
    assert len(kth.jobs) == 28475
    assert [(s.job, s.reason) for s in kth.skipped] == [(27313, "no processor count")]


@pytest.mark.slow
def test_fcfs_agrees_with_the_published_peer_figures(kth: SwfTrace) -> None:
    ours = figures(replay(kth.jobs, kth.cores, "fcfs"))
    for key, peer in PUBLISHED["fcfs"].items():
        assert ours[key] == pytest.approx(peer, rel=0.03), key
    # Closer than required: the only difference is rule 4 (8 zero-length jobs).
    assert ours["avg_wait"] == pytest.approx(PUBLISHED["fcfs"]["avg_wait"], rel=1e-5)


@pytest.mark.slow
def test_easy_differs_from_the_peer_only_by_its_rules(kth: SwfTrace) -> None:
    ours = figures(replay(kth.jobs, kth.cores, "easy"))
    peer = PUBLISHED["easy"]
    # Textbook EASY keeps every reservation: waits are longer than AccaSim's greedy variant.
    assert ours["avg_wait"] == pytest.approx(6847.37, abs=0.01)
    assert ours["avg_bsld"] == pytest.approx(91.51, abs=0.01)
    assert ours["avg_wait"] / peer["avg_wait"] == pytest.approx(1.1235, abs=1e-3)
    assert ours["utilization"] == pytest.approx(peer["utilization"], rel=0.03)
    # With AccaSim's rules, the same core and driver give the published figures to the digit.
    for policy, model in MODELS.items():
        modelled = figures(replay(kth.jobs, kth.cores, policy, scheduler_factory=model))
        for key, value in PUBLISHED[policy].items():
            assert modelled[key] == pytest.approx(
                value, abs=0.006 if key != "utilization" else 5e-5
            )


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["easy", "fcfs"])
def test_every_kth_job_starts_as_in_the_real_peer(
    policy: str, kth: SwfTrace, tmp_path: Path
) -> None:
    record = tmp_path / "peer.csv"
    report = run_peer(KTH, policy, record)
    assert report["jobs"] == PUBLISHED[policy]["jobs"]
    assert report["avg_wait"] == pytest.approx(PUBLISHED[policy]["avg_wait"], abs=0.006)
    accasim = peer_starts(record)
    model = replay(kth.jobs, kth.cores, policy, scheduler_factory=MODELS[policy])
    differing = [
        (job.id, start, accasim[int(job.id or 0)])
        for job, start in zip(model.jobs, model.start, strict=True)
        if accasim[int(job.id or 0)] != start
    ]
    assert differing == []
