"""Slurm's federation as a baseline: sibling jobs at every cluster, the origin's lock.

Theory of operation, from Slurm's Federated Scheduling Guide (slurm.schedmd.com/federation.html)
and its controller (``src/slurmctld/fed_mgr.c``). A job submitted to a cluster of a federation
names its *origin* cluster, which submits a *sibling job* to every *viable* cluster
(``_get_viable_sibs``). Each cluster schedules its sibling by its own policy, independently. A
cluster that can allocate resources for the job first asks the origin for the job's *lock*
(``fed_mgr_job_lock``), granted if no other cluster holds it; the holder starts the job and the
origin *revokes* every other sibling (``_revoke_sibling_jobs``). Slurm moves no data between
clusters: the job's files must be reachable wherever it runs.

In GBroker's world (:class:`~gbroker.core.dispatch.Broker` with ``Algorithm.FEDERATION``) a site
is a cluster, the owner broker is the origin and its federation is S(i): the siblings go to every
site of S(i) that the job's requirements allow and that is not draining (:func:`sibling_sites`),
each scheduled in that site's own queue, with no F(j), DCSMon load or NetMon forecast. The lock
is DR's late-binding claim, and the revocation the withdrawal of the others. A sibling refused
the lock is dropped at once rather than left pending; the outcome is the same, because a
claiming site already holds its cores, so the holder always starts and no lock is ever given
back. By default only the holder stages the job's inputs (:class:`~gbroker.core.events.Fetch`),
as a Slurm job reads remote input once it runs; ``DispatchPolicy.stage_reservations`` stages at
every sibling.

What is not modelled, and the measured cost of staging at every sibling: docs/EXPERIMENTS.md,
"Sparrow and Slurm federation as baselines".
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["sibling_sites"]


def sibling_sites(eligible: Collection[str]) -> list[str]:
    """Where a federated job's siblings go: every eligible site of S(i), in name order."""
    return sorted(eligible)
