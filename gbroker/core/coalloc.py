"""Where a co-allocated job's components go: KOALA's placement policies, pure.

Theory of operation. A *co-allocated* job runs as k components at once, each component a set of
cores at one site (a cluster), all started together and ended together (KOALA, Mohamed &
Epema, "KOALA: a co-allocating grid scheduler", CCPE 20(16), 2008; SEEDS §000). The owner
broker places a job from its view of its neighbourhood: for every candidate site an
:class:`Offer` (the idle cores it sees there, the site's size, and the forecast time to stage
the job's input files there). :func:`place` answers with a (site, cores) pair per component, or
None when the components do not fit the idle cores *now*; the caller then keeps the job in its
placement queue and tries again later (KOALA retries the queue periodically and fails a job
after a threshold of tries: :class:`PlacementQueue`, its settings :class:`CoAllocation`).

Components are placed one after another, the largest first (ties: the order given), each on the
idle cores the ones before it left; a site may host several components of one job. Every tie
between sites breaks on the site's name, so a placement is a function of its inputs. The
policies (:class:`CoPolicy`): Worst-Fit, Close-to-Files, Cluster Minimization and Flexible
Cluster Minimization (which re-splits a *flexible* job's total over as few sites as possible).
CM and FCM are the plain greedy readings of their papers' aims.

Once placed, the components are ordinary jobs of the owner's
:class:`~gbroker.core.dispatch.Broker`, each with its :class:`~gbroker.core.model.Gang`: the
claim protocol that starts them all at once exists once, in the Broker, for the daemon and the
simulator alike. Each policy's rule, its paper and an example, and how the daemon places at
submission instead: docs/COALLOCATION.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gbroker.errors import InvalidInput

__all__ = [
    "CoAllocation",
    "CoPolicy",
    "Offer",
    "Placed",
    "Placement",
    "PlacementFailed",
    "PlacementQueue",
    "place",
]


class CoPolicy(StrEnum):
    """KOALA's placement policies for co-allocated jobs."""

    WORST_FIT = "worst-fit"
    CLOSE_TO_FILES = "close-to-files"
    CM = "cm"
    FCM = "fcm"


@dataclass(frozen=True, slots=True)
class Offer:
    """What the owner sees of one candidate site.

    Attributes:
        site: the site's name.
        free: idle cores there, as the broker's view sees them.
        total: the site's cores.
        staging: forecast seconds to stage the job's input files there (t_j; 0 when they are
            all there already).
    """

    site: str
    free: int
    total: int
    staging: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.site, str) or not self.site:
            raise InvalidInput("offer.site", "a non-empty site name", self.site)
        if not isinstance(self.total, int) or self.total < 1:
            raise InvalidInput(f"offer[{self.site}].total", "cores >= 1", self.total)
        if not isinstance(self.free, int) or not 0 <= self.free <= self.total:
            raise InvalidInput(
                f"offer[{self.site}].free",
                f"idle cores between 0 and total ({self.total})",
                self.free,
            )
        if not (isinstance(self.staging, int | float) and 0 <= self.staging < math.inf):
            raise InvalidInput(f"offer[{self.site}].staging", "seconds >= 0", self.staging)


def place(
    components: Sequence[int],
    offers: Sequence[Offer],
    policy: CoPolicy,
    *,
    flexible: bool = False,
) -> list[tuple[str, int]] | None:
    """(site, cores) per component (in the order given), or None when they do not fit now.

    With ``flexible`` and FCM the job's total, ``sum(components)``, is re-split over the sites:
    the list then has one entry per site used, the fullest first, and its cores sum to the
    total. Raises :class:`InvalidInput` naming the field for an empty job, a component of less
    than one core, an unknown policy or a site offered twice.
    """
    sizes = _checked_components(components)
    try:
        policy = CoPolicy(policy)
    except ValueError:
        raise InvalidInput("policy", f"one of {', '.join(CoPolicy)}", policy) from None
    free = _checked_offers(offers)
    if policy is CoPolicy.FCM and flexible:
        return _split(sum(sizes), free)
    staging = {o.site: o.staging for o in offers}
    # Sites in decreasing order of idle cores, then by name: Worst-Fit's and CM's order.
    by_room = sorted(free, key=lambda s: (-free[s], s))
    chosen: dict[int, str] = {}
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        need = sizes[k]
        site: str | None
        if policy is CoPolicy.WORST_FIT:
            site = min(free, key=lambda s: (-free[s], s), default=None)
            if site is not None and free[site] < need:
                site = None
        elif policy is CoPolicy.CLOSE_TO_FILES:
            fits = [s for s in free if free[s] >= need]
            site = min(fits, key=lambda s: (staging[s], -free[s], s), default=None)
        else:  # CM, and FCM for a job of fixed components: first fit, fullest sites first
            site = next((s for s in by_room if free[s] >= need), None)
        if site is None:
            return None
        free[site] -= need
        chosen[k] = site
    return [(chosen[k], sizes[k]) for k in range(len(sizes))]


def _split(total: int, free: dict[str, int]) -> list[tuple[str, int]] | None:
    """FCM: ``total`` cores over the fewest sites, filling the ones with most idle cores first."""
    if sum(free.values()) < total:
        return None
    placement = []
    for site in sorted(free, key=lambda s: (-free[s], s)):
        if total == 0:
            break
        take = min(free[site], total)
        if take:
            placement.append((site, take))
            total -= take
    return placement


def _checked_components(components: Sequence[int]) -> list[int]:
    if isinstance(components, str | bytes) or not isinstance(components, Sequence):
        raise InvalidInput("components", "a list of core counts", components)
    if not components:
        raise InvalidInput("components", "at least one component", components)
    for k, cores in enumerate(components):
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InvalidInput(f"components[{k}]", "cores >= 1", cores)
    return list(components)


def _checked_offers(offers: Sequence[Offer]) -> dict[str, int]:
    free: dict[str, int] = {}
    for k, offer in enumerate(offers):
        if not isinstance(offer, Offer):
            raise InvalidInput(f"offers[{k}]", "an Offer", offer)
        if offer.site in free:
            raise InvalidInput(f"offers[{k}].site", "each site offered once", offer.site)
        free[offer.site] = offer.free
    return free


# -- the owner's side: KOALA's placement queue ------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoAllocation:
    """How an owner places co-allocated jobs (KOALA's placement queue) and how long their
    components' claims are held (the owner's :class:`~gbroker.core.dispatch.Broker`).

    Attributes:
        policy: the placement policy.
        interval: seconds between two scans of the placement queue.
        threshold: placement tries after which a job fails (0: it never does).
        claim_timeout: seconds a round of the components' claims may take, from its first
            claim, before the held ones give their cores back and queue again at their sites
            (the Broker's ``coalloc_timeout``; None: ``interval``).
        rounds: rounds of claims that time out before the job fails (the Broker's
            ``coalloc_rounds``).
    """

    policy: CoPolicy = CoPolicy.WORST_FIT
    interval: float = 60.0
    threshold: int = 0
    claim_timeout: float | None = None
    rounds: int = 10

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "policy", CoPolicy(self.policy))
        except ValueError:
            raise InvalidInput(
                "coalloc.policy", f"one of {', '.join(CoPolicy)}", self.policy
            ) from None
        if not 0 < self.interval < math.inf:
            raise InvalidInput("coalloc.interval", "seconds > 0", self.interval)
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, int)
            or self.threshold < 0
        ):
            raise InvalidInput("coalloc.threshold", "tries >= 0 (0: never fail)", self.threshold)
        if self.claim_timeout is not None and not 0 < self.claim_timeout < math.inf:
            raise InvalidInput("coalloc.claim_timeout", "seconds > 0", self.claim_timeout)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise InvalidInput("coalloc.rounds", "rounds >= 1", self.rounds)

    @property
    def timeout(self) -> float:
        return self.interval if self.claim_timeout is None else self.claim_timeout


@dataclass(frozen=True, slots=True)
class Placed:
    """Job ``job_id`` fits now, at its ``tries``-th try: (site, cores) per component, as
    :func:`place` answers. The owner submits each component to its broker (a job with a
    :class:`~gbroker.core.model.Gang`)."""

    job_id: str
    placement: tuple[tuple[str, int], ...]
    tries: int


@dataclass(frozen=True, slots=True)
class PlacementFailed:
    """The job was tried ``tries`` times and never fitted: its submission fails (KOALA)."""

    job_id: str
    tries: int


Placement = Placed | PlacementFailed


@dataclass(slots=True)
class _Waiting:
    components: tuple[int, ...]
    flexible: bool
    tries: int = 0


class PlacementQueue:
    """One owner's placement queue (KOALA): the co-allocated jobs that did not fit yet.

    A submitted job is tried at once (:meth:`submit`) and, when it does not fit the idle cores
    now, waits at the tail of the queue; :meth:`scan`, every ``interval``, tries the queue from
    head to tail. Each try counts; past ``threshold`` tries the job fails. A job that fits
    leaves the queue as :class:`Placed`: from then on its components are ordinary jobs of the
    owner's :class:`~gbroker.core.dispatch.Broker`, which holds their claims until every one
    has claimed and grants them at once, requeues them at their sites when a round times out
    and fails the job after its rounds (``Broker._gang_claim``, the daemon's protocol too).
    """

    def __init__(self, config: CoAllocation) -> None:
        self.config = config
        self.queue: dict[str, _Waiting] = {}  # head first

    def __len__(self) -> int:
        return len(self.queue)

    def tries(self, job_id: str) -> int:
        """Tries of a job still queued (0: not queued)."""
        waiting = self.queue.get(job_id)
        return 0 if waiting is None else waiting.tries

    def submit(
        self,
        job_id: str,
        components: Sequence[int],
        offers: Sequence[Offer],
        *,
        flexible: bool = False,
    ) -> Placement | None:
        """A new job: try it now; when it does not fit (None), it waits at the queue's tail."""
        if job_id in self.queue:
            raise InvalidInput("job.id", "a job id this owner does not hold", job_id)
        self.queue[job_id] = _Waiting(tuple(_checked_components(components)), flexible)
        return self._try(job_id, offers)

    def scan(self, offers: Callable[[str], Sequence[Offer]]) -> list[Placement]:
        """Try every queued job, head to tail; ``offers(job_id)``: what the owner sees for it.

        The cores a job placed in this scan takes are gone for the jobs after it."""
        taken: dict[str, int] = {}
        out: list[Placement] = []
        for job_id in list(self.queue):
            seen = [
                Offer(o.site, max(0, o.free - taken.get(o.site, 0)), o.total, o.staging)
                for o in offers(job_id)
            ]
            outcome = self._try(job_id, seen)
            if outcome is None:
                continue
            if isinstance(outcome, Placed):
                for site, cores in outcome.placement:
                    taken[site] = taken.get(site, 0) + cores
            out.append(outcome)
        return out

    def _try(self, job_id: str, offers: Sequence[Offer]) -> Placement | None:
        waiting = self.queue[job_id]
        waiting.tries += 1
        placement = place(waiting.components, offers, self.config.policy, flexible=waiting.flexible)
        if placement is not None:
            del self.queue[job_id]
            return Placed(job_id, tuple(placement), waiting.tries)
        if self.config.threshold and waiting.tries >= self.config.threshold:
            del self.queue[job_id]
            return PlacementFailed(job_id, waiting.tries)
        return None
