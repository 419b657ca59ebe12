""":mod:`gbroker.jobs.jsdl_write`: what we write reads back as the same description (hypothesis)."""

from __future__ import annotations

from hypothesis import given

from gbroker.jobs.description import JobDescription
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.jsdl_write import to_jsdl
from tests.jobs.jsdl_documents import _settings, descriptions


@_settings
@given(descriptions())
def test_jsdl_round_trip(desc: JobDescription) -> None:
    assert parse_jsdl(to_jsdl(desc)) == desc
