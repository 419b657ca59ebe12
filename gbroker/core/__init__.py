"""The sans-I/O core: pure decisions, shared by the broker daemon and the simulator.

Nothing in this package reads a clock, touches a socket or a file, or draws global randomness.
Callers pass ``now`` and events in and carry out the commands that come back. Here live the job
and site model (:mod:`.model`, :mod:`.names`), the job state machine (:mod:`.states`), F(j)
(:mod:`.ranking`), what a site offers a job (:mod:`.requirements`), the owner's dispatch
algorithms and the site agent (:mod:`.dispatch`, :mod:`.site`), the local scheduler and its
malleability policies (:mod:`.localsched`, :mod:`.malleable`, :mod:`.sdpolicy`), liveness and
black-hole health (:mod:`.liveness`, :mod:`.health`), job arrays and the paper's metrics.

May import: :mod:`gbroker.errors` and the standard library only.

The names below are re-exported lazily (PEP 562): importing one small module, such as
:mod:`.names` (which the command line's client commands use to check job ids before any request),
does not load the whole core.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from gbroker.core.localsched import Allocation, LocalScheduler, QueuePolicy, StartJob
    from gbroker.core.model import InputFile, Job, JobClass, SiteState
    from gbroker.core.ranking import Candidate, Score, choose_site, rank_sites, staging_time
    from gbroker.core.states import TERMINAL_STATES, TRANSITIONS, JobState, check_transition

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Allocation",
    "Candidate",
    "InputFile",
    "Job",
    "JobClass",
    "JobState",
    "LocalScheduler",
    "QueuePolicy",
    "Score",
    "SiteState",
    "StartJob",
    "check_transition",
    "choose_site",
    "rank_sites",
    "staging_time",
]

_HOMES = {
    "Allocation": "localsched",
    "LocalScheduler": "localsched",
    "QueuePolicy": "localsched",
    "StartJob": "localsched",
    "InputFile": "model",
    "Job": "model",
    "JobClass": "model",
    "SiteState": "model",
    "Candidate": "ranking",
    "Score": "ranking",
    "choose_site": "ranking",
    "rank_sites": "ranking",
    "staging_time": "ranking",
    "TERMINAL_STATES": "states",
    "TRANSITIONS": "states",
    "JobState": "states",
    "check_transition": "states",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
