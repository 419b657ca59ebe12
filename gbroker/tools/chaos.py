"""``gbroker chaos``: the product's own resilience test, run against a fleet.

Theory of operation. A fleet made by ``gbroker fleet up`` (:mod:`gbroker.fleet`) serves a stream of
real jobs while brokers are killed with SIGKILL and restarted exactly as the fleet started them
(``fleet.kill`` / ``fleet.restart``: same command, same journal); optionally the fleet's MQTT broker
is killed and restarted too, a burst of concurrent clients submits to one broker that is killed
mid-burst, or a site is cut off from everyone for a while (``--partition``, in a fleet of network
namespaces or containers only). The submitter behaves like a real client
(:class:`gbroker.client.gclient.Client`): every submission carries a fresh ``Idempotency-Key``
and is retried with the same key while the broker does not answer.

What ran is read off what the processes did, never off what the brokers believe: each job
appends its start and end, one ``O_APPEND`` write per line so lines never interleave, to one log
in a run directory that jobs of any account can append to. At the end the owners are asked for
each job's final record and the two are compared, job by job: a job lost, run twice, forgotten
by its owner or reported otherwise than it ran is an anomaly, and each anomalous job gets its
story (its log lines, its owner's final record and journaled history). The exit status is 1 on
any loss, double run, forgotten job or unanswered submission, else 0. Every count and the
measured runs: docs/RESILIENCE.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import shlex
import sqlite3
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gbroker import fleet
from gbroker.client.gclient import BrokerUnreachable, Client, ClientError
from gbroker.core.names import check_site_name, count, job_owner
from gbroker.errors import GBrokerError, InvalidInput

__all__ = [
    "ChaosPlan",
    "ChaosReport",
    "Partition",
    "format_report",
    "parse_partition",
    "run_chaos",
]

RUN_LOG = "runs.log"
PARTITION_AT = 5.0
"""Seconds into the stream when ``--partition`` cuts its site off."""
_TERMINAL = frozenset({"done", "failed", "cancelled"})
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Partition:
    """Cut ``site`` off from every other member of the fleet for ``seconds``."""

    site: str
    seconds: float


def parse_partition(text: str) -> Partition:
    """``SITE:SECONDS`` as ``--partition`` takes it."""
    site, sep, seconds = text.rpartition(":")
    if not sep or not site:
        raise InvalidInput("--partition", "SITE:SECONDS, e.g. Xeon80:10", text)
    check_site_name(site, field="--partition site")
    try:
        duration = float(seconds)
    except ValueError:
        raise InvalidInput("--partition", "SITE:SECONDS with SECONDS a number", text) from None
    if not math.isfinite(duration) or duration <= 0:
        raise InvalidInput("--partition", "a positive number of seconds", text)
    return Partition(site, duration)


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    """What to do to the fleet (``gbroker chaos``'s options)."""

    jobs: int = 100
    rate: float = 5.0  # submissions per second (Poisson)
    kill_every: float | None = None  # SIGKILL a random broker this often during the stream
    down_for: float = 5.0  # seconds a killed broker (or the MQTT broker) stays down
    kill_mqtt_at: float | None = None  # seconds into the stream
    burst_clients: int = 0  # after the stream: this many clients at once, their broker killed
    burst_jobs: int | None = None  # the burst's jobs, shared by its clients (None: 8 each)
    partition: Partition | None = None
    algorithm: str | None = None
    seed: int = 1
    job_seconds: tuple[float, float] = (1.0, 3.0)
    settle: float = 120.0  # seconds to wait for every job to end after the last submission
    grace: float = 2.0  # then seconds more for late (double) runs to show

    def __post_init__(self) -> None:
        if self.jobs < 0:
            raise InvalidInput("--jobs", "a non-negative number of jobs", self.jobs)
        if self.jobs and not (math.isfinite(self.rate) and self.rate > 0):
            raise InvalidInput("--rate", "a positive number of jobs per second", self.rate)
        if self.kill_every is not None and not self.kill_every > 0:
            raise InvalidInput("--kill-every", "a positive number of seconds", self.kill_every)
        if not self.down_for >= 0:
            raise InvalidInput("--down-for", "a non-negative number of seconds", self.down_for)
        if self.kill_mqtt_at is not None and not self.kill_mqtt_at >= 0:
            raise InvalidInput("--kill-mqtt-at", "a non-negative time in s", self.kill_mqtt_at)
        if self.burst_clients < 0:
            raise InvalidInput("--burst-clients", "a non-negative number", self.burst_clients)
        if self.burst_jobs is not None and self.burst_jobs < 1:
            raise InvalidInput("--burst-jobs", "a positive number of jobs", self.burst_jobs)
        low, high = self.job_seconds
        if not 0 <= low <= high:
            raise InvalidInput("--job-seconds", "MIN:MAX with 0 <= MIN <= MAX", self.job_seconds)
        if not self.jobs and not self.burst_clients:
            raise InvalidInput("--jobs", "some jobs (--jobs N or --burst-clients K)", 0)


@dataclass(slots=True)
class _Submission:
    key: str
    entry: str
    sent_at: float
    phase: str  # stream | burst
    job_id: str | None = None
    replayed: bool = False
    error: str | None = None
    answered_at: float | None = None


@dataclass(slots=True)
class _Run:
    pid: int
    site: str
    start: float
    end: float | None = None


@dataclass(slots=True)
class ChaosReport:
    """The figures and the anomalous jobs' stories; :meth:`as_dict` is the ``--json`` form."""

    fleet: str
    run_dir: str
    began: float  # wall-clock time of the start (the stories' times are shown from it)
    plan: dict[str, Any]
    counts: dict[str, int]
    submit_to_end: dict[str, float | None]
    events: list[dict[str, Any]]
    stories: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        c = self.counts
        return not (c["lost"] or c["ran_twice"] or c["unanswered"] or c["forgotten"])

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "fleet": self.fleet,
            "run_dir": self.run_dir,
            "began": self.began,
            "plan": self.plan,
            "counts": self.counts,
            "submit_to_end_s": self.submit_to_end,
            "events": self.events,
            "anomalies": self.stories,
        }


def _job(log: Path, seconds: float) -> str:
    """A job that records its own run: a start line, ``seconds`` of sleep, an end line."""
    stamp = '"$GBROKER_JOB_ID" {} "$(date +%s.%N)" "$$" "$GBROKER_SITE"'
    path = shlex.quote(str(log))
    script = (
        f"printf '%s %s %s %s %s\\n' {stamp.format('start')} >> {path}; "
        f"sleep {seconds:.2f}; "
        f"printf '%s %s %s %s %s\\n' {stamp.format('end')} >> {path}"
    )
    return json.dumps(
        {
            "name": "chaos",
            "executable": "/bin/sh",
            "arguments": ["-c", script],
            "total_cpu_count": {"exact": 1},
            "wall_time_limit": int(seconds) + 120,
        }
    )


def _run_dir(run_dir: str | Path | None, shared: str | None = None) -> Path:
    """The run directory, and its log that every job's user may append to. ``shared``: the
    directory a container fleet shares with its sites (the run directory must be in it)."""
    if run_dir is None:
        directory = Path(tempfile.mkdtemp(prefix="gbroker-chaos-", dir=shared))
    else:
        directory = Path(run_dir)
        if shared is not None and not directory.resolve().is_relative_to(shared):
            raise InvalidInput(
                "--run-dir",
                f"a directory in {shared} (what the fleet's containers share)",
                str(directory),
            )
        directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    if (
        os.geteuid() == 0 and shared is None
    ):  # jobs run as nobody: each parent must let them through
        for parent in [directory.resolve(), *directory.resolve().parents]:
            if not parent.stat().st_mode & stat.S_IXOTH:
                raise InvalidInput(
                    "--run-dir",
                    "a directory the jobs' user (nobody) can reach: o+x on every parent",
                    str(parent),
                )
    log = directory / RUN_LOG
    if log.exists():
        raise InvalidInput("--run-dir", f"a directory without a {RUN_LOG} of an earlier run", log)
    log.touch()
    log.chmod(0o666)  # jobs append (O_APPEND); nobody else writes
    return directory


def _read_runs(log: Path) -> tuple[dict[str, list[_Run]], dict[str, list[str]]]:
    """Job id -> its runs (one per process), and job id -> its raw log lines."""
    runs: dict[str, dict[int, _Run]] = {}
    lines: dict[str, list[str]] = {}
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) != 5 or parts[1] not in ("start", "end"):
            continue
        job_id, what, at, pid, site = parts
        lines.setdefault(job_id, []).append(line)
        try:
            when, process = float(at), int(pid)
        except ValueError:
            continue
        mine = runs.setdefault(job_id, {})
        if what == "start":
            mine[process] = _Run(process, site, when)
        elif process in mine:
            mine[process].end = when
        else:  # an end without its start (cannot happen with O_APPEND; shown if it does)
            mine[process] = _Run(process, site, math.nan, when)
    return {job_id: list(r.values()) for job_id, r in runs.items()}, lines


def _history(directory: Path, job_id: str) -> list[dict[str, Any]]:
    """The owner's journaled transitions of a job (a local fleet's journal, read-only)."""
    journal = directory / job_owner(job_id) / "journal.sqlite"
    if not journal.exists():
        return []
    uri = f"{journal.absolute().as_uri()}?mode=ro"  # escaped: a '#' in a directory is its own
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute(
                "SELECT state, site, at FROM transitions WHERE job_id = ? ORDER BY seq", (job_id,)
            ).fetchall()
    except sqlite3.Error as exc:
        return [{"error": f"{journal}: {exc}"}]
    return [{"state": r[0], "site": r[1], "at": r[2]} for r in rows]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _settled(
    finals: dict[str, dict[str, Any] | None], runs: dict[str, list[_Run]], job_id: str
) -> bool:
    """Whether a job is as final as it gets: terminal at its owner, or forgotten by its owner
    after its process ended."""
    if job_id not in finals:
        return False  # its owner is down: ask again
    final = finals[job_id]
    if final is None:
        return any(r.end is not None for r in runs.get(job_id, ()))
    return final["state"] in _TERMINAL


class _Chaos:
    def __init__(
        self,
        directory: Path,
        plan: ChaosPlan,
        run_dir: Path,
        progress: Progress | None,
    ) -> None:
        self.directory = directory
        self.plan = plan
        self.run_dir = run_dir
        self.log = run_dir / RUN_LOG
        self.rng = random.Random(plan.seed)
        record = fleet.load(directory)
        self.urls: dict[str, str] = {n: m["url"] for n, m in record["sites"].items()}
        self.token = fleet.client_token(directory)
        tls = record.get("tls")
        self.ca = tls["ca"] if tls else None
        self.has_mqtt = record.get("mqtt") is not None
        self.progress = progress or (lambda _: None)
        self.began = time.time()
        self.events: list[dict[str, Any]] = []
        self.submissions: list[_Submission] = []
        self.down: set[str] = set()
        self.cut: set[str] = set()  # partitioned now
        self._restarts = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    # -- what is done to the fleet ---------------------------------------------------------------

    def _event(self, what: str, **detail: Any) -> None:
        at = time.time() - self.began
        self.events.append({"at": round(at, 3), "event": what, **detail})
        shown = " ".join(f"{k}={v}" for k, v in detail.items())
        self.progress(f"[{at:7.1f} s] {what} {shown}")

    def client(self, site: str) -> Client:
        retry_for = max(60.0, 4 * self.plan.down_for)
        return Client(
            self.urls[site], token=self.token, ca=self.ca, attempts=1000, retry_for=retry_for
        )

    async def kill_broker(self, site: str) -> None:
        """SIGKILL ``site``'s broker, and start it again after ``down_for``."""
        self.down.add(site)
        pid = fleet.kill(self.directory, site)
        self._event("killed", site=site, pid=pid)
        task = asyncio.create_task(self._restart_later(site))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _restart_later(self, site: str) -> None:
        await asyncio.sleep(self.plan.down_for)
        while True:  # a restart that fails (e.g. the site is cut off) is tried again
            try:
                async with self._restarts:
                    pid = await asyncio.to_thread(fleet.restart, self.directory, site)
                break
            except GBrokerError as exc:
                self._event("restart failed", site=site, error=str(exc)[:200])
                await asyncio.sleep(1.0)
        self.down.discard(site)
        self._event("restarted", site=site, pid=pid)

    async def _killer(self, stop: asyncio.Event) -> None:
        assert self.plan.kill_every is not None
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: it may swallow a cancel
                async with asyncio.timeout(self.plan.kill_every):
                    await stop.wait()
                return
            up = sorted(set(self.urls) - self.down - self.cut)  # a cut-off site stays up
            if up:
                await self.kill_broker(self.rng.choice(up))

    async def _partition(self, at: float) -> None:
        """Cut the plan's site off ``at`` s into the stream (a netns fleet: its bridge port
        goes down, so it hears no one, no one hears it, and its processes run on), then heal."""
        partition = self.plan.partition
        assert partition is not None
        await asyncio.sleep(at)
        while partition.site in self.down:  # killed just now: cut it once it is back
            await asyncio.sleep(0.2)
        self.cut.add(partition.site)
        await asyncio.to_thread(fleet.partition, self.directory, partition.site, True)
        self._event("partitioned", site=partition.site, seconds=partition.seconds)
        try:
            await asyncio.sleep(partition.seconds)
        finally:
            await asyncio.to_thread(fleet.partition, self.directory, partition.site, False)
            self.cut.discard(partition.site)
        self._event("healed", site=partition.site)

    async def _mqtt_outage(self, at: float) -> None:
        await asyncio.sleep(at)
        pid = await asyncio.to_thread(fleet.kill_mqtt, self.directory)
        self._event("mqtt killed", pid=pid)
        await asyncio.sleep(self.plan.down_for)
        async with self._restarts:
            pid = await asyncio.to_thread(fleet.restart_mqtt, self.directory)
        self._event("mqtt restarted", pid=pid)

    # -- submitting ------------------------------------------------------------------------------

    async def _submit(self, client: Client, submission: _Submission, job: str) -> None:
        before = client.replayed
        try:
            submission.job_id = await client.submit(job, key=submission.key)
            submission.replayed = client.replayed > before
        except (GBrokerError, OSError) as exc:
            submission.error = str(exc)[:300]
        submission.answered_at = time.time()

    def _new(self, entry: str, phase: str) -> tuple[_Submission, str]:
        seconds = self.rng.uniform(*self.plan.job_seconds)
        submission = _Submission(str(uuid.uuid4()), entry, time.time(), phase)
        self.submissions.append(submission)
        return submission, _job(self.log, seconds)

    async def stream(self) -> None:
        plan = self.plan
        stop = asyncio.Event()
        chaos: list[asyncio.Task[None]] = []
        if plan.kill_every is not None:
            chaos.append(asyncio.create_task(self._killer(stop)))
        if plan.kill_mqtt_at is not None:
            chaos.append(asyncio.create_task(self._mqtt_outage(plan.kill_mqtt_at)))
        if plan.partition is not None:
            chaos.append(asyncio.create_task(self._partition(PARTITION_AT)))
        clients = {site: self.client(site) for site in self.urls}
        async with contextlib.AsyncExitStack() as stack:
            for c in clients.values():
                await stack.enter_async_context(c)
            sending = []
            for n in range(plan.jobs):
                await asyncio.sleep(self.rng.expovariate(plan.rate))
                entry = self.rng.choice(sorted(self.urls))
                submission, job = self._new(entry, "stream")
                sending.append(asyncio.create_task(self._submit(clients[entry], submission, job)))
                if (n + 1) % max(1, plan.jobs // 10) == 0:
                    self._event("submitting", sent=n + 1, of=plan.jobs)
            await asyncio.gather(*sending)
            stop.set()
            await asyncio.gather(*chaos)

    async def burst(self) -> None:
        """``burst_clients`` clients submit ``burst_jobs`` jobs back to back to one broker,
        which is SIGKILLed once half of them are acknowledged: by then jobs are starting there
        as fast as they come, and the clients retry the rest (same keys) until it is back."""
        k = self.plan.burst_clients
        total = self.plan.burst_jobs or 8 * k
        target = self.rng.choice(sorted(set(self.urls) - self.down))
        self._event("burst", site=target, clients=k, jobs=total)
        answered = asyncio.Event()
        tickets = itertools.count()
        count = 0

        async def client_loop() -> None:
            nonlocal count
            async with self.client(target) as client:
                while next(tickets) < total:
                    submission, job = self._new(target, "burst")
                    await self._submit(client, submission, job)
                    count += 1
                    if count >= total // 2:
                        answered.set()

        clients = [asyncio.create_task(client_loop()) for _ in range(k)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(answered.wait(), 60.0)
        await self.kill_broker(target)
        await asyncio.gather(*clients)

    async def wait_for_restarts(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background))

    # -- the end ---------------------------------------------------------------------------------

    async def finals(self) -> dict[str, dict[str, Any] | None]:
        """Each accepted job's record at its owner (None: the owner does not know it)."""
        ids = {s.job_id for s in self.submissions if s.job_id}
        known: dict[str, dict[str, Any] | None] = {}
        for site in sorted({job_owner(job_id) for job_id in ids}):
            mine = {job_id for job_id in ids if job_owner(job_id) == site}
            async with self.client(site) as client:
                client.attempts = 3
                try:
                    listed = {job["id"]: job for job in await client.jobs()}
                except (GBrokerError, OSError):
                    continue  # down: its jobs stay unknown this round
                for job_id in mine:
                    if job_id in listed:
                        known[job_id] = listed[job_id]
                        continue
                    with contextlib.suppress(BrokerUnreachable):
                        try:
                            known[job_id] = await client.status(job_id)
                        except ClientError as exc:
                            if exc.status == 404:
                                known[job_id] = None
        return known

    async def settle(self) -> dict[str, dict[str, Any] | None]:
        deadline = time.monotonic() + self.plan.settle
        last_shown = 0.0
        while True:
            finals = await self.finals()
            runs, _ = _read_runs(self.log)
            ids = {s.job_id for s in self.submissions if s.job_id}
            open_ = [job_id for job_id in ids if not _settled(finals, runs, job_id)]
            if time.monotonic() - last_shown > 5:
                last_shown = time.monotonic()
                self._event("settling", open=len(open_), accepted=len(ids))
            if not open_ or time.monotonic() > deadline:
                await asyncio.sleep(self.plan.grace)  # late runs (a job run twice) show up
                return await self.finals() if open_ else finals
            await asyncio.sleep(0.5)

    def report(self, finals: dict[str, dict[str, Any] | None]) -> ChaosReport:
        runs, lines = _read_runs(self.log)
        accepted = {s.job_id: s for s in self.submissions if s.job_id}
        counts = dict.fromkeys(
            (
                "submitted",
                "accepted",
                "replayed",
                "unanswered",
                "done",
                "failed",
                "cancelled",
                "not_terminal",
                "unknown",
                "forgotten",
                "lost",
                "ran_twice",
                "reported_otherwise",
                "ran_unacknowledged",
            ),
            0,
        )
        counts["submitted"] = len(self.submissions)
        counts["accepted"] = len(accepted)
        counts["replayed"] = sum(s.replayed for s in self.submissions)
        counts["unanswered"] = sum(s.job_id is None for s in self.submissions)
        latencies = []
        stories = []
        for job_id, submission in accepted.items():
            final = finals.get(job_id, ...)
            mine = runs.get(job_id, [])
            complete = [r for r in mine if r.end is not None and not math.isnan(r.start)]
            problems = []
            state = None
            if final is ...:
                counts["unknown"] += 1
                problems.append("owner unreachable at the end")
            elif final is None:
                counts["forgotten"] += 1
                problems.append("forgotten by its owner")
            else:
                state = final["state"]
                key = state if state in _TERMINAL else "not_terminal"
                counts[key] += 1
                if key == "not_terminal":
                    problems.append(f"not terminal ({state})")
            if not mine and state not in ("failed", "cancelled"):
                counts["lost"] += 1
                problems.append("lost: never started")
            if len(mine) > 1:
                counts["ran_twice"] += 1
                problems.append(f"ran {len(mine)} times")
            otherwise = (
                (complete and state not in (None, "done") and final is not ...)
                or (state == "done" and not complete)
                or (
                    state == "done"
                    and final not in (None, ...)
                    and complete
                    and final["site"] not in {r.site for r in complete}
                )
            )
            if otherwise:
                counts["reported_otherwise"] += 1
                problems.append("the log and the owner disagree")
            if complete:
                latencies.append(max(r.end or 0.0 for r in complete) - submission.sent_at)
            if problems:
                stories.append(
                    {
                        "job": job_id,
                        "problems": problems,
                        "entry": submission.entry,
                        "phase": submission.phase,
                        "submitted_at": submission.sent_at,
                        "replayed": submission.replayed,
                        "log": lines.get(job_id, []),
                        "owner_record": None if final is ... else final,
                        "history": _history(self.directory, job_id),
                    }
                )
        for job_id in sorted(set(runs) - set(accepted)):
            counts["ran_unacknowledged"] += 1
            stories.append(
                {
                    "job": job_id,
                    "problems": ["ran, but no submission was answered with its id"],
                    "log": lines.get(job_id, []),
                    "history": _history(self.directory, job_id),
                }
            )
        stories += [
            {
                "job": None,
                "problems": [f"unanswered: {submission.error}"],
                "entry": submission.entry,
                "phase": submission.phase,
                "submitted_at": submission.sent_at,
                "key": submission.key,
            }
            for submission in self.submissions
            if submission.job_id is None
        ]
        plan = {
            k: getattr(self.plan, k)
            for k in ChaosPlan.__dataclass_fields__
            if k not in ("partition", "job_seconds")
        }
        plan["job_seconds"] = list(self.plan.job_seconds)
        return ChaosReport(
            str(self.directory),
            str(self.run_dir),
            self.began,
            plan,
            counts,
            {"p50": _quantile(latencies, 0.5), "p99": _quantile(latencies, 0.99)},
            self.events,
            stories,
        )


async def run_chaos(
    directory: str | Path,
    plan: ChaosPlan,
    run_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> ChaosReport:
    """Run ``plan`` against the fleet in ``directory``; see the module docstring."""
    directory = Path(directory)
    record = fleet.load(directory)
    if plan.partition is not None:
        if plan.partition.site not in record["sites"]:
            sites = ", ".join(record["sites"])
            raise InvalidInput("--partition", f"a site of the fleet: {sites}", plan.partition.site)
        if record.get("runtime", "local") not in ("netns", "docker"):
            raise InvalidInput(
                "--partition",
                "a fleet whose brokers run in network namespaces or containers (fleet up "
                f"--runtime netns|docker); the fleet in {directory} runs them as plain "
                "processes on loopback, which no partition can separate",
            )
    if plan.kill_mqtt_at is not None and record.get("mqtt") is None:
        raise InvalidInput("--kill-mqtt-at", "a fleet that runs its own MQTT broker (not --mqtt)")
    if plan.algorithm is not None:
        changed = await asyncio.to_thread(
            fleet.set_serve_option, directory, "--algorithm", plan.algorithm
        )
        if progress and changed:
            progress(f"restarted {', '.join(changed)} with --algorithm {plan.algorithm}")
    shared = record.get("docker", {}).get("runs")
    chaos = _Chaos(directory, plan, _run_dir(run_dir, shared), progress)
    chaos._event("start", fleet=str(directory), run_dir=str(chaos.run_dir))
    if plan.jobs:
        await chaos.stream()
    if plan.burst_clients:
        await chaos.wait_for_restarts()
        await chaos.burst()
    await chaos.wait_for_restarts()
    finals = await chaos.settle()
    chaos._event("end")
    return chaos.report(finals)


_ROWS = (
    ("submitted", "submissions"),
    ("accepted", "accepted (answered with a job id)"),
    ("replayed", "answered as a repeat (Idempotent-Replayed)"),
    ("unanswered", "unanswered (the client gave up)"),
    ("done", "done"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
    ("not_terminal", "not terminal"),
    ("unknown", "owner unreachable at the end"),
    ("forgotten", "forgotten by their owner"),
    ("lost", "LOST (never started)"),
    ("ran_twice", "RAN TWICE"),
    ("reported_otherwise", "ran but reported otherwise"),
    ("ran_unacknowledged", "ran without an acknowledged submission"),
)


def format_report(report: ChaosReport, stories: int = 20) -> str:
    """The report for a person: the counts, the latencies and up to ``stories`` stories."""

    def _at(when: float | None) -> str:
        return "-" if when is None else f"{when - report.began:+9.3f} s"

    out = [f"chaos on {report.fleet} (jobs' own log: {report.run_dir}/{RUN_LOG})"]
    out.append(f"  started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report.began))}")
    kills = sum(e["event"] == "killed" for e in report.events)
    mqtt = sum(e["event"] == "mqtt killed" for e in report.events)
    cuts = [e for e in report.events if e["event"] == "partitioned"]
    line = f"  {count(kills, 'broker kill')} (SIGKILL), {count(mqtt, 'MQTT broker kill')}"
    line += "".join(f", {e['site']} cut off for {e['seconds']:g} s" for e in cuts)
    out.append(line)
    out += [f"  {text:<44} {report.counts[key]:>7}" for key, text in _ROWS]
    lat = report.submit_to_end
    if lat["p50"] is not None:
        out.append(f"  {'submit-to-end p50 / p99 (s)':<44} {lat['p50']:>7.2f} / {lat['p99']:.2f}")
    for story in report.stories[:stories]:
        out.append(f"\n{story['job'] or '(no id)'}: {'; '.join(story['problems'])}")
        if "submitted_at" in story:
            out.append(f"    {_at(story['submitted_at'])}  submitted to {story['entry']}")
        for line in story.get("log", []):
            _, what, at, pid, site = line.split()
            with contextlib.suppress(ValueError):
                out.append(f"    {_at(float(at))}  process {pid} {what}s at {site} (its log)")
        for step in story.get("history", []):
            if "at" in step:
                out.append(f"    {_at(step['at'])}  owner journal: {step['state']} {step['site']}")
        record = story.get("owner_record")
        if record:
            out.append(
                f"    owner's final record: {record.get('state')} at {record.get('site')}, "
                f"started {_at(record.get('started_at'))}, ended {_at(record.get('ended_at'))}"
            )
    if len(report.stories) > stories:
        out.append(f"\n... and {len(report.stories) - stories} more (--json shows all)")
    out.append("\nOK: no loss, no double run" if report.ok else "\nFAILED: see above")
    return "\n".join(out)


def progress_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
