"""Site names and job ids (gbroker.core.names)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.core.names import check_job_id, check_site_name, job_owner
from gbroker.errors import InvalidInput


@pytest.mark.parametrize("name", ["s0", "Xeon80", "P4-18", "r0c1", "a_b", "x" * 64, "0"])
def test_site_names_of_our_topologies_are_accepted(name: str) -> None:
    assert check_site_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "a.b", "a/b", "s+", "#", "-s", " s0", "s0\n", "é", "x" * 65, None, 7, b"s0"]
)
def test_other_site_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_site_name(name, field="claim.site")
    assert caught.value.field == "claim.site"
    assert caught.value.expected.startswith("a site name: letters, digits")


def test_a_site_name_may_have_to_be_known() -> None:
    assert check_site_name("s0", known={"s0"}) == "s0"
    with pytest.raises(InvalidInput, match=r"^site: expected a site of the topology, got 'Mars'$"):
        check_site_name("Mars", known={"s0"})


@pytest.mark.parametrize("job_id", ["s0.1", "Xeon80.17000000000000001", "P4-18.0", "a." + "9" * 32])
def test_job_ids_name_their_owner(job_id: str) -> None:
    assert check_job_id(job_id) == job_id
    assert job_owner(job_id) == job_id.split(".")[0]


@pytest.mark.parametrize(
    "job_id",
    [
        "X.1/../../metrics",  # GET /api/v1/jobs/X.1%2F..%2F..%2Fmetrics was forwarded
        "s0.1%2F..",
        "s0.",
        ".1",
        "s0",
        "s0.1.2",
        "s0.1\n",
        "s0.-1",
        "s0.1e3",
        "s0.١",  # an Arabic-Indic digit is a \d, not a job serial
        "s0." + "1" * 33,
        "x" * 65 + ".1",
        2**63,
        None,
    ],
)
def test_malformed_job_ids_are_refused(job_id: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_job_id(job_id, field="path.id")
    assert caught.value.field == "path.id"
    assert caught.value.expected.startswith("a job id <site>.<digits>")


def test_a_job_id_may_have_to_belong_to_a_known_site() -> None:
    assert check_job_id("s0.5", known_sites={"s0"}) == "s0.5"
    with pytest.raises(InvalidInput, match="owner is a site of the topology"):
        check_job_id("Mars.5", known_sites={"s0"})


@given(st.text(max_size=120))
def test_any_text_is_an_id_or_an_invalid_input(text: str) -> None:
    try:
        job_id = check_job_id(text)
    except InvalidInput as exc:
        message = str(exc)
        assert message.startswith("id: expected a job id")
        return
    site, serial = job_id.split(".")
    assert check_site_name(site) == site
    assert serial.isascii()
    assert serial.isdigit()
