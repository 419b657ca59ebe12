""":mod:`gbroker.jobs.mapping`: the JSON/YAML equivalents of JSDL, their precise field errors and
round trips."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gbroker.jobs.description import ApplicationKind, JobDescription, JsdlError, RangeValue
from gbroker.jobs.documents import loads_job_description
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from tests.jobs.jsdl_documents import _settings, descriptions

# ---------------------------------------------------------------------------------------------
# JSON / YAML


@pytest.mark.parametrize(
    ("data", "path", "expected", "found"),
    [
        ([], "document", "a mapping (a JSON object or YAML mapping)", []),
        ({"exectuable": "/bin/x"}, "exectuable",
         "a known field: did you mean 'executable'? (known fields: gbroker jsdl fields, or "
         "docs/JSDL.md)", "exectuable"),
        ({"executable": "/bin/x", "arguments": "-v"}, "arguments", "a list of strings", "-v"),
        ({"executable": "/bin/x", "arguments": ["-v", 3]}, "arguments[1]", "a string", 3),
        ({"executable": "/bin/x", "number_of_processes": "8"}, "number_of_processes",
         "an integer", "8"),
        ({"executable": "/bin/x", "number_of_processes": True}, "number_of_processes",
         "an integer", True),
        ({"executable": "/bin/x", "number_of_processes": 0}, "number_of_processes",
         "an integer >= 1", 0),
        ({"executable": "/bin/x", "total_cpu_count": {"lower": 8, "upper": 2}},
         "total_cpu_count.upper", ">= lower (8)", 2),
        ({"executable": "/bin/x", "total_cpu_count": {"min": 2}}, "total_cpu_count.min",
         "a known field (known: exact, lower, upper)", "min"),
        ({"executable": "/bin/x", "total_cpu_count": {"exact": 2, "upper": 4}}, "total_cpu_count",
         "exact alone, or lower and/or upper", ["exact", "upper"]),
        ({"executable": "/bin/x", "total_cpu_count": 2.5}, "total_cpu_count", "an integer", 2.5),
        ({"executable": "/bin/x", "total_cpu_time": "1h"}, "total_cpu_time",
         "a mapping (a JSON object or YAML mapping)", "1h"),
        ({"executable": "/bin/x", "environment": ["A=1"]}, "environment",
         "a mapping of variable names to values", ["A=1"]),
        ({"executable": "/bin/x", "environment": {"A B": "1"}}, "environment",
         "variable names without '=' or spaces", "A B"),
        ({"executable": "/bin/x", "staging": [{"file_name": "a"}, {"file_name": "b", "size": -1}]},
         "staging[1].size", "an integer >= 0", -1),
        ({"executable": "/bin/x", "staging": [{"source": "http://x"}]}, "staging[0].file_name",
         "a file name", None),
        ({"executable": "/bin/x", "staging": [{"file_name": "a", "creation_flag": "replace"}]},
         "staging[0].creation_flag", "overwrite, append or dontOverwrite", "replace"),
        ({"executable": "/bin/x", "job_class": "elastic"}, "job_class",
         "rigid, moldable or malleable", "elastic"),
        ({"executable": "/bin/x", "application": "posix", "number_of_processes": 4},
         "application", "spmd for a job with SPMD fields", ApplicationKind.POSIX),
        ({"executable": "/bin/x", "min_cores": 8, "max_cores": 4}, "max_cores",
         "at least 8 cores (min_cores)", 4),
        ({"arguments": ["-v"]}, "executable", "an executable or an application name", None),
        ({"executable": "/bin/\x00x"}, "executable", "text without control characters",
         "/bin/\x00x"),
    ],
)  # fmt: skip
def test_mappings_get_precise_field_errors(
    data: object, path: str, expected: str, found: object
) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping(data, document="job.yaml")
    err = caught.value
    assert (err.document, err.path, err.found) == ("job.yaml", path, found)
    assert err.expected.startswith(expected)


def test_a_bare_number_is_an_exact_range_in_mappings() -> None:
    desc = from_mapping({"executable": "/bin/x", "total_cpu_count": 16, "total_cpu_time": 60.5})
    assert desc.total_cpu_count == RangeValue.exact(16)
    assert desc.total_cpu_time == RangeValue.exact(60.5)
    assert to_mapping(desc)["total_cpu_count"] == {"exact": 16}


@_settings
@given(descriptions())
def test_mapping_json_and_yaml_round_trips(desc: JobDescription) -> None:
    mapping = to_mapping(desc)
    assert from_mapping(mapping) == desc
    assert loads_job_description(json.dumps(mapping), fmt="json") == desc
    # PyYAML writes NEL, LS and PS unquoted and then reads them as line breaks: its bug, not ours.
    assume(not any(c in json.dumps(mapping, ensure_ascii=False) for c in "\x85\u2028\u2029"))
    assert loads_job_description(yaml.safe_dump(mapping, allow_unicode=True), fmt="yaml") == desc


def test_an_error_about_a_huge_shared_structure_is_small_and_quick() -> None:
    # What the alias bomb built: a few nodes whose repr is astronomically long.
    value: list[Any] = ["lol"] * 9
    for _ in range(40):
        value = [value] * 9
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", "arguments": value})
    assert caught.value.path == "arguments[0]"
    assert len(str(caught.value)) < 300


def test_an_error_quotes_a_bounded_snippet_of_a_long_value() -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", "wall_time_limit": "9" * 1_000_000})
    message = str(caught.value)
    assert message.startswith("<mapping>: wall_time_limit: expected an integer, got '999")
    assert "(str of length 1000000)" in message
    assert len(message) < 300


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        ({"min_cores": 1e23}, "min_cores", "an integer from 1 to 1048576"),
        ({"max_cores": 2**63}, "max_cores", "an integer from 1 to 1048576"),
        ({"number_of_processes": 2**64}, "number_of_processes", "an integer from 1 to 1048576"),
        ({"threads_per_process": 10**400}, "threads_per_process", "an integer from 1 to"),
        ({"wall_time_limit": 2**63}, "wall_time_limit", "whole seconds from 0 to 316224000"),
        ({"cpu_time_limit": 1e300}, "cpu_time_limit", "whole seconds from 0 to"),
        ({"total_cpu_count": 2**63}, "total_cpu_count", "CPU counts that are whole numbers"),
        ({"total_cpu_count": {"lower": 1, "upper": 1e23}}, "total_cpu_count", "CPU counts"),
        ({"total_cpu_time": {"upper": 1e300}}, "total_cpu_time", "seconds from 0 to"),
        ({"staging": [{"file_name": "a", "size": 2**63}]}, "staging[0].size",
         "a size in bytes from 0 to 1125899906842624"),
    ],
)  # fmt: skip
def test_huge_integers_are_refused_naming_the_field(
    data: dict[str, Any], path: str, expected: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", **data}, document="job.json")
    assert caught.value.path == path
    assert caught.value.expected.startswith(expected)
    # The same through JSON text (1e23 is a float there, 2**63 an int).
    with pytest.raises(JsdlError):
        loads_job_description(json.dumps({"executable": "/bin/x", **data}), fmt="json")


_json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_job_keys = st.sampled_from(
    ["executable", "arguments", "environment", "input", "output", "error", "working_directory",
     "wall_time_limit", "cpu_time_limit", "min_cores", "max_cores", "number_of_processes",
     "total_cpu_count", "total_cpu_time", "staging", "job_class", "application"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_job_keys, _json_values, max_size=6))
def test_any_mapping_is_a_usable_job_or_a_jsdl_error(data: dict[str, Any]) -> None:
    import msgpack

    data.setdefault("executable", "/bin/x")
    texts = [(json.dumps(data), "json")]
    with contextlib.suppress(yaml.YAMLError, ValueError, OverflowError):
        texts.append((yaml.safe_dump(data), "yaml"))
    messages = []
    for text, fmt in texts:
        try:
            desc = loads_job_description(text, fmt=fmt)
        except JsdlError as exc:
            messages.append(str(exc))
            continue
        # Accepted means usable: a job for the schedulers, a journal entry, a JSDL document.
        desc.to_job("s0.1", "s0")
        msgpack.packb(to_mapping(desc))
        assert parse_jsdl(to_jsdl(desc)) == desc
    assert all(len(message) < 1500 for message in messages)


@pytest.mark.parametrize(
    ("mapping", "path", "expected"),
    [
        ({"filesystem_names": {"outptu": "S"}, "output": "x"}, "filesystem_names.outptu",
         "a path field"),
        ({"filesystem_names": {"input": "S"}}, "filesystem_names.input",
         "a reference to a field the job has"),
        ({"filesystem_names": {"arguments[0]": "S"}, "arguments": ["../x"]},
         "filesystem_names.arguments[0]", "a relative path"),
        ({"file_systems": [{"type": "normal"}]}, "file_systems[0].name", "a file system name"),
        ({"file_systems": [{"name": "S", "disk_space": {"lower": -1}}]},
         "file_systems[0].disk_space.lower", "a number >= 0"),
        ({"exclusive_execution": "yes"}, "exclusive_execution", "true or false"),
        ({"staging": [{"file_name": "f", "filesystem": ""}]}, "staging[0].filesystem",
         "a file system name"),
    ],
)  # fmt: skip
def test_new_mapping_fields_get_precise_errors(
    mapping: dict[str, Any], path: str, expected: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/true", **mapping}, document="job.yaml")
    assert caught.value.path == path
    assert caught.value.expected.startswith(expected)


def test_staging_only_needs_staging_and_no_program_fields() -> None:
    assert from_mapping({"staging": [{"file_name": "f", "inline_data": "x"}]}).staging_only
    with pytest.raises(JsdlError, match="executable: expected an executable"):
        from_mapping({"arguments": ["x"], "staging": [{"file_name": "f", "inline_data": "x"}]})
    with pytest.raises(JsdlError, match="executable: expected an executable"):
        from_mapping({"name": "nothing"})


# -- unknown keys of a JSON/YAML job: the nearest first, a short list


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        ("executable: x\nexecutabel: y\n", "executabel",
         "a known field: did you mean 'executable'? (known fields: gbroker jsdl fields, or "
         "docs/JSDL.md)"),
        ("executable: x\nwall_time: 5\n", "wall_time",
         "a known field: did you mean 'wall_time_limit' or 'total_cpu_time'? (known fields: "
         "gbroker jsdl fields, or docs/JSDL.md)"),
        ("executable: x\njob_class: malleable\nmalleability: {size: power2}\n",
         "malleability.size",
         "a known field: did you mean 'sizes'? (known: sizes, initiative, obligation, "
         "deadline, reconfiguration_cost, evolving, initial)"),
        ("executable: x\nstaging: [{file_name: a, sorce: 'http://x/a'}]\n", "staging[0].sorce",
         "a known field: did you mean 'source'? (known: file_name, source, target, "
         "creation_flag, delete_on_termination, inline_data, site, size, filesystem)"),
        ("executable: x\nfile_systems: [{name: S, mount: /s}]\n", "file_systems[0].mount",
         "a known field: did you mean 'mount_point'? (known: name, type, description, "
         "mount_point, disk_space)"),
        ("executable: x\nswep: {}\n", "swep",
         "a known field: did you mean 'sweep'? (known fields: gbroker jsdl fields, or "
         "docs/JSDL.md)"),
        ("executable: x\nname: a\nsweep: {assignments: [{parameters: [name], value: [b]}]}\n",
         "sweep.assignments[0].value",
         "a known field: did you mean 'values'? (known: parameters, values, loop_integer, "
         "loop_double)"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_nearest_known_ones_in_a_short_line(
    text: str, path: str, expected: str
) -> None:
    from gbroker.jobs.sweep import loads_submission

    with pytest.raises(JsdlError) as caught:
        loads_submission(text, document="job.yaml", fmt="yaml")
    assert (caught.value.path, caught.value.expected) == (path, expected)
    assert len(str(caught.value)) < 300
