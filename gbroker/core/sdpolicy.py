"""SD-Policy's malleable backfill: start a malleable job now by shrinking running mates. Pure.

Source: D'Amico, Jokanovic, Corbalan, *Holistic slowdown driven scheduling and resource
management for malleable jobs*, ICPP 2019 (``SEEDS.md`` §001; ``../shared/seeds/001_*``),
§3.1-3.4, on a site that counts cores (no nodes).

When a malleable job ``j`` cannot start by static backfill, SD-Policy compares two predicted
ends (Listing 1):

- ``static_end = start_static + req_j``: it waits for its reservation, then runs as asked;
- ``mall_end = now + req_j + increase_j``: it starts now on fewer cores than it asked for. Its
  runtime grows by ``increase_j``, the ideal model's (Equation 5): ``req · (asked / used − 1)``.

Only if ``mall_end < static_end`` does it pick **mates**: running malleable jobs that each give up
a ``sharing_factor`` of their cores (SharingFactor, 0.5 on MareNostrum: one socket of two), never
going below their own minimum. It picks at most ``max_mates`` mates (m = 2 in the paper, §3.2.4)
whose cores, with the free ones, make up what ``j`` needs: its size times the sharing factor, and
at least its minimum. Among them it chooses the combination with the least sum of penalties, where
each mate's penalty is its predicted slowdown (Equation 4):

    p_i = (wait_i + increase_i + req_i) / req_i,
    increase_i = overlap · given_i / (cores_i − given_i)   (ideal model: it runs on fewer cores
                                                            while j runs)

A mate is eligible only if ``p_i < MAX_SLOWDOWN``. The cut-off is either a static value (5, 10,
50, infinity) or dynamic: the average slowdown of the running jobs (§3.2.2). Constraint: ``j``
must end inside every mate's allocation, i.e. no mate ends (at its shrunk size) before ``j``
(§3.2.4). The worst-case model (Equation 6) needs per-node allocations; a site of cores has a
single "node", so both models agree here. :func:`sd_backfill` returns the decision, or None.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gbroker.errors import InvalidInput

__all__ = ["Candidate", "Mate", "SdDecision", "SdPolicy", "average_slowdown", "sd_backfill"]


@dataclass(frozen=True, slots=True)
class SdPolicy:
    """``max_slowdown``: the static cut-off (``math.inf`` for none), or None for the dynamic one
    (the average slowdown of the running jobs)."""

    max_slowdown: float | None = 10.0
    sharing_factor: float = 0.5
    max_mates: int = 2

    def __post_init__(self) -> None:
        if self.max_slowdown is not None and not self.max_slowdown >= 1:
            raise InvalidInput(
                "sd_policy.max_slowdown", "a slowdown >= 1, inf, or dynamic", self.max_slowdown
            )
        if not 0 < self.sharing_factor < 1:
            raise InvalidInput(
                "sd_policy.sharing_factor", "a fraction in (0, 1)", self.sharing_factor
            )
        if type(self.max_mates) is not int or not 1 <= self.max_mates <= 4:
            raise InvalidInput("sd_policy.max_mates", "an integer in [1, 4]", self.max_mates)

    @classmethod
    def parse(cls, text: str) -> SdPolicy:
        """``10``, ``inf`` or ``dynamic``: the MAX_SLOWDOWN of ``--sd-policy``."""
        if text == "dynamic":
            return cls(None)
        try:
            value = float(text)
        except ValueError:
            expected = "a MAX_SLOWDOWN (e.g. 10, inf) or dynamic"
            raise InvalidInput("sd_policy", expected, text) from None
        return cls(value)


@dataclass(frozen=True, slots=True)
class Mate:
    """A running malleable job as SD-Policy weighs it."""

    job_id: str
    cores: int
    min_cores: int
    wait: float  # seconds it waited in the queue
    requested: float  # req_i: its requested run time
    planned_end: float  # when it is planned to end at its current size


@dataclass(frozen=True, slots=True)
class Candidate:
    """The malleable job that cannot start statically: ``asked`` cores (at least ``min_cores``)
    for ``requested`` seconds, with ``static_start`` its predicted start by static backfill."""

    job_id: str
    asked: int
    min_cores: int
    requested: float
    static_start: float


@dataclass(frozen=True, slots=True)
class SdDecision:
    """Start the job now on ``cores`` cores; each mate gives ``given[job_id]`` cores."""

    job_id: str
    cores: int
    given: dict[str, int]
    mall_end: float
    static_end: float
    penalties: dict[str, float]


def average_slowdown(mates: Sequence[Mate], now: float) -> float:
    """The dynamic MAX_SLOWDOWN: the running jobs' mean predicted slowdown (wait + req) / req."""
    values = [(m.wait + m.requested) / m.requested for m in mates if m.requested > 0]
    return sum(values) / len(values) if values else math.inf


def sd_backfill(
    job: Candidate, free: int, mates: Sequence[Mate], now: float, policy: SdPolicy
) -> SdDecision | None:
    """SD-Policy's decision for ``job`` at ``now`` with ``free`` cores (see the module)."""
    if job.requested <= 0 or job.asked < 1:
        return None
    used = max(job.min_cores, math.ceil(job.asked * policy.sharing_factor))
    if used >= job.asked:
        return None  # it would not start smaller than it asked: nothing to gain
    need = used - free
    mall_end = now + job.requested * job.asked / used  # req + increase (Equation 5)
    static_end = job.static_start + job.requested
    if not mall_end < static_end:
        return None
    if need <= 0:  # the free cores suffice at the smaller size: no mate needed
        return SdDecision(job.job_id, used, {}, mall_end, static_end, {})
    cutoff = (
        policy.max_slowdown if policy.max_slowdown is not None else average_slowdown(mates, now)
    )
    overlap = mall_end - now
    eligible: list[tuple[float, Mate, int]] = []
    for mate in mates:
        offer = min(math.floor(mate.cores * policy.sharing_factor), mate.cores - mate.min_cores)
        if offer <= 0 or mate.requested <= 0:
            continue
        increase = overlap * offer / (mate.cores - offer)
        # Constraint: the new job ends inside the mate's allocation (the mate, shrunk, ends later).
        if mate.planned_end + increase < mall_end:
            continue
        penalty = (mate.wait + increase + mate.requested) / mate.requested
        if penalty < cutoff:
            eligible.append((penalty, mate, offer))
    eligible.sort(key=lambda e: (e[0], e[1].job_id))  # the list sorted by penalty (§3.2.4)
    best: tuple[float, tuple[tuple[float, Mate, int], ...]] | None = None
    for size in range(1, policy.max_mates + 1):
        for combination in itertools.combinations(eligible, size):
            if sum(offered for _, _, offered in combination) < need:
                continue
            total = sum(penalty for penalty, _, _ in combination)
            if best is None or total < best[0]:
                best = (total, combination)
    if best is None:
        return None
    given: dict[str, int] = {}
    left = need
    for _, mate, offered in best[1]:  # take what is needed, lowest penalty first
        take = min(offered, left)
        given[mate.job_id] = take
        left -= take
    penalties = {mate.job_id: penalty for penalty, mate, _ in best[1]}
    return SdDecision(job.job_id, used, given, mall_end, static_end, penalties)
