#!/usr/bin/env python3
"""A malleable GBroker job: a Monte Carlo estimate of pi on one worker process per core it holds.

Submit it as a malleable job (``examples/malleable-pi.yaml``) to a site that resizes jobs (``gbroker
serve --malleability fpsma --initiative pwa``). It listens on its control channel
(:mod:`gbroker.app.malleable`), takes whatever it is offered, and keeps exactly one worker process
per core of its allocation: when the site grows it, new workers start; when the site shrinks it,
workers stop after their current batch. The site moves the CPU affinity of every process of the job,
so its workers run on exactly the CPUs of its allocation.

The work is fixed: ``--batches`` batches of ``--samples`` points, batch ``i`` drawn from a
generator seeded with ``i``, each counted exactly once whoever computes it; so the result does not
depend on how the job was resized. Once a second it prints a line (on standard output)::

    t=3.0 cores=2 workers=2 rate=1.9e+06/s cpus=0,1 done=120/400

and at the end writes ``result.json`` (samples, hits, the estimate, the allocations it saw) in its
working directory.

It can move to another site without CRIU (issue 27): its state is the batches counted so far,
saved by its ``on_checkpoint`` hook at a safe point of its main loop (between two batches'
results); started again with ``GBROKER_RESTORE``, it counts only the batches left. A batch that
was running when the job stopped is counted at the target, once.

Standard library only, and gbroker.app.malleable, which every GBroker site
puts on its jobs' ``PYTHONPATH`` (the directory ``$GBROKER_APP_PATH``): uploading this script is
enough (``gbroker submit examples/malleable-pi.yaml --upload examples/malleable_pi.py``), and any
Python a site runs jobs with can run it. It says on standard error where the library came from.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import json
import math
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from types import ModuleType


def _library() -> ModuleType:
    """gbroker.app.malleable: from the site (on the job's path), else a copy staged beside this
    script (``--upload gbroker/app/malleable.py``: one file, standard library only), else from
    the checkout this script is in (run by hand)."""
    try:
        return importlib.import_module("gbroker.app.malleable")
    except ImportError:
        pass
    try:
        return importlib.import_module("malleable")
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        return importlib.import_module("gbroker.app.malleable")


malleable = _library()
print(f"gbroker.app.malleable from {malleable.__file__}", file=sys.stderr, flush=True)


def batch(index: int, samples: int, pause: float = 0.0) -> tuple[int, int, tuple[int, ...]]:
    """Points of batch ``index`` inside the unit quarter circle; with the CPUs it ran on. The
    worker first sleeps ``pause`` seconds (``--pause``: a job that lasts without loading the
    host, as a test wants)."""
    if pause:
        time.sleep(pause)
    rng = random.Random(index)
    hits = 0
    for _ in range(samples):
        x, y = rng.random(), rng.random()
        if x * x + y * y <= 1.0:
            hits += 1
    return index, hits, tuple(sorted(os.sched_getaffinity(0)))


class Pool:
    """Worker processes, as many as the job's cores: resized by starting a new pool of the new
    size and letting the old one finish what it holds."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.context = multiprocessing.get_context("fork")
        self.executor = self._new(size)
        self.retired: list[concurrent.futures.ProcessPoolExecutor] = []

    def _new(self, size: int) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(size, mp_context=self.context)

    def resize(self, size: int) -> None:
        if size != self.size:
            self.retired.append(self.executor)
            self.executor.shutdown(wait=False, cancel_futures=False)
            self.executor = self._new(size)
            self.size = size

    def close(self) -> None:
        for executor in (*self.retired, self.executor):
            executor.shutdown(wait=True)


def saved(batches: int, samples: int) -> dict[int, int]:
    """The batches counted before a move (``GBROKER_RESTORE``), or none on a fresh start."""
    state = malleable.restored()
    if state is None:
        return {}
    data = json.loads(state)
    if (data["batches"], data["samples"]) != (batches, samples):
        raise SystemExit("the saved state is of another run (--batches, --samples differ)")
    print(f"restored: {len(data['hits'])}/{batches} batches counted", file=sys.stderr, flush=True)
    return {int(index): count for index, count in data["hits"].items()}


async def run(batches: int, samples: int, pause: float = 0.0) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    hits = saved(batches, samples)

    def checkpoint() -> bytes:  # called at a safe point: hits holds whole batches only
        return json.dumps({"batches": batches, "samples": samples, "hits": hits}).encode()

    async with malleable.Channel(on_checkpoint=checkpoint) as channel:
        pool = Pool(channel.allocation.cores)
        allocations: list[list[float | int]] = [[0.0, channel.allocation.cores]]
        began = time.monotonic()
        pending = [index for index in range(batches) if index not in hits]
        running: dict[asyncio.Future[tuple[int, int, tuple[int, ...]]], int] = {}
        cpus_seen: tuple[int, ...] = ()
        last_line, done_at_line = began, len(hits)

        def keep_busy() -> None:
            while pending and len(running) < pool.size:
                index = pending.pop(0)
                future = loop.run_in_executor(pool.executor, batch, index, samples, pause)
                running[asyncio.ensure_future(future)] = index

        keep_busy()
        events = asyncio.ensure_future(channel.next())
        while running:
            await channel.safe_point()  # a checkpoint is taken here, and a moved job stops here
            done, _ = await asyncio.wait(
                [*running, events], return_when=asyncio.FIRST_COMPLETED, timeout=1.0
            )
            for finished in done:
                if finished is events:
                    continue
                running.pop(finished)  # type: ignore[arg-type]
                number, count, cpus_seen = finished.result()
                hits.setdefault(number, count)
            if events.done():
                event = events.result()
                if isinstance(event, malleable.Offer):
                    await channel.accept(event)  # all of it: this job uses any number of cores
                elif isinstance(event, malleable.Allocation):
                    pool.resize(event.cores)
                    allocations.append([round(time.monotonic() - began, 3), event.cores])
                events = asyncio.ensure_future(channel.next())
            keep_busy()
            now = time.monotonic()
            if now - last_line >= 1.0:
                rate = (len(hits) - done_at_line) * samples / (now - last_line)
                print(
                    f"t={now - began:.1f} cores={channel.allocation.cores} workers={pool.size} "
                    f"rate={rate:.3g}/s cpus={','.join(map(str, cpus_seen))} "
                    f"done={len(hits)}/{batches}",
                    flush=True,
                )
                last_line, done_at_line = now, len(hits)
        events.cancel()
        pool.close()
    total = sum(hits.values())
    estimate = 4 * total / (batches * samples)
    return {
        "batches": len(hits),
        "samples": batches * samples,
        "hits": total,
        "pi": estimate,
        "error": abs(estimate - math.pi),
        "allocations": allocations,
        "seconds": round(time.monotonic() - began, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400, help="batches of work (400)")
    parser.add_argument("--samples", type=int, default=20_000, help="points per batch (20000)")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds each batch also sleeps: the job then lasts about BATCHES x PAUSE / cores "
        "without loading the host (0)",
    )
    args = parser.parse_args()
    result = asyncio.run(run(args.batches, args.samples, args.pause))
    Path("result.json").write_text(json.dumps(result) + "\n")
    print(f"pi ~ {result['pi']:.6f} from {result['samples']:,} samples", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
