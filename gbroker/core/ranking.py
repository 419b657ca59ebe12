"""Ranking candidate sites with the paper's function F(j) (ARCHITECTURE §2).

Theory of operation. A broker i that holds job (rank r) looks at itself and its neighbourhood
L(i). The feasible set is S(i) = {j in L(i) ∪ {i} : n_j >= r}. For each feasible j it knows a
(possibly stale) state (n_j, c_j, q_j) and a forecast t_j of the time to stage the job's input
files to j. A site that is draining (``SiteState.draining``: it takes no new work) is in no
S(i). With t_max, c_max, w_max the maxima over S(i) of t_j, c_j and w_j = q_j / n_j:

    F(j) = t_j/t_max + c_max/c_j + w_j/w_max   if c_j < r or q_j > 0   (the job would wait)
    F(j) = t_j/t_max                           otherwise               (it can start at once)

The best site minimises F. A site where the job starts at once scores <= 1, one where it would
wait scores >= 1 (c_max/c_j >= 1) unless no feasible site has a free core at all.

The paper leaves the degenerate cases open; we define them:
- a zero maximum makes its whole term 0 (t_max = 0: all files local everywhere; w_max = 0: no
  queue anywhere; c_max = 0: no free core anywhere);
- c_j = 0 while c_max > 0 makes c_max/c_j the finite penalty c_max + 1, worse than any site with a
  free core (c_max/c_j <= c_max for c_j >= 1) and never inf or NaN;
- ties break deterministically: fresher state first (larger ``observed_at``), then lower site id.

c_j counts a site's free cores and the busy cores it would free at once by shrinking its running
malleable jobs (``SiteState.shrinkable``, published by sites under PWA;
:mod:`gbroker.core.malleable`): a job goes where it can start now, by shrinking if need be. For a
job that may share (``Job.shares_cores``), the broker counts as shrinkable too the cores an
SD-Policy site's mates would give it (``SiteState.shareable``, :mod:`gbroker.core.sdpolicy`),
laying them over before it ranks (``SiteState.for_job``); for any other job they are busy.

Cost is O(|S(i)|) per decision, independent of the number of sites H. A broker's decision uses
:func:`best_sites` on plain rows (site, state, t_j, observed_at): it builds no object per site.
At thousands of simulated sites most of the heap is out of the CPU caches, and a fresh object
there is likely a cache miss; :class:`Candidate` and :class:`Score` serve the other callers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gbroker.core.model import InputFile, SiteState
from gbroker.errors import InvalidInput

__all__ = [
    "Candidate",
    "Score",
    "SiteRow",
    "Terms",
    "TransferForecast",
    "best_sites",
    "choose_site",
    "f_terms",
    "rank_sites",
    "staging_time",
]

TransferForecast = Callable[[str, str, int], float]
"""t(i, j, m): forecast seconds to move m bytes from site i to site j."""

SiteRow = tuple[str, SiteState, float, float]
"""A candidate as a plain tuple: site, state, transfer_time (t_j) and observed_at."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One site as the deciding broker sees it.

    Attributes:
        site: the site's id.
        state: its last known state (n_j, c_j, q_j, s_j).
        transfer_time: t_j, forecast seconds to stage the job's files there.
        observed_at: when ``state`` was sampled (the freshness used to break ties).
    """

    site: str
    state: SiteState
    transfer_time: float = 0.0
    observed_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.transfer_time >= 0:  # also rejects NaN
            raise InvalidInput(
                f"candidate[{self.site}].transfer_time", "seconds >= 0", self.transfer_time
            )


@dataclass(frozen=True, slots=True)
class Score:
    """F(j) for one feasible site, and whether the job would wait there."""

    site: str
    value: float
    waits: bool
    observed_at: float

    def sort_key(self) -> tuple[float, float, str]:
        """Lower is better: F, then fresher data, then lower site id."""
        return (self.value, -self.observed_at, self.site)


@dataclass(frozen=True, slots=True)
class Terms:
    """F(j) of one feasible site term by term, for people (``gbroker explain``).

    ``transfer`` is t_j/t_max; ``free`` is c_max/c_j and ``load`` w_j/w_max, both 0 when the job
    can start at once there (``waits`` False); ``value`` is F(j), their sum.
    """

    site: str
    transfer_time: float
    transfer: float
    free: float
    load: float
    waits: bool
    value: float
    observed_at: float = 0.0


def staging_time(files: Iterable[InputFile], site: str, forecast: TransferForecast) -> float:
    """t_j = sum over files l not already at ``site`` of t(h_l, j, z_l)."""
    if type(files) is tuple and len(files) == 1:
        # The usual job has one input file: no generator to build for it.
        f = files[0]
        return forecast(f.site, site, f.size) if f.site != site else 0
    return sum(forecast(f.site, site, f.size) for f in files if f.site != site)


def _evaluate(rank: int, rows: Sequence[SiteRow]) -> list[tuple[float, bool, SiteRow]]:
    """F(j) and whether the job would wait, for each feasible row, in the rows' order.

    One function with no calls inside (the ratios and ``load_per_core`` are written out): at
    thousands of simulated sites, the code a decision runs must come back into the CPU caches as
    much as its data, so a decision runs as little distinct code as it can.
    """
    if rank < 1:
        raise InvalidInput("rank", "an integer >= 1", rank)
    # A loop, not a comprehension, which would build a function object per decision.
    feasible = []
    for row in rows:
        if row[1].total_cores >= rank and not row[1].draining:
            feasible.append(row)  # noqa: PERF401
    if not feasible:
        return []
    # The maxima over S(i), as max() finds them (the first of equal values).
    _, state, t_max, _ = feasible[0]
    c_max = state.free_cores + state.shrinkable
    w_max = state.queued / state.total_cores
    for _, state, t_j, _ in feasible:
        if t_j > t_max:
            t_max = t_j
        if state.free_cores + state.shrinkable > c_max:
            c_max = state.free_cores + state.shrinkable
        w_j = state.queued / state.total_cores
        if w_j > w_max:
            w_max = w_j
    out = []
    for row in feasible:
        state = row[1]
        free = state.free_cores + state.shrinkable
        value = row[2] / t_max if t_max > 0 else 0.0
        waits = free < rank or state.queued > 0
        if waits:
            if c_max == 0:
                free_term = 0.0
            elif free == 0:
                free_term = c_max + 1.0
            else:
                free_term = c_max / free
            w_j = state.queued / state.total_cores
            value += free_term + (w_j / w_max if w_max > 0 else 0.0)
        out.append((value, waits, row))
    return out


def _scores(rank: int, candidates: Sequence[Candidate]) -> list[Score]:
    rows = [(c.site, c.state, c.transfer_time, c.observed_at) for c in candidates]
    return [Score(row[0], value, waits, row[3]) for value, waits, row in _evaluate(rank, rows)]


def best_sites(rank: int, rows: Sequence[SiteRow], how_many: int = 1) -> list[str]:
    """The ``how_many`` best feasible sites, best first: :func:`rank_sites`' order, from rows.

    Rows must have valid transfer times (>= 0), as a :class:`Candidate` checks them.
    """
    if how_many == 1:  # a plain argmin: no list of keys to build and sort
        best: tuple[float, float, str] | None = None
        for value, _, row in _evaluate(rank, rows):
            key = (value, -row[3], row[0])
            if best is None or key < best:
                best = key
        return [] if best is None else [best[2]]
    keys = sorted((value, -row[3], row[0]) for value, _, row in _evaluate(rank, rows))
    return [key[2] for key in keys[:how_many]]


def f_terms(rank: int, candidates: Sequence[Candidate]) -> list[Terms]:
    """F(j) of each feasible candidate with its terms, best first (:func:`rank_sites`' order).

    The same arithmetic as the ranking's hot path, written out term by term; tests hold the two
    to the same values.
    """
    if rank < 1:
        raise InvalidInput("rank", "an integer >= 1", rank)
    feasible = [c for c in candidates if c.state.total_cores >= rank and not c.state.draining]
    if not feasible:
        return []
    t_max = max(c.transfer_time for c in feasible)
    c_max = max(c.state.available for c in feasible)
    w_max = max(c.state.load_per_core for c in feasible)
    out = []
    for c in feasible:
        free = c.state.available
        transfer = c.transfer_time / t_max if t_max > 0 else 0.0
        waits = free < rank or c.state.queued > 0
        free_term = load_term = 0.0
        if waits:
            if c_max == 0:
                free_term = 0.0
            elif free == 0:
                free_term = c_max + 1.0
            else:
                free_term = c_max / free
            load_term = c.state.load_per_core / w_max if w_max > 0 else 0.0
        value = transfer + (free_term + load_term) if waits else transfer  # as _evaluate adds
        out.append(
            Terms(
                c.site, c.transfer_time, transfer, free_term, load_term, waits, value, c.observed_at
            )
        )
    out.sort(key=lambda t: (t.value, -t.observed_at, t.site))
    return out


def rank_sites(rank: int, candidates: Sequence[Candidate]) -> list[Score]:
    """Score the feasible candidates for a job of ``rank`` cores, best first.

    Sites with fewer than ``rank`` cores in all, and draining sites, are not feasible and are left
    out; the result is empty when no candidate is feasible.
    """
    return sorted(_scores(rank, candidates), key=Score.sort_key)


def choose_site(rank: int, candidates: Sequence[Candidate]) -> Score | None:
    """The local-optimal choice j* = argmin F(j) over S(i), in O(|S(i)|); None if S(i) is empty."""
    return min(_scores(rank, candidates), key=Score.sort_key, default=None)
