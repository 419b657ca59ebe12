"""gbroker.sim.apples: paired worlds, NWS forecasts, and execution agreeing with the planner."""

from __future__ import annotations

import random

import pytest

from gbroker.core.apples import plan
from gbroker.errors import InvalidInput
from gbroker.sim.apples import (
    HISTORY,
    HOPS,
    PERIOD,
    TESTBED,
    Load,
    World,
    execute,
    forecasts,
    jacobi_model,
    run_methods,
)


def test_a_world_is_the_same_whatever_order_it_is_read_in() -> None:
    one, two = World.make(3, 1200), World.make(3, 1200)
    late = [two.cpu["alpha1"].share(HISTORY + 50 * PERIOD), two.hops["wan"].share(HISTORY)]
    assert one.cpu["alpha1"].share(HISTORY + 50 * PERIOD) == late[0]
    assert one.hops["wan"].share(HISTORY) == late[1]
    assert one.cpu_forecast == two.cpu_forecast
    assert one.hop_forecast == two.hop_forecast
    assert World.make(4, 1200).cpu_forecast != one.cpu_forecast


def test_forecasts_are_availabilities_and_bandwidths() -> None:
    world = World.make(0, 1000)
    assert set(world.cpu_forecast) == {m.name for m in TESTBED}
    assert all(0 < v <= 1 for v in world.cpu_forecast.values())
    assert set(world.hop_forecast) == set(HOPS)
    assert all(0 < world.hop_forecast[h] <= 1.2 * HOPS[h][0] for h in HOPS)


def test_in_a_steady_world_forecast_right_the_run_takes_what_the_planner_predicted() -> None:
    world = World(0, 1500)
    for k, m in enumerate(TESTBED):
        world.cpu[m.name] = Load(random.Random(k), 0.0, 0.0)  # never changes
        world.cpu_forecast[m.name] = world.cpu[m.name].share(0.0)
    for k, hop in enumerate(HOPS):
        world.hops[hop] = Load(random.Random(100 + k), 0.0, 0.0)
        world.hop_forecast[hop] = HOPS[hop][0] * world.hops[hop].share(0.0)
    model = jacobi_model(1500, 30)
    resources, link = forecasts(world)
    for select in (True, False):
        chosen = plan(model, resources, link, select=select)
        actual = execute(world, model, chosen.sites, chosen.units)
        assert actual == pytest.approx(chosen.predicted, rel=1e-9)


def test_every_method_runs_and_a_too_small_grid_is_refused() -> None:
    runs = run_methods(1, 1000, 5)
    assert list(runs) == [
        "blocked",
        "compile-time AppLeS",
        "runtime AppLeS, no selection",
        "runtime AppLeS",
    ]
    for r in runs.values():
        assert sum(r.units) == 1000
        assert r.actual > 0
    assert runs["blocked"].units == (125,) * 8
    with pytest.raises(InvalidInput, match=r"^size: expected at least 8 rows"):
        run_methods(0, 7, 5)
