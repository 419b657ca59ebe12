"""SD-Policy's malleable backfill: start a malleable job now by shrinking running mates. Pure.

Source: D'Amico, Jokanovic, Corbalan, *Holistic slowdown driven scheduling and resource
management for malleable jobs*, ICPP 2019 (``SEEDS.md`` §001), §3. The local scheduler
(:mod:`gbroker.core.localsched`) calls :func:`sd_backfill` for a malleable job that static
backfill cannot start, and carries the decision out.

Theory of operation. The paper shares *nodes*: a new job j that asked for W whole nodes runs on
the nodes of running malleable jobs, its *mates*, each giving j a SharingFactor of its nodes. A
GBroker site counts cores, not nodes, so here j, which asked ``A`` cores, starts on
``G = max(ceil(SF·A), min)`` cores taken from at most ``m`` mates, each giving at most
``floor(SF·cores)`` and never going below its own minimum; its nominal ``A`` cores are split
over its mates in proportion to what each gave (a :class:`Segment` per mate, the cores-only
stand-in for "its share of the mate's nodes").

j's speed follows the paper's runtime models (ideal, Equation 5; worst case, Equation 6:
:func:`speed`). j shares only if its worst-case end beats its end by static backfill
(Listing 1). Mates are eligible while their predicted slowdown, the penalty of Equation 4,
stays under ``MAX_SLOWDOWN``; among the cheapest candidates, the feasible combination of least
summed penalty wins. j must end inside every mate's allocation, and a mate that would end by
the queue head's reservation must still end by it, so malleable backfill never delays the head
(EASY's promise).

Each formula and where it departs from the paper: docs/MALLEABILITY.md, "SD-Policy".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gbroker.errors import InvalidInput

__all__ = [
    "Mate",
    "NewJob",
    "RuntimeModel",
    "SdDecision",
    "SdPolicy",
    "Segment",
    "average_slowdown",
    "guest_cores",
    "sd_backfill",
    "speed",
]


class RuntimeModel(StrEnum):
    """How a job that shares cores runs (§3.4)."""

    IDEAL = "ideal"  # Equation 5: its cores over its asked cores
    WORST = "worst"  # Equation 6: its least used share bounds it


@dataclass(frozen=True, slots=True)
class SdPolicy:
    """A site's SD-Policy.

    Attributes:
        max_slowdown: MAX_SLOWDOWN, the static cut-off on a mate's penalty (``math.inf``: none),
            or None for the dynamic one (the running jobs' average predicted slowdown).
        sharing_factor: SharingFactor, the most of its cores a mate gives (0.5: one socket).
        max_mates: m, the most mates one new job shares (2 in the paper).
        runtime_model: how shared jobs really run: the site plans with it and the simulator
            runs jobs by it (the decision itself always predicts with the worst case).
        candidates: how many mates, by least penalty, the combinations are drawn from (the
            paper's "only the first nm mates, with lower p").
    """

    max_slowdown: float | None = 10.0
    sharing_factor: float = 0.5
    max_mates: int = 2
    runtime_model: RuntimeModel = RuntimeModel.IDEAL
    candidates: int = 16

    def __post_init__(self) -> None:
        if self.max_slowdown is not None and not (
            isinstance(self.max_slowdown, int | float) and self.max_slowdown >= 1
        ):
            raise InvalidInput(
                "sd_policy.max_slowdown", "a slowdown >= 1, inf, or dynamic", self.max_slowdown
            )
        if not (isinstance(self.sharing_factor, int | float) and 0 < self.sharing_factor < 1):
            raise InvalidInput(
                "sd_policy.sharing_factor", "a fraction in (0, 1)", self.sharing_factor
            )
        if type(self.max_mates) is not int or not 1 <= self.max_mates <= 4:
            raise InvalidInput("sd_policy.max_mates", "an integer in [1, 4]", self.max_mates)
        try:
            object.__setattr__(self, "runtime_model", RuntimeModel(self.runtime_model))
        except ValueError:
            expected = f"one of {', '.join(RuntimeModel)}"
            raise InvalidInput("sd_policy.runtime_model", expected, self.runtime_model) from None
        if type(self.candidates) is not int or not 1 <= self.candidates <= 64:
            raise InvalidInput("sd_policy.candidates", "an integer in [1, 64]", self.candidates)

    @staticmethod
    def parse_max_slowdown(text: str) -> float | None:
        """``10``, ``inf`` or ``dynamic`` (None): the MAX_SLOWDOWN of ``--sd-policy``."""
        text = text.strip().lower()
        if text == "dynamic":
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not value >= 1:  # also NaN
            raise InvalidInput(
                "sd_policy.max_slowdown", "a number >= 1 (e.g. 10), inf, or dynamic", text
            )
        return value

    @classmethod
    def parse(cls, text: str) -> SdPolicy:
        """The default policy with the MAX_SLOWDOWN ``text`` (see :meth:`parse_max_slowdown`)."""
        return cls(cls.parse_max_slowdown(text))

    def __str__(self) -> str:
        cut = "dynamic" if self.max_slowdown is None else f"{self.max_slowdown:g}"
        return (
            f"MAX_SLOWDOWN {cut}, SharingFactor {self.sharing_factor:g}, m {self.max_mates},"
            f" {self.runtime_model} runtime model"
        )


@dataclass(slots=True)
class Segment:
    """A part of a shared job's allocation: ``cores`` of the ``nominal`` cores it would have
    had there statically, on the cores of ``mate`` (None once that mate has ended and j holds
    its whole share)."""

    mate: str | None
    nominal: float
    cores: int


def speed(model: RuntimeModel, segments: Sequence[Segment], asked: int) -> float:
    """The fraction of its static speed a job on ``segments`` runs at, under ``model``.

    Ideal (Equation 5): ``sum(cores) / asked``. Worst case (Equation 6): the least
    ``cores / nominal`` over its segments, as a statically balanced job waits for its slowest
    part. Never above 1: a job cannot run faster than it asked to."""
    if model is RuntimeModel.IDEAL:
        share = sum(s.cores for s in segments) / asked
    else:
        share = min(s.cores / s.nominal for s in segments)
    return min(1.0, share)


def average_slowdown(slowdowns: Sequence[float]) -> float:
    """The dynamic MAX_SLOWDOWN (§3.2.2): the running jobs' average predicted slowdown, each
    ``(wait + extended + req) / req`` by requested times; infinite when none is known."""
    return sum(slowdowns) / len(slowdowns) if slowdowns else math.inf


def guest_cores(asked: int, min_cores: int, sharing_factor: float) -> int:
    """G, the cores a job that asked ``asked`` starts on when it shares: SharingFactor of
    them, at least its minimum (§3.3: "depends on the SharingFactor and the minimum amount")."""
    return max(min_cores, math.ceil(sharing_factor * asked))


@dataclass(frozen=True, slots=True)
class Mate:
    """A running malleable job, at its static size, as SD-Policy weighs it."""

    job_id: str
    cores: int  # c_i: its cores now, its static size
    min_cores: int
    wait: float  # seconds it waited in the queue
    requested: float  # req_i: its requested run time on ``cores``
    extended: float  # seconds earlier shares are predicted to have added to its run time
    planned_end: float  # when it is planned to end

    @property
    def slowdown(self) -> float:
        """Its predicted slowdown as it stands: (wait + extended + req) / req."""
        return (self.wait + self.extended + self.requested) / self.requested

    def offer(self, sharing_factor: float) -> int:
        """The most cores it gives: SharingFactor of them, down to its minimum."""
        return min(math.floor(sharing_factor * self.cores), self.cores - self.min_cores)

    def increase(self, overlap: float, given: int) -> float:
        """Seconds giving ``given`` cores for ``overlap`` seconds adds to its run time."""
        return overlap * given / self.cores

    def penalty(self, overlap: float, given: int) -> float:
        """p_i (Equation 4)."""
        increase = self.increase(overlap, given)
        return (self.wait + self.extended + increase + self.requested) / self.requested


@dataclass(frozen=True, slots=True)
class NewJob:
    """The malleable job static backfill cannot start: it asked ``asked`` cores (it runs on
    no fewer than ``min_cores``) for ``requested`` seconds, and would start at
    ``static_start`` by static backfill."""

    job_id: str
    asked: int
    min_cores: int
    requested: float
    static_start: float


@dataclass(frozen=True, slots=True)
class SdDecision:
    """Start the job now on ``cores`` cores, ``given[m]`` of them from mate ``m``."""

    job_id: str
    cores: int
    given: dict[str, int]
    nominal: dict[str, float]  # n_i: its static share on each mate's cores
    increases: dict[str, float]  # each mate's predicted increase
    penalties: dict[str, float]  # each mate's p_i
    mall_end: float
    static_end: float


def sd_backfill(
    job: NewJob,
    mates: Sequence[Mate],
    now: float,
    policy: SdPolicy,
    cutoff: float,
    protect: float | None = None,
) -> SdDecision | None:
    """SD-Policy's decision for ``job`` at ``now`` (see the module), or None: it waits.

    ``cutoff`` is MAX_SLOWDOWN (the caller resolves the dynamic one). ``protect``: the queue
    head's reservation when ``job`` is not the head; a mate planned to end by then must still
    end by then."""
    asked, req = job.asked, job.requested
    if not (0 < req < math.inf) or not mates:
        return None
    cores = guest_cores(asked, job.min_cores, policy.sharing_factor)
    if cores >= asked:
        return None  # it cannot run smaller than it asked
    overlap = req * asked / cores  # both models agree at the start (see the module)
    mall_end = now + overlap
    static_end = job.static_start + req
    if not mall_end < static_end:
        return None
    eligible: list[tuple[float, Mate, int]] = []
    for mate in mates:
        if not 0 < mate.requested < math.inf:
            continue  # no penalty to weigh
        offer = mate.offer(policy.sharing_factor)
        if offer <= 0 or mate.planned_end + mate.increase(overlap, offer) < mall_end:
            continue  # it cannot give, or it ends before j would, whatever it gives
        penalty = mate.penalty(overlap, offer)
        if penalty < cutoff:  # constraint 2, on the most it may give
            eligible.append((penalty, mate, offer))
    eligible.sort(key=lambda e: (e[0], e[1].job_id))  # the list sorted by penalty (§3.2.4)
    del eligible[policy.candidates :]
    best: tuple[float, dict[str, int]] | None = None
    for size in range(1, policy.max_mates + 1):
        for combination in itertools.combinations(eligible, size):
            given = _distribute(combination, cores, overlap, mall_end, protect)
            if given is None:
                continue
            total = sum(m.penalty(overlap, given[m.job_id]) for _, m, _ in combination)
            if best is None or total < best[0]:
                best = (total, given)
    if best is None:
        return None
    given = best[1]
    by_id = {m.job_id: m for _, m, _ in eligible}
    return SdDecision(
        job.job_id,
        cores,
        given,
        {mate: g * asked / cores for mate, g in given.items()},
        {mate: by_id[mate].increase(overlap, g) for mate, g in given.items()},
        {mate: by_id[mate].penalty(overlap, g) for mate, g in given.items()},
        mall_end,
        static_end,
    )


def _distribute(
    combination: tuple[tuple[float, Mate, int], ...],
    need: int,
    overlap: float,
    mall_end: float,
    protect: float | None,
) -> dict[str, int] | None:
    """What each mate of ``combination`` (lowest penalty first) gives towards ``need`` cores,
    or None when they cannot give it or a constraint fails."""
    given: dict[str, int] = {}
    left = need
    for _, mate, offer in combination:
        if left == 0:
            return None  # a mate that gives nothing is no mate: a smaller combination covers it
        take = min(offer, left)
        end = mate.planned_end + mate.increase(overlap, take)
        if end < mall_end:
            return None  # j must end inside the mate's allocation (§3.2.4)
        if protect is not None and mate.planned_end <= protect < end:
            return None  # it would free its cores after the head's reservation
        given[mate.job_id] = take
        left -= take
    return given if left == 0 else None
