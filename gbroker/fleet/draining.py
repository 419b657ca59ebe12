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

    def call(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``GET`` the site's drain progress, or ``POST`` ``body`` to change it."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**bearer(self.token or ""), "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + DRAIN_PATH, data=data, headers=headers)
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
        if self.site is not None and answer.get("site") != self.site:
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
    ``drained``, calling ``progress`` with each report that differs from the one before;
    raises FleetError if it is not drained within ``timeout`` seconds (the drain stays on).
    """
    report = target.call({"drain": on, "migrate": migrate} if on else {"drain": False})
    if not (on and wait):
        return report
    deadline = time.monotonic() + timeout
    shown: dict[str, Any] | None = None
    while not report["drained"]:
        counts = {k: report.get(k) for k in _LEFT}
        if progress is not None and counts != shown:
            progress(report)
            shown = counts
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
