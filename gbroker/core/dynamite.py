"""Dynamite's migration decider for running jobs: which job moves, from where, to where. Pure.

Source: Iskra, van der Linden, Hendrikse, Overeinder, van Albada, Sloot, *DYNAMITE: dynamic task
migration support*, Esprit 1999 (``SEEDS.md`` §002), "Migration Decider". The daemon (``serve
--migrate-running``) and the simulator (:class:`gbroker.sim.grid.GridSimulation` with
``GridConfig.migration``) call :func:`decide_migrations` every interval S and carry the moves
out by checkpoint, transfer and restore.

Theory of operation. Each site j gets a normalized **capacity** C_j = sum_i k_i c_ij in [0, 1]
over its free cores, its relative speed now and its queue (the paper's formula (1), coefficients
k_i summing to 1); its **load index** is L_j = 1 − C_j. Both rooms are max-heaps, and the
decider looks at their tops only: a move is considered when

    L1 > T  and  C1 > 1 − T          (T: the threshold of ``MigrationPolicy``)

and made for the source's job whose **net gain** at the target is largest: the time it saves by
the target's speed, less the image's checkpoint, transfer (NetMon's forecast t, F(j)'s t_j term)
and restore. A target must have the job's cores free and no queue, so a restored job starts at
once: its wait is 0 by construction (a restored job waiting in a queue would hold neither cores
nor progress, which a real site cannot promise). Only long jobs move, at most once per interval
(Dynamite migrates "infrequently", with "absolute priority to reliability").

After a move both sites' C_j are recomputed and the rooms re-sorted, and the decider looks again
until no move qualifies (the paper's recursion written as a loop); cores a moved job leaves are
not moved into in the same decision, as they are free only once the job is dumped. Ties break
by site name, then job id, so a decision depends only on its inputs. The formulas and the
policy's keys: docs/MIGRATION.md, "The decider".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gbroker.core.model import SiteState
from gbroker.errors import InvalidInput

__all__ = [
    "MigrationPolicy",
    "Move",
    "RunningJob",
    "SiteLoad",
    "TransferForecast",
    "capacity",
    "decide_migrations",
    "migration_cost",
    "parse_migration_policy",
    "remaining_estimate",
]

TransferForecast = Callable[[str, str, int], float]
"""t(i, j, m): forecast seconds to move m bytes from site i to site j (as in F(j))."""

MB = 1_000_000


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class MigrationPolicy:
    """When running jobs migrate: Dynamite's threshold, how often, and the cost model.

    Attributes:
        threshold: T in (0, 1): migrate when L1 > T and C1 > 1 − T. A higher T moves less.
        interval: S, seconds between decisions; also the least time between two moves of a job.
        min_remaining: seconds a job must still have to run (by its estimate) to be moved.
        checkpoint_rate: bytes per second a checkpoint is dumped at (the cost's dump term).
        restore_rate: bytes per second an image is restored at.
        k_cores, k_speed, k_queue: the coefficients k_i of C_j (normalized to sum to 1).
    """

    threshold: float
    interval: float
    min_remaining: float = 600.0
    checkpoint_rate: float = 200.0 * MB
    restore_rate: float = 200.0 * MB
    k_cores: float = 0.5
    k_speed: float = 0.5
    k_queue: float = 0.0

    def __post_init__(self) -> None:
        if not (_number(self.threshold) and 0 < self.threshold < 1):
            raise InvalidInput("migrate_running.threshold", "a number in (0, 1)", self.threshold)
        if not (_number(self.interval) and 0 < self.interval < math.inf):
            raise InvalidInput("migrate_running.interval", "seconds > 0", self.interval)
        if not (_number(self.min_remaining) and 0 <= self.min_remaining < math.inf):
            raise InvalidInput("migrate_running.min_remaining", "seconds >= 0", self.min_remaining)
        for name in ("checkpoint_rate", "restore_rate"):
            value = getattr(self, name)
            if not (_number(value) and value > 0):
                raise InvalidInput(f"migrate_running.{name}", "bytes per second > 0", value)
        weights = (self.k_cores, self.k_speed, self.k_queue)
        for name, value in zip(("k_cores", "k_speed", "k_queue"), weights, strict=True):
            if not (_number(value) and 0 <= value < math.inf):
                raise InvalidInput(f"migrate_running.{name}", "a coefficient >= 0", value)
        if sum(weights) <= 0:
            raise InvalidInput(
                "migrate_running.k_cores", "coefficients k_cores, k_speed, k_queue not all 0", 0
            )

    def __str__(self) -> str:
        return (
            f"threshold={self.threshold:g},interval={self.interval:g},"
            f"min_remaining={self.min_remaining:g}"
        )


# The keys ``--migrate-running`` takes, with what each expects (for its error message).
_KEYS: Mapping[str, str] = {
    "threshold": "a number in (0, 1)",
    "interval": "seconds > 0",
    "min_remaining": "seconds >= 0",
    "checkpoint_rate": "bytes per second > 0",
    "restore_rate": "bytes per second > 0",
    "k_cores": "a coefficient >= 0",
    "k_speed": "a coefficient >= 0",
    "k_queue": "a coefficient >= 0",
}
_REQUIRED = ("threshold", "interval")
_FORMAT = "off, or threshold=T,interval=S[,key=value...]"


def parse_migration_policy(text: str) -> MigrationPolicy | None:
    """``off`` (None) or ``threshold=T,interval=S[,min_remaining=S,checkpoint_rate=B/s,
    restore_rate=B/s,k_cores=K,k_speed=K,k_queue=K]``: the value of ``--migrate-running``.

    Raises InvalidInput naming the key and what it expects: an unknown key, a key given twice, a
    missing ``threshold`` or ``interval``, a value that is no number or out of its range.
    """
    if not isinstance(text, str):
        raise InvalidInput("migrate_running", _FORMAT, text)
    stripped = text.strip()
    if stripped.lower() == "off":
        return None
    if not stripped:
        raise InvalidInput("migrate_running", _FORMAT, text)
    values: dict[str, float] = {}
    for part in stripped.split(","):
        key, equals, raw = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not equals or not key:
            raise InvalidInput("migrate_running", f"key=value pairs ({_FORMAT})", part.strip())
        if key not in _KEYS:
            raise InvalidInput("migrate_running", f"a key among {', '.join(_KEYS)}", key)
        if key in values:
            raise InvalidInput(f"migrate_running.{key}", "given once", part.strip())
        try:
            value = float(raw.strip())
        except ValueError:
            raise InvalidInput(f"migrate_running.{key}", _KEYS[key], raw.strip()) from None
        if math.isnan(value):
            raise InvalidInput(f"migrate_running.{key}", _KEYS[key], raw.strip())
        values[key] = value
    for key in _REQUIRED:
        if key not in values:
            raise InvalidInput(f"migrate_running.{key}", f"{_KEYS[key]} ({_FORMAT})")
    threshold = values.pop("threshold")
    interval = values.pop("interval")
    return MigrationPolicy(threshold=threshold, interval=interval, **values)


@dataclass(frozen=True, slots=True)
class SiteLoad:
    """One site as the decider sees it: its DCSMon state and its relative speed now.

    ``speed``: how fast it runs jobs now relative to a nominal site (1.0); it drops when
    background load arrives. None: unknown, taken as 1.0.
    """

    site: str
    state: SiteState
    speed: float | None = None

    def __post_init__(self) -> None:
        if not self.site:
            raise InvalidInput("site_load.site", "a site name", self.site)
        if self.speed is not None and not (_number(self.speed) and 0 < self.speed < math.inf):
            raise InvalidInput(f"site_load[{self.site}].speed", "a speed > 0 or None", self.speed)

    @property
    def relative_speed(self) -> float:
        return 1.0 if self.speed is None else self.speed


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job running at ``site`` that could move.

    Attributes:
        job_id: its id.
        site: where it runs.
        cores: the cores it holds (it needs as many free at a target).
        started_at: when it started (where it runs now, or first).
        remaining: estimated seconds it still runs at ``site``'s current speed (see
            :func:`remaining_estimate`).
        image_size: bytes of its checkpoint bundle (the process image and its directory).
        last_moved: when it last migrated; None if never.
    """

    job_id: str
    site: str
    cores: int
    started_at: float
    remaining: float
    image_size: int
    last_moved: float | None = None

    def __post_init__(self) -> None:
        where = f"running_job[{self.job_id}]"
        if not self.job_id:
            raise InvalidInput("running_job.job_id", "a non-empty id", self.job_id)
        if type(self.cores) is not int or self.cores < 1:
            raise InvalidInput(f"{where}.cores", "an integer >= 1", self.cores)
        if not (_number(self.remaining) and self.remaining >= 0):
            raise InvalidInput(f"{where}.remaining", "seconds >= 0", self.remaining)
        if type(self.image_size) is not int or self.image_size < 0:
            raise InvalidInput(f"{where}.image_size", "bytes >= 0", self.image_size)


@dataclass(frozen=True, slots=True)
class Move:
    """Migrate ``job_id`` from ``source`` to ``target``: it saves ``saving`` seconds of run
    time at a cost of ``cost`` seconds (checkpoint, transfer, restore, wait)."""

    job_id: str
    source: str
    target: str
    saving: float
    cost: float
    load: float = field(default=0.0, compare=False)  # L1 of the source when decided
    capacity: float = field(default=0.0, compare=False)  # C1 of the target when decided

    @property
    def gain(self) -> float:
        return self.saving - self.cost


def remaining_estimate(
    requested: float | None, elapsed_work: float, speed: float = 1.0
) -> float | None:
    """Seconds a job still runs at a site of ``speed``: its requested (wall-time) run time at
    nominal speed minus the work it has done (seconds of nominal speed), never below 0.

    None when it requested no time (such a job is never moved: its saving is unknown).
    """
    if requested is None:
        return None
    return max(0.0, requested - elapsed_work) / speed


def capacity(state: SiteState, speed: float, fastest: float, policy: MigrationPolicy) -> float:
    """C_j = sum_i k_i c_ij, in [0, 1], of a site of relative ``speed`` when the fastest site
    runs at ``fastest`` (see the module's docstring)."""
    return _capacity(state.free_cores, state, speed, fastest, policy)


def _capacity(
    free_cores: int, state: SiteState, speed: float, fastest: float, policy: MigrationPolicy
) -> float:
    total = policy.k_cores + policy.k_speed + policy.k_queue
    free = free_cores / state.total_cores
    fast = min(1.0, speed / fastest)
    queue = 1.0 - min(1.0, state.queued / state.total_cores)
    return (policy.k_cores * free + policy.k_speed * fast + policy.k_queue * queue) / total


def migration_cost(
    job: RunningJob,
    target: str,
    policy: MigrationPolicy,
    forecast: TransferForecast,
    ahead: int = 0,
) -> float:
    """Seconds the job stands still to move: dump, transfer (NetMon's forecast), restore.

    ``ahead``: bytes of images that the same decision sends out of the job's site before this
    one; they share its uplink, so this image arrives once they and it have crossed (priced as
    one transfer of both)."""
    size = job.image_size
    transfer = 0.0
    if size > 0:
        transfer = forecast(job.site, target, ahead + size)
    return size / policy.checkpoint_rate + transfer + size / policy.restore_rate


def decide_migrations(
    policy: MigrationPolicy,
    sites: Sequence[SiteLoad],
    running: Sequence[RunningJob],
    forecast: TransferForecast,
    now: float,
) -> list[Move]:
    """The moves of one decision, in the order made (see the module's docstring).

    ``sites``: every site the decider may move between (a site named twice is refused);
    ``running``: the jobs that could move (those already migrating left out), each at one of
    ``sites``. Draining sites are never targets.
    """
    by_name: dict[str, SiteLoad] = {}
    for load in sites:
        if load.site in by_name:
            raise InvalidInput("sites", "each site once", load.site)
        by_name[load.site] = load
    at: dict[str, list[RunningJob]] = {name: [] for name in by_name}
    for job in running:
        if job.site not in by_name:
            raise InvalidInput(f"running_job[{job.job_id}].site", "one of the sites", job.site)
        at[job.site].append(job)
    if not by_name:
        return []
    fastest = max(load.relative_speed for load in by_name.values())
    free = {name: load.state.free_cores for name, load in by_name.items()}
    leaving = dict.fromkeys(by_name, 0)  # cores of jobs moved away in this decision
    sending = dict.fromkeys(by_name, 0)  # bytes of images sent out of each site in it

    def current(name: str) -> float:
        load = by_name[name]
        cores = free[name] + leaving[name]
        return _capacity(cores, load.state, load.relative_speed, fastest, policy)

    def movable(job: RunningJob) -> bool:
        if job.remaining < policy.min_remaining:
            return False
        return job.last_moved is None or now - job.last_moved >= policy.interval

    for name in at:
        at[name] = sorted((j for j in at[name] if movable(j)), key=lambda j: j.job_id)
    # The rooms: max-heaps as (−value, site), with each site's latest value to skip stale tops.
    value = {name: current(name) for name in by_name}
    load_room = [(-(1.0 - value[n]), n) for n in by_name if at[n]]
    capacity_room = [(-value[n], n) for n in by_name if not by_name[n].state.draining]
    heapq.heapify(load_room)
    heapq.heapify(capacity_room)
    moves: list[Move] = []

    def top(room: list[tuple[float, str]], load: bool) -> tuple[float, str] | None:
        while room:
            key, name = room[0]
            fresh = 1.0 - value[name] if load else value[name]
            if -key == fresh:
                return fresh, name
            heapq.heappop(room)  # stale: the site's value changed since it was pushed
        return None

    while True:
        loaded = top(load_room, load=True)
        freest = top(capacity_room, load=False)
        if loaded is None or freest is None:
            break
        l1, source = loaded
        c1, _ = freest
        if not (l1 > policy.threshold and c1 > 1.0 - policy.threshold):
            break
        move = _best_move(
            policy, source, by_name, at, free, value, capacity_room, forecast, l1, sending[source]
        )
        if move is None:
            heapq.heappop(load_room)  # nothing of it qualifies: the next loaded site
            continue
        moves.append(move)
        job = next(j for j in at[source] if j.job_id == move.job_id)
        at[source].remove(job)
        leaving[source] += job.cores  # its capacity, but no one's cores until the job is dumped
        sending[source] += job.image_size
        free[move.target] -= job.cores
        heapq.heappop(load_room)  # the source's entry: pushed again below with its new value
        for name in (source, move.target):
            value[name] = current(name)
            if at[name]:
                heapq.heappush(load_room, (-(1.0 - value[name]), name))
            if not by_name[name].state.draining:
                heapq.heappush(capacity_room, (-value[name], name))
    return moves


def _best_move(
    policy: MigrationPolicy,
    source: str,
    by_name: Mapping[str, SiteLoad],
    at: Mapping[str, list[RunningJob]],
    free: Mapping[str, int],
    value: Mapping[str, float],
    capacity_room: Sequence[tuple[float, str]],
    forecast: TransferForecast,
    l1: float,
    ahead: int = 0,
) -> Move | None:
    """The move of largest gain of a job at ``source`` to a target of capacity > 1 − T.

    Targets are tried by capacity, best first (the capacity room's order); the first one where
    some job qualifies takes the job of largest gain there (ties: lower job id).
    """
    floor = 1.0 - policy.threshold
    targets = sorted(
        {name for _, name in capacity_room if name != source and value[name] > floor},
        key=lambda n: (-value[n], n),
    )
    v_source = by_name[source].relative_speed
    for target in targets:
        state = by_name[target].state
        if state.draining or state.queued > 0:
            continue
        v_target = by_name[target].relative_speed
        best: Move | None = None
        for job in at[source]:
            if job.cores > free[target]:
                continue
            saving = job.remaining - job.remaining * v_source / v_target
            if saving <= 0:
                continue
            cost = migration_cost(job, target, policy, forecast, ahead)
            if saving <= cost:
                continue
            move = Move(job.job_id, source, target, saving, cost, l1, value[target])
            if best is None or move.gain > best.gain:
                best = move
        if best is not None:
            return best
    return None
