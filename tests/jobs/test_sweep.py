"""Parameter sweeps (GFD.149) and their JSON/YAML form: the fixtures in the shapes Genesis II
writes, cross products, every function, and a precise error for each way a sweep can be wrong."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.arrays import MAX_ARRAY_SIZE
from gbroker.jobs.description import JobDescription, JsdlError
from gbroker.jobs.sweep import JobArray, load_submission, loads_job, loads_submission

FIXTURES = Path(__file__).parents[1] / "fixtures" / "jsdl"
SWEEP = "http://schemas.ogf.org/jsdl/2009/03/sweep"
FUNCTIONS = "http://schemas.ogf.org/jsdl/2009/03/sweep/functions"
JSDL = "http://schemas.ggf.org/jsdl/2005/11/jsdl"
POSIX = "http://schemas.ggf.org/jsdl/2005/11/jsdl-posix"
BINDINGS = (
    f'<s:NamespaceBinding prefix="j" ns="{JSDL}"/><s:NamespaceBinding prefix="p" ns="{POSIX}"/>'
)


def array(path: str) -> JobArray:
    loaded = load_submission(FIXTURES / path)
    assert isinstance(loaded, JobArray)
    return loaded


def document(sweep: str, resources: str = "", arguments: tuple[str, ...] = ("i",)) -> str:
    args = "".join(f"<p:Argument>{a}</p:Argument>" for a in arguments)
    return f"""<j:JobDefinition xmlns:j="{JSDL}" xmlns:p="{POSIX}" xmlns:s="{SWEEP}"
        xmlns:f="{FUNCTIONS}">
      <j:JobDescription>
        <j:Application><p:POSIXApplication><p:Executable>/bin/echo</p:Executable>{args}
        </p:POSIXApplication></j:Application>{resources}
      </j:JobDescription>
      {sweep}
    </j:JobDefinition>"""


def assignment(match: str, function: str) -> str:
    return (
        f"<s:Assignment><s:DocumentNode>{BINDINGS}<s:Match>{match}</s:Match></s:DocumentNode>"
        f"{function}</s:Assignment>"
    )


ARG1 = "/j:JobDefinition/j:JobDescription/j:Application/p:POSIXApplication/p:Argument[1]"


def rejected(text: str) -> JsdlError:
    with pytest.raises(JsdlError) as caught:
        loads_submission(text, document="doc")
    message = str(caught.value)
    assert message.startswith("doc: ")
    assert "\n" not in message
    return caught.value


# -- the fixtures ------------------------------------------------------------------------------


def test_a_100_value_sweep_is_100_jobs_with_their_values() -> None:
    jobs = array("sweep_echo_100.jsdl")
    assert jobs.size == 100
    for k, job in enumerate(jobs.elements, start=1):
        assert job.arguments == ("value", str(k))  # the placeholder replaced, not kept
        assert job.name == f"echo-sweep-{k}"
        assert job.output == "out.txt"
    assert jobs.varying() == {
        "arguments": [["value", "1"], ["value", "2"], ["value", "3"], ["value", "4"]],
        "name": ["echo-sweep-1", "echo-sweep-2", "echo-sweep-3", "echo-sweep-4"],
    }


def test_an_mpi_sweep_substitutes_arguments_and_stage_out_targets() -> None:
    jobs = array("sweep_mpi_4.jsdl")
    assert jobs.size == 4
    for k, job in enumerate(jobs.elements, start=1):
        assert (
            job.arguments[1] == f"echo rank-count $GBROKER_CORES run {k}; echo run {k} > hosts.txt"
        )
        assert [e.target for e in job.stage_out] == [
            f"http://results.example.org/sweep/mpi-out-{k}",
            f"http://results.example.org/sweep/hosts-{k}.txt",
        ]
        assert job.number_of_processes == 2


def test_nested_sweeps_are_cross_products_and_the_yaml_form_is_the_same() -> None:
    xml, yaml = array("sweep_nested.jsdl"), array("sweep_nested.yaml")
    assert xml.elements == yaml.elements
    got = [(job.arguments, job.environment["SEED"]) for job in xml.elements]
    expected = [
        ((f"--model={model}", f"--dt={dt}"), seed)
        for model, seed in (("lorenz", "30"), ("rossler", "20"), ("chua", "10"))
        for dt in ("0.1", "0.3", "0.4")  # 0.2 is an Exception; decimal steps stay exact
    ]
    assert got == expected
    assert yaml.mapping is not None
    assert "sweep" in yaml.mapping


def test_a_document_without_a_sweep_is_one_job() -> None:
    assert isinstance(load_submission(FIXTURES / "requirements.jsdl"), JobDescription)
    assert isinstance(loads_submission("executable: /bin/true\n"), JobDescription)


def test_sibling_sweeps_add_up_and_attributes_take_values() -> None:
    sweep = (
        f"<s:Sweep>{assignment(ARG1, '<f:Values><f:Value>a</f:Value></f:Values>')}</s:Sweep>"
        "<s:Sweep>"
        + assignment(
            "//p:Environment/@name", "<f:Values><f:Value>X</f:Value><f:Value>Y</f:Value></f:Values>"
        )
        + "</s:Sweep>"
    )
    text = document(sweep).replace(
        "</p:Executable>", '</p:Executable><p:Environment name="V">1</p:Environment>'
    )
    jobs = loads_submission(text)
    assert isinstance(jobs, JobArray)
    assert [(j.arguments, dict(j.environment)) for j in jobs.elements] == [
        (("a",), {"V": "1"}),
        (("i",), {"X": "1"}),
        (("i",), {"Y": "1"}),
    ]


def test_several_substitutions_in_one_node_keep_the_templates_positions() -> None:
    # "i-j": the first value is longer than its placeholder; the second still lands on "j".
    sweep = (
        "<s:Sweep>"
        + assignment(f"substring({ARG1}, 1, 1)", "<f:Values><f:Value>100</f:Value></f:Values>")
        + "<s:Sweep>"
        + assignment(f"substring({ARG1}, 3, 1)", '<f:LoopInteger start="7" end="8"/>')
        + "</s:Sweep></s:Sweep>"
    )
    jobs = loads_submission(document(sweep, arguments=("i-j",)))
    assert isinstance(jobs, JobArray)
    assert [j.arguments for j in jobs.elements] == [("100-7",), ("100-8",)]


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(-50, 50),
    count=st.integers(1, 40),
    step=st.integers(-7, 7).filter(bool),
    exceptions=st.lists(st.integers(-400, 400), max_size=5),
)
def test_loop_integer_is_pythons_range_minus_its_exceptions(
    start: int, count: int, step: int, exceptions: list[int]
) -> None:
    end = start + (count - 1) * step
    wanted = [v for v in range(start, end + (1 if step > 0 else -1), step) if v not in exceptions]
    excepted = "".join(f"<f:Exception>{x}</f:Exception>" for x in exceptions)
    function = (
        f'<f:LoopInteger start="{start}" end="{end}" step="{step}">{excepted}</f:LoopInteger>'
    )
    text = document(f"<s:Sweep>{assignment(ARG1, function)}</s:Sweep>")
    if not wanted:
        assert "0 jobs" in str(rejected(text))
        return
    jobs = loads_submission(text)
    assert isinstance(jobs, JobArray)
    assert [j.arguments[0] for j in jobs.elements] == [str(v) for v in wanted]


def test_loop_double_counts_in_decimal() -> None:
    text = document(
        "<s:Sweep>"
        + assignment(ARG1, '<f:LoopDouble start="1" end="0" step="-0.25"/>')
        + "</s:Sweep>"
    )
    jobs = loads_submission(text)
    assert isinstance(jobs, JobArray)
    assert [j.arguments[0] for j in jobs.elements] == ["1.0", "0.75", "0.5", "0.25", "0.0"]
    assert Decimal("0.1") * 3 == Decimal("0.3")  # why decimal: 0.1 * 3 != 0.3 in binary


# -- errors ----------------------------------------------------------------------------------

LOOP = '<f:LoopInteger start="1" end="3"/>'


@pytest.mark.parametrize(
    ("sweep", "path", "expected", "found"),
    [
        (
            f'<s:Sweep>{assignment(ARG1, """<f:LoopInteger start="1" end="100000"/>""")}</s:Sweep>',
            "JobDefinition/Sweep/Assignment[1]/LoopInteger",
            f"a loop of at most {MAX_ARRAY_SIZE} values",
            "100000 values",
        ),
        (
            "<s:Sweep>"
            + assignment(ARG1, '<f:LoopInteger start="1" end="200"/>')
            + "<s:Sweep>"
            + assignment(f"substring({ARG1}, 1, 0)", '<f:LoopInteger start="1" end="100"/>')
            + "</s:Sweep></s:Sweep>",
            "JobDefinition/Sweep",
            f"a sweep of at most {MAX_ARRAY_SIZE} jobs",
            "20000 jobs",
        ),
        (
            "<s:Sweep>"
            + assignment(ARG1, LOOP)
            + assignment("//p:Executable", '<f:LoopInteger start="1" end="2"/>')
            + "</s:Sweep>",
            "JobDefinition/Sweep",
            "Assignments that yield as many values each",
            "3, 2",
        ),
        (
            f"<s:Sweep>{assignment('//p:Input', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "an XPath that selects a node of the JobDescription",
            "nothing",
        ),
        (
            f"<s:Sweep>{assignment('//q:Argument', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "an XPath 1.0 expression (prefixes bound by NamespaceBinding)",
            None,
        ),
        (
            f"<s:Sweep>{assignment('//p:Argument[', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "an XPath 1.0 expression",
            None,
        ),
        (
            f"<s:Sweep>{assignment('//j:Application', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "elements of text only",
            None,
        ),
        (
            f"<s:Sweep>{assignment('/j:JobDefinition', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "nodes inside the JobDescription",
            None,
        ),
        (
            "<s:Sweep>" + assignment(ARG1, LOOP.replace("/>", ' step="0"/>')) + "</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/LoopInteger",
            "a step other than 0",
            "0",
        ),
        (
            f'<s:Sweep>{assignment(ARG1, """<f:LoopDouble start="1" end="3"/>""")}</s:Sweep>',
            "JobDefinition/Sweep/Assignment[1]/LoopDouble/@step",
            'a step="..." attribute',
            None,
        ),
        (
            f'<s:Sweep>{assignment(ARG1, """<f:LoopInteger start="1.5" end="3"/>""")}</s:Sweep>',
            "JobDefinition/Sweep/Assignment[1]/LoopInteger/@start",
            "an integer",
            "1.5",
        ),
        (
            f"<s:Sweep>{assignment(ARG1, '''<f:Values/>''')}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/Values/Value",
            "at least one Value",
            None,
        ),
        (
            f"<s:Sweep><s:Assignment><s:FileSweep/>{LOOP}</s:Assignment></s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/FileSweep",
            "DocumentNode parameters (GBroker sweeps no other kind of parameter)",
            "FileSweep",
        ),
        (
            f"<s:Sweep>{assignment(ARG1, '<f:Random/>')}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/Random",
            "a function: Values, LoopInteger or LoopDouble",
            "Random",
        ),
        (
            f"<s:Sweep>{assignment(ARG1, LOOP + LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/LoopInteger",
            "exactly one function per Assignment",
            "LoopInteger",
        ),
        (
            "<s:Sweep>"
            + assignment(
                ARG1,
                LOOP.replace(
                    '3"/>',
                    '2"><f:Exception>1</f:Exception><f:Exception>2</f:Exception></f:LoopInteger>',
                ),
            )
            + "</s:Sweep>",
            "JobDefinition/Sweep",
            "a sweep of at least one job",
            "0 jobs (every value is an Exception)",
        ),
        (
            f"<s:Sweep>{assignment(f'substring({ARG1}, 0)', LOOP)}</s:Sweep>",
            "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match",
            "a whole-number substring start >= 1",
            0,
        ),
        ("<s:Sweep/>", "JobDefinition/Sweep/Assignment", "at least one Assignment", None),
    ],
)
def test_each_way_a_sweep_is_wrong_is_named(
    sweep: str, path: str, expected: str, found: object
) -> None:
    err = rejected(document(sweep))
    assert err.path == path
    assert err.expected.startswith(expected)
    if found is not None:
        assert err.found == found


def test_overlapping_substitutions_are_refused() -> None:
    sweep = (
        "<s:Sweep>"
        + assignment(f"substring({ARG1}, 1, 2)", LOOP)
        + assignment(f"substring({ARG1}, 2, 1)", LOOP)
        + "</s:Sweep>"
    )
    err = rejected(document(sweep, arguments=("abc",)))
    assert err.path == "JobDefinition/Sweep/Assignment[2]/DocumentNode[1]/Match"
    assert err.expected == (
        "a substitution that does not overlap the one of "
        "JobDefinition/Sweep/Assignment[1]/DocumentNode[1]/Match"
    )
    assert err.found == "both replace character 2 of 'abc'"


def test_an_element_that_is_not_a_valid_job_names_the_element() -> None:
    resources = "<j:Resources><j:TotalCPUCount><j:Exact>4</j:Exact></j:TotalCPUCount></j:Resources>"
    match = "//j:TotalCPUCount/j:Exact"
    values = "<f:Values><f:Value>2</f:Value><f:Value>many</f:Value></f:Values>"
    err = rejected(document(f"<s:Sweep>{assignment(match, values)}</s:Sweep>", resources))
    assert (
        err.path
        == "JobDefinition/JobDescription/Resources/TotalCPUCount/Exact [sweep element 2 of 2]"
    )
    assert err.expected == "a number"
    assert err.found == "many"


def test_a_huge_sweep_is_refused_before_any_job_is_made() -> None:
    # 10^9 values: counted, not enumerated.
    function = '<f:LoopInteger start="1" end="1000000000"/>'
    err = rejected(document(f"<s:Sweep>{assignment(ARG1, function)}</s:Sweep>"))
    assert err.found == "1000000000 values"


@pytest.mark.parametrize(
    ("yaml", "path", "expected"),
    [
        (
            "sweep: {assignments: [{parameters: ['arguments[3]'], values: [1]}]}",
            "sweep.assignments[0].parameters[0]",
            "a field the job has",
        ),
        (
            "sweep: {assignments: [{parameters: [environment], values: [1]}]}",
            "sweep.assignments[0].parameters[0]",
            "a field holding a value",
        ),
        (
            "sweep: {assignments: [{parameters: [{field: wall_time_limit, start: 1}],"
            " values: [1]}]}",
            "sweep.assignments[0].parameters[0]",
            "a text field for a substring",
        ),
        (
            "sweep: {assignments: [{parameters: [name], values: [a],"
            " loop_integer: {start: 1, end: 2}}]}",
            "sweep.assignments[0]",
            "exactly one of values, loop_integer or loop_double",
        ),
        ("sweep: {assignments: [], sweeps: []}", "sweep.assignments", "a list of at least one"),
        (
            "sweep: {assignment: []}",
            "sweep.assignment",
            "a known field: did you mean 'assignments'? (known: assignments, sweeps)",
        ),
        (
            "sweep: {assignments: [{parameters: [name],"
            " loop_integer: {start: 1, end: 9, step: 0}}]}",
            "sweep.assignments[0].loop_integer",
            "a step other than 0",
        ),
        (
            "sweep: {assignments: [{parameters: [name], values: [{a: 1}]}]}",
            "sweep.assignments[0].values[0]",
            "a string or a number",
        ),
        (
            "sweep: {assignments: [{parameters: [wall_time_limit], values: [soon]}]}",
            "wall_time_limit [sweep element 1 of 1]",
            "an integer",
        ),
    ],
)
def test_each_way_a_yaml_sweep_is_wrong_is_named(yaml: str, path: str, expected: str) -> None:
    template = "executable: /bin/echo\nname: job\narguments: [a]\nwall_time_limit: 5\n"
    text = f"{template}environment: {{A: b}}\n{yaml}\n"
    err = rejected(text)
    assert err.path == path
    assert err.expected.startswith(expected)


def test_a_whole_numeric_field_takes_a_number() -> None:
    text = (
        "executable: /bin/true\nwall_time_limit: 5\n"
        "sweep: {assignments: [{parameters: [wall_time_limit],"
        " loop_integer: {start: 10, end: 30, step: 10}}]}\n"
    )
    jobs = loads_submission(text)
    assert isinstance(jobs, JobArray)
    assert [j.wall_time_limit for j in jobs.elements] == [10, 20, 30]


def test_uploads_are_added_to_every_job_of_a_sweep_in_either_form() -> None:
    from gbroker.client.gclient import with_staging
    from gbroker.jobs.description import StagingEntry

    entry = StagingEntry(
        "data.bin", source="http://127.0.0.1:1/files/" + "0" * 64, site="a", size=7
    )
    for name in ("sweep_echo_100.jsdl", "sweep_nested.yaml"):
        loaded = loads_submission(with_staging((FIXTURES / name).read_bytes(), [entry]))
        assert isinstance(loaded, JobArray)
        assert all(job.staging[-1] == entry for job in loaded.elements)
    single = loads_submission(with_staging(b"executable: /bin/true\n", [entry]))
    assert single == JobDescription(executable="/bin/true", staging=(entry,))


@pytest.mark.parametrize("name", ["sweep_echo_100.jsdl", "sweep_nested.yaml"])
def test_loads_job_leaves_a_sweep_unexpanded(name: str) -> None:
    """What a broker reads on its loop: a sweep is left for a worker (None), unexpanded."""
    assert loads_job((FIXTURES / name).read_bytes()) is None


def test_loads_job_reads_a_plain_job_as_loads_submission_does() -> None:
    plain = b"executable: /bin/echo\narguments: [x]\n"
    assert loads_job(plain) == loads_submission(plain)
    with pytest.raises(JsdlError):
        loads_job(b"executable: 3\n")
