"""Benchmark: how fast does a real broker daemon take, decide and start jobs, next to Slurm?

    python -m scripts.bench.bench_daemon [--clients 64] [--submissions 5000] [--warmup 500]
                                   [--cores 64] [--starts 50] [--idle 20] [--spawns 2000]
                                   [--slurm-backlog 2000] [--quick]
                                   [--no-slurm] [--no-gbroker] [--json] [--dir DIR]
    python -m scripts.bench.bench_daemon --slurm-site [--site-jobs 2000] [--site-warmup 20]
                                   [--clients 64] [--cores 64] [--quick] [--json] [--dir DIR]

Three figures, each printed next to the target of the daemon's issue:

(a) **Durable submissions per second to one broker.** A 1-site fleet (``gbroker.fleet``: one
    ``gbroker serve`` process with ``--cores`` cores, and its embedded MQTT broker) receives a
    trivial job (``/bin/true`` on one core) from ``--clients`` concurrent aiohttp clients in
    this process. A submission counts only when answered 201, which the broker sends only after
    the job's journal row is committed (fsync). ``--warmup`` submissions go first, then the next
    ``--submissions`` are timed. Two runs, each on a fresh fleet:

    - *running*: the site is idle, so the broker also dispatches, launches and reports every one
      of those jobs meanwhile, on the same CPUs; the warm-up jobs have all started (by the
      broker's ``gbroker_jobs_started_total``) before the timed submissions begin;
    - *busy*: a first job holds every core, so the trivial jobs are dispatched and queue (a
      burst at a busy site): the broker's intake alone.

    Both print the jobs started per second during the timed window of submissions (that
    counter's increase over the window) and the broker's own durable-submission latency
    histogram. Target: >= 1,000/s.
(b) **Dispatch decision latency**, p50 and p99, read from the *running* broker's ``/metrics``
    histogram ``gbroker_dispatch_decision_seconds`` (the wall time of the core's handling of
    each submission). Quantiles from buckets are *upper bounds*: the bound of the bucket holding
    the quantile. The exact mean (sum / count) is shown too. Target: p99 < 2 ms.
(c) **Submit-to-start latency** of a trivial job on an idle 6-site fleet
    (``topologies/paper-6-torus.yaml`` through ``gbroker.fleet``, embedded MQTT broker):
    ``--starts`` jobs, one at a time, each to a random broker (seeded), each waited for;
    ``started_at - submitted_at`` from the job's status. Median and p90. Target: median < 100 ms.

Then **one table compares GBroker, Slurm and the machine's limit** on the same load: N =
``--submissions`` trivial jobs (``/bin/true``, one core) sent by ``--clients`` concurrent
clients to one ``--cores``-CPU site, after ``--warmup`` jobs that have all started. Every row
is measured the same way, from the N timed jobs only:

- **submitted/s** = N / (seconds from the first submission sent to the last one acknowledged);
- **started/s** = (N - 1) / (last start - first start), where a job's *start* is the system's
  own record of launching it: GBroker's ``started_at`` (its supervisor's timestamp, read from
  ``GET /api/v1/jobs`` once all have started); for Slurm the creation time of the job's output
  file, which ``slurmstepd`` opens in the job's process just before it execs the batch script
  (see scripts/bench/bench_slurm.py; Slurm's own ``StartTime`` is whole seconds, checked to agree);
- **submit-to-start**, median and p90 = start - the wall time at which the client sent that
  job's submission (same machine, same clock). When jobs arrive faster than they start, this
  includes their wait in the backlog, for both systems alike;
- **idle, 1 by 1**: the same latency at the idle site, once the timed jobs have started:
  ``--idle`` more jobs, one at a time, each sent after the previous one started and a random
  (seeded) pause in [0, 1) s, lest the jobs keep step with slurmctld's once-a-second loop.

Rows:

- *gbroker*: the N timed jobs of run (a) *running* above;
- *slurm 22.05 as packaged*: Debian's ``slurm-wlm`` started here (scripts/bench/bench_slurm.py: a
  generated ``slurm.conf``, one node declaring ``--cores`` CPUs, ``select/cons_tres``, no
  accounting, its own ``munged``), jobs sent as ``sbatch --wrap=/bin/true`` by the same number
  of concurrent clients, each running ``sbatch``; ``SchedulerParameters`` unset;
- *slurm 22.05 tuned*: the same with ``SchedulerParameters=batch_sched_delay=0,
  sched_min_interval=0`` (schedule each batch job when it arrives) and error-only logging;
- *limit*: scripts/bench/bench_spawn.py, a bare loop that only starts ``/bin/true`` and reaps it,
  ``--spawns`` times, with ``os.fork`` + ``os.execv`` and with ``os.posix_spawn``, serial and
  one loop per usable CPU, in a fresh Python process. Its rate is starts / wall seconds; the
  fastest of the four is *the limit*, marked in the table. One more row, not a candidate: the
  spawn loop per CPU where each start first makes a job directory and its two stream files on
  the fleets' file system, as any batch system does for a job (GBroker's launcher, slurmstepd):
  what the file system adds to a start.

Then **a backlog released at once**, the start rate alone: in the *busy* run above, the warm-up
and the N timed jobs all queue behind the job holding every core; that job is then cancelled and
the N timed jobs' starts give started/s as above (first to last start), with no submission
competing for the CPUs meanwhile, and the time from the release to the first and the last start.
Slurm gets the same: a job holding every CPU (``sbatch --ntasks=CPUS --wrap 'sleep 300'``),
``--slurm-backlog`` trivial jobs (2,000; fewer than GBroker's N because ``sbatch`` submits a few
dozen per second) queued behind it, then ``scancel`` of the blocker. Below that table, where
GBroker's CPU went while its backlog started, in ms per job (from ``/proc``): the broker
process, its launchers, the jobs themselves (the launchers' reaped children), and the rest of
the machine's busy time.

With ``--isolation both`` (the default) the backlog is run twice: with jobs isolated as a root
broker runs them by default (a uid per user, a cgroup per job: ``gbroker/site/identity.py``,
``gbroker/site/cgroups.py``) and not (``serve --run-as nobody --job-cgroups off``: every job as
nobody, rlimits and CPU affinity only), and the cost of isolation in start rate is printed (the
target: within 10%). ``--isolation on`` or ``off`` runs one of them throughout.

Below the tables: GBroker's started/s (of the running row, and of the backlog) as a fraction of
the limit (and of the fork+exec loop with one loop per CPU, the machine's fork/exec/reap rate),
and as a multiple of each Slurm's. Slurm is installed by scripts/setup/ensure_slurm.sh when missing
(apt-get; root or sudo); ``--no-slurm`` skips it and the tables then say ``slurm: not run
(--no-slurm given)``; ``--no-gbroker`` likewise skips (a), (b), (c) and GBroker's rows.

**GBroker in front of Slurm, against that Slurm alone** (``--slurm-site``, run alone: none of
the above). One site, ``manager: slurm``, of ``--cores`` cores: ``gbroker fleet up`` of that
one-site topology starts its Slurm cluster (gbroker/fleet/slurm.py: one node declaring
``--cores`` CPUs, ``SchedulerParameters=batch_sched_delay=0,sched_min_interval=0``) and its
broker (``--manager slurm``, gbroker/site/slurm.py). Each row runs on a fresh fleet of that same
topology, one after the other, so that neither inherits the other's jobs in Slurm's records
(``squeue --states=all`` lists every job of the last hour, ``MinJobAge=3600``); in the first,
the broker is up and idle (it looks at the cluster once a second, as it would while the
cluster's own users submit). N = ``--site-jobs`` trivial jobs (``/bin/true``, one core) are
sent by ``--clients`` concurrent clients, after ``--site-warmup`` jobs that have all ended:

- *slurm alone*: ``sbatch --wrap=/bin/true`` straight to the cluster (as ``nobody`` when run as
  root, the account the broker runs the other row's jobs as);
- *gbroker -> slurm*: HTTP submissions to the site's broker, as (a) sends them; the broker
  holds each in Slurm with ``sbatch --hold``, records its id, then releases it.

Per row: submitted/s (as above: sbatch's id or the broker's 201 is the acknowledgement),
started/s and submit-to-start median and p90 (starts as above: the job's output file's creation,
which GBroker's ``started_at`` of a Slurm job is too), and **done/s** = N / (seconds from the
first submission to the last job's end as the system records it): Slurm's ``EndTime``
(``squeue --states=all``; whole seconds, rounded down) for Slurm alone, the job's ``ended_at``
for GBroker (which is that same ``EndTime``, read by its poll), each taken no earlier than the
job's start. Beside it, the seconds until this client *saw* every job ended (``squeue`` has no
job left to run, or the broker's ``gbroker_jobs_finished_total`` counts them all; looked at
every 0.25 s): what a user waits. Below: what each Slurm command the broker runs costs alone on
the cluster after GBroker's row (median of 10, serial): ``sbatch --hold``, ``scontrol release``,
``squeue --states=all``; and the machine's load average before, between and after the rows.

``--quick`` runs a short version (fewer submissions, starts, spawns and idle jobs; Slurm gets 40
timed jobs after 10; ``--slurm-site`` 40 after 5) for a smoke test; its figures are indicative
only. Every process started here is stopped however the run ends: its end, a failure, Ctrl-C,
SIGTERM or SIGHUP (exit 128 + the signal's number; scripts/orderly.py: a signal that arrives
while a fleet or a Slurm starts or stops waits until it is up and armed to be stopped, or down);
the brokers run with ``--stop-jobs-on-exit``, so their jobs stop with them. The fleets and
Slurms live in a temporary directory unless ``--dir`` names one (the journal's fsyncs then hit
that directory's disk); Slurm's sockets alone live in a short directory of their own under the
system's temporary directory, as Unix socket paths must stay short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gbroker import fleet
from gbroker.daemon.metrics import bucket_quantile
from gbroker.fleet.slurm import SEARCH_PATH
from gbroker.security import runtime
from gbroker.security.auth import bearer
from gbroker.topology import SiteSpec, Topology, save_topology
from scripts import ROOT, options, orderly
from scripts.bench import bench_slurm

SPAWN = "scripts.bench.bench_spawn"  # run as a module from the checkout: it imports scripts.orderly
TORUS = ROOT / "topologies" / "paper-6-torus.yaml"
TRIVIAL_JOB = json.dumps(
    {"name": "bench", "executable": "/bin/true", "total_cpu_count": {"exact": 1}}
).encode()
TARGETS = {"submissions_per_s": 1000.0, "decision_p99_s": 2e-3, "start_median_s": 0.1}
ISOLATED: tuple[str, ...] = ()
"""``serve`` as it is by default: as root, a uid per user and a cgroup per job."""
SHARED = ("--run-as", "nobody", "--job-cgroups", "off")
"""``serve`` without job isolation: every job as nobody, rlimits and CPU affinity only."""


@contextlib.contextmanager
def running_fleet(
    topology: Path, directory: Path, extra: tuple[str, ...] = ()
) -> Iterator[dict[str, str]]:
    """A fleet up for the block's duration; its URLs by site. Always brought down
    (:func:`orderly.fleet`).

    Its brokers stop their jobs when they stop (``--stop-jobs-on-exit``), so that nothing a
    benchmark started outlives it; ``extra``: more ``serve`` arguments.
    """
    serve_args = ("--stop-jobs-on-exit", *extra)
    with orderly.fleet(topology, directory, serve_args=serve_args) as record:
        yield {name: member["url"] for name, member in record["sites"].items()}


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


async def _submit_many(
    http: aiohttp.ClientSession, url: str, count: int, clients: int
) -> tuple[float, dict[str, float]]:
    """Submit ``count`` trivial jobs from ``clients`` concurrent workers.

    Returns the seconds it took and, by job id, the wall time (``time.time()``) at which its
    request was sent. Anything but 201 (durable and acknowledged) aborts the benchmark.
    """
    tickets = itertools.count()
    issued: dict[str, float] = {}

    async def worker() -> None:
        while next(tickets) < count:
            at = time.time()
            async with http.post(f"{url}/api/v1/jobs", data=TRIVIAL_JOB) as response:
                body = await response.read()
                if response.status != 201:
                    raise RuntimeError(f"submission answered {response.status}: {body[:200]!r}")
            issued[json.loads(body)["id"]] = at

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - began, issued


def _cpu_now(broker: int | None) -> tuple[float, ...]:
    """CPU seconds so far: the machine's busy and total (``/proc/stat``, every CPU), this
    process's own (the benchmark's clients), and the broker's event loop (its main thread)."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        jiffies = [int(x) for x in f.readline().split()[1:]]
    idle = jiffies[3] + jiffies[4]  # idle and iowait
    total = sum(jiffies[:8])
    loop = 0.0
    if broker is not None:
        with contextlib.suppress(OSError):
            with open(f"/proc/{broker}/task/{broker}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            loop = (int(fields[11]) + int(fields[12])) / hz  # utime, stime
    return (total - idle) / hz, total / hz, time.process_time(), loop


def _process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process so far (every thread), and of its children it has reaped."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # gone: counted as nothing from here
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / hz, (int(fields[13]) + int(fields[14])) / hz


def _split_now(broker: int, launchers: list[int]) -> tuple[float, ...]:
    """CPU seconds so far: the machine's busy and total, the broker process (every thread),
    its launchers, and the jobs (the launchers' reaped children: each launcher reaps its jobs)."""
    busy, total, _, _ = _cpu_now(None)
    of_launchers = [_process_cpu(pid) for pid in launchers]
    return (
        busy,
        total,
        _process_cpu(broker)[0],
        sum(own for own, _ in of_launchers),
        sum(children for _, children in of_launchers),
    )


def _cpu_split(before: tuple[float, ...], after: tuple[float, ...], jobs: int) -> dict[str, float]:
    """Where the machine's CPU went while ``jobs`` jobs started: milliseconds per job."""
    busy, total, broker, launchers, children = (b - a for a, b in zip(before, after, strict=True))
    per_job = 1e3 / jobs
    return {
        "machine_busy": busy / total,
        "broker_ms_per_job": broker * per_job,
        "launchers_ms_per_job": launchers * per_job,
        "jobs_ms_per_job": children * per_job,
        "other_ms_per_job": (busy - broker - launchers - children) * per_job,
    }


def _cpu_shares(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
    busy, total, clients, loop = (b - a for a, b in zip(before, after, strict=True))
    cpus = os.cpu_count() or 1
    return {
        "machine_busy": busy / total,
        "clients_share": clients / total,
        "broker_loop_busy": loop / (total / cpus),  # of one CPU, over the same wall time
    }


async def _scrape(http: aiohttp.ClientSession, url: str) -> dict[str, list[Any]]:
    """The broker's /metrics: samples by family name."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _counter(metrics: dict[str, list[Any]], name: str) -> float:
    return float(sum(s.value for s in metrics.get(name, []) if s.name == f"{name}_total"))


def _histogram(metrics: dict[str, list[Any]], name: str, **labels: str) -> dict[str, float]:
    """Count, mean and bucket-bound p50/p99 of a histogram (of its samples with ``labels``)."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for sample in metrics.get(name, []):
        if any(sample.labels.get(k) != v for k, v in labels.items()):
            continue
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


async def _occupy(http: aiohttp.ClientSession, url: str, cores: int) -> str:
    """Start a job that holds every core of the site, so that what follows queues; its id."""
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
                return str(body["id"])
        await asyncio.sleep(0.05)
    raise RuntimeError("the blocking job did not start within 30 s")


async def _wait_started(http: aiohttp.ClientSession, url: str, count: int) -> None:
    """Wait until the broker has started ``count`` jobs in all (its own counter)."""
    deadline = time.monotonic() + 60 + count / 10
    while _counter(await _scrape(http, url), "gbroker_jobs_started") < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not start {count} jobs in time")
        await asyncio.sleep(0.25)


async def _throughput(
    url: str,
    clients: int,
    submissions: int,
    warmup: int,
    busy_cores: int | None,
    idle: tuple[int, int],
    broker: int | None = None,
) -> dict[str, Any]:
    """(a) and (b) at one broker: into an idle site, or with ``busy_cores`` all taken.

    Into an idle site, the warm-up jobs are waited for before the timed submissions, and the
    timed ones after them; their starts then make the GBroker row of the comparison, with
    :func:`_idle` for ``idle`` = (jobs, seed) once the site is idle again.
    """
    connector = aiohttp.TCPConnector(limit=clients)
    token = runtime.find_token(url) or ""  # the fleet's admin token, as a client finds it
    async with aiohttp.ClientSession(connector=connector, headers=bearer(token)) as http:
        await _ready(http, url)
        blocker = None if busy_cores is None else await _occupy(http, url, busy_cores)
        await _submit_many(http, url, warmup, clients)
        if busy_cores is None:
            await _wait_started(http, url, warmup)
        before = await _scrape(http, url)
        cpu_before = _cpu_now(broker)
        seconds, issued = await _submit_many(http, url, submissions, clients)
        cpu = _cpu_shares(cpu_before, _cpu_now(broker))
        after = await _scrape(http, url)
        if blocker is not None:
            # The backlog: every job queued behind the blocker may start once it goes.
            async with http.get(f"{url}/api/v1/health") as response:
                launchers = (await response.json())["executor"]["launcher_pids"]
            split_before = _split_now(broker, launchers) if broker is not None else None
            released = time.time()
            async with http.delete(f"{url}/api/v1/jobs/{blocker}") as response:
                if response.status != 200:
                    raise RuntimeError(f"cancelling the blocker: {response.status}")
            await _wait_started(http, url, 1 + warmup + submissions)
            if split_before is not None:
                assert broker is not None
                # Every launcher there now: one started after the release counts from nothing.
                async with http.get(f"{url}/api/v1/health") as response:
                    now_up = (await response.json())["executor"]["launcher_pids"]
                split_after = _split_now(broker, sorted({*launchers, *now_up}))
                split = _cpu_split(split_before, split_after, warmup + submissions)
            async with http.get(f"{url}/api/v1/jobs?limit=100000") as response:
                listed = (await response.json())["jobs"]
            backlog = _backlog(
                released, warmup, {job["id"]: job["started_at"] for job in listed}, issued
            )
            if split_before is not None:
                backlog["cpu"] = split
        if busy_cores is None:
            await _wait_started(http, url, warmup + submissions)
            async with http.get(f"{url}/api/v1/jobs?limit=100000") as response:
                jobs = (await response.json())["jobs"]

            async def one() -> float:
                at = time.time()
                async with http.post(f"{url}/api/v1/jobs", data=TRIVIAL_JOB) as response:
                    body = await response.json()
                    if response.status != 201:
                        raise RuntimeError(f"submission answered {response.status}: {body}")
                async with http.get(f"{url}/api/v1/jobs/{body['id']}/wait?timeout=30") as reply:
                    status = await reply.json()
                if status["started_at"] is None:
                    raise RuntimeError(f"job {body['id']} never started: {status}")
                return float(status["started_at"]) - at

            idle_figures = await _idle(one, *idle)
    started = _counter(after, "gbroker_jobs_started") - _counter(before, "gbroker_jobs_started")
    figures = {
        "submissions": submissions,
        "clients": clients,
        "seconds": seconds,
        "submissions_per_s": submissions / seconds,
        "started_per_s": started / seconds,
        "cpu": cpu,
        "decision": _histogram(after, "gbroker_dispatch_decision_seconds"),
        "durable": _histogram(after, "gbroker_durable_submission_seconds"),
        "journal": {
            kind: _histogram(after, "gbroker_journal_commit_seconds", kind=kind)
            for kind in ("submit", "update", "launch", "other")
            if any(
                sample.labels.get("kind") == kind
                for sample in after.get("gbroker_journal_commit_seconds", [])
            )
        },
    }
    if blocker is not None:
        figures["backlog"] = backlog
    if busy_cores is None:
        starts = {job["id"]: job["started_at"] for job in jobs if job["id"] in issued}
        figures["jobs"] = {
            "warmup": warmup,
            **_job_starts(seconds, issued, starts),
            **idle_figures,
        }
    return figures


def _start_rate(at: list[float]) -> float:
    """Starts per second, from the first start to the last (``at`` sorted). Slurm records start
    times in whole seconds, so a quick run's starts may all fall in one second: their span is then
    taken as that second, and the rate is the least it can have been (NaN for one start alone)."""
    if len(at) < 2:
        return math.nan
    return (len(at) - 1) / max(at[-1] - at[0], 1.0 if at[-1] == at[0] else 0.0)


def _job_starts(
    seconds: float, issued: dict[str, float], starts: Mapping[str, float | None]
) -> dict[str, Any]:
    """The comparison's row for one system: rates and submit-to-start of the timed jobs.

    ``seconds``: how long their submissions took; ``issued``: when each was sent, by job id;
    ``starts``: when each started, from the system's own records.
    """
    known = {job: at for job, at in starts.items() if job in issued and at is not None}
    missing = [job for job in issued if job not in known]
    if missing:
        raise RuntimeError(f"{len(missing)} jobs have no start time, e.g. {missing[0]}")
    at = sorted(known.values())
    latencies = sorted(known[job] - sent for job, sent in issued.items())
    count = len(issued)
    return {
        "jobs": count,
        "submissions_per_s": count / seconds,
        "started_per_s": _start_rate(at),
        "start_median_s": statistics.median(latencies),
        "start_p90_s": _p90(latencies),
    }


def _backlog(
    released: float, ahead: int, starts: dict[str, float | None], issued: dict[str, float]
) -> dict[str, Any]:
    """The backlog row for one system: how fast the N timed jobs, queued behind a job that
    held every core (and behind ``ahead`` more), started once that job went at ``released``.

    ``starts``: each job's start from the system's own records (only the timed ones, the ids of
    ``issued``, count). The rate is taken from the first to the last of their starts, as in the
    other rows: it is the system's start rate alone, with no submissions competing for the CPU.
    """
    known = {job: starts.get(job) for job in issued}
    missing = [job for job, at in known.items() if at is None]
    if missing:
        raise RuntimeError(f"{len(missing)} queued jobs have no start time, e.g. {missing[0]}")
    at = sorted(a for a in known.values() if a is not None)
    count = len(at)
    return {
        "jobs": count,
        "ahead": ahead,
        "started_per_s": _start_rate(at),
        "release_to_first_s": at[0] - released,
        "release_to_last_s": at[-1] - released,
    }


IDLE_PAUSE_S = 1.0


async def _idle(one: Callable[[], Awaitable[float]], jobs: int, seed: int) -> dict[str, Any]:
    """Submit-to-start at an idle site: ``jobs`` jobs one at a time, each until it started.

    ``one`` submits a job, waits for its start and returns start - sent. Before each job, a
    random pause in [0, ``IDLE_PAUSE_S``) s (seeded) keeps the submissions out of step with any
    periodic loop of the system measured: slurmctld's background loop runs once a second, and a
    job sent as soon as the previous one started would always land at the same point of it.
    """
    rng = random.Random(seed)
    latencies = []
    for _ in range(jobs):
        await asyncio.sleep(rng.uniform(0, IDLE_PAUSE_S))
        latencies.append(await one())
    ordered = sorted(latencies)
    return {
        "idle_jobs": jobs,
        "idle_start_median_s": statistics.median(ordered),
        "idle_start_p90_s": _p90(ordered),
    }


def _p90(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


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
        "p90_s": _p90(ordered),
        "max_s": ordered[-1],
    }


async def _slurm_jobs(
    slurm: bench_slurm.SingleNodeSlurm,
    clients: int,
    submissions: int,
    warmup: int,
    idle: tuple[int, int],
) -> dict[str, Any]:
    """The comparison's row for Slurm: the same load as GBroker's, measured the same way."""
    warm, timed, one_by_one = (slurm.directory / name for name in ("warmup-out", "out", "idle"))
    for directory in (warm, timed, one_by_one):
        directory.mkdir()

    async def one() -> float:
        _, issued = await bench_slurm.submit_many(slurm.env, one_by_one, 1, 1)
        ((job, at),) = issued.items()
        return await bench_slurm.start_of(one_by_one, job, timeout=30) - at

    try:
        if warmup:
            await bench_slurm.submit_many(slurm.env, warm, warmup, clients)
            await bench_slurm.wait_started(warm, warmup, timeout=60 + warmup / 5)
        seconds, issued = await bench_slurm.submit_many(slurm.env, timed, submissions, clients)
        await bench_slurm.wait_started(timed, submissions, timeout=60 + submissions / 5)
        starts = bench_slurm.started_at(slurm.env, timed, list(issued))
        idle_figures = await _idle(one, *idle)
    except bench_slurm.SlurmError as e:
        raise bench_slurm.SlurmError(f"{e}; pending: {slurm.pending_reasons()}") from e
    return {"warmup": warmup, **_job_starts(seconds, issued, dict(starts)), **idle_figures}


async def _slurm_backlog(
    slurm: bench_slurm.SingleNodeSlurm, clients: int, jobs: int, ahead: int
) -> dict[str, Any]:
    """Slurm's backlog row: ``ahead`` then ``jobs`` trivial jobs queued behind a job holding
    every CPU, released at once by cancelling it; measured as GBroker's (:func:`_backlog`)."""
    first, timed = (slurm.directory / name for name in ("backlog-ahead", "backlog"))
    for directory in (first, timed):
        directory.mkdir()
    try:
        blocker = await bench_slurm.occupy(slurm.env, slurm.cpus, slurm.directory)
        if ahead:
            await bench_slurm.submit_many(slurm.env, first, ahead, clients)
        _, issued = await bench_slurm.submit_many(slurm.env, timed, jobs, clients)
        released = time.time()
        bench_slurm.cancel(slurm.env, blocker)
        await bench_slurm.wait_started(timed, jobs, timeout=120 + jobs / 5)
        starts = bench_slurm.started_at(slurm.env, timed, list(issued))
    except bench_slurm.SlurmError as e:
        raise bench_slurm.SlurmError(f"{e}; pending: {slurm.pending_reasons()}") from e
    return _backlog(released, ahead, dict(starts), issued)


SLURM_SITE = "solo"
"""The one site of ``--slurm-site``'s topology."""


def _slurm_site_topology(directory: Path, cores: int) -> Path:
    """One site of ``cores`` cores in front of a Slurm cluster of its own (``manager: slurm``:
    ``fleet up`` starts the cluster, one node declaring ``cores`` CPUs)."""
    path = directory / "slurm-site.yaml"
    site = SiteSpec(SLURM_SITE, cores, manager="slurm")
    save_topology(Topology([site], [], name="slurm-site"), path)
    return path


def _slurm_site(work: Path, cores: int, jobs: int, warmup: int, clients: int) -> dict[str, Any]:
    """``--slurm-site``: the same load straight to Slurm and through GBroker in front of it,
    each on a fresh fleet of the same one-site topology (the broker idle in the first)."""
    topology = _slurm_site_topology(work, cores)
    figures: dict[str, Any] = {
        "load": {"cores": cores, "jobs": jobs, "warmup": warmup, "clients": clients},
        "load_average": {"before": os.getloadavg()},
    }
    serve_args = ("--stop-jobs-on-exit",)
    print(f"slurm alone: {jobs:,} jobs by sbatch ...", file=sys.stderr)
    with orderly.fleet(topology, work / "alone", serve_args=serve_args) as record:
        cluster = record["slurm"][SLURM_SITE]
        env = {**os.environ, "SLURM_CONF": cluster["conf"], "PATH": SEARCH_PATH}
        out = Path(cluster["sockets"]) / "jobs" / "alone"  # where the site's jobs live, too
        figures["slurm"] = asyncio.run(_slurm_alone(env, out, jobs, warmup, clients))
    figures["load_average"]["between"] = os.getloadavg()
    print(f"gbroker -> slurm: {jobs:,} jobs by HTTP ...", file=sys.stderr)
    with orderly.fleet(topology, work / "gbroker", serve_args=serve_args) as record:
        url = record["sites"][SLURM_SITE]["url"]
        figures["gbroker"] = asyncio.run(_gbroker_slurm(url, jobs, warmup, clients))
        cluster = record["slurm"][SLURM_SITE]
        env = {**os.environ, "SLURM_CONF": cluster["conf"], "PATH": SEARCH_PATH}
        probe = Path(cluster["sockets"]) / "jobs" / "probe"
        _open_to_jobs(probe)
        figures["commands"] = bench_slurm.command_seconds(env, probe, 10, _job_account())
        asyncio.run(bench_slurm.drained(env, timeout=60))
    figures["load_average"]["after"] = os.getloadavg()
    return figures


def _job_account() -> tuple[str, ...]:
    """``sbatch`` options that run a job as the broker runs it: as root, a broker in front of
    Slurm runs every job as ``nobody`` (its ``run_as``); as anyone else, as themselves."""
    if os.geteuid() != 0:
        return ()
    return ("--uid=nobody", "--gid=nogroup") if _has_group("nogroup") else ("--uid=nobody",)


def _has_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _open_to_jobs(directory: Path) -> None:
    """A directory the jobs' account may write their output files in."""
    directory.mkdir(parents=True)
    directory.chmod(0o1777)


async def _slurm_alone(
    env: dict[str, str], out: Path, jobs: int, warmup: int, clients: int
) -> dict[str, Any]:
    """The row of Slurm alone: ``jobs`` trivial jobs by ``sbatch`` from ``clients`` concurrent
    workers, after ``warmup`` that have all ended; each job's start its output file's creation,
    its end Slurm's ``EndTime`` (or its start, if later: ``EndTime`` is rounded down)."""
    warm, timed = out / "warmup", out / "timed"
    for directory in (warm, timed):
        _open_to_jobs(directory)
    account = _job_account()
    timeout = 120 + jobs / 2
    if warmup:
        await bench_slurm.submit_many(env, warm, warmup, clients, account)
        await bench_slurm.drained(env, timeout)
    seconds, issued = await bench_slurm.submit_many(env, timed, jobs, clients, account)
    seen = await bench_slurm.drained(env, timeout)
    starts = bench_slurm.started_at(env, timed, list(issued))
    ends = bench_slurm.ended_at(env, list(issued))
    return _done_row(seconds, issued, starts, ends, seen)


async def _gbroker_slurm(url: str, jobs: int, warmup: int, clients: int) -> dict[str, Any]:
    """The row of GBroker in front of Slurm: ``jobs`` trivial jobs by HTTP (as :func:`_throughput`
    sends them), after ``warmup`` that have all ended; each job's start and end its
    ``started_at`` and ``ended_at`` (the broker's record of Slurm's, see
    gbroker/site/slurm.py)."""
    connector = aiohttp.TCPConnector(limit=clients)
    token = runtime.find_token(url) or ""
    timeout = 120 + jobs / 2
    async with aiohttp.ClientSession(connector=connector, headers=bearer(token)) as http:
        await _ready(http, url)
        if warmup:
            await _submit_many(http, url, warmup, clients)
            await _wait_finished(http, url, warmup, timeout)
        seconds, issued = await _submit_many(http, url, jobs, clients)
        seen = await _wait_finished(http, url, warmup + jobs, timeout)
        async with http.get(f"{url}/api/v1/jobs?limit={warmup + jobs}") as response:
            listed = {job["id"]: job for job in (await response.json())["jobs"]}
    wrong = [job for job in issued if listed.get(job, {}).get("state") != "done"]
    if wrong:
        raise RuntimeError(f"{len(wrong)} jobs did not end done, e.g. {listed.get(wrong[0])}")
    starts = {job: listed[job]["started_at"] for job in issued}
    ends = {job: float(listed[job]["ended_at"]) for job in issued}
    return _done_row(seconds, issued, starts, ends, seen)


async def _wait_finished(
    http: aiohttp.ClientSession, url: str, count: int, timeout: float
) -> float:
    """Wait until the broker's jobs that ended number ``count`` (its own counter); when that was
    first seen (``time.time()``, within the 0.25 s between two looks)."""
    deadline = time.monotonic() + timeout
    while True:
        ended = _counter(await _scrape(http, url), "gbroker_jobs_finished")
        if ended >= count:
            return time.time()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count - ended:.0f} jobs had not ended after {timeout:g} s")
        await asyncio.sleep(0.25)


def _done_row(
    seconds: float,
    issued: dict[str, float],
    starts: Mapping[str, float | None],
    ends: dict[str, float],
    seen: float,
) -> dict[str, Any]:
    """A row of ``--slurm-site``: :func:`_job_starts`'s figures, and jobs done per second from
    the first submission sent to the last end as the system records it (a job's end no earlier
    than its start) and to when the client saw the last one end."""
    row = _job_starts(seconds, issued, starts)
    first = min(issued.values())
    last_end = max(max(ends[job], starts[job] or 0.0) for job in issued)
    count = len(issued)
    row.update(
        first_to_last_end_s=last_end - first,
        done_per_s=count / (last_end - first),
        first_to_seen_done_s=seen - first,
        seen_done_per_s=count / (seen - first),
    )
    return row


def _report_slurm_site(figures: dict[str, Any]) -> None:
    """``--slurm-site``'s table: both rows side by side, then what each Slurm command costs."""
    load = figures["load"]
    print(
        f"N = {load['jobs']:,} trivial jobs (/bin/true, 1 core) from {load['clients']} concurrent "
        f"clients to one Slurm site of {load['cores']} CPUs\n(fleet up, manager: slurm; each row "
        f"on a fresh fleet; timed after {load['warmup']} warm-up jobs had ended)"
    )
    print(
        f"{'':22} {'submitted/s':>11} {'started/s':>10} {'done/s':>8} {'last end':>9} "
        f"{'seen done':>10} {'submit-to-start':>21}"
    )
    print(f"{'':22} {'':>11} {'':>10} {'':>8} {'':>9} {'':>10} {'median':>10} {'p90':>10}")
    for key, label in (("slurm", "slurm alone (sbatch)"), ("gbroker", "gbroker -> slurm")):
        row = figures[key]
        print(
            f"{label:22} {row['submissions_per_s']:>11,.1f} {row['started_per_s']:>10,.1f} "
            f"{row['done_per_s']:>8,.1f} {row['first_to_last_end_s']:>8.1f}s "
            f"{row['first_to_seen_done_s']:>9.1f}s {_ms(row['start_median_s'])} "
            f"{_ms(row['start_p90_s'])}"
        )
    ratio = figures["gbroker"]["done_per_s"] / figures["slurm"]["done_per_s"]
    print(f"gbroker -> slurm does {ratio:.0%} of Slurm alone's jobs/s")
    commands = ", ".join(f"{name} {_ms(s).strip()}" for name, s in figures["commands"].items())
    print(f"each Slurm command alone (median of 10, the cluster knowing N+ jobs): {commands}")
    averages = figures["load_average"]
    print(
        "load average (1, 5, 15 min): "
        + "; ".join(
            f"{when} {' '.join(f'{x:.2f}' for x in averages[when])}"
            for when in ("before", "between", "after")
        )
    )
    print(
        "submitted/s: N / (first submission sent to last one acknowledged: sbatch's id, or\n"
        "  GBroker's 201); started/s: (N - 1) / (first to last start); a start: the job's output\n"
        "  file's creation by slurmstepd (GBroker's started_at is it); done/s: N / (first\n"
        "  submission sent to the last end as the system records it: Slurm's EndTime, whole\n"
        "  seconds rounded down, or GBroker's ended_at, the same EndTime; no end before its\n"
        "  start); last end, seen done: seconds from the first submission to that end, and to\n"
        "  when this client saw every job ended (squeue, or the broker's counter; 0.25 s looks)."
    )


def _limit(count: int, files: Path) -> dict[str, Any]:
    """scripts/bench/bench_spawn.py's bare start loops, in a fresh process (a small one to fork),
    and its loop that makes each job's directory and stream files in ``files`` (where the fleets
    live: the same file system)."""
    done = orderly.run_process(
        [
            sys.executable,
            "-m",
            SPAWN,
            "--count",
            str(count),
            "--json",
            "--files",
            str(files.resolve()),
        ],
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{SPAWN} exited {done.returncode}: {done.stderr[-500:]}")
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def _one_site(directory: Path, cores: int) -> Path:
    path = directory / "one-site.yaml"
    save_topology(Topology([SiteSpec("solo", cores)], [], name="one-site"), path)
    return path


def _verdict(value: float, target: float, below: bool) -> str:
    met = value < target if below else value >= target
    return "met" if met else "MISSED"


def _report(figures: dict[str, Any]) -> None:
    if "running" in figures:
        _report_gbroker(figures)
    _report_comparison(figures)


def _report_gbroker(figures: dict[str, Any]) -> None:
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
        commits = ", ".join(
            f"{kind} p50 <= {h['p50'] * 1e3:g} ms, p99 <= {h['p99'] * 1e3:g} ms"
            for kind, h in a["journal"].items()
            if h["count"]
        )
        print(f"    journal commit latency (queued to committed): {commits}")
        cpu = a["cpu"]
        print(
            f"    CPU meanwhile: the machine {cpu['machine_busy']:.0%} busy, of which the "
            f"{a['clients']} clients (this process) {cpu['clients_share']:.0%} of the machine;"
            f" the broker's event loop {cpu['broker_loop_busy']:.0%} of a CPU"
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


LIMIT_ROWS = {
    "fork_serial": "fork+exec, serial",
    "fork_parallel": "fork+exec, 1 loop per CPU",
    "spawn_serial": "posix_spawn, serial",
    "spawn_parallel": "posix_spawn, 1 loop per CPU",
    "spawn_files_parallel": "spawn + job dir, 2 files, 1 per CPU",
}


def _report_comparison(figures: dict[str, Any]) -> None:
    """One table: GBroker, Slurm as packaged and tuned, and the bare start loops."""
    load = figures["load"]
    print(
        f"\nN trivial jobs (/bin/true, 1 core each) on one {load['cores']}-CPU site from "
        f"{load['clients']} concurrent clients, timed once the warm-up jobs had started"
    )
    print(
        f"{'':36} {'warm-up':>7} {'N':>6} {'submitted/s':>11} {'started/s':>10} "
        f"{'submit-to-start':>21} {'idle, 1 by 1':>21}"
    )
    print(
        f"{'':36} {'':>7} {'':>6} {'':>11} {'':>10} {'median':>10} {'p90':>10} "
        f"{'median':>10} {'p90':>10}"
    )
    rows = [("gbroker", "gbroker: 1 broker (gbroker.fleet)", figures.get("gbroker"))]
    rows += [
        ("slurm", _SLURM_LABELS[variant.name], figures["slurm"].get(variant.name))
        for variant in (bench_slurm.DEFAULT, bench_slurm.TUNED)
    ]
    for system, label, row in rows:
        if row is None:
            print(f"{label:36} {system}: not run ({figures['not_run'][system]})")
            continue
        latencies = " ".join(
            _ms(row[key])
            for key in ("start_median_s", "start_p90_s", "idle_start_median_s", "idle_start_p90_s")
        )
        print(
            f"{label:36} {row['warmup']:>7,} {row['jobs']:>6,} {row['submissions_per_s']:>11,.0f} "
            f"{row['started_per_s']:>10,.1f} {latencies}"
        )
    limit = figures["limit"]
    for key, label in LIMIT_ROWS.items():
        run = limit["runs"][key]
        mark = "   <- the limit" if key == limit["limit"] else ""
        print(
            f"{'limit: ' + label:36} {'':>7} {run['starts']:>6,} {'':>11} {run['per_s']:>10,.0f}"
            f"{mark}"
        )
    _report_backlog(figures)
    ratios = figures["ratios"]
    said = []
    if "of_limit" in ratios:
        said.append(f"gbroker starts at {ratios['of_limit']:.1%} of the limit")
    said += [
        f"{ratios[variant.name]:.1f}x {variant.name}'s"
        for variant in (bench_slurm.DEFAULT, bench_slurm.TUNED)
        if variant.name in ratios
    ]
    if said:
        print("ratios of started/s: " + "; ".join(said))
    if "backlog_of_limit" in ratios:
        backlog = [
            f"{ratios['backlog_of_limit']:.1%} of the limit",
            f"{ratios['backlog_of_fork_parallel']:.1%} of fork+exec, 1 loop per CPU",
            f"{ratios['backlog_of_files']:.1%} of spawn with a job dir and 2 files",
        ]
        backlog += [
            f"{ratios[f'backlog {variant.name}']:.1f}x {variant.name}'s"
            for variant in (bench_slurm.DEFAULT, bench_slurm.TUNED)
            if f"backlog {variant.name}" in ratios
        ]
        print("ratios of backlog started/s: gbroker " + "; ".join(backlog))
    print(
        f"slurm tuned: SchedulerParameters={bench_slurm.TUNED.scheduler_parameters}, "
        f"SlurmctldDebug={bench_slurm.TUNED.debug}\n"
        "started/s: (N - 1) / (last start - first start) of the N timed jobs, each start as\n"
        "  the system records it (gbroker: the job's started_at from its supervisor; slurm:\n"
        "  the creation of the job's output file by slurmstepd as it launches the job);\n"
        "submit-to-start: from the moment the client sent the job's submission; idle, 1 by 1:\n"
        f"  {figures['load']['idle']} more jobs, each sent after the previous one started and a "
        "random pause < 1 s."
    )


def _report_backlog(figures: dict[str, Any]) -> None:
    """The start rate alone: jobs queued behind a blocking job, released at once."""
    print(
        "\nA backlog released at once: N trivial jobs (after 'ahead' more) queued behind a job "
        "holding every CPU,\nwhich is then cancelled; no submissions meanwhile"
    )
    print(
        f"{'':36} {'ahead':>7} {'N':>6} {'':>11} {'started/s':>10} "
        f"{'release to first':>21} {'release to last':>21}"
    )
    isolated = figures.get("isolation") != "off"
    rows = [
        (
            "gbroker",
            "gbroker: 1 broker" + (", isolated" if isolated else ", not isolated"),
            figures.get("busy", {}).get("backlog"),
        )
    ]
    if "busy-shared" in figures:
        rows.append(
            ("gbroker", "gbroker: 1 broker, not isolated", figures["busy-shared"]["backlog"])
        )
    rows += [
        ("slurm", _SLURM_LABELS[variant.name], figures["slurm_backlog"].get(variant.name))
        for variant in (bench_slurm.DEFAULT, bench_slurm.TUNED)
    ]
    for system, label, row in rows:
        if row is None:
            print(f"{label:36} {system}: not run ({figures['not_run'][system]})")
            continue
        print(
            f"{label:36} {row['ahead']:>7,} {row['jobs']:>6,} {'':>11} "
            f"{row['started_per_s']:>10,.1f} {_ms(row['release_to_first_s']):>21} "
            f"{_ms(row['release_to_last_s']):>21}"
        )
    for key, said in (("busy", "isolated" if isolated else ""), ("busy-shared", "not isolated")):
        split = figures.get(key, {}).get("backlog", {}).get("cpu")
        if split is None:
            continue
        print(
            f"gbroker{' ' + said if said else ''}: CPU per job while its backlog started (ms, "
            f"from /proc): the broker {split['broker_ms_per_job']:.2f}, its launchers "
            f"{split['launchers_ms_per_job']:.2f}, the jobs themselves "
            f"{split['jobs_ms_per_job']:.2f}, the rest {split['other_ms_per_job']:.2f}; the "
            f"machine {split['machine_busy']:.0%} busy (until the last start was seen)"
        )
    if "busy-shared" in figures and "busy" in figures:
        on = figures["busy"]["backlog"]["started_per_s"]
        off = figures["busy-shared"]["backlog"]["started_per_s"]
        print(
            f"isolation (a uid per user, a cgroup per job) costs {1 - on / off:+.1%} of the "
            f"backlog's start rate: {on:,.0f}/s isolated, {off:,.0f}/s not (target: within 10%)"
        )
    print()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:>7,.0f} ms"


_SLURM_LABELS = {
    bench_slurm.DEFAULT.name: "slurm 22.05 as packaged",
    bench_slurm.TUNED.name: "slurm 22.05 tuned",
}


def _ratios(figures: dict[str, Any]) -> dict[str, float]:
    """GBroker's start rate as a fraction of the limit and as a multiple of each Slurm's."""
    gbroker = figures.get("gbroker")
    if gbroker is None:
        return {}
    runs = figures["limit"]["runs"]
    limit = runs[figures["limit"]["limit"]]["per_s"]
    ratios = {"of_limit": gbroker["started_per_s"] / limit}
    for name, row in figures["slurm"].items():
        ratios[name] = gbroker["started_per_s"] / row["started_per_s"]
    backlog = figures.get("busy", {}).get("backlog")
    if backlog is not None:
        rate = backlog["started_per_s"]
        ratios["backlog_of_limit"] = rate / limit
        ratios["backlog_of_fork_parallel"] = rate / runs["fork_parallel"]["per_s"]
        ratios["backlog_of_files"] = rate / runs["spawn_files_parallel"]["per_s"]
        for name, row in figures["slurm_backlog"].items():
            ratios[f"backlog {name}"] = rate / row["started_per_s"]
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument("--submissions", type=int, default=5000, help="timed submissions (5000)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed submissions first (500)")
    parser.add_argument("--cores", type=int, default=64, help="cores of the 1-site fleet (64)")
    parser.add_argument("--starts", type=int, default=50, help="jobs for submit-to-start (50)")
    parser.add_argument(
        "--idle", type=int, default=20, help="jobs one at a time at an idle site per row (20)"
    )
    parser.add_argument("--spawns", type=int, default=2000, help="starts per bare loop (2000)")
    parser.add_argument(
        "--slurm-backlog",
        type=int,
        default=2000,
        help="jobs Slurm gets queued behind a blocking job in the backlog row (2000)",
    )
    parser.add_argument(
        "--slurm-site",
        action="store_true",
        help="only this: --site-jobs jobs straight to a Slurm site's cluster and through its "
        "broker (see the docs above)",
    )
    parser.add_argument(
        "--site-jobs", type=int, default=2000, help="timed jobs per row of --slurm-site (2000)"
    )
    parser.add_argument(
        "--site-warmup", type=int, default=20, help="untimed jobs first in --slurm-site (20)"
    )
    parser.add_argument("--seed", type=int, default=1, help="picks the brokers in (c)")
    parser.add_argument(
        "--isolation",
        choices=("both", "on", "off"),
        default="both",
        help="jobs isolated (a uid per user, a cgroup per job: the default of a root broker), "
        "or not (--run-as nobody --job-cgroups off), or both: the backlog run twice (default)",
    )
    parser.add_argument("--quick", action="store_true", help="a short run for a smoke test")
    options.add_json(parser)
    parser.add_argument("--no-slurm", action="store_true", help="do not install or run Slurm")
    parser.add_argument("--no-gbroker", action="store_true", help="do not run GBroker")
    parser.add_argument("--dir", type=Path, help="where the fleets live (default: a temp dir)")
    args = parser.parse_args(argv)
    slurm_load = (args.clients, args.submissions, args.warmup)
    if args.quick:
        args.submissions, args.warmup, args.starts, args.spawns, args.idle = 500, 100, 8, 200, 1
        slurm_load = (args.clients, 40, 10)
        args.slurm_backlog = 40
        args.site_jobs, args.site_warmup = 40, 5
    positive = ("clients", "submissions", "cores", "starts", "spawns", "idle", "slurm_backlog")
    for name in (*positive, "site_jobs"):
        if getattr(args, name) < 1:
            flag = name.replace("_", "-")
            parser.error(f"--{flag}: expected an integer >= 1, got {getattr(args, name)}")
    for name in ("warmup", "site_warmup"):
        if getattr(args, name) < 0:
            flag = name.replace("_", "-")
            parser.error(f"--{flag}: expected an integer >= 0, got {getattr(args, name)}")
    if args.slurm_site:
        return _main_slurm_site(args, parser)
    not_run: dict[str, str] = {}
    if args.no_gbroker:
        not_run["gbroker"] = "--no-gbroker given"
    if args.no_slurm:
        not_run["slurm"] = "--no-slurm given"
    else:
        try:
            bench_slurm.ensure_installed()
        except bench_slurm.SlurmError as e:
            print(f"bench_daemon: {e}; pass --no-slurm to measure without it", file=sys.stderr)
            return 2
    figures: dict[str, Any] = {
        "quick": args.quick,
        "targets": TARGETS,
        "load": {"clients": args.clients, "cores": args.cores, "idle": args.idle},
        "not_run": not_run,
        "slurm": {},
        "slurm_backlog": {},
    }
    load = (args.clients, args.submissions, args.warmup)
    try:
        with orderly.temporary_directory("gbroker-bench-", args.dir) as work:
            print("the limit: bare start loops ...", file=sys.stderr)
            figures["limit"] = _limit(args.spawns, work)
            if not args.no_gbroker:
                topology = _one_site(work, args.cores)
                runs = [("running", None, ISOLATED), ("busy", args.cores, ISOLATED)]
                if args.isolation in ("off", "both"):
                    runs.append(("busy-shared", args.cores, SHARED))
                if args.isolation == "off":  # the shared account and no cgroups throughout
                    runs = [("running", None, SHARED), ("busy", args.cores, SHARED)]
                figures["isolation"] = args.isolation
                for key, busy, extra in runs:
                    print(f"(a, b) one broker, {key} ...", file=sys.stderr)
                    with running_fleet(topology, work / key, extra) as urls:
                        record = json.loads((work / key / fleet.FLEET_FILE).read_text())
                        broker = int(record["sites"]["solo"]["pid"])
                        figures[key] = asyncio.run(
                            _throughput(urls["solo"], *load, busy, (args.idle, args.seed), broker)
                        )
                figures["gbroker"] = figures["running"].pop("jobs")
                print("(c) an idle 6-site torus ...", file=sys.stderr)
                with running_fleet(TORUS, work / "six") as urls:
                    figures["starts"] = asyncio.run(_starts(urls, args.starts, args.seed))
            if not args.no_slurm:
                for variant in (bench_slurm.DEFAULT, bench_slurm.TUNED):
                    print(f"{variant.name} ...", file=sys.stderr)
                    directory = work / variant.name.replace(" ", "-")
                    directory.mkdir()
                    with bench_slurm.running(directory, args.cores, variant) as slurm:
                        figures["slurm"][variant.name] = asyncio.run(
                            _slurm_jobs(slurm, *slurm_load, (args.idle, args.seed))
                        )
                        figures["slurm_backlog"][variant.name] = asyncio.run(
                            _slurm_backlog(slurm, args.clients, args.slurm_backlog, 0)
                        )
    except bench_slurm.SlurmError as e:
        print(f"bench_daemon: slurm: {e}", file=sys.stderr)
        return 1
    figures["ratios"] = _ratios(figures)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _report(figures)
    return 0


def _main_slurm_site(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``--slurm-site``: that comparison alone."""
    if args.no_slurm or args.no_gbroker:
        given = "--no-slurm" if args.no_slurm else "--no-gbroker"
        parser.error(f"--slurm-site: measures both GBroker and Slurm, without {given}")
    try:
        bench_slurm.ensure_installed()
        with orderly.temporary_directory("gbroker-bench-", args.dir) as work:
            figures = _slurm_site(work, args.cores, args.site_jobs, args.site_warmup, args.clients)
    except bench_slurm.SlurmError as e:
        print(f"bench_daemon: slurm: {e}", file=sys.stderr)
        return 1
    figures["quick"] = args.quick
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _report_slurm_site(figures)
    return 0


if __name__ == "__main__":
    orderly.run(main)
