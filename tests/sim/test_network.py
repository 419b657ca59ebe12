from __future__ import annotations

from collections.abc import Callable

import pytest

from gbroker.sim.kernel import Kernel
from gbroker.sim.network import FlowNetwork, Transfer


def star(kernel: Kernel, up: dict[str, float], latency: float = 0.0) -> FlowNetwork:
    """Sites with an uplink and a downlink each (capacity from ``up``)."""

    def route(a: str, b: str) -> tuple[tuple[tuple[str, ...], ...], float]:
        return (("up", a), ("down", b)), latency

    def capacity(resource: tuple[str, ...]) -> float:
        return up[resource[1]]

    return FlowNetwork(kernel, route, capacity)


def collect(done: list[tuple[str, float]], kernel: Kernel) -> Callable[[Transfer], None]:
    def on_done(t: Transfer) -> None:
        done.append((t.target, kernel.now))

    return on_done


def test_one_transfer_takes_size_over_bandwidth_plus_latency() -> None:
    k = Kernel()
    net = star(k, {"a": 10.0, "b": 100.0}, latency=0.5)
    done: list[tuple[str, float]] = []
    net.send("a", "b", 100, collect(done, k))
    k.run()
    assert dict(done) == pytest.approx({"b": 10.5})
    assert net.bytes_moved == 100


def test_concurrent_transfers_share_the_source_uplink() -> None:
    # Copying the same 100 bytes to 4 sites over a 10 B/s uplink: each gets 2.5 B/s -> 40 s,
    # four times as long as one copy: the effect behind DR(m=6)'s degradation in the paper.
    k = Kernel()
    net = star(k, {"x": 10.0, "a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0})
    done: list[tuple[str, float]] = []
    for site in "abcd":
        net.send("x", site, 100, collect(done, k))
    k.run()
    assert dict(done) == pytest.approx(dict.fromkeys("abcd", 40.0))


def test_max_min_fairness_gives_leftover_bandwidth_to_unconstrained_flows() -> None:
    # x->a is limited by a's downlink (2 B/s); x->b then gets the rest of x's 10 B/s uplink (8).
    k = Kernel()
    net = star(k, {"x": 10.0, "a": 2.0, "b": 100.0})
    done: list[tuple[str, float]] = []
    net.send("x", "a", 20, collect(done, k))
    net.send("x", "b", 80, collect(done, k))
    k.run()
    assert dict(done) == {"a": pytest.approx(10.0), "b": pytest.approx(10.0)}


def test_rates_change_when_a_transfer_ends() -> None:
    # Two flows share 10 B/s; the short one (50 B) ends at 10 s, then the long one (150 B, 50 left
    # at 10 s... 150 - 5*10 = 100 left) runs alone at 10 B/s: ends at 20 s.
    k = Kernel()
    net = star(k, {"x": 10.0, "a": 100.0, "b": 100.0})
    done: list[tuple[str, float]] = []
    net.send("x", "a", 50, collect(done, k))
    net.send("x", "b", 150, collect(done, k))
    k.run()
    assert dict(done) == {"a": pytest.approx(10.0), "b": pytest.approx(20.0)}


def test_local_and_empty_transfers_cost_no_bandwidth() -> None:
    k = Kernel()
    net = star(k, {"x": 1.0, "a": 1.0}, latency=0.25)
    done: list[tuple[str, float]] = []
    net.send("x", "x", 10**9, collect(done, k))
    net.send("x", "a", 0, collect(done, k))
    k.run()
    assert sorted(done) == [("a", 0.25), ("x", 0.0)]
