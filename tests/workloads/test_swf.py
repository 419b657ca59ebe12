from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.errors import InvalidInput, TraceFormatError
from gbroker.workloads.swf import read_swf

FIXTURE = Path(__file__).parent.parent / "fixtures" / "quirks.swf"


def test_header_fields_and_machine_size() -> None:
    trace = read_swf(FIXTURE)
    assert trace.header.max_procs == 8
    assert trace.header.max_nodes == 8
    assert trace.header.max_jobs == 9
    assert trace.header.unix_start_time == 843480031
    assert trace.header.fields["Computer"].startswith("test machine")
    assert trace.cores == 8
    assert trace.records == 9


def test_every_skip_is_reported_with_its_reason() -> None:
    trace = read_swf(FIXTURE)
    assert [j.id for j in trace.jobs] == [1, 2, 6, 8, 9]
    reasons = {s.job: s.reason for s in trace.skipped}
    assert reasons == {
        3: "unknown run time",
        4: "no processor count",
        5: "more processors than the machine's 8",
        7: "unknown submit time",
    }
    assert len(trace.jobs) + len(trace.skipped) == trace.records
    assert trace.skip_summary()["unknown run time"] == 1


def test_field_fallbacks_and_unknowns() -> None:
    jobs = {j.id: j for j in read_swf(FIXTURE).jobs}
    assert jobs[2].processors == 2  # allocated -1: falls back to requested
    assert jobs[6].requested_time is None  # -1: unknown estimate
    assert jobs[8].run_time > (jobs[8].requested_time or 0)  # kept: runs past its request
    assert jobs[1].run_time == 100


def test_requested_processors_field_and_filters() -> None:
    trace = read_swf(FIXTURE, processors="requested", statuses=frozenset({1}), limit=2)
    assert [j.id for j in trace.jobs] == [1, 2]
    big = read_swf(FIXTURE, cores=32)
    assert 5 in [j.id for j in big.jobs]
    failed = [s for s in read_swf(FIXTURE, statuses=frozenset({1})).skipped if s.job == 6]
    assert failed[0].reason == "status 0 not selected"


def test_gzip_is_recognised_by_content(tmp_path: Path) -> None:
    packed = tmp_path / "trace.data"
    packed.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert read_swf(packed).jobs == read_swf(FIXTURE).jobs


def test_malformed_lines_name_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 4\n1 0 -1 10 1 -1 -1 1 10 -1 1 1 1 -1 -1 -1 -1 -1\n2 5 -1 ten 1\n")
    with pytest.raises(TraceFormatError, match=r"bad.swf:3: job line: expected 18 fields, got 5"):
        read_swf(bad)
    bad.write_text("; MaxProcs: 4\n1 0 -1 1x0 1 -1 -1 1 10 -1 1 1 1 -1 -1 -1 -1 -1\n")
    with pytest.raises(TraceFormatError, match=r"bad.swf:2: field 4 \(run time\)") as info:
        read_swf(bad)
    assert isinstance(info.value, InvalidInput)


def test_a_trace_without_machine_size_needs_cores(tmp_path: Path) -> None:
    bare = tmp_path / "bare.swf"
    bare.write_text("1 0 -1 10 2 -1 -1 2 10 -1 1 1 1 -1 -1 -1 -1 -1\n")
    with pytest.raises(InvalidInput, match="MaxProcs"):
        read_swf(bare)
    assert read_swf(bare, cores=4).jobs[0].processors == 2


def test_broken_gzip_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.swf.gz"
    broken.write_bytes(gzip.compress(FIXTURE.read_bytes())[:40])
    with pytest.raises(InvalidInput, match="gzip"):
        read_swf(broken)


field_value = st.one_of(st.just(-1), st.integers(0, 10**6))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(field_value, min_size=18, max_size=18), max_size=30))
def test_any_well_formed_trace_accounts_for_every_record(rows: list[list[int]]) -> None:
    """Property: every job line is either replayable or skipped with a reason; nothing is lost."""
    import tempfile

    text = "; MaxProcs: 64\n" + "".join(" ".join(map(str, r)) + "\n" for r in rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.swf"
        path.write_text(text)
        trace = read_swf(path)
    assert trace.records == len(rows)
    assert len(trace.jobs) + len(trace.skipped) == len(rows)
    for job in trace.jobs:
        assert 1 <= job.processors <= 64
        assert job.submit >= 0
        assert job.run_time >= 0
