from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from gbroker.errors import InvalidInput
from gbroker.workloads.streams import (
    PAPER_RANKS,
    SPEC_MPI_PROGRAMS,
    iter_poisson_stream,
    lazy_streams,
    paper_streams,
    swf_arrivals,
)
from gbroker.workloads.trace import TraceJob


def test_poisson_stream_has_the_requested_intensity_and_the_paper_job_model() -> None:
    arrivals = list(iter_poisson_stream(random.Random(5), 0.25, 20_000, "Xeon80", "Xeon80"))
    gaps = [b.time - a.time for a, b in itertools.pairwise(arrivals)]
    assert sum(gaps) / len(gaps) == pytest.approx(4.0, rel=0.03)  # 1/λ
    ranks = Counter(a.job.rank for a in arrivals)
    assert set(ranks) == set(PAPER_RANKS)
    assert min(ranks.values()) > 0.23 * len(arrivals)  # uniform over {1, 2, 4, 8}
    programs = Counter(a.job.input_files[0].name for a in arrivals)
    assert len(programs) == len(SPEC_MPI_PROGRAMS)
    for a in arrivals[:50]:
        assert a.job.input_files[0].site == "Xeon80"
        assert a.job.requested_time == pytest.approx(a.run_time * 1.5)
        assert a.job.id.startswith("Xeon80.")


def test_amdahl_run_times() -> None:
    wrf = SPEC_MPI_PROGRAMS[0]
    assert wrf.run_time(1) == wrf.run_time_1
    assert wrf.run_time(8) == pytest.approx(wrf.run_time_1 * (0.05 + 0.95 / 8))


def test_streams_split_the_total_and_merge_by_time() -> None:
    arrivals = paper_streams(random.Random(1), 0.1, 301, ["a", "b", "c"], None)
    assert len(arrivals) == 301
    assert Counter(a.entry for a in arrivals) == {"a": 101, "b": 100, "c": 100}
    assert [a.time for a in arrivals] == sorted(a.time for a in arrivals)
    assert all(a.job.input_files[0].site == a.entry for a in arrivals)  # data at the entry
    assert len({a.job.id for a in arrivals}) == 301
    again = paper_streams(random.Random(1), 0.1, 301, ["a", "b", "c"], None)
    assert again == arrivals


def test_lazy_streams_are_one_poisson_stream_per_entry_drawn_in_time_order() -> None:
    entries = [f"s{k}" for k in range(8)]
    arrivals = list(lazy_streams(3, 0.05, 16_000, entries, None))
    assert len(arrivals) == 16_000
    assert [a.time for a in arrivals] == sorted(a.time for a in arrivals)
    per_entry = Counter(a.entry for a in arrivals)
    assert set(per_entry) == set(entries)
    assert all(abs(n - 2_000) < 4 * 2_000**0.5 for n in per_entry.values())  # multinomial
    for entry in ("s0", "s7"):  # each entry's own stream has intensity λ: mean gap 1/λ = 20 s
        times = [a.time for a in arrivals if a.entry == entry]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert sum(gaps) / len(gaps) == pytest.approx(20.0, rel=0.06)
        ids = [a.job.id for a in arrivals if a.entry == entry]
        assert ids == [f"{entry}.{n}" for n in range(len(ids))]
    assert all(a.job.input_files[0].site == a.entry for a in arrivals[:100])
    again = list(lazy_streams(3, 0.05, 100, entries, "s2"))
    assert again == list(lazy_streams(3, 0.05, 100, entries, "s2"))  # fixed by the seed
    assert {a.job.input_files[0].site for a in again} == {"s2"}


def test_swf_jobs_are_split_over_sites_and_oversized_ones_reported() -> None:
    trace = [TraceJob(0, 4, 10, 20, 1), TraceJob(5, 64, 10, 20, 2), TraceJob(9, 1, 3, None, 3)]
    arrivals, skipped = swf_arrivals(trace, ["x", "y"], random.Random(0), max_cores=32)
    assert [a.job.rank for a in arrivals] == [4, 1]
    assert skipped == [(2, "more processors than the largest site's 32")]
    assert arrivals[1].job.requested_time is None


def test_bad_parameters() -> None:
    with pytest.raises(InvalidInput, match="rate"):
        iter_poisson_stream(random.Random(0), 0.0, 10, "a", None)
    with pytest.raises(InvalidInput, match="entries"):
        paper_streams(random.Random(0), 0.1, 10, [], None)
    with pytest.raises(InvalidInput, match="entries"):
        lazy_streams(0, 0.1, 10, [], None)
    with pytest.raises(InvalidInput, match="distinct"):
        lazy_streams(0, 0.1, 10, ["a", "a"], None)
    with pytest.raises(InvalidInput, match="rate"):
        lazy_streams(0, -1.0, 10, ["a"], None)
    with pytest.raises(InvalidInput, match="jobs"):
        lazy_streams(0, 0.1, -1, ["a"], None)
