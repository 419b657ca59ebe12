"""Ranking candidate sites with the paper's function F(j) (ARCHITECTURE §2).

Theory of operation. A broker i that holds job (rank r) looks at itself and its neighbourhood
L(i). The feasible set is S(i) = {j in L(i) ∪ {i} : n_j >= r}. For each feasible j it knows a
(possibly stale) state (n_j, c_j, q_j) and a forecast t_j of the time to stage the job's input
files to j. With t_max, c_max, w_max the maxima over S(i) of t_j, c_j and w_j = q_j / n_j:

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

Cost is O(|S(i)|) per decision, independent of the number of sites H.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gbroker.core.model import InputFile, SiteState
from gbroker.errors import InvalidInput

__all__ = ["Candidate", "Score", "TransferForecast", "choose_site", "rank_sites", "staging_time"]

TransferForecast = Callable[[str, str, int], float]
"""t(i, j, m): forecast seconds to move m bytes from site i to site j."""


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


def staging_time(files: Iterable[InputFile], site: str, forecast: TransferForecast) -> float:
    """t_j = sum over files l not already at ``site`` of t(h_l, j, z_l)."""
    return sum(forecast(f.site, site, f.size) for f in files if f.site != site)


def _ratio(numerator: float, maximum: float) -> float:
    return numerator / maximum if maximum > 0 else 0.0


def _scores(rank: int, candidates: Sequence[Candidate]) -> list[Score]:
    if rank < 1:
        raise InvalidInput("rank", "an integer >= 1", rank)
    feasible = [c for c in candidates if c.state.total_cores >= rank]
    if not feasible:
        return []
    t_max = max(c.transfer_time for c in feasible)
    c_max = max(c.state.free_cores for c in feasible)
    w_max = max(c.state.load_per_core for c in feasible)
    scores = []
    for cand in feasible:
        state = cand.state
        value = _ratio(cand.transfer_time, t_max)
        waits = state.free_cores < rank or state.queued > 0
        if waits:
            if c_max == 0:
                free_term = 0.0
            elif state.free_cores == 0:
                free_term = c_max + 1.0
            else:
                free_term = c_max / state.free_cores
            value += free_term + _ratio(state.load_per_core, w_max)
        scores.append(Score(cand.site, value, waits, cand.observed_at))
    return scores


def rank_sites(rank: int, candidates: Sequence[Candidate]) -> list[Score]:
    """Score the feasible candidates for a job of ``rank`` cores, best first.

    Sites with fewer than ``rank`` cores in all are not feasible and are left out; the result is
    empty when no candidate is feasible.
    """
    return sorted(_scores(rank, candidates), key=Score.sort_key)


def choose_site(rank: int, candidates: Sequence[Candidate]) -> Score | None:
    """The local-optimal choice j* = argmin F(j) over S(i), in O(|S(i)|); None if S(i) is empty."""
    return min(_scores(rank, candidates), key=Score.sort_key, default=None)
