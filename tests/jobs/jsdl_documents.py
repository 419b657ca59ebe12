"""What the JSDL tests share: every document in shared/data/jsdl and what it must parse to (or why
it must be rejected), the official XSDs, builders of our own documents, and hypothesis strategies
for job descriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import xmlschema
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from gbroker.core.model import JobClass
from gbroker.jobs.description import (
    GBROKER_NS,
    JSDL_NS,
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


def _total(inner: str) -> str:
    return f"<jsdl:TotalCPUCount>{inner}</jsdl:TotalCPUCount>"


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


# ---------------------------------------------------------------------------------------------
# Issue 24, JSDL: an element of JSDL's namespaces is honoured or refused, never read and dropped

HPCPA = "http://schemas.ggf.org/jsdl/2006/07/jsdl-hpcpa"


def _hpcpa(inner: str) -> str:
    return (
        f'<hpcpa:HPCProfileApplication xmlns:hpcpa="{HPCPA}">'
        f"<hpcpa:Executable>/bin/pwd</hpcpa:Executable>{inner}</hpcpa:HPCProfileApplication>"
    )
