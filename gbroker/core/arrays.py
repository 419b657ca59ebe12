"""Job arrays: one submission that becomes many ordinary jobs (a parameter sweep, GFD.149).

Theory of operation. A user submits one description with a sweep; it becomes N descriptions,
each a full job with its values substituted (:mod:`gbroker.jobs.sweep`). The array itself schedules
nothing: every element is an ordinary job with an ordinary life (ranked with F(j), dispatched,
run, reported), so neither the broker's core nor a site's needs to know arrays exist. What this
module fixes, for both drivers alike, is the naming and the summary:

* the array's id is an ordinary job id ``<owner>.<n>`` and element i (counted from 1) is
  ``<owner>.<n>_<i>``, as Slurm names array tasks; :data:`gbroker.core.names.JOB_ID` accepts both,
  and the owner of either is ``<owner>``;
* an array's state sums up its elements' (:func:`array_state`): running while any element
  runs, else the least advanced unfinished state; once every element has ended, done if all
  are done, failed if any failed, else cancelled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gbroker.core.states import TERMINAL_STATES, JobState
from gbroker.errors import InvalidInput

__all__ = [
    "ELEMENT_SEPARATOR",
    "MAX_ARRAY_SIZE",
    "array_state",
    "element_id",
    "element_ids",
    "split_element",
    "state_counts",
]

ELEMENT_SEPARATOR = "_"
#: The most jobs one array may hold (a sweep of more is refused when it is read).
MAX_ARRAY_SIZE = 10_000

# Unfinished states from the least advanced on (a migrating job waits as a queued one does).
_PROGRESS = (JobState.SUBMITTED, JobState.STAGING, JobState.QUEUED, JobState.MIGRATING)


def element_id(array_id: str, index: int) -> str:
    """The id of element ``index`` (from 1) of array ``array_id``."""
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= MAX_ARRAY_SIZE:
        raise InvalidInput("index", f"an element index from 1 to {MAX_ARRAY_SIZE}", index)
    return f"{array_id}{ELEMENT_SEPARATOR}{index}"


def element_ids(array_id: str, size: int) -> list[str]:
    """The ids of all ``size`` elements of ``array_id``, in order."""
    return [element_id(array_id, i) for i in range(1, size + 1)]


def split_element(job_id: str) -> tuple[str, int] | None:
    """(array id, index) when ``job_id`` names an element of an array, else None."""
    array_id, sep, index = job_id.rpartition(ELEMENT_SEPARATOR)
    if not sep or not index.isdigit() or "." not in array_id:
        return None
    return array_id, int(index)


def state_counts(states: Iterable[JobState]) -> dict[str, int]:
    """How many elements are in each state (only states that occur)."""
    return {str(state): n for state, n in sorted(Counter(states).items())}


def array_state(states: Iterable[JobState]) -> JobState:
    """The state of an array whose elements are in ``states`` (rules in the module docstring)."""
    seen = set(states)
    if not seen:
        raise InvalidInput("states", "the states of at least one element", [])
    unfinished = seen - TERMINAL_STATES
    if JobState.RUNNING in unfinished:
        return JobState.RUNNING
    if unfinished:
        return min(unfinished, key=_PROGRESS.index)
    if seen == {JobState.DONE}:
        return JobState.DONE
    return JobState.FAILED if JobState.FAILED in seen else JobState.CANCELLED
