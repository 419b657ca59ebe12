"""A co-allocated job's `components` and an AppLeS job's `model`, in JSON/YAML and in JSDL with
the GBroker extension (issue 28): read, checked naming the field, written back the same."""

from __future__ import annotations

import pytest

from gbroker.core.apples import PerformanceModel
from gbroker.jobs.description import Component, JsdlError
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping
from gbroker.jobs.sweep import loads_job

YAML = """
executable: jacobi
components:
  - {cores: 2, site: A}
  - {cores: 1}
coallocation: cm
"""

MODEL = """
executable: jacobi
model: {units: 1000, compute: 0.001, exchange: 8000, iterations: 50}
"""


def test_components_are_read_and_written_back_in_yaml_and_jsdl() -> None:
    desc = loads_job(YAML, document="job.yaml")
    assert desc is not None
    assert desc.components == (Component(2, "A"), Component(1))
    assert desc.coallocation == "cm"
    assert from_mapping(to_mapping(desc)) == desc
    xml = to_jsdl(desc)
    assert '<gbroker:Component cores="2" site="A" />' in xml
    assert loads_job(xml, document="job.jsdl") == desc
    job = desc.to_job("A.1", "A")
    assert job.rank == 2  # as its largest component sees a site


def test_a_model_is_read_and_written_back_in_yaml_and_jsdl() -> None:
    desc = loads_job(MODEL, document="job.yaml")
    assert desc is not None
    assert desc.model == PerformanceModel(units=1000, compute=0.001, exchange=8000, iterations=50)
    assert from_mapping(to_mapping(desc)) == desc
    assert loads_job(to_jsdl(desc), document="job.jsdl") == desc


def test_a_component_is_the_job_pinned_to_its_site_with_its_rank() -> None:
    desc = loads_job(YAML, document="job.yaml")
    assert desc is not None
    part = desc.component("A.7", 1, 2, "B", 1, units=40)
    job = part.to_job("A.7_2", "A")
    assert job.rank == 1
    assert job.gang is not None
    assert (job.gang.id, job.gang.index, job.gang.size, job.gang.site) == ("A.7", 1, 2, "B")
    assert part.components == ()
    assert from_mapping(to_mapping(part)) == part  # what the owner sends the component's site


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("executable: x\ncomponents: [{cores: 0}]", "components[0].cores"),
        ("executable: x\ncomponents: [{site: A}]", "components[0].cores"),
        ("executable: x\ncomponents: [{cores: 1, host: A}]", "components[0].host"),
        ("executable: x\ncomponents: {cores: 1}", "components"),
        ("executable: x\ncomponents: [{cores: 1}]\ncoallocation: best", "coallocation"),
        ("executable: x\ncoallocation: cm", "coallocation"),
        ("executable: x\ncomponents: [{cores: 1}]\ntotal_cpu_count: 4", "total_cpu_count"),
        ("executable: x\ncomponents: [{cores: 1}]\ncandidate_hosts: [A]", "candidate_hosts"),
        ("executable: x\ncomponents: [{cores: 1}]\njob_class: moldable", "job_class"),
        ("executable: x\nmodel: {units: 10}", "model.compute"),
        ("executable: x\nmodel: {units: 10, compute: 1, rows: 3}", "model.rows"),
        ("executable: x\nmodel: {units: 0, compute: 1}", "model.units"),
        ("executable: x\nmodel: {units: 1, compute: 1, topology: mesh}", "model.topology"),
        (
            "executable: x\nmodel: {units: 1, compute: 1}\ncomponents: [{cores: 1}]",
            "components",
        ),
    ],
)
def test_a_bad_component_or_model_is_refused_naming_the_field(text: str, path: str) -> None:
    with pytest.raises(JsdlError) as caught:
        loads_job(text, document="job.yaml")
    assert caught.value.path == path, caught.value


def test_a_bad_component_in_jsdl_names_its_element() -> None:
    desc = loads_job(YAML, document="job.yaml")
    assert desc is not None
    xml = to_jsdl(desc).replace('cores="2"', 'cores="two"')
    with pytest.raises(JsdlError, match=r"Component/@cores"):
        loads_job(xml, document="job.jsdl")
    xml = to_jsdl(loads_job(MODEL, document="m.yaml")).replace('units="1000"', 'units="-1"')  # type: ignore[arg-type]
    with pytest.raises(JsdlError, match=r"Model/@units"):
        loads_job(xml, document="job.jsdl")
