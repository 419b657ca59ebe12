"""Benchmark: what black-hole protection costs the owner broker per job.

    python -m scripts.bench.bench_black_hole [--sites 64] [--jobs 20000]

A DLO owner with ``--sites`` sites in its neighbourhood (all seen alike) handles, per job, the
submission, the start and the end, first without black-hole protection, then with the default
:class:`~gbroker.core.health.HealthPolicy` and no suspect site, then with one suspect site (its
F(j) is scored down, which ranks through :func:`~gbroker.core.ranking.rank_sites`). It prints
the mean wall time per job (submit + start + finish) of each.
"""

from __future__ import annotations

import argparse
import time

from gbroker.core.dispatch import Broker, DispatchPolicy, JobFinished, JobStarted, JobSubmitted
from gbroker.core.health import HealthPolicy
from gbroker.core.model import Job, Observation, SiteState


def per_job(sites: int, jobs: int, health: HealthPolicy | None, suspect: bool) -> float:
    names = [f"s{i}" for i in range(sites)]
    view = {s: Observation(SiteState(64, 8, 1), 0.0) for s in names}
    broker = Broker(names[0], names[1:], DispatchPolicy(), lambda *_: 0.0, health=health)
    if suspect and broker.health is not None:
        for n in range(20):  # s1 fails fast half the time, s2 never: s1 is suspect
            broker.health.record("s1", n % 2 == 0, 1.0, 0.0)
            broker.health.record("s2", True, 50.0, 0.0)
        assert broker.health.penalties(1.0)
    began = time.perf_counter()
    for n in range(jobs):
        [dispatch] = broker.handle(JobSubmitted(Job(f"s0.{n}", 1)), 1.0, view)
        broker.handle(JobStarted(f"s0.{n}", dispatch.site), 1.0, view)  # type: ignore[union-attr]
        broker.handle(JobFinished(f"s0.{n}", dispatch.site, True, 5.0), 1.0, view)  # type: ignore[union-attr]
    return (time.perf_counter() - began) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sites", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=20000)
    args = parser.parse_args()
    for label, health, suspect in (
        ("off", None, False),
        ("on, no suspect site", HealthPolicy(), False),
        ("on, one suspect site", HealthPolicy(), True),
    ):
        seconds = per_job(args.sites, args.jobs, health, suspect)
        line = f"black-hole protection {label:<22} {seconds * 1e6:7.1f} µs per job"
        print(f"{line} ({args.sites} sites)")


if __name__ == "__main__":
    main()
