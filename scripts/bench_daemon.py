"""Benchmark: how fast does a real broker daemon take, decide and start jobs?

    python scripts/bench_daemon.py [--clients 64] [--submissions 5000] [--warmup 500]
                                   [--cores 64] [--starts 50] [--quick] [--json] [--dir DIR]

Three figures, each printed next to the target of the daemon's issue:

(a) **Durable submissions per second to one broker.** A 1-site fleet (``gbroker.fleet``: one
    ``gbroker serve`` process with ``--cores`` cores, and its embedded MQTT broker) receives a
    trivial job (``/bin/true`` on one core) from ``--clients`` concurrent aiohttp clients in
    this process. A submission counts only when answered 201, which the broker sends only after
    the job's journal row is committed (fsync). After ``--warmup`` submissions the next
    ``--submissions`` are timed. Two runs, each on a fresh fleet:

    - *running*: the site is idle, so the broker also dispatches, launches and reports every one
      of those jobs meanwhile, on the same CPUs;
    - *busy*: a first job holds every core, so the trivial jobs are dispatched and queue (a
      burst at a busy site): the broker's intake alone.

    Both print the jobs started per second during the timed window and the broker's own
    durable-submission latency histogram. Target: >= 1,000/s.
(b) **Dispatch decision latency**, p50 and p99, read from the *running* broker's ``/metrics``
    histogram ``gbroker_dispatch_decision_seconds`` (the wall time of the core's handling of
    each submission). Quantiles from buckets are *upper bounds*: the bound of the bucket holding
    the quantile. The exact mean (sum / count) is shown too. Target: p99 < 2 ms.
(c) **Submit-to-start latency** of a trivial job on an idle 6-site fleet
    (``topologies/paper-6-torus.yaml`` through ``gbroker.fleet``, embedded MQTT broker):
    ``--starts`` jobs, one at a time, each to a random broker (seeded), each waited for;
    ``started_at - submitted_at`` from the job's status. Median and p90. Target: median < 100 ms.

``--quick`` runs a short version (fewer submissions and starts) for a smoke test; its figures
are indicative only. Every process started here is stopped on exit, on Ctrl-C, on SIGTERM and on
failure: a signal that arrives while a fleet starts or stops is held until the fleet is up and
the ``finally`` that stops it armed, or until it is down; the brokers run with
``--stop-jobs-on-exit``, so their jobs stop with them. The fleets live in a temporary directory
unless ``--dir`` names one (the journal's fsyncs then hit that directory's disk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gbroker import fleet, runtime
from gbroker.auth import bearer
from gbroker.daemon.metrics import bucket_quantile
from gbroker.topology import SiteSpec, Topology, save_topology

ROOT = Path(__file__).resolve().parent.parent
TORUS = ROOT / "topologies" / "paper-6-torus.yaml"
TRIVIAL_JOB = json.dumps(
    {"name": "bench", "executable": "/bin/true", "total_cpu_count": {"exact": 1}}
).encode()
TARGETS = {"submissions_per_s": 1000.0, "decision_p99_s": 2e-3, "start_median_s": 0.1}


class _Terminated(Exception):
    """SIGTERM arrived: unwind through the ``finally`` blocks like Ctrl-C does."""


class _Interrupts:
    """Ctrl-C and SIGTERM, held back while a fleet starts or stops.

    A signal that lands inside ``fleet.up`` could leave processes started but not yet recorded,
    and one inside ``fleet.down`` could leave some running. While held, a signal is remembered
    and raised once it is safe: inside the ``try`` whose ``finally`` brings the fleet down.
    (Blocking the signals with ``pthread_sigmask`` instead would be inherited by the brokers,
    which would then ignore the SIGTERM that stops them.)
    """

    def __init__(self) -> None:
        self._held = 0
        self._pending: int | None = None

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: object) -> None:
        if self._held:
            self._pending = signum
        else:
            self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1

    def deliver(self) -> None:
        """Raise a signal that arrived while held, if any."""
        if self._pending is not None and not self._held:
            signum, self._pending = self._pending, None
            self._raise(signum)


INTERRUPTS = _Interrupts()


@contextlib.contextmanager
def running_fleet(topology: Path, directory: Path) -> Iterator[dict[str, str]]:
    """A fleet up for the block's duration; its URLs by site. Always brought down.

    Its brokers stop their jobs when they stop (``--stop-jobs-on-exit``), so that nothing a
    benchmark started outlives it.
    """
    with INTERRUPTS.held():
        record = fleet.up(topology, directory, serve_args=("--stop-jobs-on-exit",))
    try:
        INTERRUPTS.deliver()
        yield {name: member["url"] for name, member in record["sites"].items()}
    finally:
        with INTERRUPTS.held():
            fleet.down(directory)
        INTERRUPTS.deliver()


async def _ready(http: aiohttp.ClientSession, url: str, timeout: float = 30.0) -> None:
    """Wait until the broker answers HTTP (its port may open before its routes serve)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with http.get(f"{url}/api/v1/info") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:g} s")
        await asyncio.sleep(0.05)


async def _submit_many(http: aiohttp.ClientSession, url: str, count: int, clients: int) -> float:
    """Submit ``count`` trivial jobs from ``clients`` concurrent workers; the seconds it took.

    Anything but 201 (durable and acknowledged) aborts the benchmark.
    """
    tickets = itertools.count()

    async def worker() -> None:
        while next(tickets) < count:
            async with http.post(f"{url}/api/v1/jobs", data=TRIVIAL_JOB) as response:
                body = await response.read()
                if response.status != 201:
                    raise RuntimeError(f"submission answered {response.status}: {body[:200]!r}")

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - began


async def _scrape(http: aiohttp.ClientSession, url: str) -> dict[str, list[Any]]:
    """The broker's /metrics: samples by family name."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _counter(metrics: dict[str, list[Any]], name: str) -> float:
    return float(sum(s.value for s in metrics.get(name, []) if s.name == f"{name}_total"))


def _histogram(metrics: dict[str, list[Any]], name: str) -> dict[str, float]:
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for sample in metrics.get(name, []):
        if sample.name == f"{name}_bucket":
            buckets.append((float(sample.labels["le"]), sample.value))
        elif sample.name == f"{name}_sum":
            total = sample.value
        elif sample.name == f"{name}_count":
            count = sample.value
    if not buckets:
        raise RuntimeError(f"/metrics has no histogram {name}")
    return {
        "count": count,
        "mean": total / count if count else math.nan,
        "p50": bucket_quantile(0.5, buckets),
        "p99": bucket_quantile(0.99, buckets),
    }


async def _occupy(http: aiohttp.ClientSession, url: str, cores: int) -> None:
    """Start a job that holds every core of the site, so that what follows queues."""
    blocker = {
        "name": "bench-blocker",
        "executable": "/bin/sleep",
        "arguments": ["300"],  # bounded, should anything outlive the fleet
        "total_cpu_count": {"exact": cores},
    }
    async with http.post(f"{url}/api/v1/jobs", data=json.dumps(blocker)) as response:
        body = await response.json()
        if response.status != 201:
            raise RuntimeError(f"the blocking job was refused: {body}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with http.get(f"{url}/api/v1/jobs/{body['id']}") as response:
            if (await response.json())["state"] == "running":
                return
        await asyncio.sleep(0.05)
    raise RuntimeError("the blocking job did not start within 30 s")


async def _throughput(
    url: str, clients: int, submissions: int, warmup: int, busy_cores: int | None
) -> dict[str, Any]:
    """(a) and (b) at one broker: into an idle site, or with ``busy_cores`` all taken."""
    connector = aiohttp.TCPConnector(limit=clients)
    token = runtime.find_token(url) or ""  # the fleet's admin token, as a client finds it
    async with aiohttp.ClientSession(connector=connector, headers=bearer(token)) as http:
        await _ready(http, url)
        if busy_cores is not None:
            await _occupy(http, url, busy_cores)
        await _submit_many(http, url, warmup, clients)
        before = await _scrape(http, url)
        seconds = await _submit_many(http, url, submissions, clients)
        after = await _scrape(http, url)
    started = _counter(after, "gbroker_jobs_started") - _counter(before, "gbroker_jobs_started")
    return {
        "submissions": submissions,
        "clients": clients,
        "seconds": seconds,
        "submissions_per_s": submissions / seconds,
        "started_per_s": started / seconds,
        "decision": _histogram(after, "gbroker_dispatch_decision_seconds"),
        "durable": _histogram(after, "gbroker_durable_submission_seconds"),
    }


async def _starts(urls: dict[str, str], jobs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    latencies: list[float] = []
    token = runtime.find_token(next(iter(urls.values()))) or ""
    async with aiohttp.ClientSession(headers=bearer(token)) as http:
        for url in urls.values():
            await _ready(http, url)
        await asyncio.sleep(1.0)  # let DCSMon's first states go round the neighbourhood
        for _ in range(jobs):
            url = urls[rng.choice(sorted(urls))]
            async with http.post(f"{url}/api/v1/jobs", data=TRIVIAL_JOB) as response:
                body = await response.json()
                if response.status != 201:
                    raise RuntimeError(f"{url}: submission answered {response.status}: {body}")
            async with http.get(f"{url}/api/v1/jobs/{body['id']}/wait?timeout=30") as response:
                status = await response.json()
            if status["state"] != "done":
                raise RuntimeError(f"job {body['id']} ended {status['state']}: {status}")
            latencies.append(status["started_at"] - status["submitted_at"])
    ordered = sorted(latencies)
    return {
        "jobs": jobs,
        "median_s": statistics.median(ordered),
        "p90_s": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
        "max_s": ordered[-1],
    }


def _one_site(directory: Path, cores: int) -> Path:
    path = directory / "one-site.yaml"
    save_topology(Topology([SiteSpec("solo", cores)], [], name="one-site"), path)
    return path


def _verdict(value: float, target: float, below: bool) -> str:
    met = value < target if below else value >= target
    return "met" if met else "MISSED"


def _report(figures: dict[str, Any]) -> None:
    target = TARGETS["submissions_per_s"]
    for key, what in (
        ("running", "the site runs every job meanwhile"),
        ("busy", "the site's cores are busy, jobs queue"),
    ):
        a = figures[key]
        durable = a["durable"]
        rate = a["submissions_per_s"]
        print(
            f"(a) durable submissions/s, 1 broker, {a['clients']} clients, {a['submissions']:,} "
            f"timed, {what}: {rate:,.0f}/s   target >= {target:,.0f}/s: "
            f"{_verdict(rate, target, below=False)}"
        )
        print(
            f"    jobs started meanwhile: {a['started_per_s']:,.0f}/s; durable submission latency "
            f"at the broker: mean {durable['mean'] * 1e3:.1f} ms, p50 <= {durable['p50'] * 1e3:g} "
            f"ms, p99 <= {durable['p99'] * 1e3:g} ms"
        )
    d = figures["running"]["decision"]
    print(
        f"(b) dispatch decision, {d['count']:,.0f} decisions: mean {d['mean'] * 1e3:.3f} ms, "
        f"p50 <= {d['p50'] * 1e3:g} ms, p99 <= {d['p99'] * 1e3:g} ms (bucket upper bounds)   "
        f"target p99 < {TARGETS['decision_p99_s'] * 1e3:g} ms: "
        f"{_verdict(d['p99'], TARGETS['decision_p99_s'], below=True)}"
    )
    c = figures["starts"]
    print(
        f"(c) submit-to-start, idle 6-site torus fleet, {c['jobs']} jobs: "
        f"median {c['median_s'] * 1e3:.1f} ms, p90 {c['p90_s'] * 1e3:.1f} ms, "
        f"max {c['max_s'] * 1e3:.1f} ms   target median < {TARGETS['start_median_s'] * 1e3:g} ms: "
        f"{_verdict(c['median_s'], TARGETS['start_median_s'], below=True)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument("--submissions", type=int, default=5000, help="timed submissions (5000)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed submissions first (500)")
    parser.add_argument("--cores", type=int, default=64, help="cores of the 1-site fleet (64)")
    parser.add_argument("--starts", type=int, default=50, help="jobs for submit-to-start (50)")
    parser.add_argument("--seed", type=int, default=1, help="picks the brokers in (c)")
    parser.add_argument("--quick", action="store_true", help="a short run for a smoke test")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--dir", type=Path, help="where the fleets live (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.submissions, args.warmup, args.starts = 500, 100, 8
    for name in ("clients", "submissions", "cores", "starts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup: expected an integer >= 0, got {args.warmup}")
    INTERRUPTS.install()
    figures: dict[str, Any] = {"quick": args.quick, "targets": TARGETS}
    load = (args.clients, args.submissions, args.warmup)
    try:
        with tempfile.TemporaryDirectory(prefix="gbroker-bench-", dir=args.dir) as tmp:
            work = Path(tmp)
            topology = _one_site(work, args.cores)
            for key, busy in (("running", None), ("busy", args.cores)):
                print(f"(a, b) one broker, {key} ...", file=sys.stderr)
                with running_fleet(topology, work / key) as urls:
                    figures[key] = asyncio.run(_throughput(urls["solo"], *load, busy))
            print("(c) an idle 6-site torus ...", file=sys.stderr)
            with running_fleet(TORUS, work / "six") as urls:
                figures["starts"] = asyncio.run(_starts(urls, args.starts, args.seed))
    except (KeyboardInterrupt, _Terminated):
        print("interrupted; every fleet was brought down", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _report(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
