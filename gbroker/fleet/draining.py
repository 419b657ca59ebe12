"""``fleet drain`` and ``undrain``: a site takes no new work, hands its queued jobs back to their
owners and lets its running jobs finish (:mod:`gbroker.daemon.drain`); against a fleet's site or
any broker's URL with an admin token."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gbroker.errors import InvalidInput
from gbroker.fleet.members import FleetError, fleet_token, load, site_member
from gbroker.security.auth import bearer
from gbroker.security.tls import client_context

__all__ = [
    "DRAIN_PATH",
    "DrainTarget",
    "JobsWatch",
    "drain",
    "drain_left",
    "drain_target",
]

DRAIN_PATH = "/api/v1/drain"  # gbroker.daemon.drain.DRAIN_PATH, without importing the daemon


class DrainTarget:
    """Where a site's broker answers, with what token and CA: from a fleet or given."""

    def __init__(
        self, site: str | None, url: str, token: str | None, context: ssl.SSLContext | None
    ) -> None:
        self.site = site
        self.url = url.rstrip("/")
        self.token = token
        self.context = context

    def call(self, body: dict[str, Any] | None = None, path: str = DRAIN_PATH) -> dict[str, Any]:
        """``GET`` the site's drain progress, or ``POST`` ``body`` to change it (``path``:
        another of the broker's routes, e.g. a job's status, which it asks the job's owner)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**bearer(self.token or ""), "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
                answer: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                reason = exc.reason
            raise FleetError(f"{self.url}: {exc.code}: {reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FleetError(f"{self.url} is unreachable: {reason}") from None
        if path == DRAIN_PATH and self.site is not None and answer.get("site") != self.site:
            raise InvalidInput("site", f"the site of {self.url} ({answer.get('site')})", self.site)
        return answer


def drain_target(
    directory: str | Path | None,
    site: str | None,
    url: str | None = None,
    token: str | None = None,
    ca: str | Path | None = None,
) -> DrainTarget:
    """The broker of ``site`` in the fleet in ``directory`` (its admin token and CA from there),
    or the broker at ``url`` with ``token``; then ``site``, if given, must be its site."""
    if url is not None:
        context = client_context(Path(ca)) if ca is not None and url.startswith("https:") else None
        return DrainTarget(site, url, token, context)
    if directory is None or site is None:
        raise InvalidInput("site", "a site of a fleet directory, or a broker URL")
    record = load(directory)
    member = site_member(record, site)
    context = client_context(Path(record["tls"]["ca"])) if record.get("tls") else None
    return DrainTarget(site, member["url"], token or fleet_token(record), context)


def drain(
    target: DrainTarget,
    on: bool = True,
    wait: bool = True,
    timeout: float = 3600.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    poll: float = 0.5,
    migrate: bool = False,
) -> dict[str, Any]:
    """Drain the target's site (``on``) or lift its drain; returns its last progress report.

    With ``migrate``, jobs running there move to other sites by checkpoint instead of running
    to their end there. With ``wait`` (draining only), polls until the site reports
    ``drained``, calling ``progress`` with each report, the last (drained) one too; raises
    FleetError if it is not drained within ``timeout`` seconds (the drain stays on).
    """
    report = target.call({"drain": on, "migrate": migrate} if on else {"drain": False})
    if not (on and wait):
        return report
    deadline = time.monotonic() + timeout
    while True:
        if progress is not None:
            progress(report)
        if report["drained"]:
            break
        if time.monotonic() >= deadline:
            left = drain_left(report)
            raise FleetError(f"{report['site']} not drained after {timeout:g} s: {left}")
        time.sleep(poll)
        report = target.call()
        if not report["draining"]:
            raise FleetError(f"{report['site']}: the drain was lifted meanwhile")
    return report


_LEFT = ("staging", "queued", "claiming", "running", "reporting")


def drain_left(report: dict[str, Any]) -> str:
    """What a drain report says is still at the site, e.g. ``2 queued, 1 running``."""
    left = [f"{report[k]} {k}" for k in _LEFT if report.get(k)]
    return ", ".join(left) or "nothing left"


class JobsWatch:
    """What a drain says of each job at the site as it goes (``fleet drain`` prints it on
    stderr): which it waits for and why (queued: handed back to its owner; running: to end,
    or, with ``migrate``, moving, or staying and why, e.g. pinned to the site by its candidate
    hosts), and where each went once it left. Each job's owner is asked its status (through the
    site's broker) when the drain report changes; a line is said once, until what it says
    changes."""

    def __init__(self, target: DrainTarget) -> None:
        self.target = target
        self.here: set[str] = set()
        self.said: dict[str, str] = {}

    def lines(self, report: dict[str, Any]) -> list[str]:
        """The news since the last report (``report``: the site's drain progress)."""
        site = report["site"]
        jobs = {str(j["id"]): str(j["phase"]) for j in report.get("jobs") or ()}
        news = []
        for job_id in sorted(self.here - set(jobs)):  # gone from the site: where to?
            status = self._status(job_id)
            if status is None:
                news.append(f"{job_id} left {site}")
            elif status.get("state") in ("done", "failed", "cancelled"):
                news.append(f"{job_id} ended at {status.get('site') or site} ({status['state']})")
            elif status.get("site") and status.get("site") != site:
                news.append(f"{job_id} moved to {status['site']} ({status.get('state')})")
            else:
                news.append(f"{job_id} went back to its owner ({status.get('state')})")
            self.said.pop(job_id, None)
        for job_id, phase in sorted(jobs.items()):
            line = self._waiting(job_id, phase, site, bool(report.get("migrate")))
            if self.said.get(job_id) != line:
                self.said[job_id] = line
                news.append(line)
        self.here = set(jobs)
        return news

    def _waiting(self, job_id: str, phase: str, site: str, migrate: bool) -> str:
        if phase in ("staging", "queued"):
            return (
                f"{job_id} {phase} at {site}: handed back to its owner, to go to another site "
                "if one fits it"
            )
        if phase != "running":  # claiming its cores, or fetching its input
            return f"{job_id} {phase} at {site}: waiting for it to start"
        if not migrate:
            return f"{job_id} running at {site}: waiting for it to end"
        status = self._status(job_id) or {}
        move = status.get("move")
        if isinstance(move, dict):
            frozen = ", frozen" if move.get("frozen") else ""
            return f"{job_id} moving from {site} to {move.get('to')}{frozen}"
        if status.get("move_error"):
            return f"{job_id} runs on at {site}: {status['move_error']}; waiting for it to end"
        return f"{job_id} running at {site}: asking its owner to move it"

    def _status(self, job_id: str) -> dict[str, Any] | None:
        try:
            return self.target.call(path=f"/api/v1/jobs/{job_id}")
        except (FleetError, InvalidInput):
            return None
