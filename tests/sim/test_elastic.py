"""Speed-up models and the malleable single-site simulator, against hand-computed runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gbroker.core.malleable import MalleabilityPolicy
from gbroker.errors import InvalidInput
from gbroker.sim.elastic import ElasticJob, ElasticResult, load_elastisim, simulate
from gbroker.workloads.speedup import (
    Amdahl,
    Downey,
    ElastiSimApplication,
    ElastiSimPlatform,
    Linear,
)
from tests.conftest import shared_data

ELASTISIM = shared_data() / "elastisim"
PLATFORM = ElastiSimPlatform(
    nodes=16, node_speed=1e11, node_bandwidth=12.5e9, pfs_read=80e9, pfs_write=50e9
)


def test_amdahl_and_downey_as_their_formulas_say() -> None:
    assert Amdahl(100.0, 0.1).run_time(4) == pytest.approx(100 * (0.1 + 0.9 / 4))
    assert Amdahl(100.0, 0.0).run_time(5) == pytest.approx(20.0)
    low = Downey(100.0, parallelism=4, sigma=0.0)
    assert [low.speedup(n) for n in (1, 2, 4, 5, 7, 30)] == [1, 2, 4, 4, 4, 4]
    high = Downey(100.0, parallelism=4, sigma=2.0)
    assert high.speedup(1) == pytest.approx(1.0)
    assert high.speedup(10) == pytest.approx(4.0)  # n = A + A sigma - sigma: the plateau
    assert high.speedup(5) == pytest.approx(5 * 4 * 3 / (2 * 8 + 4))
    assert high.run_time(64) == pytest.approx(25.0)
    mid = Downey(100.0, parallelism=8, sigma=0.5)
    assert mid.speedup(6) == pytest.approx(8 * 6 / (8 + 0.5 * 5 / 2))
    assert mid.speedup(10) == pytest.approx(8 * 10 / (0.5 * 7.5 + 10 * 0.75))
    with pytest.raises(InvalidInput, match=r"amdahl\.serial"):
        Amdahl(1.0, 1.5)
    with pytest.raises(InvalidInput, match=r"downey\.parallelism"):
        Downey(1.0, 0.5, 0.0)


def test_elastisim_s_platform_is_read_from_its_simgrid_file() -> None:
    platform = ElastiSimPlatform.load(ELASTISIM / "crossbar.xml")
    assert platform == ElastiSimPlatform(128, 100e9, 100e9 / 8, 80e9, 50e9)


MODEL = {
    "phases": [
        {
            "iterations": "iterations",
            "evolving_request": "phase_iteration % 2 == 0 ? num_nodes - 4 : num_nodes + 4",
            "tasks": [
                {"type": "cpu", "flops": "flops/num_nodes^alpha", "bytes": "communication_size"},
                {"type": "pfs_write", "bytes": "checkpoint_size"},
            ],
        }
    ]
}
ARGS = {
    "iterations": 4,
    "flops": 8e12,
    "alpha": 1.0,
    "model_size": 8e10,
    "checkpoint_size": 5e10,
    "communication_size": 1.25e10,
}


def test_an_elastisim_application_s_iteration_and_reconfiguration_times() -> None:
    app = ElastiSimApplication.from_model(MODEL, ARGS, PLATFORM)
    # On 8 nodes: compute 8e12 / 8 / 1e11 = 10 s, exchange 1.25e10 * 7/8 / 12.5e9 = 0.875 s
    # (coupled: the longer counts), checkpoint 5e10 / 5e10 = 1 s.
    assert app.iteration_time(8) == pytest.approx(11.0)
    assert app.run_time(8) == pytest.approx(44.0)
    # Read 8e10 B at 80 GB/s (1 s), scatter 8e10 * 7/8 B at 12.5 GB/s (5.6 s).
    assert app.reconfiguration(8) == pytest.approx(1.0 + 5.6)
    assert [app.evolving_request(k, 8) for k in range(3)] == [4, 12, 4]
    bad = {"phases": [{**MODEL["phases"][0], "evolving_request": "num_nodes * 2"}]}
    with pytest.raises(InvalidInput, match="evolving_request"):
        ElastiSimApplication.from_model(bad, ARGS, PLATFORM)
    with pytest.raises(InvalidInput, match="application_model"):
        ElastiSimApplication.from_model(MODEL, {"iterations": 1}, PLATFORM)


def test_pwa_shrinks_a_malleable_job_for_a_rigid_one_and_grows_it_back() -> None:
    """4 cores. A (malleable, 1-4 cores, 100 s on one) starts on 4 at t=0 (25 s of work). B
    (rigid, 2 cores, 20 s) comes at 10: A, 40% done, shrinks to 2; B runs 10-30. Then A grows
    back to 4 with 80% done and ends at 35. Held rigid, A runs 0-25 and B 25-45."""
    jobs = [
        ElasticJob("A", 0.0, "malleable", 1, 4, Linear(100.0, 1)),
        ElasticJob("B", 10.0, "rigid", 2, 2, Linear(20.0, 2)),
    ]
    result = simulate(jobs, 4, MalleabilityPolicy("fpsma", "pwa"))  # type: ignore[arg-type]
    a, b = result.outcomes
    assert (a.start, a.history) == (0.0, ((0.0, 4), (10.0, 2), (30.0, 4)))
    assert a.end == pytest.approx(35.0)
    assert (b.start, b.end) == (10.0, 30.0)
    assert result.makespan == pytest.approx(35.0)
    assert result.utilization == pytest.approx((4 * 10 + 2 * 20 + 4 * 5 + 2 * 20) / (4 * 35))
    held = simulate(jobs, 4, None, hold_rigid=True)
    assert [(o.start, o.end) for o in held.outcomes] == [(0.0, 25.0), (25.0, 45.0)]
    assert (held.mean_wait, held.resizes()) == (7.5, 0)


def test_a_reconfiguration_pauses_the_job_for_its_cost() -> None:
    jobs = [
        ElasticJob("A", 0.0, "malleable", 1, 4, Linear(100.0, 1, cost=2.0)),
        ElasticJob("B", 10.0, "rigid", 2, 2, Linear(20.0, 2)),
    ]
    result = simulate(jobs, 4, MalleabilityPolicy("fpsma", "pwa"))  # type: ignore[arg-type]
    a = result.outcomes[0]
    # Starts: 2 s of no progress, then 8 s at 4 cores (32%); at 10 it shrinks: 2 s pause, then
    # 18 s at 2 cores (36%) until B ends at 30; grows: 2 s pause, 32% left at 4 cores (8 s).
    assert a.end == pytest.approx(30.0 + 2.0 + 8.0)


def test_an_evolving_job_asks_at_each_iteration_and_gets_shrinks_and_free_cores() -> None:
    app = ElastiSimApplication.from_model(MODEL, {**ARGS, "model_size": 0.0}, PLATFORM)
    jobs = [ElasticJob("E", 0.0, "evolving", 2, 16, app, app.iterations)]
    result = simulate(jobs, 12, MalleabilityPolicy("fpsma", "pwa", shrink_for_head=False))  # type: ignore[arg-type]
    (e,) = result.outcomes
    # Starts on 12; asks for 12 + 4 at iteration 1 (only 12 exist: stays), 12 - 4 at 2, 8 + 4 at 3.
    assert [cores for _, cores in e.history] == [12, 8, 12]
    held = simulate(jobs, 12, None, hold_rigid=True)
    assert [cores for _, cores in held.outcomes[0].history] == [12]


def check_never_oversubscribed(result: ElasticResult) -> None:
    changes: list[tuple[float, int]] = []
    for o in result.outcomes:
        sizes = [*o.history, (o.end, 0)]
        previous = 0
        for at, cores in sizes:
            changes.append((at, cores - previous))
            previous = cores
    in_use = 0
    for _, delta in sorted(changes, key=lambda c: (c[0], c[1])):
        in_use += delta
        assert in_use <= result.cores


def test_elastisim_s_500_job_workload_runs_to_the_end_under_every_policy() -> None:
    jobs, platform = load_elastisim(ELASTISIM)
    assert Counter(j.kind for j in jobs) == {
        "rigid": 238,
        "moldable": 163,
        "malleable": 74,
        "evolving": 19,
        "adaptive": 6,
    }
    for policy, hold in (
        (None, True),
        (MalleabilityPolicy("fpsma", "pwa", shrink_for_head=False), False),  # type: ignore[arg-type]
        (MalleabilityPolicy("egs", "pra", reserve=4), False),  # type: ignore[arg-type]
    ):
        result = simulate(jobs, platform.nodes, policy, hold_rigid=hold)
        assert len(result.outcomes) == 500
        assert all(o.start >= o.job.submit and o.end > o.start for o in result.outcomes)
        assert 0 < result.utilization <= 1
        assert (result.resizes() == 0) == hold
        check_never_oversubscribed(result)


def test_bad_workloads_are_refused_naming_the_job() -> None:
    with pytest.raises(InvalidInput, match=r"job\[x\]\.type"):
        ElasticJob("x", 0.0, "elastic", 1, 2, Linear(1.0, 1))
    with pytest.raises(InvalidInput, match="num_nodes_max"):
        ElasticJob("x", 0.0, "moldable", 4, 2, Linear(1.0, 1))
    with pytest.raises(InvalidInput, match="num_nodes_min"):
        simulate([ElasticJob("x", 0.0, "rigid", 8, 8, Linear(1.0, 8))], 4, None)
    with pytest.raises(InvalidInput, match="ElastiSim project"):
        load_elastisim(Path("/nonexistent"))
