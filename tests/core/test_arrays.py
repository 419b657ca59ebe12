"""Job arrays' ids and the state that sums up their elements (gbroker.core.arrays)."""

from __future__ import annotations

import pytest

from gbroker.core.arrays import (
    MAX_ARRAY_SIZE,
    array_state,
    element_id,
    element_ids,
    split_element,
    state_counts,
)
from gbroker.core.names import check_job_id, job_owner
from gbroker.core.states import JobState
from gbroker.errors import InvalidInput

S = JobState


def test_element_ids_are_job_ids_of_the_same_owner() -> None:
    ids = element_ids("a.17", 3)
    assert ids == ["a.17_1", "a.17_2", "a.17_3"]
    for job_id in ids:
        assert check_job_id(job_id) == job_id
        assert job_owner(job_id) == "a"
        assert split_element(job_id) == ("a.17", int(job_id[-1]))
    assert split_element("a.17") is None
    assert split_element("my_site.17") is None  # an underscore in a site name is no element
    assert split_element(element_id("my_site.17", 2)) == ("my_site.17", 2)


@pytest.mark.parametrize("index", [0, -1, MAX_ARRAY_SIZE + 1, True, 1.5])
def test_element_indexes_are_bounded(index: object) -> None:
    with pytest.raises(InvalidInput):
        element_id("a.1", index)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("states", "summed"),
    [
        ([S.DONE, S.DONE], S.DONE),
        ([S.DONE, S.FAILED, S.CANCELLED], S.FAILED),
        ([S.DONE, S.CANCELLED], S.CANCELLED),
        ([S.DONE, S.RUNNING, S.SUBMITTED], S.RUNNING),
        ([S.QUEUED, S.STAGING, S.DONE], S.STAGING),
        ([S.MIGRATING, S.QUEUED], S.QUEUED),
        ([S.FAILED, S.SUBMITTED], S.SUBMITTED),
    ],
)
def test_an_arrays_state_sums_up_its_elements(states: list[JobState], summed: JobState) -> None:
    assert array_state(states) is summed


def test_counts_and_an_empty_array() -> None:
    assert state_counts([S.DONE, S.RUNNING, S.DONE]) == {"done": 2, "running": 1}
    with pytest.raises(InvalidInput):
        array_state([])
