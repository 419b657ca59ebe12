"""Black-hole protection: sites whose jobs fail fast far more often than the others'. Pure.

Theory of operation. A *black hole* is a site that takes jobs and fails them at once (a broken
installation, a full disk, a missing library). It looks idle, so F(j) keeps feeding it and it
swallows a stream of jobs. HTCondor's job router throttles such routes by their failure rate; an
owner broker here does the same with what it alone knows for sure, the outcomes of its own jobs.

Each end of an owned job is recorded against the site that ran it, with the owner's time. A
*fast failure* is a job that ended FAILED within ``fast`` seconds of its start, or without a
start the owner heard of (it failed staging or launching); a success, or a failure after a real
run, is an ordinary outcome. Over the outcomes of the last ``window`` seconds, for a site s with
n_s outcomes of which f_s were fast failures:

    p_s      = f_s / n_s                           the site's fast-failure rate
    p_rest   = (Σ f - f_s) / (Σ n - n_s)           the other sites' (the baseline)
    excess_s = p_s - p_rest

A site is judged, when an outcome arrives, only if it has at least ``min_outcomes`` outcomes and
the other sites together have as many (a baseline): a user's broken job that fails everywhere
makes no site a black hole, and an owner that has seen only one site judges none. A judged site
whose excess reaches ``suspect_excess`` is *scored down*: ``penalty × excess_s`` is added to its
F(j). One whose excess reaches ``exclude_excess`` is *excluded*: it is in no S(i) for ``cooldown``
seconds (a :class:`SiteExcluded` notice says so once), and its outcomes so far are forgotten, so
after the cool-down it is judged afresh on what it does next.

:class:`SiteHealth` keeps the outcomes in one deque in time order, so forgetting the old ones costs
O(1) each, and recomputes the verdicts only when an outcome comes or goes: the per-decision
queries (:meth:`SiteHealth.excluded`, :meth:`SiteHealth.penalties`) return cached values.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields

from gbroker.core.events import SiteExcluded
from gbroker.errors import InvalidInput

__all__ = ["HealthPolicy", "SiteExcluded", "SiteHealth", "SiteRecord"]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The thresholds of black-hole protection (see the module docstring).

    Attributes:
        fast: a failure within this many seconds of the job's start is a fast failure.
        window: seconds an outcome counts for.
        min_outcomes: outcomes a site needs, and the other sites together, to be judged.
        suspect_excess: excess of fast-failure rate over the baseline that scores a site down.
        penalty: F(j) grows by ``penalty × excess`` at a suspect site.
        exclude_excess: excess that excludes a site.
        cooldown: seconds an excluded site stays out.
    """

    fast: float = 10.0
    window: float = 600.0
    min_outcomes: int = 5
    suspect_excess: float = 0.3
    penalty: float = 2.0
    exclude_excess: float = 0.6
    cooldown: float = 300.0

    def __post_init__(self) -> None:
        for name in ("fast", "penalty"):
            if not getattr(self, name) >= 0:  # also rejects NaN
                raise InvalidInput(f"black_hole.{name}", "a number >= 0", getattr(self, name))
        for name in ("window", "cooldown"):
            if not getattr(self, name) > 0:
                raise InvalidInput(f"black_hole.{name}", "seconds > 0", getattr(self, name))
        if isinstance(self.min_outcomes, bool) or not (
            isinstance(self.min_outcomes, int) and self.min_outcomes >= 1
        ):
            raise InvalidInput("black_hole.min_outcomes", "an integer >= 1", self.min_outcomes)
        if not 0 < self.suspect_excess <= 1:
            raise InvalidInput(
                "black_hole.suspect_excess", "a rate difference in (0, 1]", self.suspect_excess
            )
        if not self.suspect_excess <= self.exclude_excess <= 1:
            raise InvalidInput(
                "black_hole.exclude_excess",
                f"a rate difference in [suspect_excess ({self.suspect_excess:g}), 1]",
                self.exclude_excess,
            )

    @classmethod
    def parse(cls, text: str) -> HealthPolicy:
        """A policy from ``name=value`` pairs separated by commas (e.g. ``fast=5,cooldown=60``);
        the fields not named keep their defaults."""
        known = [f.name for f in fields(cls)]
        values: dict[str, float | int] = {}
        for item in text.split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in known:
                expected = f"name=value pairs, names among {', '.join(known)}"
                raise InvalidInput("black_hole", expected, item)
            try:
                values[name] = int(value) if name == "min_outcomes" else float(value)
            except ValueError:
                raise InvalidInput(f"black_hole.{name}", "a number", value) from None
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SiteRecord:
    """What the owner knows of a site's outcomes in the window, and its verdict now."""

    outcomes: int
    fast_failures: int
    penalty: float
    excluded_until: float | None


class SiteHealth:
    """One owner's record of its jobs' outcomes per site, and the verdicts drawn from it."""

    def __init__(self, policy: HealthPolicy) -> None:
        self.policy = policy
        self._outcomes: deque[tuple[float, str, bool]] = deque()  # (when, site, fast failure)
        self._counts: dict[str, list[int]] = {}  # site -> [outcomes, fast failures]
        self._total = [0, 0]
        self._excluded: dict[str, float] = {}  # site -> end of its cool-down
        self._excluded_now: frozenset[str] = frozenset()
        self._next_readmission = float("inf")
        self._penalties: dict[str, float] = {}

    def is_fast_failure(self, ok: bool, run_time: float | None) -> bool:
        """Whether an end counts as a fast failure: failed, and within ``fast`` s of its start
        (``run_time`` None: no start was seen)."""
        return not ok and (run_time is None or run_time <= self.policy.fast)

    def record(self, site: str, ok: bool, run_time: float | None, now: float) -> list[SiteExcluded]:
        """An owned job ended at ``site``; returns the sites this outcome got excluded."""
        fast = self.is_fast_failure(ok, run_time)
        self._expire(now)
        self._outcomes.append((now, site, fast))
        counts = self._counts.setdefault(site, [0, 0])
        counts[0] += 1
        counts[1] += fast
        self._total[0] += 1
        self._total[1] += fast
        return self._judge(now)

    def excluded(self, now: float) -> frozenset[str]:
        """The sites in their cool-down at ``now``."""
        if now >= self._next_readmission:
            self._excluded = {s: until for s, until in self._excluded.items() if until > now}
            self._excluded_now = frozenset(self._excluded)
            self._next_readmission = min(self._excluded.values(), default=float("inf"))
        return self._excluded_now

    def penalties(self, now: float) -> dict[str, float]:
        """What to add to F(j) of each suspect site (sites not named: nothing)."""
        expired = self._outcomes and self._outcomes[0][0] <= now - self.policy.window
        if expired or now >= self._next_readmission:
            # Only an outcome excludes a site (and says so); here the scores are brought up to
            # date with the outcomes that aged out and the cool-downs that ended.
            self._expire(now)
            self._verdicts(now, exclude=False)
        return self._penalties

    def records(self, now: float) -> dict[str, SiteRecord]:
        """Every site with outcomes in the window or a cool-down running, as of ``now``."""
        penalties = self.penalties(now)
        excluded = self.excluded(now)
        out = {}
        for site in sorted({*self._counts, *excluded}):
            outcomes, fast_failures = self._counts.get(site, (0, 0))
            out[site] = SiteRecord(
                outcomes,
                fast_failures,
                penalties.get(site, 0.0),
                self._excluded[site] if site in excluded else None,
            )
        return out

    def _expire(self, now: float) -> None:
        horizon = now - self.policy.window
        outcomes = self._outcomes
        while outcomes and outcomes[0][0] <= horizon:
            _, site, fast = outcomes.popleft()
            counts = self._counts[site]
            counts[0] -= 1
            counts[1] -= fast
            self._total[0] -= 1
            self._total[1] -= fast
            if counts[0] == 0:
                del self._counts[site]

    def _forget(self, site: str) -> None:
        counts = self._counts.pop(site, None)
        if counts is None:
            return
        self._total[0] -= counts[0]
        self._total[1] -= counts[1]
        self._outcomes = deque(o for o in self._outcomes if o[1] != site)

    def _judge(self, now: float) -> list[SiteExcluded]:
        """Score down and exclude as the outcomes now say. An exclusion forgets the site's
        outcomes, which moves the others' baselines: judge again until no site is excluded."""
        notices: list[SiteExcluded] = []
        while True:
            found = self._verdicts(now, exclude=True)
            if not found:
                return notices
            for notice in found:
                self._excluded[notice.site] = notice.until
                self._next_readmission = min(self._next_readmission, notice.until)
                self._forget(notice.site)
            self._excluded_now = frozenset(self._excluded)
            notices.extend(found)

    def _verdicts(self, now: float, exclude: bool) -> list[SiteExcluded]:
        """The sites to exclude now (if ``exclude``); sets the penalties of the suspect ones."""
        policy = self.policy
        total, total_fast = self._total
        excluded = self.excluded(now)
        self._penalties = {}
        found: list[SiteExcluded] = []
        for site, (n, f) in self._counts.items():
            rest = total - n
            if n < policy.min_outcomes or rest < policy.min_outcomes or site in excluded:
                continue
            rate = f / n
            baseline = (total_fast - f) / rest
            excess = rate - baseline
            if exclude and excess >= policy.exclude_excess:
                found.append(SiteExcluded(site, now + policy.cooldown, f, n, rate, baseline))
            elif excess >= policy.suspect_excess:
                self._penalties[site] = policy.penalty * excess
        return found
