"""A malleable job's declaration (issue 12): the GBroker JSDL extension and its JSON/YAML form."""

from __future__ import annotations

import pytest

from gbroker.core.malleable import Initiative, Malleability, Obligation, SizeKind, SizeRule
from gbroker.core.model import JobClass
from gbroker.errors import InvalidInput
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from gbroker.jobs.mapping import from_mapping, to_mapping

DOCUMENT = """<?xml version="1.0"?>
<jsdl:JobDefinition xmlns:jsdl="http://schemas.ggf.org/jsdl/2005/11/jsdl"
    xmlns:posix="http://schemas.ggf.org/jsdl/2005/11/jsdl-posix" xmlns:gbroker="urn:gbroker:jsdl:1">
  <jsdl:JobDescription>
    <jsdl:Application>
      <posix:POSIXApplication><posix:Executable>/bin/ft</posix:Executable></posix:POSIXApplication>
    </jsdl:Application>
    <gbroker:Scheduling>
      <gbroker:JobClass>malleable</gbroker:JobClass>
      <gbroker:MinCores>2</gbroker:MinCores>
      <gbroker:MaxCores>32</gbroker:MaxCores>
      <gbroker:Malleability sizes="power2" obligation="mandatory" deadline="5"
          reconfigurationCost="1.5" evolving="true" initial="2" initiative="both"/>
    </gbroker:Scheduling>
  </jsdl:JobDescription>
</jsdl:JobDefinition>
"""

FT = Malleability(
    sizes=SizeRule(SizeKind.POWER2),
    initiative=Initiative.BOTH,
    obligation=Obligation.MANDATORY,
    deadline=5.0,
    reconfiguration_cost=1.5,
    evolving=True,
    initial=2,
)


def test_the_jsdl_extension_carries_every_field_to_the_job() -> None:
    desc = parse_jsdl(DOCUMENT, document="ft.jsdl")
    assert desc.malleability == FT
    job = desc.to_job("a.1", "a")
    assert (job.rank, job.max_rank, job.job_class, job.malleability) == (
        2, 32, JobClass.MALLEABLE, FT,
    )  # fmt: skip
    assert parse_jsdl(to_jsdl(desc), document="again") == desc


def test_the_mapping_form_says_the_same_and_keeps_only_what_differs_from_the_defaults() -> None:
    desc = parse_jsdl(DOCUMENT, document="ft.jsdl")
    mapping = to_mapping(desc)
    assert mapping["malleability"] == {
        "sizes": "power2",
        "initiative": "both",
        "obligation": "mandatory",
        "deadline": 5.0,
        "reconfiguration_cost": 1.5,
        "evolving": True,
        "initial": 2,
    }
    assert from_mapping(mapping) == desc
    plain = from_mapping(
        {"executable": "x", "job_class": "malleable", "min_cores": 1, "max_cores": 4,
         "malleability": {"sizes": "1,2,4"}}
    )  # fmt: skip
    assert plain.malleability == Malleability(sizes=SizeRule.parse("1,2,4"))
    assert to_mapping(plain)["malleability"] == {"sizes": "1,2,4"}


@pytest.mark.parametrize(
    ("declared", "where", "expected"),
    [
        ({"deadline": 0}, "malleability.deadline", "seconds in (0, 86400]"),
        ({"obligation": "maybe"}, "malleability.obligation", "voluntary"),
        ({"sizes": "multiple:x"}, "malleability.sizes", "multiple:K"),
        ({"initial": 0}, "malleability.initial", "an integer >= 1"),
        ({"evolving": "yes"}, "malleability.evolving", "true or false"),
        ({"colour": "red"}, "malleability.colour", "a known field"),
    ],
)
def test_a_bad_declaration_names_its_field(
    declared: dict[str, object], where: str, expected: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        from_mapping(
            {"executable": "x", "job_class": "malleable", "min_cores": 1, "max_cores": 4,
             "malleability": declared}, document="job.yaml"
        )  # fmt: skip
    assert where in str(caught.value)
    assert expected in str(caught.value)


def test_only_a_malleable_job_declares_malleability() -> None:
    with pytest.raises(InvalidInput, match="malleability: expected a malleable job"):
        from_mapping({"executable": "x", "max_cores": 4, "malleability": {}})  # moldable


def test_a_bad_xml_attribute_is_named_with_its_element() -> None:
    bad = DOCUMENT.replace('deadline="5"', 'deadline="soon"')
    with pytest.raises(InvalidInput, match="Malleability/@deadline: expected a number"):
        parse_jsdl(bad, document="ft.jsdl")
    unknown = DOCUMENT.replace('deadline="5"', 'colour="red"')
    with pytest.raises(InvalidInput, match="Malleability/@colour: expected an attribute of"):
        parse_jsdl(unknown, document="ft.jsdl")
