"""Malleability: the sizes a job takes, and how a site grows and shrinks its running jobs. Pure.

Theory of operation. A *malleable* job runs on a number of cores that may change while it runs,
between its ``rank`` (fewest) and ``max_rank`` (most) and only to the sizes its application
accepts (:class:`SizeRule`: any size, multiples of k, powers of two, or a list). Following KOALA
(Buisson, Sonmez, Mohamed, Lammers, Epema: *Scheduling malleable applications in multicluster
systems*, CoreGRID TR-0092, 2007; ``SEEDS.md`` §000), the scheduler does not need to know an
application's constraints to make an offer: it offers, and the application answers with what it
takes. Here the application declares its rule with the job, so that the simulator can answer for
it and a real application's answer can be checked; :meth:`SizeRule.take` is that answer: the
largest size it accepts within what is offered, or, asked to give cores back, the largest size
it accepts at most what is left and at least its minimum (so it may give back more than asked).

KOALA's two *malleability management policies* (§5.3) decide who is offered what: **FPSMA**
(grow the earliest-started first, shrink the latest-started first) and **EGS** (split equally,
the remainder as a bonus or malus of one core); and, per site, *when* (§5.2): **PRA** grows
running jobs before serving the queue, **PWA** serves the queue first and shrinks running jobs
for its head; growth never takes a site's ``reserve``. The local scheduler
(:mod:`gbroker.core.localsched`) applies the *when*.

:func:`grow` and :func:`shrink` apply a policy to a set of :class:`Member` jobs and return the
:class:`Resize` of each job whose size changes. They never take a job below its minimum or above
its maximum, to a size it does not accept, and never hand out more than the amount given (growth)
— the property tests in ``tests/core/test_malleable.py`` check it on random cases. The policies
in full and the experiments: docs/MALLEABILITY.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gbroker.errors import InvalidInput

__all__ = [
    "Initiative",
    "Malleability",
    "MalleabilityPolicy",
    "Member",
    "Obligation",
    "Policy",
    "Precedence",
    "Resize",
    "SizeRule",
    "grow",
    "shrink",
]

_MAX_LISTED = 1024  # sizes a job may list (bounded: a job description is untrusted input)


class SizeKind(StrEnum):
    ANY = "any"
    MULTIPLE = "multiple"
    POWER2 = "power2"
    LISTED = "listed"


@dataclass(frozen=True, slots=True)
class SizeRule:
    """Which core counts an application accepts (besides its minimum and maximum).

    ``any``; ``multiple`` of ``step``; ``power2``; or ``listed`` sizes. :meth:`parse` reads the
    forms a job description uses: ``any``, ``multiple:4``, ``power2``, ``2,4,6,12``.
    """

    kind: SizeKind = SizeKind.ANY
    step: int = 1
    listed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", SizeKind(self.kind))
        except ValueError:
            raise InvalidInput("sizes", f"one of {', '.join(SizeKind)}", self.kind) from None
        if self.kind is SizeKind.MULTIPLE and not (type(self.step) is int and self.step >= 1):
            raise InvalidInput("sizes.step", "an integer >= 1", self.step)
        if self.kind is SizeKind.LISTED:
            if not self.listed or len(self.listed) > _MAX_LISTED:
                raise InvalidInput("sizes", f"1 to {_MAX_LISTED} sizes", len(self.listed))
            if any(type(n) is not int or n < 1 for n in self.listed):
                raise InvalidInput("sizes", "core counts >= 1", self.listed)
            object.__setattr__(self, "listed", tuple(sorted(set(self.listed))))

    @classmethod
    def parse(cls, text: str) -> SizeRule:
        text = text.strip()
        if text in ("any", ""):
            return cls()
        if text in ("power2", "powers-of-two", "pow2"):
            return cls(SizeKind.POWER2)
        if text.startswith("multiple:"):
            try:
                step = int(text.partition(":")[2])
            except ValueError:
                raise InvalidInput("sizes", "multiple:K with K an integer >= 1", text) from None
            return cls(SizeKind.MULTIPLE, step=step)
        try:
            sizes = tuple(int(part) for part in text.split(","))
        except ValueError:
            raise InvalidInput(
                "sizes", "any, power2, multiple:K, or a list of sizes like 2,4,8", text
            ) from None
        return cls(SizeKind.LISTED, listed=sizes)

    def __str__(self) -> str:
        if self.kind is SizeKind.MULTIPLE:
            return f"multiple:{self.step}"
        if self.kind is SizeKind.LISTED:
            return ",".join(map(str, self.listed))
        return str(self.kind)

    def accepts(self, n: int) -> bool:
        if n < 1:
            return False
        if self.kind is SizeKind.ANY:
            return True
        if self.kind is SizeKind.MULTIPLE:
            return n % self.step == 0
        if self.kind is SizeKind.POWER2:
            return n & (n - 1) == 0
        return n in self.listed

    def largest(self, lo: int, hi: int) -> int | None:
        """The largest accepted size in ``[lo, hi]`` (None: there is none)."""
        if hi < lo or hi < 1:
            return None
        if self.kind is SizeKind.ANY:
            return hi
        if self.kind is SizeKind.MULTIPLE:
            n = hi - hi % self.step
        elif self.kind is SizeKind.POWER2:
            n = 1 << (hi.bit_length() - 1)
        else:
            n = max((s for s in self.listed if s <= hi), default=0)
        return n if n >= lo and n >= 1 else None

    def smallest(self, lo: int, hi: int) -> int | None:
        """The smallest accepted size in ``[lo, hi]`` (None: there is none)."""
        lo = max(lo, 1)
        if hi < lo:
            return None
        if self.kind is SizeKind.ANY:
            return lo
        if self.kind is SizeKind.MULTIPLE:
            n = -(-lo // self.step) * self.step
        elif self.kind is SizeKind.POWER2:
            n = 1 << (lo - 1).bit_length()
        else:
            n = min((s for s in self.listed if s >= lo), default=hi + 1)
        return n if n <= hi else None

    def take(self, current: int, target: int, lo: int, hi: int) -> int:
        """The size a job at ``current`` (bounds ``lo``..``hi``) takes when offered ``target``.

        Growing (target > current): the largest accepted size in [current, min(target, hi)],
        else it stays. Shrinking: the largest accepted size in [lo, max(target, lo)], else the
        smallest accepted one in [lo, current), else it stays.
        """
        if target >= current:
            return self.largest(current, min(target, hi)) or current
        best = self.largest(lo, max(target, lo))
        if best is None:
            best = self.smallest(lo, current - 1)
        return current if best is None else best


def _coerce(obj: object, **kinds: type[StrEnum]) -> None:
    """Make each named field of a frozen dataclass its enum, or name it in the error."""
    for name, kind in kinds.items():
        value = getattr(obj, name)
        try:
            object.__setattr__(obj, name, kind(value))
        except ValueError:
            expected = f"one of {', '.join(kind)}"
            raise InvalidInput(f"malleability.{name}", expected, value) from None


class Initiative(StrEnum):
    """Who may start a change of size (KOALA §2.3)."""

    SCHEDULER = "scheduler"
    APPLICATION = "application"
    BOTH = "both"


class Obligation(StrEnum):
    """Whether a change must be honoured (KOALA §2.4): a voluntary offer may be taken in part;
    a mandatory shrink must be done by its deadline, else the site enforces it (see the
    daemon's resize protocol)."""

    VOLUNTARY = "voluntary"
    MANDATORY = "mandatory"


@dataclass(frozen=True, slots=True)
class Malleability:
    """What a malleable (or evolving) job declares beyond its ``rank`` and ``max_rank``.

    Attributes:
        sizes: the core counts the application accepts.
        initiative: who may change its size.
        obligation: whether a change must be honoured.
        deadline: seconds the application has to answer (and, for a mandatory shrink, to
            comply with) a change.
        reconfiguration_cost: seconds of work each change of size costs the job.
        evolving: the application itself asks to grow or shrink while it runs (ElastiSim's
            evolving jobs).
        initial: the size it starts with (then the scheduler resizes it), as KOALA's malleable
            jobs start on 2 processors; None: the largest size free when it starts.
    """

    sizes: SizeRule = SizeRule()
    initiative: Initiative = Initiative.SCHEDULER
    obligation: Obligation = Obligation.VOLUNTARY
    deadline: float = 30.0
    reconfiguration_cost: float = 0.0
    evolving: bool = False
    initial: int | None = None

    def __post_init__(self) -> None:
        _coerce(self, initiative=Initiative, obligation=Obligation)
        if self.initial is not None and not (type(self.initial) is int and self.initial >= 1):
            raise InvalidInput("malleability.initial", "an integer >= 1 (cores)", self.initial)
        if not 0 < self.deadline <= 86_400:
            raise InvalidInput("malleability.deadline", "seconds in (0, 86400]", self.deadline)
        if not 0 <= self.reconfiguration_cost <= 86_400:
            raise InvalidInput(
                "malleability.reconfiguration_cost",
                "seconds in [0, 86400]",
                self.reconfiguration_cost,
            )

    @property
    def scheduler_may_resize(self) -> bool:
        return self.initiative is not Initiative.APPLICATION


class Policy(StrEnum):
    """Who is offered what (KOALA §5.3)."""

    FPSMA = "fpsma"
    EGS = "egs"


class Precedence(StrEnum):
    """When a site resizes (KOALA §5.2)."""

    PRA = "pra"
    PWA = "pwa"


@dataclass(frozen=True, slots=True)
class MalleabilityPolicy:
    """A site's malleability manager: the policy, the precedence, and the ``reserve`` of cores
    that growth never takes. ``shrink_for_head`` False makes PWA serve the queue and then grow,
    never shrinking (ElastiSim's example FCFS scheduler)."""

    policy: Policy = Policy.FPSMA
    precedence: Precedence = Precedence.PRA
    reserve: int = 0
    shrink_for_head: bool = True

    def __post_init__(self) -> None:
        _coerce(self, policy=Policy, precedence=Precedence)
        if type(self.reserve) is not int or self.reserve < 0:
            raise InvalidInput("malleability.reserve", "an integer >= 0", self.reserve)


@dataclass(frozen=True, slots=True)
class Member:
    """A running malleable job as the policies see it."""

    job_id: str
    started: float
    cores: int
    min_cores: int
    max_cores: int
    sizes: SizeRule = SizeRule()

    def take(self, target: int) -> int:
        return self.sizes.take(self.cores, target, self.min_cores, self.max_cores)

    @property
    def can_grow(self) -> bool:
        return self.sizes.largest(self.cores + 1, self.max_cores) is not None

    @property
    def can_give(self) -> int:
        """The most cores it can give back (down to its smallest accepted size)."""
        floor = self.sizes.smallest(self.min_cores, self.cores)
        return 0 if floor is None else self.cores - floor


@dataclass(frozen=True, slots=True)
class Resize:
    """Job ``job_id`` goes from ``old`` to ``cores`` cores."""

    job_id: str
    old: int
    cores: int

    @property
    def delta(self) -> int:
        return self.cores - self.old


def _by_start(members: Iterable[Member], latest_first: bool) -> list[Member]:
    # Ties broken by job id, so that a decision never depends on the order it was given.
    return sorted(members, key=lambda m: (m.started, m.job_id), reverse=latest_first)


def grow(policy: Policy, members: Sequence[Member], amount: int) -> list[Resize]:
    """Offer ``amount`` free cores to the running malleable ``members`` (KOALA Figures 4, 5).

    The resizes returned add up to at most ``amount``."""
    if amount <= 0 or not members:
        return []
    order = _by_start(members, latest_first=False)  # earliest started first
    out = []
    if policy is Policy.FPSMA:
        left = amount
        for member in order:
            new = member.take(member.cores + left)
            if new != member.cores:
                out.append(Resize(member.job_id, member.cores, new))
                left -= new - member.cores
            if left == 0:
                break
        return out
    share, bonus = divmod(amount, len(order))
    for i, member in enumerate(order):
        offered = share + (1 if i < bonus else 0)
        new = member.take(member.cores + offered)
        if new != member.cores:
            out.append(Resize(member.job_id, member.cores, new))
    return out


def shrink(policy: Policy, members: Sequence[Member], amount: int) -> list[Resize]:
    """Ask the running malleable ``members`` to give back ``amount`` cores (KOALA Figures 4,
    5). They may give back more (to reach a size they accept) or less (their minimums)."""
    if amount <= 0 or not members:
        return []
    order = _by_start(members, latest_first=True)  # latest started first
    out = []
    if policy is Policy.FPSMA:
        left = amount
        for member in order:
            new = member.take(member.cores - left)
            if new < member.cores:
                out.append(Resize(member.job_id, member.cores, new))
                left -= member.cores - new
            if left <= 0:
                break
        return out
    share, malus = divmod(amount, len(order))
    for i, member in enumerate(order):
        asked = share + (1 if i < malus else 0)
        if asked == 0:
            continue
        new = member.take(member.cores - asked)
        if new < member.cores:
            out.append(Resize(member.job_id, member.cores, new))
    return out
