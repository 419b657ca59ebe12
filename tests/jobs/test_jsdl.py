"""JSDL job descriptions: every real document in shared/data/jsdl, the official XSDs, hostile XML,
the JSON/YAML equivalents, round trips (with hypothesis) and the ``gbroker jsdl check`` command."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import defusedxml.ElementTree as SafeET
import pytest
import xmlschema
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gbroker.core.model import InputFile, JobClass
from gbroker.errors import GBrokerError
from gbroker.jobs.description import (
    GBROKER_NS,
    JSDL_NS,
    MAX_DOCUMENT_BYTES,
    POSIX_NS,
    SPMD_NS,
    SPMD_VARIATION_PREFIX,
    SPMD_VARIATIONS,
    ApplicationKind,
    CreationFlag,
    FileSystem,
    JobDescription,
    JsdlError,
    RangeValue,
    StagingEntry,
)
from gbroker.jobs.documents import load_job_description, loads_job_description, summary
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from tests.conftest import shared_data

DATA = shared_data() / "jsdl"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "jsdl"
DESC = "JobDefinition/JobDescription"
APP = f"{DESC}/Application"
RES = f"{DESC}/Resources"
GRIDWAY_HOST = "gsiftp://hydrus.dacya.ucm.es/home/jose"
OPENMPI = "http://www.ogf.org/jsdl/2007/02/jsdl-spmd/OpenMPI"


# ---------------------------------------------------------------------------------------------
# Every document in shared/data/jsdl: what it must parse to, or why it must be rejected


@dataclass(frozen=True)
class Parsed:
    """Spot checks of a document that must parse (and of the job derived from it)."""

    executable: str | None
    arguments: tuple[str, ...] = ()
    application_name: str | None = None
    application: ApplicationKind | None = ApplicationKind.POSIX
    rank: int = 1
    max_rank: int | None = None
    job_class: JobClass = JobClass.RIGID
    requested_time: float | None = None
    stage_in: tuple[tuple[str, str | None], ...] = ()
    stage_out: tuple[tuple[str, str], ...] = ()
    more: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejected:
    """A document that must be refused: where, and what was expected."""

    path: str
    expected: str
    found: object = None


def _gridway(stage_in: tuple[str, ...], stage_out: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    return {
        "name": "Simple Application GW Template vs JSDL",
        "application_name": "ls",
        "input": None,  # /dev/null reads as no Input
        "output": "stdout.${JOB_ID}",
        "error": "stderr.${JOB_ID}",
        "candidate_hosts": ("*.dacya.ucm.es",),  # GridWay's <CandidateHost>
        "staged_in_names": stage_in,
    }


_GW_OUT_STD = (
    ("stdout.${JOB_ID}", f"{GRIDWAY_HOST}/stdout.${{JOB_ID}}"),
    ("stderr.${JOB_ID}", f"{GRIDWAY_HOST}/stderr.${{JOB_ID}}"),
)
_UNICORE_STDIO = {"input": "stdin", "output": "stdout", "error": "stderr"}
_NOTHING_TO_RUN = "an Executable (in POSIXApplication, HPCProfileApplication or SPMDApplication)"
_FRAGMENT = (
    "IndividualCPUCount",
    f"the root element JobDefinition in namespace {JSDL_NS} (a JSDL fragment, not a job "
    "definition)",
    f"{{{JSDL_NS}}}IndividualCPUCount",
)
_NO_FILE_NAME = "a FileName (the file's name in the job's directory)"
_STAGING_SCHEDULE = Rejected(
    f"{DESC}/DataStaging[1]/StagingSchedule",
    "an element JSDL defines in DataStaging (StagingSchedule is not JSDL's",
    "StagingSchedule",
)
_SAMPLE_HPC = Parsed(
    "bin/stdin.txt",
    ("-rn",),
    application=ApplicationKind.HPCPA,  # under schemas.ogf.org, as UNICORE writes it
    stage_in=(("bin/stdin.txt", "ftp://sunfire2.cs.virginia.edu:5213/gridsam.sh"),),
    stage_out=(("stdout.txt", "ftp://sunfire2.cs.virginia.edu:5213/enter_file_name_here.out"),),
    more={"total_cpu_count": RangeValue.exact(1), "output": "stdout.txt", "name": None},
)

EXPECTED: dict[str, Parsed | Rejected] = {
    # GridWay writes jsdl-hpcpa: without declaring the prefix.
    "gridway/HPCProfileExample.xml": Rejected(
        "line 22, column 4",
        "well-formed XML",
        "unbound prefix jsdl-hpcpa (no xmlns:jsdl-hpcpa in scope)",
    ),
    "gridway/POSIXProfileExample.xml": Parsed(
        "/bin/ls",
        ("-la file1.txt file2.txt file3.txt> output1.txt output2 output3.zaz",),
        application_name="ls",
        stage_in=tuple((f"file{i}.txt", f"{GRIDWAY_HOST}/file1.txt") for i in (1, 2, 3)),
        stage_out=(
            ("output1.txt", GRIDWAY_HOST),
            ("output2", GRIDWAY_HOST),
            ("output3.zas", GRIDWAY_HOST),
            *_GW_OUT_STD,
        ),
        more={
            **_gridway(("file1.txt", "file2.txt", "file3.txt"), ()),
            "environment": {"LD_LIBRARY_PATH": "/usr/local/lib", "GW_LOCATION": "/local/home/jose"},
            "individual_cpu_count": RangeValue.exact(10),
        },
    ),
    "gridway/basicExample.xml": Parsed(
        "/bin/ls",
        ("-la file.txt",),
        application_name="ls",
        stage_in=(("file.txt", f"{GRIDWAY_HOST}/file.txt"),),
        stage_out=_GW_OUT_STD,
        more={
            **_gridway(("file.txt",), ()),
            "environment": {"LD_LIBRARY_PATH": "/usr/local/lib"},
            "individual_cpu_count": None,
        },
    ),
    # 115 KB, mostly a GridBean model in another namespace (ignored).
    "unicorex/ems__big.jsdl": Parsed(
        None, application_name="Date", application=None, more={"application_version": "1.0"}
    ),
    "unicorex/ems__date.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        more={"name": "my test job", "application_version": "1.0"},
    ),
    "unicorex/ems__date_with_inlinedata.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        stage_in=(("infile.txt", "inline://dummy"),),
        more={"inline": {"infile.txt": "test data"}, "input_sizes": {"infile.txt": 9}},
    ),
    "unicorex/ems__date_with_redirect.jsdl": Parsed(
        "/bin/date", more={"output": "myout", "error": "myerr"}
    ),
    "unicorex/ems__date_with_resources.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        requested_time=30.0,  # IndividualCPUTime, the only time it gives
        more={"projects": ("testing_project",), "individual_cpu_time": RangeValue.exact(30)},
    ),
    "unicorex/ems__email.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        more={"annotations": ("user email: test@foo.bar",)},
    ),
    "unicorex/ems__empty.jsdl": Rejected(DESC, _NOTHING_TO_RUN, "an empty JobDescription"),
    # DataStaging before Application and no CreationFlag: schema-invalid, accepted.
    "unicorex/ems__ls_with_stagein.jsdl": Parsed(
        "/bin/ls",
        ("-l",),
        stage_in=(("infile.txt", "file:///etc/hosts"),),
        more={"creation_flags": (CreationFlag.OVERWRITE,)},
    ),
    "unicorex/ems__non-zero-exit-code.jsdl": Parsed("/bin/false"),
    "unicorex/ems__sleep.jsdl": Parsed("/bin/sleep", ("20",)),
    # An unknown URI scheme fails at staging time, not when the job is described.
    "unicorex/ems__stagein_problem.jsdl": Parsed(
        "/bin/ls", ("-l",), stage_in=(("infile.txt", "wrongscheme:///wrongurl"),)
    ),
    "unicorex/ems__stageout_problem.jsdl": Parsed(
        "/bin/date", stage_out=(("stdout", "wrongscheme://wrongurl"),)
    ),
    # GFD.56 makes Application optional: DataStaging alone is a staging-only job.
    "unicorex/io__http1.jsdl": Parsed(
        None,
        application=None,
        stage_in=(("test", "http://www.fz-juelich.de"),),
        more={"staging_only": True},
    ),
    "unicorex/jsdl__date.jsdl": Parsed(
        None,
        ("TESTARGUMENT1", "TESTARGUMENT2"),
        application_name="Date",
        more={"application_version": "1.0"},
    ),
    "unicorex/jsdl__date2.jsdl": Parsed("/bin/mydate", ("TESTARGUMENT1",)),
    "unicorex/jsdl__date_simple.jsdl": Parsed(None, application_name="Date", application=None),
    "unicorex/jsdl__empty.jsdl": Rejected(DESC, _NOTHING_TO_RUN, "an empty JobDescription"),
    # Schema-valid, but POSIX UserName (and GroupName) ask to run as another account: GBroker
    # runs a job as the account its site maps the submitting user to, so it refuses them (it
    # read and dropped them before).
    "unicorex/jsdl__ex_posix.jsdl": Rejected(
        f"{APP}/POSIXApplication/UserName", "no UserName (a job runs as", "nobody"
    ),
    "unicorex/jsdl__ftp_with_wsse_ext.jsdl": Parsed(
        "/bin/cat",
        ("unicore_input.txt",),
        application=ApplicationKind.HPCPA,
        stage_in=(("unicore_input.txt", "ftp://zam935:21/sampledata/sample1.txt"),),
        stage_out=(("stdout.txt", "ftp://zam935:21/sampledata/fzj_unicore.txt"),),
        more={"output": "stdout.txt", "error": "stderr.txt"},
    ),
    "unicorex/jsdl__hpcp_sleep.jsdl": Parsed(
        None, ("10",), application_name="Sleep", application=ApplicationKind.HPCPA
    ),
    "unicorex/jsdl__hpcp_sleep_other_namespace.jsdl": Parsed(
        None, ("10",), application_name="Sleep", application=ApplicationKind.HPCPA
    ),
    "unicorex/jsdl__inline_data_staging.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        stage_in=(("input.txt", "inline://foo"),),
        more={
            "inline": {"input.txt": "#!/bin/sh\nhostname\n\t\t\t"},
            "input_sizes": {"input.txt": 22},
        },
    ),
    "unicorex/jsdl__interactive.jsdl": Parsed(
        None,
        application_name="Date",
        application=None,
        more={"annotations": ("Job type: INTERACTIVE",)},
    ),
    # StagingSchedule (from a draft HPC file staging profile) written in JSDL's namespace, which
    # defines no such element: a schedule GBroker does not keep, so refused (read and dropped
    # before; its ftp: staging was refused at submission anyway).
    "unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl": _STAGING_SCHEDULE,
    "unicorex/jsdl__jsdl_sample_with_hpc_ext_nouser.jsdl": _STAGING_SCHEDULE,
    "unicorex/jsdl__posix.jsdl": Parsed(
        "/bin/date",
        ("-v",),
        more={**_UNICORE_STDIO, "environment": {"test": "test_value", "foo": "bar"}},
    ),
    "unicorex/jsdl__prepost.jsdl": Parsed(None, application_name="Date", application=None),
    # Bare RangeValue fragments (schema-valid, but not jobs); their ranges are checked below.
    "unicorex/jsdl__range1.jsdl": Rejected(*_FRAGMENT),
    "unicorex/jsdl__range2.jsdl": Rejected(*_FRAGMENT),
    "unicorex/jsdl__range3.jsdl": Rejected(*_FRAGMENT),
    "unicorex/jsdl__sleep.jsdl": Parsed(None, ("10",), application_name="Sleep"),
    "unicorex/jsdl__spmd.jsdl": Parsed(
        "/bin/date",
        ("-v",),
        application=ApplicationKind.SPMD,
        rank=8,
        more={
            **_UNICORE_STDIO,
            "number_of_processes": 8,
            "processes_per_host": 4,
            "threads_per_process": None,
            "threads_from_allocation": True,  # actualIndividualCPUCount="true"
            "spmd_variation": OPENMPI,
        },
    ),
    "unicorex/jsdl__spmd2.jsdl": Parsed(
        "/bin/date",
        ("-v",),
        application=ApplicationKind.SPMD,
        rank=1,
        more={
            "number_of_processes": None,
            "processes_from_allocation": True,  # actualTotalCPUCount="true"
            "processes_per_host": 4,
            "threads_per_process": 2,
            "spmd_variation": OPENMPI,
        },
    ),
    "unicorex/jsdl__staging_1.jsdl": Rejected(f"{DESC}/DataStaging[1]/FileName", _NO_FILE_NAME),
    "unicorex/jsdl__staging_2.jsdl": Rejected(f"{DESC}/DataStaging[1]/FileName", _NO_FILE_NAME),
    "unicorex/jsdl__staging_3.jsdl": Rejected(f"{DESC}/DataStaging[1]/FileName", _NO_FILE_NAME),
    "unicorex/jsdl__staging_4.jsdl": Rejected(f"{DESC}/DataStaging[1]/FileName", _NO_FILE_NAME),
    "unicorex/jsdl__staging_credentials.jsdl": Parsed(
        None,
        application=None,
        stage_in=tuple((f"{n}.txt", f"http://some.where/{n}.txt") for n in ("foo", "bar", "spam")),
        more={"staging_only": True},
    ),
    "unicorex/jsdl__testConditional.jsdl": Parsed(
        None,
        application_name="TestConditionalArgs",
        more={"environment": {"Conditional": "true", "Conditional2": "true"}},
    ),
    "unicorex/jsdl__testConditional2.jsdl": Parsed(
        None, application_name="TestConditionalArgs", application=None
    ),
}


def _documents() -> list[str]:
    return sorted(
        f"{p.parent.name}/{p.name}"
        for sub in ("unicorex", "gridway")
        for p in (DATA / sub).iterdir()
        if p.suffix in (".jsdl", ".xml")
    )


def test_the_table_covers_every_document_in_shared_data() -> None:
    documents = _documents()
    assert len(documents) == 43
    assert documents == sorted(EXPECTED)


def _check_parsed(desc: JobDescription, want: Parsed) -> None:
    assert desc.executable == want.executable
    assert desc.arguments == want.arguments
    assert desc.application_name == want.application_name
    assert desc.application is want.application
    job = desc.to_job("job-1", "s0")
    assert (job.rank, job.max_rank, job.job_class) == (
        want.rank,
        want.max_rank or want.rank,
        want.job_class,
    )
    assert job.requested_time == want.requested_time
    assert tuple((e.file_name, e.source) for e in desc.stage_in) == want.stage_in
    assert tuple((e.file_name, e.target) for e in desc.stage_out) == want.stage_out
    # Inputs of unknown place and size sit at the submitting broker with size 0.
    sizes = want.more.get("input_sizes", {})
    assert job.input_files == tuple(
        InputFile(name, sizes.get(name, 0), "s0") for name, _ in want.stage_in
    )
    for key, value in want.more.items():
        if key == "inline":
            assert {e.file_name: e.inline_data for e in desc.staging if e.inline_data} == value
        elif key == "input_sizes":
            continue
        elif key == "staged_in_names":
            assert tuple(e.file_name for e in desc.stage_in) == value
        elif key == "creation_flags":
            assert tuple(e.creation_flag for e in desc.staging) == value
        elif key == "environment":
            assert desc.environ == value
        else:
            assert getattr(desc, key) == value, key


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_shared_document_parses_to_its_job_or_is_rejected_precisely(name: str) -> None:
    want = EXPECTED[name]
    path = DATA / name
    if isinstance(want, Parsed):
        desc = load_job_description(path)
        _check_parsed(desc, want)
        # What we write back is the same description, and so is its JSON form.
        assert parse_jsdl(to_jsdl(desc)) == desc
        assert from_mapping(json.loads(json.dumps(to_mapping(desc)))) == desc
        return
    with pytest.raises(JsdlError) as caught:
        load_job_description(path)
    err = caught.value
    assert err.document == str(path)
    assert err.path == want.path
    assert err.expected.startswith(want.expected)
    assert err.found == want.found
    message = str(err)
    assert message.startswith(f"{path}: {want.path}: expected ")
    assert "\n" not in message


def _without_staging_schedule(name: str) -> str:
    text = (DATA / name).read_text()
    stripped = re.sub(r"\s*<StagingSchedule>\w+</StagingSchedule>", "", text)
    assert stripped.count("<DataStaging>") == 2
    assert "StagingSchedule" not in stripped
    return stripped


@pytest.mark.parametrize(
    "name",
    [
        "unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl",
        "unicorex/jsdl__jsdl_sample_with_hpc_ext_nouser.jsdl",
    ],
)
def test_the_hpc_samples_without_their_staging_schedule_read_as_before(name: str) -> None:
    desc = parse_jsdl(_without_staging_schedule(name))
    _check_parsed(desc, _SAMPLE_HPC)
    assert parse_jsdl(to_jsdl(desc)) == desc


def test_gridway_unbound_prefix_message_reads_well() -> None:
    with pytest.raises(JsdlError) as caught:
        load_job_description(DATA / "gridway" / "HPCProfileExample.xml")
    assert str(caught.value).endswith(
        "HPCProfileExample.xml: line 22, column 4: expected well-formed XML, "
        "got 'unbound prefix jsdl-hpcpa (no xmlns:jsdl-hpcpa in scope)'"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("jsdl__range1.jsdl", RangeValue.exact(1)),  # written 1.0
        ("jsdl__range2.jsdl", RangeValue.at_most(10)),
        ("jsdl__range3.jsdl", RangeValue.between(1, 10)),  # written 1.0 .. 10.0
    ],
)
def test_range_fragments_read_right_inside_a_job(name: str, expected: RangeValue) -> None:
    fragment = (DATA / "unicorex" / name).read_text()
    desc = parse_jsdl(_job(resources=fragment))
    assert desc.individual_cpu_count == expected


# ---------------------------------------------------------------------------------------------
# The official XSDs: which documents are schema-valid, and why the others are not

SCHEMA = DATA / "schema"


@cache
def jsdl_schema() -> xmlschema.XMLSchema10:
    # jsdl-spmd.xsd imports ./jsdl-posix.xsd; loading the three together resolves everything
    # locally (no network) and lets lax xsd:any content validate against the extensions.
    return xmlschema.XMLSchema10(
        [str(SCHEMA / "jsdl.xsd"), str(SCHEMA / "jsdl-posix.xsd"), str(SCHEMA / "jsdl-spmd.xsd")]
    )


NOT_WELL_FORMED = {"gridway/HPCProfileExample.xml"}
# Schema-invalid documents, with a word the validator's complaint must contain. We accept all of
# them but staging_1..4 (no FileName) as real writers produce them.
SCHEMA_INVALID = {
    # <CandidateHost> (schema: CandidateHosts); Environment before Input in POSIXApplication.
    "gridway/POSIXProfileExample.xml": "CandidateHost",
    "gridway/basicExample.xml": "CandidateHost",
    # xsi:type names GridBean types that no schema here declares.
    "unicorex/ems__big.jsdl": "gridBeanParameter",
    # DataStaging without the required CreationFlag.
    "unicorex/ems__date_with_inlinedata.jsdl": "CreationFlag",
    "unicorex/ems__ls_with_stagein.jsdl": "CreationFlag",
    "unicorex/ems__stagein_problem.jsdl": "CreationFlag",
    "unicorex/ems__stageout_problem.jsdl": "CreationFlag",
    "unicorex/io__http1.jsdl": "CreationFlag",
    # HPC File Staging's StagingSchedule written in the JSDL namespace.
    "unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl": "StagingSchedule",
    "unicorex/jsdl__jsdl_sample_with_hpc_ext_nouser.jsdl": "StagingSchedule",
    # Argument after Input/Output/Error (the schema wants it right after Executable).
    "unicorex/jsdl__posix.jsdl": "Argument",
    # UNICORE's camel-case SPMD attributes; empty counts without xsi:nil; Argument order.
    "unicorex/jsdl__spmd.jsdl": "actualIndividualCPUCount",
    "unicorex/jsdl__spmd2.jsdl": "actualTotalCPUCount",
    # No FileName; staging_1/2 also leave URI unqualified.
    "unicorex/jsdl__staging_1.jsdl": "FileName",
    "unicorex/jsdl__staging_2.jsdl": "FileName",
    "unicorex/jsdl__staging_3.jsdl": "FileName",
    "unicorex/jsdl__staging_4.jsdl": "FileName",
}


def test_schema_validity_of_every_well_formed_document() -> None:
    schema = jsdl_schema()
    valid, invalid = set(), {}
    for name in _documents():
        if name in NOT_WELL_FORMED:
            with pytest.raises(xmlschema.XMLResourceError):
                schema.is_valid(str(DATA / name))
            continue
        errors = list(schema.iter_errors(str(DATA / name)))
        if errors:
            invalid[name] = " ".join(f"{e.reason} {e.path} {e}" for e in errors)
        else:
            valid.add(name)
    assert set(invalid) == set(SCHEMA_INVALID)
    for name, word in SCHEMA_INVALID.items():
        assert word in invalid[name], name
    # Valid by the schema yet not jobs we can run: the empty descriptions, the bare
    # IndividualCPUCount fragments (a global element of jsdl.xsd), and a POSIX UserName GBroker
    # does not honour. Staging-only ones run.
    rejected_but_valid = {n for n in valid if isinstance(EXPECTED[n], Rejected)}
    assert rejected_but_valid == {
        "unicorex/jsdl__ex_posix.jsdl",
        "unicorex/ems__empty.jsdl",
        "unicorex/jsdl__empty.jsdl",
        "unicorex/jsdl__range1.jsdl",
        "unicorex/jsdl__range2.jsdl",
        "unicorex/jsdl__range3.jsdl",
    }
    assert len(valid) == 43 - len(NOT_WELL_FORMED) - len(SCHEMA_INVALID) == 25


def test_what_we_write_is_schema_valid_for_every_parsed_document() -> None:
    schema = jsdl_schema()
    for name, want in EXPECTED.items():
        if isinstance(want, Parsed):
            schema.validate(to_jsdl(load_job_description(DATA / name)))


# ---------------------------------------------------------------------------------------------
# Our own documents: extension, derivation, errors

NAMESPACES = (
    f'xmlns:jsdl="{JSDL_NS}" xmlns:jsdl-posix="{POSIX_NS}" xmlns:jsdl-spmd="{SPMD_NS}" '
    f'xmlns:gbroker="{GBROKER_NS}"'
)
POSIX_APP = (
    "<jsdl-posix:POSIXApplication><jsdl-posix:Executable>/bin/true</jsdl-posix:Executable>"
    "</jsdl-posix:POSIXApplication>"
)


def _job(app: str = POSIX_APP, resources: str = "", extra: str = "") -> str:
    return (
        f'<?xml version="1.0"?>\n<jsdl:JobDefinition {NAMESPACES}>\n<jsdl:JobDescription>\n'
        f"<jsdl:Application>{app}</jsdl:Application>\n"
        f"<jsdl:Resources>{resources}</jsdl:Resources>\n{extra}\n"
        "</jsdl:JobDescription>\n</jsdl:JobDefinition>\n"
    )


def _spmd(processes: str) -> str:
    return (
        "<jsdl-spmd:SPMDApplication><jsdl-posix:Executable>/bin/mpi</jsdl-posix:Executable>"
        f"{processes}<jsdl-spmd:SPMDVariation>{OPENMPI}</jsdl-spmd:SPMDVariation>"
        "</jsdl-spmd:SPMDApplication>"
    )


def _total(inner: str) -> str:
    return f"<jsdl:TotalCPUCount>{inner}</jsdl:TotalCPUCount>"


def _range(lower: str, upper: str) -> str:
    return (
        f"<jsdl:Range><jsdl:LowerBound{lower}</jsdl:LowerBound>"
        f"<jsdl:UpperBound{upper}</jsdl:UpperBound></jsdl:Range>"
    )


def _sched(inner: str) -> str:
    return f"<gbroker:Scheduling>{inner}</gbroker:Scheduling>"


def _nprocs(n: int) -> str:
    return _spmd(f"<jsdl-spmd:NumberOfProcesses>{n}</jsdl-spmd:NumberOfProcesses>")


@pytest.mark.parametrize(
    ("doc", "rank", "max_rank", "job_class"),
    [
        (_job(), 1, 1, JobClass.RIGID),
        (_job(resources=_total("<jsdl:Exact>4</jsdl:Exact>")), 4, 4, JobClass.RIGID),
        (_job(resources=_total(_range(">2", ">8"))), 2, 8, JobClass.MOLDABLE),
        (_job(resources=_total("<jsdl:UpperBoundedRange>8</jsdl:UpperBoundedRange>")), 1, 8,
         JobClass.MOLDABLE),
        (_job(resources=_total("<jsdl:LowerBoundedRange>4</jsdl:LowerBoundedRange>")), 4, 4,
         JobClass.RIGID),
        # NumberOfProcesses wins over TotalCPUCount for r; a range still bounds the top.
        (_job(_nprocs(8), _total(_range(">2", ">32"))), 8, 32, JobClass.MOLDABLE),
        (_job(_nprocs(2), _total("<jsdl:Exact>8</jsdl:Exact>")), 2, 2, JobClass.RIGID),
        # The GBroker extension wins over both.
        (_job(_nprocs(8), _total(_range(">2", ">32")),
              _sched("<gbroker:JobClass>malleable</gbroker:JobClass>"
                     "<gbroker:MinCores>4</gbroker:MinCores>"
                     "<gbroker:MaxCores>16</gbroker:MaxCores>")), 4, 16, JobClass.MALLEABLE),
        (_job(extra=_sched("<gbroker:JobClass>moldable</gbroker:JobClass>")), 1, 1,
         JobClass.MOLDABLE),
        # Counts are whole numbers inside the range: bounds round inwards, exclusive ones move.
        (_job(resources=_total(_range(">1.5", ">4.5"))), 2, 4, JobClass.MOLDABLE),
        (_job(resources=_total(_range(' exclusiveBound="true">2', ' exclusiveBound="1">8'))),
         3, 7, JobClass.MOLDABLE),
        # Fractional exclusive bounds: the whole numbers strictly inside (1.5, 8.5) are 2..8.
        (_job(resources=_total(_range(' exclusiveBound="true">1.5',
                                      ' exclusiveBound="true">8.5'))), 2, 8, JobClass.MOLDABLE),
    ],
)  # fmt: skip
def test_cores_are_derived_from_spmd_ranges_and_the_extension(
    doc: str, rank: int, max_rank: int, job_class: JobClass
) -> None:
    job = parse_jsdl(doc).to_job("j", "s0")
    assert (job.rank, job.max_rank, job.job_class) == (rank, max_rank, job_class)


def test_requested_time_comes_from_wall_time_else_cpu_time() -> None:
    wall = "<jsdl-posix:WallTimeLimit>3600</jsdl-posix:WallTimeLimit>"
    app = POSIX_APP.replace(
        "</jsdl-posix:POSIXApplication>", f"{wall}</jsdl-posix:POSIXApplication>"
    )
    assert parse_jsdl(_job(app)).to_job("j", "s").requested_time == 3600
    total_time = "<jsdl:TotalCPUTime><jsdl:UpperBoundedRange>7200</jsdl:UpperBoundedRange>"
    total_time += "</jsdl:TotalCPUTime>"
    four = _total("<jsdl:Exact>4</jsdl:Exact>")
    assert parse_jsdl(_job(resources=total_time + four)).to_job("j", "s").requested_time == 1800
    both = parse_jsdl(_job(app, total_time + four))
    assert both.to_job("j", "s").requested_time == 3600
    assert parse_jsdl(_job()).to_job("j", "s").requested_time is None


def test_schema_spelling_of_spmd_attributes_and_xsi_nil_are_accepted() -> None:
    xsi = 'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"'
    doc = _job(
        _spmd(
            f'<jsdl-spmd:NumberOfProcesses {xsi} actualtotalcpucount="true" xsi:nil="true"/>'
            "<jsdl-spmd:ThreadsPerProcess>2</jsdl-spmd:ThreadsPerProcess>"
        )
    )
    desc = parse_jsdl(doc)
    assert desc.processes_from_allocation is True
    assert desc.number_of_processes is None
    assert desc.threads_per_process == 2


def test_declared_encodings_are_honoured_for_bytes_and_text() -> None:
    doc = _job(extra="<jsdl:JobIdentification><jsdl:JobName>Müller</jsdl:JobName>"
                     "</jsdl:JobIdentification>")  # fmt: skip
    latin1 = doc.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="ISO-8859-1"?>')
    assert parse_jsdl(latin1.encode("latin-1")).name == "Müller"
    assert parse_jsdl(latin1).name == "Müller"
    assert parse_jsdl(doc.encode()).name == "Müller"


def test_candidate_hosts_in_both_spellings() -> None:
    hosts = (
        "<jsdl:CandidateHosts><jsdl:HostName>a</jsdl:HostName><jsdl:HostName>b</jsdl:HostName>"
        "</jsdl:CandidateHosts><jsdl:CandidateHost><jsdl:HostName> c </jsdl:HostName>"
        "</jsdl:CandidateHost>"
    )
    assert parse_jsdl(_job(resources=hosts)).candidate_hosts == ("a", "b", "c")


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


def _wall(value: str) -> str:
    return POSIX_APP.replace(
        "</jsdl-posix:POSIXApplication>",
        f"<jsdl-posix:WallTimeLimit>{value}</jsdl-posix:WallTimeLimit>"
        "</jsdl-posix:POSIXApplication>",
    )


def _staging(inner: str) -> str:
    return f"<jsdl:DataStaging><jsdl:FileName>f</jsdl:FileName>{inner}</jsdl:DataStaging>"


TOTAL = f"{RES}/TotalCPUCount"
POSIX_PATH = f"{APP}/POSIXApplication"
SPMD_PATH = f"{APP}/SPMDApplication"
SCHED = f"{DESC}/Scheduling"
STAGE = f"{DESC}/DataStaging[1]"
_ANY_RANGE = "a range kind: Exact, LowerBoundedRange, UpperBoundedRange or Range"


@pytest.mark.parametrize(
    ("doc", "path", "expected", "found"),
    [
        # counts that are not counts
        (_job(resources=_total("<jsdl:Exact>four</jsdl:Exact>")), f"{TOTAL}/Exact",
         "a number", "four"),
        (_job(resources=_total("<jsdl:Exact>INF</jsdl:Exact>")), f"{TOTAL}/Exact",
         "a number", "INF"),
        (_job(resources=_total("<jsdl:Exact>0</jsdl:Exact>")), f"{TOTAL}/Exact",
         "a CPU count >= 1", 0),
        (_job(resources=_total("<jsdl:Exact>-3</jsdl:Exact>")), f"{TOTAL}/Exact",
         "a CPU count >= 1", -3),
        (_job(resources=_total("<jsdl:Exact>2.5</jsdl:Exact>")), f"{TOTAL}/Exact",
         "a whole number of CPUs", "2.5"),
        (_job(resources=_total("<jsdl:UpperBoundedRange>0</jsdl:UpperBoundedRange>")),
         f"{TOTAL}/UpperBoundedRange", "a CPU count >= 1", "0"),
        (_job(resources=_total(_range(">8", ">2"))), f"{TOTAL}/Range",
         "LowerBound <= UpperBound (a range holding whole numbers of CPUs)", "8..2"),
        (_job(resources=_total("<jsdl:Range><jsdl:LowerBound>2</jsdl:LowerBound></jsdl:Range>")),
         f"{TOTAL}/Range/UpperBound", "its UpperBound element", None),
        (_job(resources=_total("<jsdl:Between>2</jsdl:Between>")), f"{TOTAL}/Between",
         _ANY_RANGE, f"{{{JSDL_NS}}}Between"),
        (_job(resources=_total("")), TOTAL,
         "one of Exact, LowerBoundedRange, UpperBoundedRange or Range", "nothing"),
        (_job(resources=_total("<jsdl:Exact>2</jsdl:Exact><jsdl:Exact>4</jsdl:Exact>")), TOTAL,
         "exactly one range (GBroker takes no unions of ranges)", "Exact, Exact"),
        (_job(resources=_total("<jsdl:Exact>2</jsdl:Exact>") * 2),
         TOTAL, "at most one TotalCPUCount", "another one"),
        (_job(_nprocs(0)), f"{SPMD_PATH}/NumberOfProcesses", "an integer >= 1", 0),
        (_job(_spmd("<jsdl-spmd:NumberOfProcesses>many</jsdl-spmd:NumberOfProcesses>")),
         f"{SPMD_PATH}/NumberOfProcesses", "a number", "many"),
        (_job(_spmd("<jsdl-spmd:NumberOfProcesses/>")), f"{SPMD_PATH}/NumberOfProcesses",
         'a positive integer (or actualtotalcpucount="true")', "nothing"),
        (_job(_spmd('<jsdl-spmd:NumberOfProcesses actualTotalCPUCount="maybe"/>')),
         f"{SPMD_PATH}/NumberOfProcesses/@actualtotalcpucount", "true or false", "maybe"),
        (_job(_wall("-5")), f"{POSIX_PATH}/WallTimeLimit", "an integer >= 0", -5),
        (_job(_wall("an hour")), f"{POSIX_PATH}/WallTimeLimit", "a number", "an hour"),
        # core bounds that contradict each other
        (_job(_nprocs(8), _total("<jsdl:UpperBoundedRange>4</jsdl:UpperBoundedRange>")),
         TOTAL, "at least 8 cores (number_of_processes)", 4),
        (_job(_nprocs(8), extra=_sched("<gbroker:MaxCores>2</gbroker:MaxCores>")),
         f"{SCHED}/MaxCores", "at least 8 cores (number_of_processes)", 2),
        (_job(resources=_total(_range(">2", ">8")),
              extra=_sched("<gbroker:JobClass>rigid</gbroker:JobClass>")),
         f"{SCHED}/JobClass", "moldable or malleable for a job of 2..8 cores", "rigid"),
        (_job(extra=_sched("<gbroker:JobClass>elastic</gbroker:JobClass>")),
         f"{SCHED}/JobClass", "rigid, moldable or malleable", "elastic"),
        (_job(extra=_sched("<gbroker:MinCores>0</gbroker:MinCores>")),
         f"{SCHED}/MinCores", "an integer >= 1", 0),
        (_job(extra="<gbroker:Sheduling/>"), f"{DESC}/Sheduling",
         "a GBroker element Scheduling here", "Sheduling"),
        (_job(extra=_sched("<gbroker:Cores>4</gbroker:Cores>")), f"{SCHED}/Cores",
         "a GBroker element JobClass, MinCores, MaxCores, Malleability, Component, "
         "Coallocation, Model", "Cores"),
        # the application
        ("<jsdl:JobDefinition xmlns:jsdl='" + JSDL_NS + "'><jsdl:JobDescription><jsdl:Application>"
         "<jsdl-posix:POSIXApplication xmlns:jsdl-posix='" + POSIX_NS + "'><jsdl-posix:Argument>"
         "x</jsdl-posix:Argument></jsdl-posix:POSIXApplication></jsdl:Application>"
         "</jsdl:JobDescription></jsdl:JobDefinition>", APP, _NOTHING_TO_RUN,
         "an Application with neither"),
        (_job(POSIX_APP * 2), f"{APP}/POSIXApplication", "at most one of",
         "POSIXApplication and POSIXApplication"),
        (_job(POSIX_APP.replace("jsdl-posix:POSIXApplication", "jsdl:POSIXApplication")),
         f"{APP}/POSIXApplication", f"POSIXApplication in namespace {POSIX_NS}",
         f"{{{JSDL_NS}}}POSIXApplication"),
        (_job(POSIX_APP.replace("/bin/true", "<b>/bin/true</b>")),
         f"{POSIX_PATH}/Executable/b", "text only, no child elements", None),
        (_job(POSIX_APP.replace("</jsdl-posix:Executable>",
                                "</jsdl-posix:Executable><jsdl-posix:Executable>/bin/x"
                                "</jsdl-posix:Executable>")),
         f"{POSIX_PATH}/Executable", "at most one Executable", "another one"),
        (_job(POSIX_APP.replace("</jsdl-posix:Executable>",
                                "</jsdl-posix:Executable><jsdl-posix:Environment>v"
                                "</jsdl-posix:Environment>")),
         f"{POSIX_PATH}/Environment[1]", 'a name="..." attribute', None),
        (_job(POSIX_APP.replace("</jsdl-posix:Executable>",
                                '</jsdl-posix:Executable><jsdl-posix:Environment name="A">1'
                                '</jsdl-posix:Environment><jsdl-posix:Environment name="A">2'
                                "</jsdl-posix:Environment>")),
         f"{POSIX_PATH}/Environment[2]", "each variable once", "A"),
        # staging
        (_job(extra=_staging("<jsdl:CreationFlag>replace</jsdl:CreationFlag>")),
         f"{STAGE}/CreationFlag", "overwrite, append or dontOverwrite", "replace"),
        (_job(extra=_staging("<jsdl:DeleteOnTermination>yes</jsdl:DeleteOnTermination>")),
         f"{STAGE}/DeleteOnTermination", "true or false", "yes"),
        (_job(extra=_staging("<gbroker:Size>-1</gbroker:Size>")), f"{STAGE}/Size",
         "an integer >= 0", -1),
        (_job(extra=_staging("<gbroker:Host>s1</gbroker:Host>")), f"{STAGE}/Host",
         "a GBroker element InlineData, Site or Size", "Host"),
        (_job(extra=_staging("<jsdl:Source/>")), f"{STAGE}/Source/URI",
         "a URI to stage the file in from", None),
        (_job(extra=_staging("<jsdl:Target><jsdl:URI> </jsdl:URI></jsdl:Target>")),
         f"{STAGE}/Target/URI", "a URI to stage the file out to", None),
        (_job(extra="<jsdl:DataStaging><jsdl:FileName> </jsdl:FileName></jsdl:DataStaging>"),
         f"{STAGE}/FileName", _NO_FILE_NAME, None),
        # the document itself
        ("<JobDefinition xmlns='http://example.org/'><JobDescription/></JobDefinition>",
         "JobDefinition", f"the root element JobDefinition in namespace {JSDL_NS}",
         "{http://example.org/}JobDefinition"),
        ("<JobDefinition/>", "JobDefinition",
         f"the root element JobDefinition in namespace {JSDL_NS}", "JobDefinition"),
        (f"<jsdl:JobDefinition {NAMESPACES}/>", "JobDefinition", "a JobDescription element",
         None),
        ("", "document", "a JSDL document", "an empty file"),
        (" \n\t\n", "document", "a JSDL document", "an empty file"),
        (_job().replace("</jsdl:Resources>", ""), "line 7, column 3", "well-formed XML",
         "mismatched tag"),
        ("<?xml version='1.0'?>\n<!-- nothing -->\n", "line 3, column 1", "well-formed XML",
         "no element found"),
    ],
)  # fmt: skip
def test_invalid_documents_get_precise_errors(
    doc: str, path: str, expected: str, found: object
) -> None:
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc, document="job.jsdl")
    err = caught.value
    assert (err.document, err.path, err.found) == ("job.jsdl", path, found)
    assert err.expected.startswith(expected)
    assert str(err).startswith(f"job.jsdl: {path}: expected {expected}")
    assert isinstance(err, ValueError)  # an InvalidInput: the caller's fault


def test_errors_name_the_element_path_like_the_brief() -> None:
    with pytest.raises(JsdlError, match=r"^job\.jsdl: JobDefinition/JobDescription/Resources/"
                       r"TotalCPUCount/Exact: expected a number, got 'x'$"):  # fmt: skip
        parse_jsdl(_job(resources=_total("<jsdl:Exact>x</jsdl:Exact>")), document="job.jsdl")


# ---------------------------------------------------------------------------------------------
# Hostile input

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
]>
<jsdl:JobDefinition xmlns:jsdl="http://schemas.ggf.org/jsdl/2005/11/jsdl">
<jsdl:JobDescription><jsdl:JobIdentification><jsdl:JobName>&lol9;</jsdl:JobName>
</jsdl:JobIdentification></jsdl:JobDescription></jsdl:JobDefinition>
"""
EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE j [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<jsdl:JobDefinition xmlns:jsdl="http://schemas.ggf.org/jsdl/2005/11/jsdl">
<jsdl:JobDescription><jsdl:Application><jsdl:ApplicationName>&secret;</jsdl:ApplicationName>
</jsdl:Application></jsdl:JobDescription></jsdl:JobDefinition>
"""
EXTERNAL_DTD = """<?xml version="1.0"?>
<!DOCTYPE jsdl:JobDefinition SYSTEM "http://127.0.0.1:9/jsdl.dtd">
<jsdl:JobDefinition xmlns:jsdl="http://schemas.ggf.org/jsdl/2005/11/jsdl"/>
"""


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, EXTERNAL_ENTITY, EXTERNAL_DTD])
def test_dtds_and_entities_are_refused(doc: str) -> None:
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc, document="evil.jsdl")
    err = caught.value
    assert err.path == "document"
    assert err.expected == "XML without a DTD, entity declarations or external references"
    assert err.found == "DTDForbidden"


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


def test_a_bare_number_is_an_exact_range_in_mappings() -> None:
    desc = from_mapping({"executable": "/bin/x", "total_cpu_count": 16, "total_cpu_time": 60.5})
    assert desc.total_cpu_count == RangeValue.exact(16)
    assert desc.total_cpu_time == RangeValue.exact(60.5)
    assert to_mapping(desc)["total_cpu_count"] == {"exact": 16}


# ---------------------------------------------------------------------------------------------
# Round trips with hypothesis

# Characters XML 1.0 can carry, with CR, tab and newline (which XML would otherwise normalize).
_chars = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0xD7FF),
    st.sampled_from("\t\n\r\ue000\ufffd\U0001f600"),
)
_text = st.text(_chars, max_size=12)
_token = _text.map(str.strip).filter(bool)
_maybe_token = st.none() | _token
_uri = st.from_regex(r"(https?|file|ftp|gbroker)://[a-z0-9.]{1,10}(/[A-Za-z0-9._~-]{1,8}){0,3}",
                     fullmatch=True)  # fmt: skip
# Paths inside the job directory: components that never read as "." or "..".
_component = r"[A-Za-z0-9_$-][A-Za-z0-9_.$-]{0,7}"
_path = st.from_regex(rf"{_component}(/{_component}){{0,2}}", fullmatch=True)
_env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_small = st.integers(1, 8)
_large = st.integers(8, 4096)


def _count_ranges() -> st.SearchStrategy[RangeValue]:
    return st.one_of(
        _small.map(RangeValue.exact),
        _small.map(RangeValue.at_least),
        _large.map(RangeValue.at_most),
        st.tuples(_small, _large).map(lambda b: RangeValue.between(*b)),
    )


def _time_ranges() -> st.SearchStrategy[RangeValue]:
    seconds = st.integers(0, 10**7) | st.floats(0, 1e7, allow_nan=False, allow_infinity=False)
    return st.one_of(
        seconds.map(RangeValue.exact),
        seconds.map(RangeValue.at_least),
        seconds.map(RangeValue.at_most),
        st.tuples(seconds, seconds).map(sorted).map(lambda b: RangeValue.between(*b)),
    )


_fs_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,7}", fullmatch=True)
_staging_entries = st.builds(
    StagingEntry,
    file_name=_path,
    source=st.none() | _uri,
    target=st.none() | _uri,
    creation_flag=st.sampled_from(CreationFlag),
    delete_on_termination=st.none() | st.booleans(),
    inline_data=st.none() | _text,
    site=_maybe_token,
    size=st.none() | st.integers(0, 2**40),
    filesystem=st.none() | _fs_names,
)


def _amounts() -> st.SearchStrategy[RangeValue]:
    amount = st.integers(0, 2**40)
    return st.one_of(
        amount.map(RangeValue.exact),
        amount.map(RangeValue.at_least),
        amount.map(RangeValue.at_most),
        st.tuples(amount, amount).map(sorted).map(lambda b: RangeValue.between(*b)),
    )


_file_systems = st.builds(
    FileSystem,
    name=_fs_names,
    type=st.none() | st.sampled_from(["normal", "spool", "temporary", "swap"]),
    description=_maybe_token,
    mount_point=st.none() | _path.map(lambda p: f"/{p}"),
    disk_space=st.none() | _amounts(),
)


_PATHS = ("input", "output", "error", "working_directory")


def _is_path(text: str) -> bool:
    try:
        StagingEntry(text)  # a file name confined as a file-system-relative path must be
    except JsdlError:
        return False
    return text == text.strip() and bool(text)


@st.composite
def descriptions(draw: st.DrawFn) -> JobDescription:
    kind = draw(st.sampled_from([None, *ApplicationKind]))
    fields: dict[str, Any] = {
        "name": draw(_maybe_token),
        "description": draw(st.none() | _text),
        "annotations": tuple(draw(st.lists(_token, max_size=2))),
        "projects": tuple(draw(st.lists(_token, max_size=2))),
        "application_name": draw(_maybe_token),
        "application_version": draw(_maybe_token),
        "application": kind,
        "candidate_hosts": tuple(draw(st.lists(_token, max_size=3))),
        "total_cpu_count": draw(st.none() | _count_ranges()),
        "individual_cpu_count": draw(st.none() | _count_ranges()),
        "total_cpu_time": draw(st.none() | _time_ranges()),
        "individual_cpu_time": draw(st.none() | _time_ranges()),
        "staging": tuple(draw(st.lists(_staging_entries, max_size=3))),
        "job_class": draw(st.none() | st.sampled_from(JobClass)),
        "min_cores": draw(st.none() | _small),
        "max_cores": draw(st.none() | _large),
        "exclusive_execution": draw(st.none() | st.booleans()),
        "operating_system": draw(st.none() | st.sampled_from(["LINUX", "WINNT", "MACOS"])),
        "operating_system_version": draw(_maybe_token),
        "cpu_architecture": draw(st.none() | st.sampled_from(["x86_64", "x86", "arm", "sparc"])),
        "individual_cpu_speed": draw(st.none() | _amounts()),
        "individual_network_bandwidth": draw(st.none() | _amounts()),
        "individual_physical_memory": draw(st.none() | _amounts()),
        "total_physical_memory": draw(st.none() | _amounts()),
        "individual_disk_space": draw(st.none() | _amounts()),
        "total_disk_space": draw(st.none() | _amounts()),
        "total_resource_count": draw(st.none() | _count_ranges()),
        "file_systems": tuple(
            draw(st.lists(_file_systems, max_size=2, unique_by=lambda fs: fs.name))
        ),
    }
    if kind is not None:
        fields |= {
            "executable": draw(_maybe_token),
            "arguments": tuple(draw(st.lists(_text, max_size=3))),
            "environment": draw(st.dictionaries(_env_names, _text, max_size=3)),
            "input": draw(st.none() | _path),
            "output": draw(st.none() | _path),
            "error": draw(st.none() | _path),
            "working_directory": draw(st.none() | _path),
            "wall_time_limit": draw(st.none() | st.integers(0, 10**6)),
            "cpu_time_limit": draw(st.none() | st.integers(0, 10**6)),
        }
    if kind is ApplicationKind.SPMD:
        processes = draw(st.none() | _small)
        threads = draw(st.none() | _small)
        fields |= {
            "number_of_processes": processes,
            "processes_from_allocation": draw(st.booleans()) if processes else True,
            "processes_per_host": draw(st.none() | _small),
            "threads_per_process": threads,
            "threads_from_allocation": draw(st.booleans()),
            # The schema requires it; a site runs only those of SPMD_VARIATIONS.
            "spmd_variation": SPMD_VARIATION_PREFIX + draw(st.sampled_from(list(SPMD_VARIATIONS))),
        }
    if kind is not None:
        paths = [k for k in ("executable", *_PATHS) if fields.get(k) is not None]
        paths += [f"arguments[{i}]" for i, a in enumerate(fields["arguments"]) if _is_path(a)]
        paths += [f"environment.{k}" for k, v in fields["environment"].items() if _is_path(v)]
        chosen = draw(st.lists(st.sampled_from(paths), unique=True)) if paths else []
        fields["filesystem_names"] = {key: draw(_fs_names) for key in chosen}
    staging_only = kind is None and fields["staging"] and draw(st.booleans())
    if staging_only:
        fields["application_name"] = fields["application_version"] = None
    elif fields.get("executable") is None and fields["application_name"] is None:
        fields["application_name"] = draw(_token)
    try:
        return JobDescription(**fields)
    except JsdlError:  # a rigid class over a range of cores: a real error, not a round trip
        assume(False)
        raise


_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(descriptions())
def test_jsdl_round_trip(desc: JobDescription) -> None:
    assert parse_jsdl(to_jsdl(desc)) == desc


@_settings
@given(descriptions())
def test_mapping_json_and_yaml_round_trips(desc: JobDescription) -> None:
    mapping = to_mapping(desc)
    assert from_mapping(mapping) == desc
    assert loads_job_description(json.dumps(mapping), fmt="json") == desc
    # PyYAML writes NEL, LS and PS unquoted and then reads them as line breaks: its bug, not ours.
    assume(not any(c in json.dumps(mapping, ensure_ascii=False) for c in "\x85\u2028\u2029"))
    assert loads_job_description(yaml.safe_dump(mapping, allow_unicode=True), fmt="yaml") == desc


@settings(max_examples=60, deadline=None)
@given(descriptions())
def test_what_we_write_validates_against_the_official_xsds(desc: JobDescription) -> None:
    jsdl_schema().validate(to_jsdl(desc))


@settings(max_examples=60, deadline=None)
@given(descriptions())
def test_every_description_makes_a_job(desc: JobDescription) -> None:
    job = desc.to_job("j", "home")
    assert job.rank >= 1
    assert job.max_rank >= job.rank
    assert [f.name for f in job.input_files] == [e.file_name for e in desc.stage_in]
    assert [f.site for f in job.input_files] == [e.site or "home" for e in desc.stage_in]
    assert summary(desc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_garbage_is_an_error_never_a_traceback(data: bytes | str) -> None:
    for fmt in ("jsdl", "json", "yaml", None):
        with contextlib.suppress(JsdlError):
            loads_job_description(data, fmt=fmt)


_SMALL_DOCS = [n for n in sorted(EXPECTED) if (DATA / n).stat().st_size < 10_000]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_SMALL_DOCS),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 40), st.binary(max_size=8)), max_size=4),
)
def test_mangled_real_documents_are_errors_never_tracebacks(
    name: str, edits: list[tuple[float, int, bytes]]
) -> None:
    data = (DATA / name).read_bytes()
    for where, cut, insert in edits:
        at = int(where * len(data))
        data = data[:at] + insert + data[at + cut :]
    with contextlib.suppress(JsdlError):
        parse_jsdl(data).to_job("j", "s")


# ---------------------------------------------------------------------------------------------
# gbroker jsdl check


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    """``gbroker`` with no fleet to find: ``jsdl check`` judges offline (``--topology`` aside)."""
    env = {**os.environ, "GBROKER_FLEET": str(Path(__file__).parent / "no-fleet-here")}
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_check_prints_a_summary_per_valid_file() -> None:
    spmd = str(DATA / "unicorex" / "jsdl__spmd.jsdl")
    fixture = str(FIXTURES / "malleable_mpi.yaml")
    done = gbroker("jsdl", "check", spmd, fixture)
    # The fixture's staging URLs (a gbroker:// source, a file: target) are ones brokers refuse.
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert f"{spmd}: ok\n  executable  /bin/date -v\n" in done.stdout
    assert f"{fixture}: a broker would refuse it\n" in done.stdout
    assert "  refused     staging[2].target: expected a URL with scheme http or https" in (
        done.stdout
    )
    assert "  cores       8 (rigid; SPMD OpenMPI, 8 processes, 4 per host)\n" in done.stdout
    assert "\n  name        heat-2d\n" in done.stdout
    assert "  executable  /opt/heat/bin/heat2d --grid '4096 x 4096'\n" in done.stdout
    assert "  cores       4..16 (malleable; SPMD MPICH2, 4 processes, 2 per host; " in done.stdout
    assert "  time limit  3600 s\n" in done.stdout
    assert "  stage in    grid.h5 <- gbroker://r1c1/sha256/" in done.stdout
    assert "  stage out   heat.out -> file:///home/user/results/heat.out\n" in done.stdout


def test_check_exits_1_with_one_line_per_invalid_file(tmp_path: Path) -> None:
    good = str(DATA / "unicorex" / "ems__sleep.jsdl")
    broken = str(DATA / "gridway" / "HPCProfileExample.xml")
    empty = str(DATA / "unicorex" / "ems__empty.jsdl")
    missing = str(tmp_path / "nope.jsdl")
    done = gbroker("jsdl", "check", good, broken, empty, missing)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"{good}: ok" in lines
    assert (
        f"{broken}: line 22, column 4: expected well-formed XML, "
        "got 'unbound prefix jsdl-hpcpa (no xmlns:jsdl-hpcpa in scope)'"
    ) in lines
    assert any(
        line.startswith(f"{empty}: JobDefinition/JobDescription: expected ") for line in lines
    )
    assert f"{missing}: cannot read: No such file or directory" in lines


def test_check_json_prints_a_list_with_one_object_per_file() -> None:
    spmd2 = str(DATA / "unicorex" / "jsdl__spmd2.jsdl")
    range1 = str(DATA / "unicorex" / "jsdl__range1.jsdl")
    fixture = str(FIXTURES / "malleable_mpi.jsdl")
    done = gbroker("jsdl", "check", "--json", "--site", "r0c0", spmd2, range1, fixture)
    assert done.returncode == 1
    ok, bad, mine = json.loads(done.stdout)
    assert (ok["file"], ok["ok"]) == (spmd2, True)
    assert from_mapping(ok["job"]) == load_job_description(spmd2)
    assert ok["job"]["processes_from_allocation"] is True
    assert ok["request"] == {
        "rank": 1,
        "max_rank": 1,
        "job_class": "rigid",
        "requested_time": None,
        "input_files": [],
    }
    assert (bad["file"], bad["ok"]) == (range1, False)
    assert bad["path"] == "IndividualCPUCount"
    assert bad["error"].startswith(f"{range1}: IndividualCPUCount: expected the root element")
    assert mine["request"]["input_files"] == [
        {"name": "grid.h5", "size": 268435456, "site": "r1c1"},
        {"name": "params.conf", "size": 25, "site": "r0c0"},
    ]
    assert mine["request"]["job_class"] == "malleable"


def test_check_json_exit_0_when_all_files_are_valid(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"executable": "/bin/true", "min_cores": 4}))
    done = gbroker("jsdl", "check", "--json", str(job))
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["request"]["rank"] == 4
    assert (report["refused_by_brokers"], report["schema"]) == ([], None)  # JSON: no schema
    # The fixture's staging is refused by brokers: not ok, exit 1, each reason listed.
    done = gbroker("jsdl", "check", "--json", str(FIXTURES / "malleable_mpi.json"))
    assert done.returncode == 1
    [report] = json.loads(done.stdout)
    assert (report["ok"], report["request"]["rank"]) == (False, 4)
    assert [r.split(":")[0] for r in report["refused_by_brokers"]] == [
        "staging[0].source",
        "staging[2].target",
    ]


# ---------------------------------------------------------------------------------------------
# Attacks on the landed code (issue 9, item 5): each is a precise JsdlError, quickly, and small.

YAML_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_is_refused_before_it_is_built() -> None:
    assert len(YAML_LAUGHS) < 400
    with pytest.raises(JsdlError) as caught:
        loads_job_description(YAML_LAUGHS, document="bomb.yaml")
    err = caught.value
    assert (err.path, err.expected) == ("line 1, column 4", "YAML without anchors or aliases")
    assert len(str(err)) < 200


@pytest.mark.parametrize(
    "text",
    [
        "executable: &x /bin/true\n",  # an anchor alone
        "executable: /bin/true\narguments: [*x]\n",  # an alias to nothing
        "executable: /bin/true\nenvironment: {<<: *base}\n",  # a merge key
    ],
)
def test_yaml_anchors_and_aliases_are_refused(text: str) -> None:
    with pytest.raises(JsdlError, match="expected YAML without anchors or aliases"):
        loads_job_description(text, fmt="yaml")


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


def test_huge_numbers_in_jsdl_are_refused_naming_the_element() -> None:
    doc = _job(extra=_sched("<gbroker:MinCores>1e23</gbroker:MinCores>"))
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc)
    assert caught.value.path == f"{DESC}/Scheduling/MinCores"


def test_a_description_at_every_bound_is_a_job_and_packs() -> None:
    import msgpack

    from gbroker.jobs.description import MAX_CORES, MAX_CPU_SECONDS, MAX_FILE_BYTES, MAX_SECONDS

    desc = from_mapping(
        {
            "executable": "/bin/x",
            "min_cores": MAX_CORES,
            "max_cores": MAX_CORES,
            "wall_time_limit": MAX_SECONDS,
            "cpu_time_limit": MAX_CPU_SECONDS,
            "total_cpu_time": {"upper": MAX_CPU_SECONDS},
            "staging": [{"file_name": "in", "source": "http://x/in", "size": MAX_FILE_BYTES}],
        }
    )
    job = desc.to_job("s0.1", "s0")
    assert (job.rank, job.requested_time) == (MAX_CORES, MAX_SECONDS)
    assert msgpack.unpackb(msgpack.packb(to_mapping(desc))) == to_mapping(desc)


_BAD_PATHS = [
    ("../../../../x", "a relative path inside the job directory"),
    ("a/../../x", "a relative path inside the job directory"),
    ("/tmp/x", "a relative path inside the job directory"),
    ("a\x00b", "text without control characters"),
    ("x" * 256, "a relative path inside the job directory"),
    ("/".join(["x" * 200] * 6), "a relative path inside the job directory"),
]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        *((key, value, why) for key in ("input", "output", "error") for value, why in _BAD_PATHS),
        # An absolute WorkingDirectory is taken inside the job directory (below); not these.
        *(("working_directory", value, why) for value, why in _BAD_PATHS if value != "/tmp/x"),
    ],
)
def test_paths_the_job_uses_are_confined_to_its_directory(
    key: str, value: str, expected: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", key: value})
    assert caught.value.path == key
    assert caught.value.expected.startswith(expected)
    assert len(str(caught.value)) < 500


@pytest.mark.parametrize(("value", "expected"), [*_BAD_PATHS, (".", "a file name")])
def test_staging_file_names_are_confined_to_the_job_directory(value: str, expected: str) -> None:
    staging = [{"file_name": "a"}, {"file_name": "b"}, {"file_name": value, "source": "http://x"}]
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/x", "staging": staging})
    assert caught.value.path == "staging[2].file_name"
    assert caught.value.expected.startswith(expected)


@pytest.mark.parametrize(
    ("element", "where"),
    [
        ("<jsdl-posix:Output>../out</jsdl-posix:Output>", "POSIXApplication/Output"),
        ("<jsdl-posix:Error>/tmp/err</jsdl-posix:Error>", "POSIXApplication/Error"),
        ("<jsdl-posix:Input>../../in</jsdl-posix:Input>", "POSIXApplication/Input"),
        (
            "<jsdl-posix:WorkingDirectory>/scratch/../..</jsdl-posix:WorkingDirectory>",
            "POSIXApplication/WorkingDirectory",
        ),
    ],
)
def test_bad_paths_in_jsdl_name_their_element(element: str, where: str) -> None:
    app = (
        "<jsdl-posix:POSIXApplication><jsdl-posix:Executable>/bin/x</jsdl-posix:Executable>"
        f"{element}</jsdl-posix:POSIXApplication>"
    )
    doc = _job(app=app)
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc)
    assert caught.value.path == f"{APP}/{where}"


def test_a_bad_staging_file_name_in_jsdl_names_its_element() -> None:
    staging = "<jsdl:DataStaging><jsdl:FileName>../../x</jsdl:FileName>" + (
        "<jsdl:Source><jsdl:URI>http://x/y</jsdl:URI></jsdl:Source></jsdl:DataStaging>"
    )
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(_job(extra=staging))
    assert caught.value.path == f"{DESC}/DataStaging[1]/FileName"


def test_paths_are_normalised_and_dev_null_input_is_no_input() -> None:
    desc = from_mapping(
        {
            "executable": "/bin/x",
            "input": "/dev/null",
            "output": "./out//run.log",
            "working_directory": ".",
            "staging": [{"file_name": "data/./in.txt", "source": "http://x/in"}],
        }
    )
    assert (desc.input, desc.output, desc.working_directory) == (None, "out/run.log", ".")
    assert desc.staging[0].file_name == "data/in.txt"
    assert parse_jsdl(to_jsdl(desc)) == desc


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


@given(
    lower=st.integers(4, 40).map(lambda n: n / 4),
    width=st.integers(1, 40).map(lambda n: n / 4),
    lower_exclusive=st.booleans(),
    upper_exclusive=st.booleans(),
)
def test_a_cpu_range_holds_exactly_the_whole_numbers_inside_it(
    lower: float, width: float, lower_exclusive: bool, upper_exclusive: bool
) -> None:
    """Against a reference written from the definition (not from the parser's rounding): the
    counts a range allows are the whole numbers k with lower <(=) k <(=) upper (lower >= 1)."""
    upper = lower + width
    inside = [
        k
        for k in range(0, 60)
        if (k > lower if lower_exclusive else k >= lower)
        and (k < upper if upper_exclusive else k <= upper)
    ]
    flag = {True: ' exclusiveBound="true"', False: ""}
    doc = _job(
        resources=_total(
            _range(f"{flag[lower_exclusive]}>{lower:g}", f"{flag[upper_exclusive]}>{upper:g}")
        )
    )
    if not inside:
        with pytest.raises(GBrokerError):
            parse_jsdl(doc).to_job("j", "s0")
        return
    job = parse_jsdl(doc).to_job("j", "s0")
    assert (job.rank, job.max_rank) == (inside[0], inside[-1])


# ---------------------------------------------------------------------------------------------
# What real grids write beyond programs and cores: requirements, file systems, staging-only
# jobs, and other middleware's application kinds


def test_the_requirements_fixture_reads_into_the_cores_requirements() -> None:
    from gbroker.core.requirements import Requirements

    desc = load_job_description(FIXTURES / "requirements.jsdl")
    assert desc.exclusive_execution is True
    assert (desc.operating_system, desc.cpu_architecture) == ("LINUX", "x86_64")
    assert desc.individual_physical_memory == RangeValue.at_least(800_000_000)
    assert desc.total_resource_count == RangeValue.exact(2)
    job = desc.to_job("a.1", "a")
    assert job.requirements == Requirements(
        operating_system="LINUX",
        cpu_architecture="x86_64",
        exclusive_execution=True,
        cores_per_node=2,
        nodes=2,
        individual_memory=800_000_000,
    )
    assert parse_jsdl(to_jsdl(desc)) == desc
    assert from_mapping(json.loads(json.dumps(to_mapping(desc)))) == desc
    jsdl_schema().validate(to_jsdl(desc))
    assert "needs       memory per node >= 763 MiB" in summary(desc)


def test_the_shared_documents_resources_are_requirements_now() -> None:
    posix = load_job_description(DATA / "gridway" / "POSIXProfileExample.xml")
    req = posix.to_job("x.1", "x").requirements
    assert req is not None
    assert (req.operating_system, req.operating_system_version) == ("LINUX", "2.6.9-1.66")
    assert (req.cpu_architecture, req.cpu_speed, req.cores_per_node) == ("x86_32", 1e8, 10)
    assert (req.individual_memory, req.individual_disk) == (10_000_000, 500_000_000)
    hpc = parse_jsdl(_without_staging_schedule("unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl"))
    req = hpc.to_job("x.1", "x").requirements
    assert req is not None
    assert (req.operating_system, req.cpu_architecture, req.exclusive_execution) == (
        "WINNT",
        "x86",
        True,
    )
    # A document asking for nothing beyond cores asks nothing of a site.
    assert load_job_description(DATA / "unicorex" / "jsdl__date.jsdl").requirements() is None


def test_file_system_references_resolve_by_name_and_are_requirements() -> None:
    from gbroker.core.requirements import FileSystemNeed

    desc = load_job_description(FIXTURES / "filesystems.jsdl")
    assert dict(desc.filesystem_names) == {
        "arguments[0]": "SCRATCH",
        "output": "SCRATCH",
        "environment.DATA": "SCRATCH",
    }
    assert desc.output == "results/out.txt"
    assert desc.staging[0].filesystem == "SCRATCH"
    job = desc.to_job("a.1", "a")
    assert job.requirements is not None
    assert job.requirements.file_systems == (
        FileSystemNeed("SCRATCH", "temporary", None, 1_000_000_000),
    )
    assert parse_jsdl(to_jsdl(desc)) == desc
    jsdl_schema().validate(to_jsdl(desc))
    # A reference to a file system the job does not declare is needed by name.
    text = to_jsdl(desc).replace(
        'filesystemName="SCRATCH">results', 'filesystemName="HOME">results'
    )
    needs = parse_jsdl(text).requirements()
    assert needs is not None
    assert [fs.name for fs in needs.file_systems] == ["SCRATCH", "HOME"]


def test_a_staging_only_document_is_a_job_without_a_program() -> None:
    desc = load_job_description(FIXTURES / "staging_only.jsdl")
    assert desc.staging_only
    assert desc.application is None
    assert [e.creation_flag for e in desc.staging] == [
        CreationFlag.OVERWRITE,
        CreationFlag.APPEND,
        CreationFlag.OVERWRITE,
    ]
    assert desc.staging[2].delete_on_termination is True
    assert desc.to_job("a.1", "a").rank == 1
    assert parse_jsdl(to_jsdl(desc)) == desc
    jsdl_schema().validate(to_jsdl(desc))
    assert summary(desc)[1].startswith("program     none: a staging-only job")


def test_another_middlewares_application_kind_is_named() -> None:
    with pytest.raises(JsdlError) as caught:
        load_job_description(FIXTURES / "mpi_application.jsdl")
    err = caught.value
    assert err.path == f"{APP}/MPIApplication"
    assert err.expected.startswith("a POSIXApplication, HPCProfileApplication or SPMDApplication")
    assert "write an MPI job as an SPMDApplication" in err.expected
    assert err.found == "MPIApplication of namespace urn:gridsam:mpi"


_FS = f"{RES}/FileSystem[1]"


@pytest.mark.parametrize(
    ("doc", "path", "expected", "found"),
    [
        (_job(resources="<jsdl:IndividualVirtualMemory><jsdl:Exact>1</jsdl:Exact>"
                        "</jsdl:IndividualVirtualMemory>"),
         f"{RES}/IndividualVirtualMemory", "no virtual memory requirement",
         "IndividualVirtualMemory"),
        (_job(resources="<jsdl:FileSystem/>"), f"{_FS}/@name",
         'a name="..." attribute (HOME, SCRATCH, ...)', None),
        (_job(resources="<jsdl:FileSystem name='1x'/>"), f"{_FS}/@name",
         "a file system name", "1x"),
        (_job(resources="<jsdl:FileSystem name='S'><jsdl:FileSystemType>ram</jsdl:FileSystemType>"
                        "</jsdl:FileSystem>"),
         f"{_FS}/FileSystemType", "one of normal, spool, temporary, swap", "ram"),
        (_job(resources="<jsdl:FileSystem name='S'><jsdl:MountPoint>scratch</jsdl:MountPoint>"
                        "</jsdl:FileSystem>"),
         f"{_FS}/MountPoint", "an absolute path", "scratch"),
        (_job(resources="<jsdl:FileSystem name='S'/><jsdl:FileSystem name='S'/>"),
         f"{RES}/FileSystem[2]/@name", "each file system once", "S"),
        (_job(resources="<jsdl:ExclusiveExecution>sometimes</jsdl:ExclusiveExecution>"),
         f"{RES}/ExclusiveExecution", "true or false", "sometimes"),
        (_job(resources="<jsdl:CPUArchitecture/>"), f"{RES}/CPUArchitecture/CPUArchitectureName",
         "exactly one CPUArchitectureName", 0),
        (_job(resources="<jsdl:OperatingSystem><jsdl:OperatingSystemType/></jsdl:OperatingSystem>"),
         f"{RES}/OperatingSystem/OperatingSystemType/OperatingSystemName",
         "exactly one OperatingSystemName", 0),
        (_job(resources="<jsdl:IndividualPhysicalMemory><jsdl:Exact>-1</jsdl:Exact>"
                        "</jsdl:IndividualPhysicalMemory>"),
         f"{RES}/IndividualPhysicalMemory/Exact", "a number >= 0", None),
        (_job(resources="<jsdl:TotalPhysicalMemory><jsdl:Exact>1e300</jsdl:Exact>"
                        "</jsdl:TotalPhysicalMemory>"),
         f"{RES}/TotalPhysicalMemory", "bytes from 0 to", None),
        (_job(resources="<jsdl:TotalResourceCount><jsdl:Exact>0.5</jsdl:Exact>"
                        "</jsdl:TotalResourceCount>"),
         f"{RES}/TotalResourceCount/Exact", "a whole number of CPUs", "0.5"),
        (_job(POSIX_APP.replace("<jsdl-posix:Executable>",
                                '<jsdl-posix:Output filesystemName="S">../up</jsdl-posix:Output>'
                                "<jsdl-posix:Executable>")),
         f"{POSIX_PATH}/Output", "a relative path inside the job directory", "../up"),
        (_job(POSIX_APP.replace("<jsdl-posix:Executable>",
                                '<jsdl-posix:Argument filesystemName="S">/etc/passwd'
                                "</jsdl-posix:Argument><jsdl-posix:Executable>")),
         f"{POSIX_PATH}/Argument[1]/@filesystemName", "a relative path inside the job directory",
         "/etc/passwd"),
        (_job(POSIX_APP.replace("<jsdl-posix:Executable>",
                                '<jsdl-posix:Output filesystemName="a b">x</jsdl-posix:Output>'
                                "<jsdl-posix:Executable>")),
         f"{POSIX_PATH}/Output/@filesystemName", "a file system name", "a b"),
        (_job(extra=_staging("<jsdl:FilesystemName>9</jsdl:FilesystemName>")),
         f"{STAGE}/FilesystemName", "a file system name", "9"),
    ],
)  # fmt: skip
def test_resources_and_file_systems_get_precise_errors(
    doc: str, path: str, expected: str, found: object
) -> None:
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc, document="job.jsdl")
    err = caught.value
    assert err.path == path
    assert err.expected.startswith(expected)
    if found is not None:
        assert err.found == found


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


def test_check_shows_a_sweep_as_an_array_and_what_brokers_would_refuse() -> None:
    sweep = str(FIXTURES / "sweep_echo_100.jsdl")
    uris = str(FIXTURES / "unsupported_uris.jsdl")
    done = gbroker("jsdl", "check", sweep, uris)
    assert done.returncode == 1, done.stderr  # the second: its URIs are refused
    assert f"{sweep}: ok, a sweep of 100 jobs; the first:\n" in done.stdout
    assert f"{uris}: a broker would refuse it\n" in done.stdout
    assert "  varies      name: echo-sweep-1, echo-sweep-2, echo-sweep-3, echo-sweep-4, ...\n" in (
        done.stdout
    )
    assert (
        "  refused     JobDefinition/JobDescription/DataStaging[1]/Source/URI: expected a URL "
        "with scheme http or https (not ftp:"
    ) in done.stdout
    assert "(not file: a file: URL names the broker's own disk" in done.stdout
    reports = json.loads(gbroker("jsdl", "check", sweep, uris, "--json").stdout)
    assert reports[0]["array"]["size"] == 100
    assert reports[0]["job"]["arguments"] == ["value", "1"]
    assert len(reports[1]["refused_by_brokers"]) == 2


# ---------------------------------------------------------------------------------------------
# Issue 24, JSDL: an element of JSDL's namespaces is honoured or refused, never read and dropped

HPCPA = "http://schemas.ggf.org/jsdl/2006/07/jsdl-hpcpa"
OTHER = 'xmlns:x="urn:example:other"'


def _hpcpa(inner: str) -> str:
    return (
        f'<hpcpa:HPCProfileApplication xmlns:hpcpa="{HPCPA}">'
        f"<hpcpa:Executable>/bin/pwd</hpcpa:Executable>{inner}</hpcpa:HPCProfileApplication>"
    )


def _posix(inner: str) -> str:
    return POSIX_APP.replace(
        "</jsdl-posix:POSIXApplication>", f"{inner}</jsdl-posix:POSIXApplication>"
    )


def _staged(inner: str) -> str:
    return (
        "<jsdl:DataStaging><jsdl:FileName>in.txt</jsdl:FileName>"
        f"<jsdl:CreationFlag>overwrite</jsdl:CreationFlag>{inner}</jsdl:DataStaging>"
    )


@pytest.mark.parametrize(
    ("doc", "where", "expected", "found"),
    [
        (_job(resources=_total("<jsdl:Exact>64</jsdl:Exact>").replace("Count", "Cont")),
         f"{RES}/TotalCPUCont",
         "an element JSDL defines in Resources (did you mean TotalCPUCount?)", "TotalCPUCont"),
        (_job(extra=_staged("<jsdl:FileSystemName>SCRATCH</jsdl:FileSystemName>")),
         f"{DESC}/DataStaging[1]/FileSystemName",
         "an element JSDL defines in DataStaging (did you mean FilesystemName?)",
         "FileSystemName"),
        (_job(_posix("<jsdl-posix:Exectable>/bin/x</jsdl-posix:Exectable>")),
         f"{APP}/POSIXApplication/Exectable",
         "an element JSDL POSIX defines in POSIXApplication (did you mean Executable?)",
         "Exectable"),
        (_job(_hpcpa("<hpcpa:Argumnt>1</hpcpa:Argumnt>")),
         f"{APP}/HPCProfileApplication/Argumnt",
         "an element HPC Profile Application defines in HPCProfileApplication (did you mean "
         "Argument?)", "Argumnt"),
        (_job(_spmd("<jsdl-spmd:NumberOfProcess>4</jsdl-spmd:NumberOfProcess>")),
         f"{APP}/SPMDApplication/NumberOfProcess",
         "an element JSDL SPMD defines in SPMDApplication (did you mean NumberOfProcesses?)",
         "NumberOfProcess"),
        (_job(extra="<jsdl:JobIdentification><jsdl:JobNme>x</jsdl:JobNme>"
                    "</jsdl:JobIdentification>"),
         f"{DESC}/JobIdentification/JobNme",
         "an element JSDL defines in JobIdentification (did you mean JobName?)", "JobNme"),
        (_job(resources="<jsdl:OperatingSystem><jsdl:OperatingSystemVersoin>6"
                        "</jsdl:OperatingSystemVersoin></jsdl:OperatingSystem>"),
         f"{RES}/OperatingSystem/OperatingSystemVersoin",
         "an element JSDL defines in OperatingSystem (did you mean OperatingSystemVersion?)",
         "OperatingSystemVersoin"),
        (_job(resources="<jsdl:CandidateHosts><jsdl:Hostname>h</jsdl:Hostname>"
                        "</jsdl:CandidateHosts>"),
         f"{RES}/CandidateHosts/Hostname",
         "an element JSDL defines in CandidateHosts (did you mean HostName?)", "Hostname"),
        (_job(resources=_total(_range(">1", ">4").replace("UpperBound", "Upperbound"))),
         f"{RES}/TotalCPUCount/Range/Upperbound",
         "an element JSDL defines in Range (did you mean UpperBound?)", "Upperbound"),
        (_job(extra=_staged("<jsdl:Source><jsdl:Uri>http://x/y</jsdl:Uri></jsdl:Source>")),
         f"{DESC}/DataStaging[1]/Source/Uri",
         "an element JSDL defines in Source (did you mean URI?)", "Uri"),
        # In the wrong place, or the wrong namespace: said so.
        (_job(_posix("") + "<jsdl:TotalCPUCount><jsdl:Exact>4</jsdl:Exact></jsdl:TotalCPUCount>"),
         f"{APP}/TotalCPUCount",
         "an element of Application (TotalCPUCount belongs in Resources)", "TotalCPUCount"),
        (_job(_posix("<jsdl-spmd:NumberOfProcesses>4</jsdl-spmd:NumberOfProcesses>")),
         f"{APP}/POSIXApplication/NumberOfProcesses",
         "an element of POSIXApplication (NumberOfProcesses belongs in SPMDApplication)",
         "NumberOfProcesses"),
        (_job(_posix("<jsdl:WallTimeLimit>60</jsdl:WallTimeLimit>")),
         f"{APP}/POSIXApplication/WallTimeLimit",
         f"WallTimeLimit of namespace {POSIX_NS}", f"{{{JSDL_NS}}}WallTimeLimit"),
        (_job(extra="<jsdl-posix:POSIXApplication/>"), f"{DESC}/POSIXApplication",
         "an element of JobDescription (POSIXApplication belongs in Application)",
         "POSIXApplication"),
    ],
)  # fmt: skip
def test_unknown_elements_of_the_jsdl_namespaces_are_errors_naming_the_nearest(
    doc: str, where: str, expected: str, found: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc, document="job.jsdl")
    err = caught.value
    assert (err.path, err.expected, err.found) == (where, expected, found)
    assert str(err).startswith(f"job.jsdl: {where}: expected {expected}")


@pytest.mark.parametrize(
    ("doc", "where", "expected", "found"),
    [
        (_job(resources="<jsdl:FileSystem name='HOME'><jsdl:MountSource>nfs:/home"
                        "</jsdl:MountSource></jsdl:FileSystem>"),
         f"{RES}/FileSystem[1]/MountSource", "no MountSource (a site mounts its own file systems",
         "nfs:/home"),
        (_job(_posix("<jsdl-posix:UserName>alice</jsdl-posix:UserName>")),
         f"{APP}/POSIXApplication/UserName", "no UserName (a job runs as the local account",
         "alice"),
        (_job(_hpcpa("<hpcpa:UserName>alice</hpcpa:UserName>")),
         f"{APP}/HPCProfileApplication/UserName", "no UserName", "alice"),
        (_job(_posix("<jsdl-posix:GroupName>staff</jsdl-posix:GroupName>")),
         f"{APP}/POSIXApplication/GroupName", "no GroupName", "staff"),
        (_job(_posix("<jsdl-posix:MemoryLimit>1000000</jsdl-posix:MemoryLimit>")),
         f"{APP}/POSIXApplication/MemoryLimit",
         "no MemoryLimit (GBroker applies WallTimeLimit and CPUTimeLimit only", "1000000"),
        (_job(_spmd("<jsdl-posix:VirtualMemoryLimit>9</jsdl-posix:VirtualMemoryLimit>")),
         f"{APP}/SPMDApplication/VirtualMemoryLimit", "no VirtualMemoryLimit", "9"),
        (_job(resources=_total('<jsdl:Exact epsilon="2">8</jsdl:Exact>')),
         f"{RES}/TotalCPUCount/Exact/@epsilon", "an Exact value without epsilon", "2"),
    ],
)  # fmt: skip
def test_elements_jsdl_defines_that_gbroker_does_not_honour_are_refused(
    doc: str, where: str, expected: str, found: str
) -> None:
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc)
    err = caught.value
    assert (err.path, err.found) == (where, found)
    assert err.expected.startswith(expected)


def test_other_namespaces_and_known_deviations_are_still_accepted() -> None:
    """The schemas' extension points (xsd:any of another namespace) everywhere, and what real
    writers do that the reader documents."""
    foreign = f"<x:Note {OTHER}>kept out</x:Note>"
    doc = _job(
        _spmd(f"<jsdl-spmd:NumberOfProcesses>4</jsdl-spmd:NumberOfProcesses>{foreign}") + foreign,
        f"<jsdl:CandidateHost><jsdl:HostName>h1</jsdl:HostName></jsdl:CandidateHost>{foreign}"
        f"<jsdl:OperatingSystem><jsdl:OperatingSystemType><jsdl:OperatingSystemName>LINUX"
        f"</jsdl:OperatingSystemName>{foreign}</jsdl:OperatingSystemType>{foreign}"
        "<jsdl:Description>any Linux</jsdl:Description></jsdl:OperatingSystem>"
        f"<jsdl:FileSystem name='S'>{foreign}<jsdl:Description>scratch</jsdl:Description>"
        "</jsdl:FileSystem>",
        _staged(f"<jsdl:Source><URI>http://x/in</URI>{foreign}</jsdl:Source>{foreign}") + foreign,
    ).replace("<jsdl:JobDescription>", f"<jsdl:JobDescription>{foreign}")
    desc = parse_jsdl(doc)
    assert (desc.number_of_processes, desc.candidate_hosts) == (4, ("h1",))
    assert desc.operating_system == "LINUX"
    assert desc.file_systems == (FileSystem("S", description="scratch"),)
    assert desc.staging[0].source == "http://x/in"


def test_check_names_a_misspelt_element_and_submit_refuses_it(tmp_path: Path) -> None:
    job = tmp_path / "typo.jsdl"
    job.write_text(_job(resources=_total("<jsdl:Exact>64</jsdl:Exact>").replace("Count", "Cont")))
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    assert done.stdout == (
        f"{job}: {RES}/TotalCPUCont: expected an element JSDL defines in Resources (did you "
        "mean TotalCPUCount?), got 'TotalCPUCont'\n"
    )


# -- OGF schemas: shipped, and what check says with and without --schema


def test_the_shipped_schemas_are_the_official_files_with_their_notice() -> None:
    from gbroker.jobs.jsdl_schema import SCHEMA_DIR

    for name in ("jsdl.xsd", "jsdl-posix.xsd", "jsdl-spmd.xsd"):
        shipped = (SCHEMA_DIR / name).read_bytes()
        assert shipped == (SCHEMA / name).read_bytes(), name
        assert b"Copyright (C)" in shipped
        assert b"All Rights Reserved" in shipped
    assert "unmodified" in (SCHEMA_DIR / "README.md").read_text()


def test_check_schema_prints_each_violation_with_its_path() -> None:
    basic = str(DATA / "gridway" / "basicExample.xml")
    posix = str(DATA / "unicorex" / "jsdl__posix.jsdl")
    done = gbroker("jsdl", "check", "--schema", posix, basic)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert f"{posix}: not valid by the JSDL schemas" in lines
    assert (
        "  schema      JobDefinition/JobDescription/Application/POSIXApplication: Unexpected "
        "child with tag 'jsdl-posix:Argument' at position 5."
    ) in lines
    assert f"{basic}: a broker would refuse it; not valid by the JSDL schemas" in lines
    assert (
        "  schema      JobDefinition/JobDescription/Resources: Unexpected child with tag "
        "'jsdl:CandidateHost' at position 1."
    ) in lines
    # A document GBroker refuses is still validated, each violation with its path.
    staging = str(DATA / "unicorex" / "jsdl__staging_4.jsdl")
    done = gbroker("jsdl", "check", "--schema", "--json", staging)
    [report] = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["schema"] == [
        {
            "path": f"{DESC}/DataStaging[{i}]",
            "reason": "Unexpected child with tag 'jsdl:Target' at position 1. Tag "
            "'jsdl:FileName' expected.",
        }
        for i in (1, 2)
    ]
    # Valid: exit 0, nothing more said.
    sleep = str(DATA / "unicorex" / "ems__sleep.jsdl")
    done = gbroker("jsdl", "check", "--schema", sleep)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, f"{sleep}: ok")
    assert "schema" not in done.stdout


def test_default_check_warns_where_the_schema_disagrees_without_failing() -> None:
    posix = str(DATA / "unicorex" / "jsdl__posix.jsdl")  # Argument after the streams
    spmd2 = str(DATA / "unicorex" / "jsdl__spmd2.jsdl")  # UNICORE's actualTotalCPUCount
    done = gbroker("jsdl", "check", posix, spmd2)
    assert done.returncode == 0, done.stdout
    warnings = [line for line in done.stdout.splitlines() if line.startswith("  warning")]
    assert warnings[0] == (
        "  warning     the JSDL schema disagrees: JobDefinition/JobDescription/Application/"
        "POSIXApplication: Unexpected child with tag 'jsdl-posix:Argument' at position 5."
    )
    assert (
        "  warning     the JSDL schema disagrees: JobDefinition/JobDescription/Application/"
        "SPMDApplication/NumberOfProcesses: attribute 'actualTotalCPUCount' not allowed"
    ) in warnings
    assert len(warnings) == 4


def test_the_schema_is_loaded_only_for_jsdl_and_built_once_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gbroker.jobs import jsdl_schema

    yaml_job = tmp_path / "job.yaml"
    yaml_job.write_text("executable: /bin/true\n")
    probe = (
        "import sys\nfrom gbroker.cli import main\ncode = main(sys.argv[1:])\n"
        "print('xmlschema' in sys.modules, code)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", probe, "jsdl", "check", str(yaml_job)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.stdout.splitlines()[-1] == "False 0", done.stderr
    assert not (tmp_path / "cache").exists()
    # A JSDL document: validated, and the built schemas kept in the user's cache, 0600.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jsdl_schema._schema.cache_clear()
    try:
        assert jsdl_schema.schema_violations(SafeET.fromstring(_job())) == []
        [cached] = (tmp_path / "cache" / "gbroker").iterdir()
        assert cached.stat().st_mode & 0o777 == 0o600
        jsdl_schema._schema.cache_clear()
        assert isinstance(jsdl_schema._read_cache(cached), xmlschema.XMLSchema10)
        # One another user could have written is never unpickled.
        cached.chmod(0o620)
        assert jsdl_schema._read_cache(cached) is None
    finally:
        jsdl_schema._schema.cache_clear()


# -- what a broker refuses, checked before submitting


def test_check_exits_1_with_each_reason_a_broker_would_refuse(tmp_path: Path) -> None:
    job = tmp_path / "urn.yaml"
    job.write_text(
        "executable: /bin/true\nstaging:\n"
        "  - {file_name: in.txt, source: 'urn:example:data'}\n"
        "  - {file_name: out.txt, target: 'gbroker:store', creation_flag: append}\n"
    )
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == f"{job}: a broker would refuse it"
    assert (
        "  refused     staging[0].source: expected a URL with scheme http or https (not urn: a "
        "scheme GBroker does not stage), got 'urn:example:data'"
    ) in lines
    assert (
        "  refused     staging[1].creation_flag: expected overwrite or dontOverwrite for a "
        "stage-out (an HTTP PUT or the file store replaces a file; neither can append to one), "
        "got 'append'"
    ) in lines


def test_check_matches_requirements_against_a_topologys_sites(tmp_path: Path) -> None:
    from gbroker.topology import SiteSpec, Topology, save_topology

    topology = tmp_path / "grid.yaml"
    sites = [
        SiteSpec("a", 4, operating_system="LINUX"),
        SiteSpec("b", 16, operating_system="LINUX"),
    ]
    save_topology(Topology(sites, "full", name="grid"), topology)
    job = tmp_path / "big.jsdl"
    job.write_text(_job(resources=_total("<jsdl:Exact>64</jsdl:Exact>")))
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 1
    assert (
        f"  refused     {RES}/TotalCPUCount: expected a site of the fleet with 64 cores, got "
        "'16 cores at site b, the closest of 2'"
    ) in done.stdout.splitlines()
    job.write_text(_job(resources=_total("<jsdl:Exact>16</jsdl:Exact>")))
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 0, done.stdout
    missing = gbroker("jsdl", "check", "--topology", str(tmp_path / "nope.yaml"), str(job))
    assert missing.returncode == 2
    assert missing.stderr == (
        f"gbroker jsdl check: {tmp_path / 'nope.yaml'}: expected a readable topology file, got "
        "'No such file or directory'\n"
    )


def test_an_absolute_working_directory_is_taken_inside_the_job_directory(tmp_path: Path) -> None:
    doc = _job(_hpcpa("<hpcpa:WorkingDirectory>/scratch//run/</hpcpa:WorkingDirectory>"))
    desc = parse_jsdl(doc)
    assert (desc.working_directory, desc.run_directory) == ("/scratch/run", "scratch/run")
    assert parse_jsdl(to_jsdl(desc)) == desc
    assert from_mapping(to_mapping(desc)) == desc
    assert from_mapping({"executable": "x", "working_directory": "/"}).run_directory is None
    job = tmp_path / "hpcp.jsdl"
    job.write_text(doc)
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 0, done.stdout
    assert (
        "  working dir /scratch/run: the site starts the job in scratch/run in the job's "
        "directory (it keeps a job's paths inside its directory; filesystemName names a site's "
        "file system)"
    ) in done.stdout.splitlines()


# -- an empty WorkingDirectory of a file system: its mount point


def test_an_empty_working_directory_of_a_file_system_is_its_mount_point() -> None:
    element = '<jsdl-posix:WorkingDirectory filesystemName="SPOOL"/>'
    doc = _job(_posix(element))
    jsdl_schema().validate(doc)  # as the OGF schemas allow
    desc = parse_jsdl(doc)
    assert (desc.working_directory, dict(desc.filesystem_names)) == (
        ".",
        {"working_directory": "SPOOL"},
    )
    assert desc.requirements() is not None  # a site with SPOOL
    assert parse_jsdl(to_jsdl(desc)) == desc
    # JSON/YAML say the same, with the path empty, "." or left out.
    for path in ({"working_directory": ""}, {"working_directory": "."}, {}):
        mapped = from_mapping(
            {"executable": "/bin/true", "filesystem_names": {"working_directory": "SPOOL"}, **path}
        )
        assert (mapped.working_directory, dict(mapped.filesystem_names)) == (
            ".",
            {"working_directory": "SPOOL"},
        )
    assert "working dir file system SPOOL (its mount point at the site)" in summary(desc)


# -- JSDL's enumerations


@pytest.mark.parametrize(
    ("element", "key", "value", "expected"),
    [
        ("OperatingSystem/OperatingSystemType/OperatingSystemName", "operating_system", "Linux",
         "a value of JSDL's OperatingSystemName (did you mean LINUX?)"),
        ("OperatingSystem/OperatingSystemType/OperatingSystemName", "operating_system", "linux",
         "a value of JSDL's OperatingSystemName (did you mean LINUX?)"),
        ("OperatingSystem/OperatingSystemType/OperatingSystemName", "operating_system",
         "Windoze", "a value of JSDL's OperatingSystemName (did you mean "),
        ("CPUArchitecture/CPUArchitectureName", "cpu_architecture", "aarch64",
         "a value of JSDL's CPUArchitectureName (did you mean arm?)"),
        ("CPUArchitecture/CPUArchitectureName", "cpu_architecture", "X86_64",
         "a value of JSDL's CPUArchitectureName (did you mean x86_64?)"),
    ],
)  # fmt: skip
def test_values_outside_jsdls_enumerations_are_refused_naming_the_nearest(
    element: str, key: str, value: str, expected: str
) -> None:
    outer, *inner = element.split("/")
    xml = value
    for name in reversed([outer, *inner]):
        xml = f"<jsdl:{name}>{xml}</jsdl:{name}>"
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(_job(resources=xml))
    assert (caught.value.path, caught.value.found) == (f"{RES}/{element}", value)
    assert caught.value.expected.startswith(expected)
    with pytest.raises(JsdlError) as caught:
        from_mapping({"executable": "/bin/true", key: value})
    assert (caught.value.path, caught.value.found) == (key, value)
    assert caught.value.expected.startswith(expected)


def test_the_other_enumerations_name_the_nearest_value_too() -> None:
    with pytest.raises(JsdlError, match=r"overwrite, append or dontOverwrite \(did you mean "):
        parse_jsdl(_job(extra=_staged("").replace(">overwrite<", ">Overwrite<")))
    with pytest.raises(JsdlError, match=r"one of normal, spool, temporary, swap \(did you mean "):
        from_mapping({"executable": "x", "file_systems": [{"name": "S", "type": "spol"}]})
    with pytest.raises(JsdlError, match=r"rigid, moldable or malleable \(did you mean "):
        from_mapping({"executable": "x", "job_class": "maleable"})


def test_check_refuses_an_operating_system_outside_the_enumeration(tmp_path: Path) -> None:
    job = tmp_path / "linux.yaml"
    job.write_text("executable: /bin/true\noperating_system: Linux\n")
    done = gbroker("jsdl", "check", str(job))
    assert done.returncode == 1
    assert done.stdout == (
        f"{job}: operating_system: expected a value of JSDL's OperatingSystemName (did you "
        "mean LINUX?), got 'Linux'\n"
    )


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


def test_gbroker_jsdl_fields_lists_every_field_a_job_may_have(tmp_path: Path) -> None:
    from dataclasses import fields as dataclass_fields

    done = gbroker("jsdl", "fields")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    names = {f.name for f in dataclass_fields(JobDescription)} | {"sweep"}
    assert names <= listed
    assert "  staging[i]: file_name, source, target, creation_flag, delete_on_termination, " in (
        done.stdout
    )
    as_json = json.loads(gbroker("jsdl", "fields", "--json").stdout)
    assert set(as_json["fields"]) == names
    job = tmp_path / "typo.yaml"
    job.write_text("executable: /bin/true\ncors: 4\n")
    done = gbroker("jsdl", "check", str(job))
    assert (done.returncode, done.stdout) == (
        1,
        f"{job}: cors: expected a known field: did you mean 'min_cores' or 'max_cores'? (known "
        "fields: gbroker jsdl fields, or docs/JSDL.md), got 'cors'\n",
    )


# -- CandidateHosts and SPMD's counts: honoured, where they were read and dropped


def test_candidate_hosts_are_a_requirement_check_matches_to_sites(tmp_path: Path) -> None:
    from gbroker.topology import SiteSpec, Topology, save_topology

    desc = load_job_description(FIXTURES / "malleable_mpi.yaml")
    req = desc.requirements()
    assert req is not None
    assert req.candidate_hosts == ("r0c1", "r1c0")
    topology = tmp_path / "grid.yaml"
    sites = [SiteSpec(name, 16) for name in ("a", "b")]
    save_topology(Topology(sites, "full", name="grid"), topology)
    job = tmp_path / "hosts.jsdl"
    job.write_text(
        _job(
            resources="<jsdl:CandidateHosts><jsdl:HostName>c*</jsdl:HostName></jsdl:CandidateHosts>"
        )
    )
    done = gbroker("jsdl", "check", "--topology", str(topology), str(job))
    assert done.returncode == 1
    assert (
        f"  refused     {RES}/CandidateHosts: expected a site of the fleet with the name c* "
        "(names it knows: a, b), got 'the name a at site a, the closest of 2'"
    ) in done.stdout.splitlines()
    job.write_text(job.read_text().replace(">c*<", ">B<"))
    assert gbroker("jsdl", "check", "--topology", str(topology), str(job)).returncode == 0


def test_spmd_counts_are_given_to_the_program_that_starts_the_processes() -> None:
    spmd = load_job_description(DATA / "unicorex" / "jsdl__spmd.jsdl")
    assert spmd.spmd_environment(8) == {
        "GBROKER_SPMD_PROCESSES": "8",
        "GBROKER_SPMD_PROCESSES_PER_HOST": "4",
        # actualIndividualCPUCount: 2 hosts share the 8 cores; a host's 4 among its 4 processes
        "GBROKER_SPMD_THREADS_PER_PROCESS": "1",
        "OMP_NUM_THREADS": "1",
        "GBROKER_SPMD_VARIATION": OPENMPI,
    }
    spmd2 = load_job_description(DATA / "unicorex" / "jsdl__spmd2.jsdl")
    assert spmd2.spmd_environment(6)["GBROKER_SPMD_PROCESSES"] == "6"  # one per core
    assert spmd2.spmd_environment(6)["OMP_NUM_THREADS"] == "2"
    assert parse_jsdl(_job()).spmd_environment(4) == {}
