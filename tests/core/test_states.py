from __future__ import annotations

import itertools

import pytest

from gbroker.core.states import TERMINAL_STATES, TRANSITIONS, JobState, check_transition
from gbroker.errors import GBrokerError, IllegalTransition

S = JobState


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_the_normal_life_of_a_job_is_legal() -> None:
    path = [S.SUBMITTED, S.STAGING, S.QUEUED, S.MIGRATING, S.QUEUED, S.RUNNING, S.DONE]
    for old, new in itertools.pairwise(path):
        assert check_transition(old, new) is new


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATES))
def test_terminal_states_have_no_way_out(terminal: JobState) -> None:
    assert terminal in {S.DONE, S.FAILED, S.CANCELLED}
    for target in JobState:
        with pytest.raises(IllegalTransition, match="terminal"):
            check_transition(terminal, target)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.RUNNING, S.QUEUED),
        (S.RUNNING, S.MIGRATING),
        (S.SUBMITTED, S.RUNNING),
        (S.STAGING, S.RUNNING),
        (S.QUEUED, S.QUEUED),
    ],
)
def test_illegal_transitions_raise_and_name_the_allowed_ones(old: JobState, new: JobState) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(old, new)
    assert f"{old} -> {new}" in str(info.value)
    assert isinstance(info.value, GBrokerError)


def test_every_non_terminal_state_can_be_cancelled_or_fail() -> None:
    for state in set(JobState) - TERMINAL_STATES:
        assert {S.CANCELLED, S.FAILED} <= TRANSITIONS[state]
