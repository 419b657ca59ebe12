"""Sparrow as a baseline: batch sampling with late binding (Ousterhout et al., SOSP 2013).

Theory of operation. Sparrow schedules a job of m tasks with no central state. Its scheduler
probes d·m workers drawn at random (*batch sampling*, §3.3; d is the *probe ratio*, 2 in the
paper's experiments, §7) and places a *reservation* in each probed worker's queue instead of a
task (*late binding*, §3.5). A worker that reaches a reservation asks the scheduler for a task
(``getTask``); the first m to ask get the m tasks, and the later ones get none. Once all m tasks
are launched, the scheduler cancels the reservations still waiting (*proactive cancellation*,
§3.6). The scheduler never reads a worker's load: the queue that reaches the reservation first
wins, whatever it looked like when probed.

In GBroker's world (:class:`~gbroker.core.dispatch.Broker` with ``Algorithm.SPARROW``) a job is
one task (m = 1) that needs r cores of one site; the owner broker is its Sparrow scheduler and a
site's queue is the worker's queue. ``ceil(d)`` sites of S(i) are drawn uniformly without
replacement from the seeded generator the broker is given (:func:`probe_sites`; all of them if
S(i) has fewer). A reservation is a replica bound late by DR's claim: the first claim is
granted (``getTask``), the rest denied, and the reservations still waiting withdrawn. F(j),
DCSMon's loads and NetMon's forecasts decide nothing. By default only the granted reservation
stages the job's inputs (:class:`~gbroker.core.events.Fetch`), as a Sparrow task reads its
input once it runs; ``DispatchPolicy.stage_reservations`` stages at every reservation.

What is not modelled, and the measured cost of staging at every reservation:
docs/EXPERIMENTS.md, "Sparrow and Slurm federation as baselines".
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Protocol

from gbroker.errors import InvalidInput

__all__ = ["DEFAULT_PROBE_RATIO", "probe_count", "probe_sites"]

DEFAULT_PROBE_RATIO = 2.0
"""d: the probe ratio of the paper's experiments (§7)."""


class _Draw(Protocol):
    def randrange(self, stop: int, /) -> int: ...


def probe_count(probe_ratio: float, tasks: int = 1) -> int:
    """How many workers Sparrow probes for ``tasks`` tasks: ceil(d · m), as its task placer
    rounds it. :class:`InvalidInput` for a ratio below 1 (fewer probes than tasks)."""
    if not 1 <= probe_ratio < math.inf:
        raise InvalidInput("probe_ratio", "a finite ratio >= 1 (probes per task)", probe_ratio)
    if tasks < 1:
        raise InvalidInput("tasks", "an integer >= 1", tasks)
    return math.ceil(probe_ratio * tasks)


def probe_sites(eligible: Collection[str], probes: int, rng: _Draw) -> list[str]:
    """A uniform random sample of ``probes`` of the ``eligible`` sites, without replacement, in
    the order drawn; all of them (in name order, drawing nothing) if there are no more than
    ``probes``.

    The draw is a partial Fisher-Yates shuffle of the sites in name order: the k-th probe is
    the site at position k + ``rng.randrange(n - k)`` of what is left, so a seed gives the same
    probes whatever order the sites were listed in.
    """
    pool = sorted(eligible)
    if probes >= len(pool):
        return pool
    for k in range(probes):
        pick = k + rng.randrange(len(pool) - k)
        pool[k], pool[pick] = pool[pick], pool[k]
    return pool[:probes]
