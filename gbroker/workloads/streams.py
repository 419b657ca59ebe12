"""Job streams for the multi-site simulator: the paper's Poisson streams and SWF traces over sites.

An :class:`Arrival` is a job entering a broker at a time, with its *actual* run time. That is
simulation truth, which the schedulers never see; they plan with ``job.requested_time``.

The paper's job model (GBroker paper §3): each job is one of the SPEC MPI2007 programs, drawn
uniformly, with rank r drawn uniformly from {1, 2, 4, 8}, and its input files at the data site
(Xeon80). The paper gives neither run times nor input sizes. Ours (:data:`SPEC_MPI_PROGRAMS`) are
calibrated so that the 6-site testbed (topologies/paper-6.yaml) saturates near the paper's
throughput; docs/EXPERIMENTS.md shows the calibration. A program's run time on r cores follows
Amdahl's law with serial fraction ``serial``, and users ask for ``overestimate`` times that.

All randomness comes from the ``random.Random`` passed in, so a seed fixes a workload.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gbroker.core.model import InputFile, Job, JobClass
from gbroker.errors import InvalidInput
from gbroker.workloads.speedup import SpeedupModel
from gbroker.workloads.trace import TraceJob

__all__ = [
    "PAPER_RANKS",
    "SPEC_MPI_PROGRAMS",
    "Arrival",
    "Program",
    "iter_poisson_stream",
    "lazy_streams",
    "make_malleable",
    "paper_streams",
    "swf_arrivals",
]

MB = 1_000_000


@dataclass(frozen=True, slots=True)
class Arrival:
    """``job`` enters broker ``entry`` at ``time``; it actually runs ``run_time`` seconds on
    ``job.rank`` cores at speed 1, and on n cores ``speedup.run_time(n)`` when a speed-up model
    (:mod:`gbroker.workloads.speedup`) is given, else ``run_time * rank / n``. ``image_size``:
    the bytes of its checkpoint (process image and directory) should it migrate while running.
    ``components``: the cores of each component of a *co-allocated* job (summing to
    ``job.rank``), placed by its owner's co-allocation policy and started together
    (:mod:`gbroker.core.coalloc`); empty for an ordinary job. ``flexible``: its components may
    be re-split (KOALA's flexible jobs, placed by FCM)."""

    time: float
    entry: str
    job: Job
    run_time: float
    speedup: SpeedupModel | None = None
    image_size: int = 0
    components: tuple[int, ...] = ()
    flexible: bool = False


@dataclass(frozen=True, slots=True)
class Program:
    """A parallel program: run time on one core at speed 1, Amdahl serial fraction, input bytes."""

    name: str
    run_time_1: float
    serial: float
    input_size: int
    overestimate: float = 1.5

    def run_time(self, rank: int) -> float:
        return self.run_time_1 * (self.serial + (1.0 - self.serial) / rank)


SPEC_MPI_PROGRAMS: tuple[Program, ...] = (
    Program("wrf", 720.0, 0.05, 300 * MB),
    Program("pop2", 560.0, 0.05, 150 * MB),
    Program("lammps", 400.0, 0.05, 40 * MB),
    Program("raxml", 480.0, 0.05, 80 * MB),
    Program("tachyon", 240.0, 0.05, 20 * MB),
)
PAPER_RANKS = (1, 2, 4, 8)


def iter_poisson_stream(
    rng: random.Random,
    rate: float,
    count: int,
    entry: str,
    data_site: str | None,
    programs: Sequence[Program] = SPEC_MPI_PROGRAMS,
    ranks: Sequence[int] = PAPER_RANKS,
    start: float = 0.0,
) -> Iterator[Arrival]:
    """``count`` jobs entering ``entry`` as a Poisson stream of intensity ``rate`` (jobs/s).

    Their input files live at ``data_site``, or at ``entry`` itself when that is None. The
    parameters are checked at once; the jobs are drawn as they are read.
    """
    if not rate > 0:
        raise InvalidInput("rate", "jobs per second > 0", rate)
    if count < 0:
        raise InvalidInput("jobs", "a count >= 0", count)

    def arrivals() -> Iterator[Arrival]:
        t = start
        for n in range(count):
            t += rng.expovariate(rate)
            yield _paper_job(rng, t, entry, n, data_site, programs, ranks)

    return arrivals()


def _paper_job(
    rng: random.Random,
    time: float,
    entry: str,
    n: int,
    data_site: str | None,
    programs: Sequence[Program],
    ranks: Sequence[int],
) -> Arrival:
    """The paper's job model: a program and a rank drawn uniformly; job id ``<entry>.<n>``."""
    program = programs[rng.randrange(len(programs))]
    rank = ranks[rng.randrange(len(ranks))]
    run = program.run_time(rank)
    files = (InputFile(f"{program.name}.in", program.input_size, data_site or entry),)
    job = Job(f"{entry}.{n}", rank, run * program.overestimate, input_files=files)
    return Arrival(time, entry, job, run)


def lazy_streams(
    seed: int,
    rate: float,
    jobs: int,
    entries: Sequence[str],
    data_site: str | None,
    programs: Sequence[Program] = SPEC_MPI_PROGRAMS,
    ranks: Sequence[int] = PAPER_RANKS,
) -> Iterator[Arrival]:
    """One Poisson stream of intensity ``rate`` into each entry broker, ``jobs`` in all, drawn
    on demand in time order (for very large runs).

    S independent Poisson streams of intensity λ merged are one Poisson stream of intensity Sλ
    whose every arrival enters a broker drawn uniformly (the superposition of Poisson
    processes), so one generator seeded with ``seed`` draws them all. Each broker then receives
    about ``jobs``/S jobs rather than exactly that many (:func:`paper_streams` splits exactly).
    One generator instead of one per stream matters at thousands of brokers: each
    ``random.Random`` holds 2.5 KB of state, which the workload would otherwise sweep through
    the CPU caches with every arrival. Job ids are ``<entry>.<n>``, n counting per entry.
    """
    if not entries:
        raise InvalidInput("entries", "at least one entry broker", entries)
    if not rate > 0:
        raise InvalidInput("rate", "jobs per second > 0", rate)
    if jobs < 0:
        raise InvalidInput("jobs", "a count >= 0", jobs)
    entries = tuple(entries)
    seen: set[str] = set()
    for entry in entries:
        if entry in seen:
            raise InvalidInput("entries", "distinct entry brokers", entry)
        seen.add(entry)

    def arrivals() -> Iterator[Arrival]:
        rng = random.Random(seed)
        total = rate * len(entries)
        counts = dict.fromkeys(entries, 0)
        t = 0.0
        for _ in range(jobs):
            t += rng.expovariate(total)
            entry = entries[rng.randrange(len(entries))]
            n = counts[entry]
            counts[entry] = n + 1
            yield _paper_job(rng, t, entry, n, data_site, programs, ranks)

    return arrivals()


def paper_streams(
    rng: random.Random,
    rate: float,
    jobs: int,
    entries: Sequence[str],
    data_site: str | None,
    programs: Sequence[Program] = SPEC_MPI_PROGRAMS,
) -> list[Arrival]:
    """``jobs`` in total over one Poisson stream of intensity ``rate`` per entry broker.

    The total is split as evenly as possible (the first streams take the remainder), and the
    streams are merged by time.
    """
    if not entries:
        raise InvalidInput("entries", "at least one entry broker", entries)
    per, extra = divmod(jobs, len(entries))
    arrivals: list[Arrival] = []
    for k, entry in enumerate(entries):
        count = per + (1 if k < extra else 0)
        arrivals += iter_poisson_stream(rng, rate, count, entry, data_site, programs)
    arrivals.sort(key=lambda a: a.time)
    return arrivals


def swf_arrivals(
    jobs: Iterable[TraceJob],
    entries: Sequence[str],
    rng: random.Random,
    max_cores: int,
) -> tuple[list[Arrival], list[tuple[object, str]]]:
    """Split a trace over entry brokers uniformly at random; skip jobs no site can hold.

    Returns the arrivals and the skipped jobs with reasons (never dropped silently).
    """
    if not entries:
        raise InvalidInput("entries", "at least one entry broker", entries)
    out: list[Arrival] = []
    skipped: list[tuple[object, str]] = []
    for k, tj in enumerate(jobs):
        if tj.processors > max_cores:
            skipped.append((tj.id, f"more processors than the largest site's {max_cores}"))
            continue
        entry = entries[rng.randrange(len(entries))]
        job = Job(
            f"{entry}.swf{tj.id if tj.id is not None else k}", tj.processors, tj.requested_time
        )
        out.append(Arrival(float(tj.submit), entry, job, tj.run_time))
    return out, skipped


def make_malleable(
    arrivals: Sequence[Arrival],
    fraction: float,
    rng: random.Random,
    max_cores: int,
    *,
    grow: bool = True,
) -> list[Arrival]:
    """A seeded ``fraction`` of the jobs made malleable, the others kept as they are.

    A malleable job of rank r runs on ceil(r/2) to min(2r, ``max_cores``) cores (it can give
    back half its cores, SD-Policy's SharingFactor of 0.5, or take twice them); its rank becomes
    ceil(r/2), and its run times (actual and requested) are restated for that rank with the
    linear speed-up the simulator assumes, so that on r cores it takes as long as before.
    Without ``grow`` its most is r: it asks r and may only give up to half (SD-Policy's jobs).
    """
    if not 0 <= fraction <= 1:
        raise InvalidInput("malleable_fraction", "a fraction in [0, 1]", fraction)
    out = []
    for arrival in arrivals:
        job = arrival.job
        if rng.random() >= fraction:
            out.append(arrival)
            continue
        low = -(-job.rank // 2)
        high = max(job.rank, min(2 * job.rank, max_cores)) if grow else job.rank
        scale = job.rank / low
        requested = None if job.requested_time is None else job.requested_time * scale
        malleable = Job(
            job.id, low, requested, JobClass.MALLEABLE, high, input_files=job.input_files
        )
        out.append(Arrival(arrival.time, arrival.entry, malleable, arrival.run_time * scale))
    return out
