""":mod:`gbroker.jobs.jsdl_read`: every real document in shared/data/jsdl, our own documents
(extension, derivation, precise errors), hostile XML, and JSDL elements honoured or refused."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.model import InputFile, JobClass
from gbroker.errors import GBrokerError
from gbroker.jobs.description import (
    JSDL_NS,
    POSIX_NS,
    ApplicationKind,
    CreationFlag,
    FileSystem,
    JobDescription,
    JsdlError,
    RangeValue,
)
from gbroker.jobs.documents import load_job_description, summary
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from tests.jobs.jsdl_documents import (
    _NO_FILE_NAME,
    _NOTHING_TO_RUN,
    APP,
    DATA,
    DESC,
    EXPECTED,
    FIXTURES,
    NAMESPACES,
    OPENMPI,
    POSIX_APP,
    RES,
    Parsed,
    _documents,
    _hpcpa,
    _job,
    _total,
    jsdl_schema,
)

_SAMPLE_HPC = Parsed(
    "bin/stdin.txt",
    ("-rn",),
    application=ApplicationKind.HPCPA,  # under schemas.ogf.org, as UNICORE writes it
    stage_in=(("bin/stdin.txt", "ftp://sunfire2.cs.virginia.edu:5213/gridsam.sh"),),
    stage_out=(("stdout.txt", "ftp://sunfire2.cs.virginia.edu:5213/enter_file_name_here.out"),),
    more={"total_cpu_count": RangeValue.exact(1), "output": "stdout.txt", "name": None},
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


def _spmd(processes: str) -> str:
    return (
        "<jsdl-spmd:SPMDApplication><jsdl-posix:Executable>/bin/mpi</jsdl-posix:Executable>"
        f"{processes}<jsdl-spmd:SPMDVariation>{OPENMPI}</jsdl-spmd:SPMDVariation>"
        "</jsdl-spmd:SPMDApplication>"
    )


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


def test_huge_numbers_in_jsdl_are_refused_naming_the_element() -> None:
    doc = _job(extra=_sched("<gbroker:MinCores>1e23</gbroker:MinCores>"))
    with pytest.raises(JsdlError) as caught:
        parse_jsdl(doc)
    assert caught.value.path == f"{DESC}/Scheduling/MinCores"


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


OTHER = 'xmlns:x="urn:example:other"'


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
