"""Sparrow as a baseline: batch sampling with late binding (Ousterhout et al., SOSP 2013).

Theory of operation. Sparrow schedules a job of m tasks with no central state. Its scheduler
probes d·m workers drawn at random (*batch sampling*, §3.3; d is the *probe ratio*, 2 in the
paper's experiments, §7) and places a *reservation* in each probed worker's queue instead of a
task (*late binding*, §3.5). A worker that reaches a reservation asks the scheduler for a task
(``getTask``); the first m to ask get the m tasks, and the later ones get none and go on to the
next reservation in their queue. Once all m tasks are launched, the scheduler cancels the
reservations still waiting (*proactive cancellation*, §3.6). The scheduler never reads a
worker's load: the queue that reaches the reservation first wins, whatever it looked like when
probed.

How it maps onto GBroker's world (:class:`~gbroker.core.dispatch.Broker` with
``Algorithm.SPARROW``):
- **Job and tasks.** A GBroker job is one parallel program of rank r that runs at one site, so it
  is one task (m = 1) that needs r cores of one site; the owner broker is its Sparrow scheduler,
  a site is a worker, and the site's queue (EASY or FCFS) is the worker's queue.
- **Which sites are probed.** ``ceil(d · 1)`` sites of S(i) (L(i) ∪ {i} with at least r cores,
  meeting the job's requirements, not draining), drawn uniformly without replacement from the
  seeded generator the broker is given (:func:`probe_sites`). If S(i) has fewer sites, all are
  probed (Sparrow's task placer probes every worker it has when there are fewer than d·m).
  Sparrow's per-task constraints (§4.1: probe only the workers holding a task's input) are not
  modelled: our jobs' inputs sit at one data site, where every job would then queue.
- **The reservation** is a replica queued at the site by DR's late-binding claim machinery: the
  site queues it like any job; when its local scheduler would start it, the site holds the
  cores and claims the start from the owner (Sparrow's ``getTask``); the owner grants the first
  claim and denies the rest (``getTask`` returning no task), and withdraws the reservations
  still waiting (proactive cancellation). A denied or withdrawn reservation gives its cores
  back, and the site goes on with its queue.
- **What Sparrow does not use**: F(j), DCSMon's loads (free cores, queue lengths) and NetMon's
  forecasts. Only the sites' sizes and requirements decide which sites are *eligible*; the
  draw decides which are probed.
- **Input staging.** Sparrow's reservations carry no task and no data: the task description
  travels in the ``getTask`` reply, and a task reads its input once it runs (§3.5, §6). So by
  default (``DispatchPolicy.stage_reservations`` False) a reservation is queued without its
  input files, and only the granted one stages them, holding its cores while they arrive
  (:class:`~gbroker.core.events.Fetch`): the idle slot of Sparrow's ``getTask`` round trip, plus
  the transfer. ``stage_reservations`` stages every reservation's inputs when it is placed, as
  DR's replicas do: d copies of each input move, and all but one are wasted.
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
