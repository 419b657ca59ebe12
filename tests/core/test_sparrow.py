"""Sparrow's batch sampling and late binding (gbroker.core.sparrow), as the owner broker runs it."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    BrokerCommand,
    ClaimAnswer,
    ClaimRequested,
    Dispatch,
    DispatchPolicy,
    JobQueued,
    JobSubmitted,
    Withdraw,
)
from gbroker.core.model import InputFile, Job, Observation, SiteState
from gbroker.core.requirements import Requirements
from gbroker.core.site import Phase
from gbroker.core.sparrow import probe_count, probe_sites
from gbroker.errors import InvalidInput
from tests.core.reservations import Harness, no_transfer, run_and_settle

MB = 1_000_000


class Scripted:
    """A random source that returns the given draws, in order, and checks each bound."""

    def __init__(self, *draws: tuple[int, int]) -> None:
        self.draws = list(draws)  # (expected stop, value)

    def randrange(self, stop: int, /) -> int:
        expected, value = self.draws.pop(0)
        assert stop == expected, f"drew randrange({stop}), expected randrange({expected})"
        return value


class NoDraws:
    def randrange(self, stop: int, /) -> int:
        raise AssertionError("nothing should be drawn")


def view(**sites: tuple[int, int, int]) -> dict[str, Observation]:
    """site=(total cores, free cores, queued) observed at t=0."""
    return {name: Observation(SiteState(n, c, q), 0.0) for name, (n, c, q) in sites.items()}


def sparrow(rng: object, probe_ratio: float = 2.0, **kw: object) -> Broker:
    policy = DispatchPolicy(Algorithm.SPARROW, probe_ratio=probe_ratio)
    return Broker("a", ["b", "c", "d"], policy, no_transfer, rng, **kw)  # type: ignore[arg-type]


def sites(out: list[BrokerCommand]) -> list[str]:
    """The sites of a decision's dispatches (it must be dispatches only)."""
    assert all(isinstance(c, Dispatch) for c in out), out
    return [c.site for c in out if isinstance(c, Dispatch)]


FOUR = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0), d=(8, 8, 0))


def test_probes_a_partial_fisher_yates_sample_of_the_sites_in_name_order() -> None:
    # S(i) in name order is [a, b, c, d]. Draw 1: randrange(4) = 2 swaps a and c: [c, b, a, d].
    # Draw 2: randrange(3) = 0 keeps b where it is. Probes: c, then b.
    b = sparrow(Scripted((4, 2), (3, 0)))
    job = Job("a.1", 2)
    out = b.handle(JobSubmitted(job), 0.0, FOUR)
    assert out == [
        Dispatch(job, "c", replica=True, deferred=True),
        Dispatch(job, "b", replica=True, deferred=True),
    ]


def test_a_seed_gives_the_same_probes_as_by_hand() -> None:
    # random.Random(0): randrange(4) = 3, then randrange(3) = 1. [a, b, c, d] -> swap a, d ->
    # [d, b, c, a] -> swap b (position 1) and c (1 + 1) -> [d, c, b, a]: probes d and c.
    draws = random.Random(0)
    assert (draws.randrange(4), draws.randrange(3)) == (3, 1)  # the generator's own draws
    b = sparrow(random.Random(0))
    out = b.handle(JobSubmitted(Job("a.1", 2)), 0.0, FOUR)
    assert sites(out) == ["d", "c"]


def test_the_probe_count_is_ceil_of_d_and_all_sites_when_fewer() -> None:
    assert [probe_count(d) for d in (1, 1.5, 2, 2.01, 3)] == [1, 2, 2, 3, 3]
    assert probe_count(2, tasks=5) == 10  # d·m for a job of m tasks, as Sparrow's placer
    # d = 1: one reservation, drawn from the four.
    one = sparrow(Scripted((4, 1)), probe_ratio=1)
    assert sites(one.handle(JobSubmitted(Job("a.1", 1)), 0.0, FOUR)) == ["b"]
    # d = 4 or more: every site of S(i), in name order, with nothing drawn.
    every = sparrow(NoDraws(), probe_ratio=7)
    out = every.handle(JobSubmitted(Job("a.1", 1)), 0.0, FOUR)
    assert sites(out) == ["a", "b", "c", "d"]
    assert probe_sites(["c", "a"], 2, NoDraws()) == ["a", "c"]


def test_only_eligible_sites_are_probed() -> None:
    # b is too small for rank 4, c drains, d is unknown: only a and e are eligible, and with
    # d = 2 both are probed without a draw.
    b = Broker(
        "a",
        ["b", "c", "d", "e"],
        DispatchPolicy(Algorithm.SPARROW),
        no_transfer,
        NoDraws(),
    )
    v = view(a=(8, 0, 5), b=(2, 2, 0), e=(8, 8, 0))
    v["c"] = Observation(SiteState(8, 8, 0, draining=True), 0.0)
    out = b.handle(JobSubmitted(Job("a.1", 4)), 0.0, v)
    assert sites(out) == ["a", "e"]
    # A job pinned to e by its candidate hosts has one eligible site.
    pinned = Job("a.2", 1, requirements=Requirements(candidate_hosts=("e",)))
    assert sites(b.handle(JobSubmitted(pinned), 0.0, v)) == ["e"]
    with pytest.raises(InvalidInput, match="rank"):
        b.handle(JobSubmitted(Job("a.3", 9)), 0.0, v)


def test_loads_and_forecasts_have_no_say() -> None:
    def forecast(src: str, dst: str, size: int) -> float:
        raise AssertionError("Sparrow never asks NetMon")

    job = Job("a.1", 2, input_files=(InputFile("in", 300 * MB, "d"),))
    idle = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0), d=(8, 8, 0))
    busy = view(a=(8, 0, 9), b=(8, 8, 0), c=(8, 0, 4), d=(8, 1, 2))
    probes = []
    for seen in (idle, busy):
        policy = DispatchPolicy(Algorithm.SPARROW)
        b = Broker("a", ["b", "c", "d"], policy, forecast, random.Random(5))
        probes.append(sites(b.handle(JobSubmitted(job), 0.0, seen)))
    # random.Random(5): randrange(4) = 2, randrange(3) = 2: [c, b, a, d] -> [c, d, a, b].
    assert probes == [["c", "d"], ["c", "d"]]


def test_the_first_reservation_to_claim_gets_the_job_and_the_other_is_cancelled() -> None:
    b = sparrow(Scripted((4, 2), (3, 0)))  # probes c and b
    job = Job("a.1", 2)
    b.handle(JobSubmitted(job), 0.0, FOUR)
    for site in ("c", "b"):
        b.handle(JobQueued(job.id, site), 0.5, FOUR)
    first = b.handle(ClaimRequested(job.id, "b"), 1.0, FOUR)
    assert first == [ClaimAnswer(job.id, "b", granted=True), Withdraw(job.id, "c")]
    assert b.handle(ClaimRequested(job.id, "c"), 1.0, FOUR) == [
        ClaimAnswer(job.id, "c", granted=False)
    ]
    assert b.handle(ClaimRequested(job.id, "b"), 1.0, FOUR) == [
        ClaimAnswer(job.id, "b", granted=True)  # a repeated claim: still b's
    ]


def test_reservations_stage_at_placement_only_when_asked() -> None:
    policy = DispatchPolicy(Algorithm.SPARROW, stage_reservations=True)
    b = Broker("a", ["b", "c", "d"], policy, no_transfer, Scripted((4, 2), (3, 0)))
    job = Job("a.1", 2)
    out = b.handle(JobSubmitted(job), 0.0, FOUR)
    assert out == [Dispatch(job, "c", replica=True), Dispatch(job, "b", replica=True)]


def test_a_job_whose_probed_sites_are_full_waits_and_starts_at_the_first_that_frees() -> None:
    h = Harness(Algorithm.SPARROW, {"a": 4, "b": 4, "c": 4, "d": 4}, Scripted((4, 2), (3, 0)))
    # c and b (the probes) are full with another owner's jobs.
    for site in ("b", "c"):
        h.agents[site].accept(Job(f"{site}.busy", 4), site)
    h._pass("b")
    h._pass("c")
    job = Job("a.1", 2, input_files=(InputFile("in", 10 * MB, "a"),))
    h.submit(job)
    h.deliver_all()
    assert h.hosting(job.id) == {"b": Phase.QUEUED, "c": Phase.QUEUED}
    assert h.launched[job.id] == 0
    h.finish("c.busy")  # c frees first: its reservation claims
    assert [(m.kind, m.site) for m in h.pending] == [("report", "c"), ("claim", "c")]
    h.deliver_all()
    assert h.fetches == [(job.id, "c")]  # only the granted reservation fetches its input
    assert h.launched[job.id] == 1
    assert h.where[job.id] == "c"
    assert h.hosting(job.id) == {"c": Phase.RUNNING}  # b's reservation was cancelled
    assert h.agents["b"].local.state().queued == 0
    h.finish("b.busy")
    h.finish(job.id)
    h.deliver_all()
    assert h.launched[job.id] == 1
    assert not h.broker.jobs


def test_a_granted_reservation_holds_its_cores_while_it_fetches_and_cannot_be_withdrawn() -> None:
    h = Harness(Algorithm.SPARROW, {"a": 4, "b": 4, "c": 4, "d": 4}, Scripted((4, 2), (3, 0)))
    job = Job("a.1", 3)
    h.submit(job)
    while not h.fetches:
        h.deliver()
    job_id, site = h.fetches[0]
    assert h.agents[site].hosted[job_id].phase is Phase.FETCHING
    assert h.agents[site].state().free_cores == 1  # its 3 cores wait for the input
    assert not h.agents[site].withdraw(job_id)
    h.deliver_all()
    assert h.launched == Counter({job.id: 1})


def test_the_probe_ratio_and_the_generator_are_checked() -> None:
    for bad in (0.5, 0, -1, float("nan"), float("inf")):
        with pytest.raises(InvalidInput, match="probe_ratio"):
            DispatchPolicy(Algorithm.SPARROW, probe_ratio=bad)
    with pytest.raises(InvalidInput, match="rng"):
        Broker("a", ["b"], DispatchPolicy(Algorithm.SPARROW), no_transfer)


@settings(max_examples=150, deadline=None)
@given(
    ratio=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    seed=st.integers(0, 2**16),
    steps=st.lists(st.tuples(st.sampled_from(["submit", "deliver", "finish"]), st.integers(0, 50))),
)
def test_no_reservation_ever_starts_a_job_twice(
    ratio: float, seed: int, steps: list[tuple[str, int]]
) -> None:
    h = Harness(
        Algorithm.SPARROW, {"a": 4, "b": 2, "c": 4, "d": 3}, random.Random(seed), probe_ratio=ratio
    )
    run_and_settle(h, steps)
