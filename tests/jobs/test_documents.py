""":mod:`gbroker.jobs.documents`: a job description in any format, sniffed, read from a file under
its size limit; garbage is an error, never a traceback."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.model import InputFile, JobClass
from gbroker.jobs.description import MAX_DOCUMENT_BYTES, ApplicationKind, JsdlError, RangeValue
from gbroker.jobs.documents import load_job_description, loads_job_description
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import to_mapping
from tests.jobs.jsdl_documents import DATA, FIXTURES, _job, jsdl_schema


def test_the_fixture_job_in_jsdl_json_and_yaml_is_one_job() -> None:
    jsdl = load_job_description(FIXTURES / "malleable_mpi.jsdl")
    assert load_job_description(FIXTURES / "malleable_mpi.json") == jsdl
    assert load_job_description(FIXTURES / "malleable_mpi.yaml") == jsdl
    assert jsdl.application is ApplicationKind.SPMD
    assert jsdl.arguments == ("--grid", "4096 x 4096")
    assert jsdl.total_cpu_count == RangeValue.between(4, 32)
    job = jsdl.to_job("r0c0-17", "r0c0")
    assert (job.rank, job.max_rank, job.job_class) == (4, 16, JobClass.MALLEABLE)
    assert job.requested_time == 3600
    # The staged-in files: one at r1c1 with its size, one inline (held by the submitting broker);
    # heat.out is staged out only.
    assert job.input_files == (
        InputFile("grid.h5", 268_435_456, "r1c1"),
        InputFile("params.conf", len("alpha = 0.5\nsteps = 1000\n"), "r0c0"),
    )
    jsdl_schema().validate(str(FIXTURES / "malleable_mpi.jsdl"))


def test_content_is_sniffed_when_the_name_says_nothing(tmp_path: Path) -> None:
    jsdl = load_job_description(FIXTURES / "malleable_mpi.jsdl")
    for source in ("malleable_mpi.jsdl", "malleable_mpi.json", "malleable_mpi.yaml"):
        plain = tmp_path / f"{source}.job"
        plain.write_bytes((FIXTURES / source).read_bytes())
        assert load_job_description(plain) == jsdl
    assert loads_job_description(to_jsdl(jsdl)) == jsdl
    assert loads_job_description(json.dumps(to_mapping(jsdl))) == jsdl
    assert loads_job_description(yaml.safe_dump(to_mapping(jsdl)), fmt="yaml") == jsdl


def test_oversized_documents_are_refused_before_parsing(tmp_path: Path) -> None:
    padding = "<!--" + "x" * MAX_DOCUMENT_BYTES + "-->"
    big = _job().replace("<jsdl:JobDescription>", padding + "<jsdl:JobDescription>")
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(big, document="big.jsdl")
    assert caught.value.path == "document"
    assert caught.value.found == len(big.encode())
    assert "expected at most 1048576 bytes (the job description size limit)" in str(caught.value)
    # Not even looked at: garbage over the limit is a size error, not a parse error.
    with pytest.raises(JsdlError, match="at most 100 bytes"):
        parse_jsdl(b"<" * 101, max_bytes=100)
    # A file is read no further than the limit.
    path = tmp_path / "big.json"
    path.write_text(" " * (MAX_DOCUMENT_BYTES + 10) + "{}")
    with pytest.raises(JsdlError) as from_file:
        load_job_description(path)
    assert from_file.value.found == MAX_DOCUMENT_BYTES + 12
    # The 115 KB UNICORE document is well inside it; a smaller limit can be set.
    with pytest.raises(JsdlError, match="at most 65536 bytes"):
        load_job_description(DATA / "unicorex" / "ems__big.jsdl", max_bytes=65536)


def test_malformed_json_and_yaml_name_line_and_column(tmp_path: Path) -> None:
    bad_json = tmp_path / "job.json"
    bad_json.write_text('{"executable": "/bin/x",\n "arguments": [1,}\n')
    with pytest.raises(JsdlError) as caught:
        load_job_description(bad_json)
    assert caught.value.path == "line 2, column 18"
    assert caught.value.expected == "well-formed JSON"
    bad_yaml = tmp_path / "job.yaml"
    bad_yaml.write_text("executable: /bin/x\narguments: [a, b\nname: x\n")
    with pytest.raises(JsdlError) as caught:
        load_job_description(bad_yaml)
    assert caught.value.path.startswith("line 3, column")
    assert caught.value.expected == "well-formed YAML"
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(JsdlError, match="expected a mapping"):
        load_job_description(empty)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_deep_nesting_is_an_error_not_a_recursion_error(fmt: str) -> None:
    with pytest.raises(JsdlError, match=f"expected {fmt.upper()} nested less deeply"):
        loads_job_description("[" * 100_000, fmt=fmt)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_garbage_is_an_error_never_a_traceback(data: bytes | str) -> None:
    for fmt in ("jsdl", "json", "yaml", None):
        with contextlib.suppress(JsdlError):
            loads_job_description(data, fmt=fmt)


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        ('{"executable": "/bin/x", "min_cores": 1' + "0" * 5000 + "}", "json",
         "numbers of at most 4300 digits"),
        ("executable: /bin/x\nmin_cores: 1" + "0" * 5000, "yaml", "well-formed YAML"),
        ("executable: /bin/x\nname: 2020-13-45", "yaml", "well-formed YAML"),
        ("executable: /bin/x\nname: !!timestamp x", "yaml", "well-formed YAML"),
        ("executable: /bin/x\nmin_cores: !!int x", "yaml", "well-formed YAML"),
    ],
)  # fmt: skip
def test_values_the_parsers_choke_on_are_jsdl_errors(text: str, fmt: str, expected: str) -> None:
    # Each of these escaped as a ValueError or AttributeError (a 500) before.
    with pytest.raises(JsdlError) as caught:
        loads_job_description(text, fmt=fmt)
    assert caught.value.expected == expected
    assert len(str(caught.value)) < 400
