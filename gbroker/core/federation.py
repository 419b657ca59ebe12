"""Slurm's federation as a baseline: sibling jobs at every cluster, the origin's lock.

Theory of operation, from Slurm's Federated Scheduling Guide (slurm.schedmd.com/federation.html,
"Job Submission" and "Job Scheduling") and its controller (``src/slurmctld/fed_mgr.c``). A job
submitted to a cluster of a federation gets a federation-wide id naming its *origin* cluster.
The origin submits a copy of it, a *sibling job*, to every *viable* cluster: every cluster of the
federation, narrowed to the job's ``--clusters`` list and ``--cluster-constraint`` features, less
those that are inactive or draining (``_get_viable_sibs``), the origin included when viable. Each
cluster schedules its sibling by its own policy, independently. A cluster that determines it
can allocate resources for the job first asks the origin for the job's *lock*
(``fed_mgr_job_lock``): the origin grants it if no other cluster holds it
(``fed_mgr_job_lock_set``). The holder starts the job and tells the origin
(``fed_mgr_job_start``), which *revokes* every other sibling (``_revoke_sibling_jobs``); a
holder that fails to allocate gives the lock back (``fed_mgr_job_unlock``) and the others may
try. Slurm moves no data between clusters: a sibling is the job's record and script, and the
job's files must be reachable wherever it runs.

How it maps onto GBroker's world (:class:`~gbroker.core.dispatch.Broker` with
``Algorithm.FEDERATION``):
- **Federation and origin.** A site is a cluster, the owner broker is the origin, and the
  federation the origin sees is its S(i): L(i) ∪ {i} (on the full graph, every site). The
  siblings go to every site of S(i) (:func:`sibling_sites`): at least r cores, meeting the
  job's requirements (its candidate hosts play ``--clusters``, its other requirements
  ``--cluster-constraint``), not draining (Slurm's DRAIN and INACTIVE states).
- **Each sibling is scheduled by its site**, in that site's own queue (EASY or FCFS). No F(j),
  no DCSMon load and no NetMon forecast decide anything.
- **The lock is DR's late-binding claim.** A site whose local scheduler would start the sibling
  holds the cores and claims the start from the owner; the owner grants the first claim, and
  withdraws the other siblings (the revocation). In Slurm a sibling refused the lock stays
  pending until it is revoked; here the owner denies it and the site drops it at once. The
  outcome is the same because a claiming site already holds its cores, so the holder always
  starts: no lock is ever given back, and Slurm's unlock has no counterpart.
- **Input staging.** Slurm's siblings carry no data, so by default a sibling is queued without
  the job's input files and only the holder of the lock stages them, holding its cores while
  they arrive (:class:`~gbroker.core.events.Fetch`), as a Slurm job that reads its input from
  remote storage once it runs. With ``DispatchPolicy.stage_reservations`` every sibling stages
  its inputs when placed: |S(i)| copies of each input move, all but one wasted.
- **Not modelled**: each cluster's own priority order for the sibling (a site queues it in
  arrival order like any job), the siblings' coordination among themselves while the origin is
  down, requeue (new siblings at the viable clusters: here only a lost or refusing site makes
  the owner place the job anew, at every site of S(i) left), and the controllers' RPC costs
  (Slurm's guide warns the federation is not meant for more than 50,000 jobs a day).
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["sibling_sites"]


def sibling_sites(eligible: Collection[str]) -> list[str]:
    """Where a federated job's siblings go: every eligible site of S(i), in name order."""
    return sorted(eligible)
