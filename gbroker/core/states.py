"""The job state machine: the one place that knows which transitions are legal (ARCHITECTURE §6).

Theory of operation. A job is SUBMITTED to its owner broker, STAGING while its input files move
to the chosen site, QUEUED in that site's local scheduler, RUNNING there, and ends DONE, FAILED or
CANCELLED. A queued job may be MIGRATING (being withdrawn from one site for another), after
which it stages or queues again — or runs, if the site started it before the withdrawal arrived
(a withdrawal succeeds only if the job has not started). Terminal states have no way out. Every
other module asks :func:`check_transition` before moving a job, so an illegal move raises at once
instead of corrupting the record.
"""

from __future__ import annotations

from enum import StrEnum

from gbroker.errors import IllegalTransition

__all__ = ["TERMINAL_STATES", "TRANSITIONS", "JobState", "check_transition"]


class JobState(StrEnum):
    SUBMITTED = "submitted"
    STAGING = "staging"
    QUEUED = "queued"
    MIGRATING = "migrating"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.SUBMITTED: frozenset({_S.STAGING, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.STAGING: frozenset({_S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.QUEUED: frozenset({_S.RUNNING, _S.MIGRATING, _S.FAILED, _S.CANCELLED}),
    # A withdrawal fails if the site started the job first: MIGRATING then ends in RUNNING.
    _S.MIGRATING: frozenset({_S.STAGING, _S.QUEUED, _S.RUNNING, _S.FAILED, _S.CANCELLED}),
    _S.RUNNING: frozenset({_S.DONE, _S.FAILED, _S.CANCELLED}),
    _S.DONE: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}
TERMINAL_STATES = frozenset(s for s, targets in TRANSITIONS.items() if not targets)


def check_transition(current: JobState, new: JobState) -> JobState:
    """Return ``new`` if a job may move from ``current`` to it; raise IllegalTransition if not."""
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        raise IllegalTransition(f"job state {current} -> {new} is illegal; allowed: {allowed}")
    return new
