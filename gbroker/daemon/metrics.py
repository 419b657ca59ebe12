"""What a broker daemon shows an operator: Prometheus metrics, the site's facts, a status page.

Theory of operation. :class:`DaemonMetrics` holds one daemon's metrics in its *own*
:class:`~prometheus_client.CollectorRegistry`: a process may run several daemons (the tests do),
and the global registry would mix their counts. The daemon calls small hooks at the moments that
matter (a submission acknowledged, a dispatch decided, a report received), and ``GET /metrics``
renders the registry in the Prometheus text format. Two kinds of figures:

- **Events** are counters and histograms updated by the hooks. Job counters are kept by the
  job's *owner* (the broker that acknowledged the submission), so summing them over a fleet
  counts every job once, wherever it ran: submitted (requests received), accepted (made durable
  and acknowledged with 201), started, finished by outcome, cancelled. Dispatches are labelled by
  target site, withdrawals and claims by their answer, failed peer calls by peer and call.
- **State** (the site's cores and queue, the owned jobs by state) is read when scraped, by a
  collector that calls back into the daemon, so it is never stale and costs nothing between
  scrapes.

The three latency histograms have buckets chosen for what they must tell apart: the dispatch
decision (the core's handling of one ``JobSubmitted``, pure CPU) from 10 µs to 100 ms, fine
around 0.1-2 ms; the durable submission (request read to acknowledgement, a journal fsync
included) from 0.25 ms to 10 s; submit-to-start (the owner's submission time to the ``started``
report's time) from 5 ms to an hour, since a job may legitimately queue that long. Quantiles
read from buckets (:func:`bucket_quantile`) are upper bounds: the true value is at most the
bound of the bucket that holds it.

:func:`describe` gathers the facts ``/api/v1/info`` returns (site, state, neighbours as this
broker's DCSMon view has them, with their age and, where measured, their forecast CPU
availability ``cpu``, the latest owned jobs) and :func:`status_page`
renders the same facts as a small self-contained HTML page, every value escaped.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter as _Tally
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from html import escape
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from dcsmon.view import NeighbourhoodView
from gbroker.core.model import SiteState
from gbroker.core.states import JobState
from gbroker.errors import InvalidInput

__all__ = [
    "CONTENT_TYPE",
    "DECISION_BUCKETS",
    "START_BUCKETS",
    "SUBMISSION_BUCKETS",
    "DaemonMetrics",
    "bucket_quantile",
    "describe",
    "status_page",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

DECISION_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7.5e-4,
    1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 0.1,
)  # fmt: skip
SUBMISSION_BUCKETS = (
    2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
JOURNAL_BUCKETS = (
    1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 1e-2, 1.5e-2, 2e-2, 3e-2, 5e-2, 7.5e-2,
    0.1, 0.2, 0.5, 1.0, 2.0,
)  # fmt: skip
START_BUCKETS = (
    5e-3, 1e-2, 2.5e-2, 5e-2, 7.5e-2, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip
MOVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
MOVE_STEPS = ("checkpoint", "bundle", "transfer", "unpack", "restore")
"""The steps of a move that ``gbroker_move_step_seconds`` times."""

LATEST_JOBS = 20  # owned jobs shown by the status page and /api/v1/info


class OwnedJob(Protocol):
    """What the metrics read of a job the broker owns (the daemon's ``JobStatus``)."""

    @property
    def state(self) -> JobState: ...
    @property
    def submitted_at(self) -> float: ...
    def as_dict(self) -> dict[str, Any]: ...


class OwnedJobs(Protocol):
    """The owned jobs in the order the broker took them (``dict.values()`` is one)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[OwnedJob]: ...
    def __reversed__(self) -> Iterator[OwnedJob]: ...


class _StateCollector(Collector):
    """The gauges read at scrape time: the site's state and the owned jobs by state."""

    def __init__(
        self, site_state: Callable[[], SiteState], owned: Callable[[], Mapping[JobState, int]]
    ) -> None:
        self._site_state = site_state
        self._owned = owned

    def collect(self) -> Iterator[Metric]:
        state = self._site_state()
        for name, doc, value in (
            ("total_cores", "n_j: the site's cores", state.total_cores),
            ("free_cores", "c_j: the site's free cores", state.free_cores),
            ("queued_jobs", "q_j: jobs queued at the site", state.queued),
            ("running_jobs", "s_j: jobs running at the site", state.running),
            ("draining", "1 while the site drains (takes no new work)", int(state.draining)),
        ):
            yield GaugeMetricFamily(f"gbroker_site_{name}", doc, value=value)
        by_state = self._owned()
        owned = GaugeMetricFamily(
            "gbroker_owned_jobs", "Jobs this broker owns, by state", labels=["state"]
        )
        for job_state in JobState:  # every state, zeros included, so series never vanish
            owned.add_metric([job_state.value], by_state.get(job_state, 0))
        yield owned


class _ExcludedCollector(Collector):
    """Which sites the owner's black-hole protection excludes now, and until when."""

    def __init__(self, excluded: Callable[[], Mapping[str, float]]) -> None:
        self._excluded = excluded

    def collect(self) -> Iterator[Metric]:
        excluded = self._excluded()
        flag = GaugeMetricFamily(
            "gbroker_site_excluded",
            "1 while this owner excludes the site as a black hole",
            labels=["site"],
        )
        until = GaugeMetricFamily(
            "gbroker_site_excluded_until_seconds",
            "End of the site's cool-down (Unix time)",
            labels=["site"],
        )
        for site, end in sorted(excluded.items()):
            flag.add_metric([site], 1)
            until.add_metric([site], end)
        yield flag
        yield until


class _CpuCollector(Collector):
    """Each site's forecast CPU availability, as this broker knows it: its own site's (DCSMon's
    sensor) and each neighbour's (their published states); a site not measured is left out."""

    def __init__(
        self, site: str, site_state: Callable[[], SiteState], view: NeighbourhoodView
    ) -> None:
        self._site = site
        self._site_state = site_state
        self._view = view

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "gbroker_site_cpu_availability",
            "Forecast fraction of a core a new process gets at the site (NWS's CPU "
            "availability: this site's own sensor, the neighbours' published states)",
            labels=["site"],
        )
        known = {
            name: seen.state.cpu for name in self._view.sites() if (seen := self._view.get(name))
        }
        known[self._site] = self._site_state().cpu
        for name, cpu in sorted(known.items()):
            if cpu is not None:
                gauge.add_metric([name], cpu)
        yield gauge


class DaemonMetrics:
    """One daemon's metrics; see the module docstring. ``render()`` is the /metrics body."""

    def __init__(
        self,
        site: str,
        site_state: Callable[[], SiteState],
        owned: Callable[[], Mapping[JobState, int]],
    ) -> None:
        """``owned``: how many jobs the broker owns in each state (a state it lacks may be
        missing), read at each scrape."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("gbroker_broker", "The broker's site", registry=r).info({"site": site})
        self.submitted = Counter(
            "gbroker_jobs_submitted", "Submission requests received (valid or not)", registry=r
        )
        self.accepted = Counter(
            "gbroker_jobs_accepted", "Submissions made durable and acknowledged", registry=r
        )
        self.started = Counter("gbroker_jobs_started", "Owned jobs that started", registry=r)
        self.finished = Counter(
            "gbroker_jobs_finished", "Owned jobs that ended, by outcome", ["outcome"], registry=r
        )
        self.cancelled = Counter("gbroker_jobs_cancelled", "Owned jobs cancelled", registry=r)
        self.dispatches = Counter(
            "gbroker_dispatches", "Jobs (and replicas) dispatched, by target site", ["site"],
            registry=r,
        )  # fmt: skip
        self.withdrawals = Counter(
            "gbroker_withdrawals", "Withdrawals asked of a site, by answer", ["result"], registry=r
        )
        self.claims = Counter(
            "gbroker_claims", "Replica claims answered, by answer", ["result"], registry=r
        )
        self.black_holes = Counter(
            "gbroker_black_hole_exclusions",
            "Sites this owner excluded for failing its jobs fast, by site",
            ["site"],
            registry=r,
        )
        self.peer_failures = Counter(
            "gbroker_peer_call_failures", "Peer calls that failed", ["peer", "call"], registry=r
        )
        self.decision_seconds = Histogram(
            "gbroker_dispatch_decision_seconds",
            "Wall time of the core broker's handling of one submission",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.submission_seconds = Histogram(
            "gbroker_durable_submission_seconds",
            "Submission request read to acknowledgement, the journal commit included",
            buckets=SUBMISSION_BUCKETS,
            registry=r,
        )
        self.journal_seconds = Histogram(
            "gbroker_journal_commit_seconds",
            "A journal write's queueing to its transaction's commit (fsync included), by kind: "
            "submit, update (an owned job's state), launch (the intent before a start), other",
            ["kind"],
            buckets=JOURNAL_BUCKETS,
            registry=r,
        )
        self.start_seconds = Histogram(
            "gbroker_submit_to_start_seconds",
            "An owned job's submission to its start as the executing site reported it",
            buckets=START_BUCKETS,
            registry=r,
        )
        self.move_seconds = Histogram(
            "gbroker_move_step_seconds",
            "Each step of a running job's move, where it ran: checkpoint and bundle at the "
            "source, transfer (the bundle fetched), unpack and restore at the target",
            ["step"],
            buckets=MOVE_BUCKETS,
            registry=r,
        )
        self.move_bytes = Counter(
            "gbroker_move_bundle_bytes", "Bytes of checkpoint bundles this site sent", registry=r
        )
        self.moves = Counter(
            "gbroker_moves",
            "Moves of running jobs this owner began, by outcome: moved (it runs at the target), "
            "off (it runs on where it was)",
            ["outcome"],
            registry=r,
        )
        for step in MOVE_STEPS:
            self.move_seconds.labels(step)
        for outcome in ("moved", "off"):
            self.moves.labels(outcome)
        # Label values known in advance are created now, so they show as 0 before the first
        # event instead of appearing later (rate() over a new series misses its first step).
        for outcome in ("done", "failed"):
            self.finished.labels(outcome)
        for result in ("withdrawn", "too_late"):
            self.withdrawals.labels(result)
        for result in ("granted", "denied"):
            self.claims.labels(result)
        r.register(_StateCollector(site_state, owned))

    # -- hooks (one line each at the daemon's call sites) ------------------------------------------

    def submission_received(self) -> None:
        self.submitted.inc()

    def submission_accepted(self, seconds: float) -> None:
        self.accepted.inc()
        self.submission_seconds.observe(seconds)

    def journal_committed(self, kind: str, seconds: float) -> None:
        """A journal write committed (called from the journal's writer thread)."""
        self.journal_seconds.labels(kind).observe(seconds)

    def decided(self, seconds: float) -> None:
        self.decision_seconds.observe(seconds)

    def dispatched(self, site: str) -> None:
        self.dispatches.labels(site).inc()

    def withdrawal(self, withdrawn: bool) -> None:
        self.withdrawals.labels("withdrawn" if withdrawn else "too_late").inc()

    def claim(self, granted: bool) -> None:
        self.claims.labels("granted" if granted else "denied").inc()

    def move_step(self, step: str, seconds: float) -> None:
        """One step of a move took ``seconds`` here (:data:`MOVE_STEPS`)."""
        self.move_seconds.labels(step).observe(seconds)

    def peer_call_failed(self, peer: str, path: str) -> None:
        self.peer_failures.labels(peer, path.rsplit("/", 1)[-1]).inc()

    def black_hole_excluded(self, site: str) -> None:
        self.black_holes.labels(site).inc()

    def watch_site_health(self, excluded: Callable[[], Mapping[str, float]]) -> None:
        """Show ``gbroker_site_excluded{site}``: 1 for each site ``excluded()`` names (site ->
        end of its cool-down), read when scraped."""
        self.registry.register(_ExcludedCollector(excluded))

    def watch_cpu(
        self, site: str, site_state: Callable[[], SiteState], view: NeighbourhoodView
    ) -> None:
        """Show ``gbroker_site_cpu_availability{site}`` for this site and the neighbours in
        ``view`` whose states carry it, read when scraped."""
        self.registry.register(_CpuCollector(site, site_state, view))

    def job_started(self, submitted_at: float, started_at: float) -> None:
        self.started.inc()
        # Two hosts' clocks meet here (the owner's and the executing site's): never negative.
        self.start_seconds.observe(max(0.0, started_at - submitted_at))

    def job_finished(self, ok: bool) -> None:
        self.finished.labels("done" if ok else "failed").inc()

    def job_cancelled(self) -> None:
        self.cancelled.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """An upper bound of the q-quantile from cumulative histogram buckets ``(le, count)``.

    The answer is the bound of the first bucket holding the q-th observation (``inf`` if only
    the +Inf bucket does); NaN when there are no observations.
    """
    if not 0.0 <= q <= 1.0:
        raise InvalidInput("q", "a quantile in [0, 1]", q)
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] == 0:
        return math.nan
    rank = q * ordered[-1][1]
    for bound, count in ordered:
        if count >= rank and count > 0:
            return bound
    return math.inf  # unreachable: the last bucket holds every observation


# -- the site's facts: /api/v1/info and the status page ------------------------------------------


def _state(state: SiteState) -> dict[str, Any]:
    """A state's figures; ``shrinkable`` and ``shareable`` (what shrinking malleable jobs, or
    SD-Policy's mates, would give at once) when there are some; ``cpu`` (the forecast CPU
    availability) only when it is measured."""
    figures: dict[str, Any] = {
        "total_cores": state.total_cores,
        "free_cores": state.free_cores,
        "queued": state.queued,
        "running": state.running,
    }
    if state.shrinkable:
        figures["shrinkable"] = state.shrinkable
    if state.shareable:
        figures["shareable"] = state.shareable
    if state.cpu is not None:
        figures["cpu"] = state.cpu
    return figures


def describe(
    site: str,
    url: str,
    state: SiteState,
    neighbours: Iterable[str],
    view: NeighbourhoodView,
    owned: OwnedJobs,
    now: float,
    latest: int = LATEST_JOBS,
    lost: Collection[str] | None = None,
) -> dict[str, Any]:
    """The facts an operator asks a broker for, as JSON-ready values.

    A neighbour is ``reported`` once DCSMon (or a heartbeat) has delivered its state (``age`` in
    seconds then says how stale it is), ``assumed`` while the broker only has the topology's idle
    guess (after the neighbour grace), ``unheard`` while it has heard nothing of it yet, and
    ``offline`` once it is lost (its last-will, missed heartbeats). Neither of the last two has a
    state, and no jobs go there. ``owned`` holds
    the owned jobs in the order they were taken, so the latest are its last: reading them costs
    ``latest`` steps, not a sort of every job the broker ever owned.
    """
    rows: list[dict[str, Any]] = []
    for name in neighbours:
        seen = view.get(name)
        if seen is None:
            status = "offline" if lost is None or name in lost else "unheard"
            rows.append({"site": name, "status": status, "state": None, "age": None})
        elif seen.observed_at == 0.0:  # the daemon seeds the view with observed_at = 0
            rows.append(
                {"site": name, "status": "assumed", "state": _state(seen.state), "age": None}
            )
        else:
            rows.append(
                {
                    "site": name,
                    "status": "reported",
                    "state": _state(seen.state),
                    "age": round(now - seen.observed_at, 3),
                }
            )
    by_state = _Tally(str(job.state) for job in owned)
    newest = itertools.islice(reversed(owned), latest)
    return {
        "site": site,
        "url": url,
        "now": now,
        "state": _state(state),
        "neighbours": rows,
        "jobs": {
            "owned": len(owned),
            "by_state": dict(sorted(by_state.items())),
            "latest": [job.as_dict() for job in newest],
        },
    }


_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}"
    "th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left}th{background:#eee}"
)


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_text(cell))}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _local_time(at: float | None) -> str | None:
    """A time as the broker's host reads it: ``2026-11-25 10:35:31``."""
    return None if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _seconds_between(start: float | None, end: float | None) -> str | None:
    return None if start is None or end is None else f"{max(0.0, end - start):.1f}"


def _state_cells(state: Mapping[str, Any] | None) -> list[object]:
    keys = ("total_cores", "free_cores", "queued", "running", "cpu")
    return [None] * len(keys) if state is None else [state.get(k) for k in keys]


def status_page(info: Mapping[str, Any], refresh: int = 5) -> str:
    """A self-contained HTML page of :func:`describe`'s facts; no script, every value escaped."""
    site = escape(str(info["site"]))
    state = info["state"]
    jobs = info["jobs"]
    neighbours = _table(
        ("site", "status", "cores", "free", "queued", "running", "cpu", "age (s)"),
        ([n["site"], n["status"], *_state_cells(n["state"]), n["age"]] for n in info["neighbours"]),
    )
    latest = _table(
        ("job", "name", "state", "site", "submitted", "waited (s)", "ran (s)", "exit"),
        (
            [
                j["id"],
                j["name"],
                j["state"],
                j["site"],
                _local_time(j["submitted_at"]),
                _seconds_between(j["submitted_at"], j["started_at"]),
                _seconds_between(j["started_at"], j["ended_at"]),
                j["exit_code"],
            ]
            for j in jobs["latest"]
        ),
    )
    counts = ", ".join(f"{escape(k)} {escape(str(v))}" for k, v in jobs["by_state"].items())
    health = info.get("health")
    parts = (
        " · ".join(
            f"{escape(name)} {'ok' if part['ok'] else 'FAILING'}"
            for name, part in health.items()
            if isinstance(part, dict) and "ok" in part  # a part that reports, not a judged one
        )
        if health
        else "not reported"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{refresh}">'
        f"<title>GBroker {site}</title><style>{_STYLE}</style></head><body>"
        f"<h1>GBroker site {site}</h1>"
        f"<p>{escape(str(info['url']))}</p>"
        f"<p>health: {parts}</p>"
        "<h2>This site</h2>"
        + _table(("cores", "free", "queued", "running", "cpu"), [_state_cells(state)])
        + "<h2>Neighbours (this broker's view)</h2>"
        + neighbours
        + f"<h2>Jobs owned here: {escape(str(jobs['owned']))}</h2>"
        + f"<p>{counts or 'none yet'}</p>"
        + f"<h3>Latest {len(jobs['latest'])}</h3>"
        + latest
        + '<p><a href="/fleet">the fleet dashboard</a> · <a href="/metrics">metrics</a> · '
        '<a href="/api/v1/info">JSON</a></p>'
        "</body></html>\n"
    )
