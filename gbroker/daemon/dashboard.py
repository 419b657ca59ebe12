"""The fleet dashboard: one page at ``/fleet``, served by any broker, showing the whole fleet live.

Theory of operation. The page (``static/dashboard.html`` with its script and styles, and the
vendored charting library uPlot) is static: no build step, no template. Its script polls this
broker's ``GET /api/v1/fleet``, which gathers in parallel, with the caller's own token, each
site's info, the jobs it owns, the F(j) terms of its recent decisions and its busy cores over
the last ten minutes; a site that does not answer in time is shown down.

Utilization is the broker's to remember, not the page's: a page that opens must show the last
ten minutes, not the seconds since it opened. Each broker keeps its own site's busy cores as a
time integral per wall-clock bucket (:class:`Utilization`, told of every change by the driver's
scheduling passes; bounded), buckets aligned so every site's line up. History starts with the
broker. Decisions are recorded (:meth:`Dashboard.record`) only while some dashboard asked for
them in the last :data:`WATCH_SECONDS`: redoing the ranking term by term is a cost a busy broker
should not pay for nobody.

Who may look: every answer with data is behind the client token. A browser cannot send an
``Authorization`` header by itself, so ``/fleet`` without a session shows a sign-in form that
posts the token once; a session is a random id in an ``HttpOnly``, ``SameSite=Strict`` cookie
mapped, in memory only, to the user, and opens ``GET`` requests only. The static assets hold
nothing of the fleet and are served without a session. Every value is set as text, never parsed
as HTML, under a Content-Security-Policy. The page: docs/OBSERVE.md; sessions: docs/SECURITY.md.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gbroker.core.dispatch import BrokerCommand, Dispatch, SiteView
from gbroker.core.model import Job
from gbroker.core.ranking import f_terms
from gbroker.security.auth import Tokens, User

__all__ = [
    "BUCKET_SECONDS",
    "HISTORY_SECONDS",
    "SESSION_COOKIE",
    "Dashboard",
    "Sessions",
    "Utilization",
]

SESSION_COOKIE = "gbroker_session"  # gbroker.daemon.guard reads it too
SESSION_SECONDS = 12 * 3600.0
"""How long a dashboard session lasts (it also ends when the broker restarts)."""
WATCH_SECONDS = 120.0
DECISIONS_KEPT = 1000
ASK_SECONDS = 2.0
"""How long the dashboard's gathering waits for each site."""
LISTED = 200
"""The most jobs asked of each owner."""
HISTORY_SECONDS = 600
"""How far back the plots reach: the page shows the last ten minutes as soon as it opens."""
BUCKET_SECONDS = 10
"""Seconds per plotted bucket (the page's throughput and wait buckets are the same)."""

STATIC = Path(__file__).parent / "static"
_ASSETS = {
    "dashboard.js": ("dashboard.js", "application/javascript"),
    "dashboard.css": ("dashboard.css", "text/css"),
    "uplot.js": ("uplot/uPlot.iife.min.js", "application/javascript"),
    "uplot.css": ("uplot/uPlot.min.css", "text/css"),
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form post say Origin: null
    "Cache-Control": "no-store",
}


class Sessions:
    """Dashboard sessions: random ids mapped to a user and their token, in memory."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens
        self._open: dict[str, tuple[User, str, float]] = {}

    def start(self, token: str, now: float) -> str | None:
        """A new session's id for a valid ``token``; None for an invalid one."""
        user = self.tokens.identify(f"Bearer {token}")
        if user is None:
            return None
        for key in [k for k, (_, _, until) in self._open.items() if until <= now]:
            del self._open[key]
        session = secrets.token_urlsafe(32)
        self._open[session] = (user, token, now + SESSION_SECONDS)
        return session

    def find(self, session: str | None, now: float) -> tuple[User, str] | None:
        """The user and token of a live session, else None."""
        found = self._open.get(session or "")
        if found is None or found[2] <= now:
            return None
        return found[0], found[1]

    def user(self, session: str | None) -> User | None:
        """The user of a live session (what the guard asks), while its token is still valid:
        a user removed from the token file loses their sessions with it."""
        found = self.find(session, time.time())
        if found is None:
            return None
        user = self.tokens.identify(f"Bearer {found[1]}")
        if user is None:
            self.end(session)
        return user

    def end(self, session: str | None) -> None:
        self._open.pop(session or "", None)


def _page(name: str) -> str:
    return (STATIC / name).read_text()


class Utilization:
    """A site's busy cores over the last :data:`HISTORY_SECONDS`: per wall-clock bucket of
    :data:`BUCKET_SECONDS`, the time integral of its busy cores and how long it was observed.
    Told of each change (:meth:`observe`); bounded (one bucket more than the history)."""

    def __init__(self, now: float, busy: int) -> None:
        self._since = now
        self._busy = busy
        self._buckets: dict[int, list[float]] = {}  # bucket number -> [core-seconds, seconds]

    def observe(self, now: float, busy: int) -> None:
        """The site has ``busy`` cores busy from ``now`` on."""
        self._close(now)
        self._busy = busy

    def series(self, now: float) -> list[tuple[float, float | None]]:
        """Each bucket of the last :data:`HISTORY_SECONDS` up to ``now``'s (its start), with
        the mean of its busy cores over the part of it observed; None where none was."""
        self._close(now)
        last = math.floor(now / BUCKET_SECONDS)
        out: list[tuple[float, float | None]] = []
        for number in range(last - HISTORY_SECONDS // BUCKET_SECONDS + 1, last + 1):
            bucket = self._buckets.get(number)
            mean = bucket[0] / bucket[1] if bucket is not None and bucket[1] > 0 else None
            out.append((number * BUCKET_SECONDS, mean))
        return out

    def _close(self, now: float) -> None:
        """Add the level since the last change, up to ``now``, to the buckets it spans."""
        at = max(self._since, now - HISTORY_SECONDS - BUCKET_SECONDS)  # older is dropped anyway
        while at < now:
            number = math.floor(at / BUCKET_SECONDS)
            end = min(now, (number + 1) * BUCKET_SECONDS)
            bucket = self._buckets.setdefault(number, [0.0, 0.0])
            bucket[0] += self._busy * (end - at)
            bucket[1] += end - at
            at = end
        self._since = max(self._since, now)  # a clock set back: nothing is counted twice
        oldest = math.floor(now / BUCKET_SECONDS) - HISTORY_SECONDS // BUCKET_SECONDS
        for number in [n for n in self._buckets if n < oldest]:
            del self._buckets[number]


class Dashboard:
    """The dashboard's routes, and the decisions this broker records for it."""

    def __init__(
        self,
        site: str,
        sites: dict[str, str],
        arcs: list[tuple[str, str]],
        cores: dict[str, int],
        sessions: Sessions,
        session: Callable[[], aiohttp.ClientSession | None],
        broker_candidates: Callable[[Job, SiteView], Any],
        submitter_of: Callable[[str], str | None],
        secure: bool,
        utilization: Utilization | None = None,
    ) -> None:
        """``sites``: every site's URL (this broker's own included, as peers reach it);
        ``arcs``: the neighbourhood graph; ``session``: the HTTP session to ask sites with;
        ``broker_candidates``: the owner's candidates for a job (its view, adjusted);
        ``submitter_of``: who submitted a job this broker owns (None: unknown now);
        ``utilization``: this site's busy cores, as the driver tells it."""
        self.site = site
        self.utilization = utilization or Utilization(time.time(), 0)
        self.sites = sites
        self.arcs = arcs
        self.cores = cores
        self.sessions = sessions
        self.session = session
        self.candidates = broker_candidates
        self.submitter_of = submitter_of
        self.secure = secure
        self.decisions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.watched_until = 0.0

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/fleet", self._page),
            web.post("/fleet/login", self._login),
            web.post("/fleet/logout", self._logout),
            web.get("/fleet/static/{name}", self._asset),
            web.get("/api/v1/fleet", self._fleet),
            web.get("/api/v1/decisions", self._decisions),
            web.get("/api/v1/utilization", self._utilization),
        ]

    # -- decisions -------------------------------------------------------------------------------

    def record(self, job: Job, commands: list[BrokerCommand], view: SiteView) -> None:
        """Keep the F(j) terms of a submission's decision, while someone watches."""
        if time.monotonic() > self.watched_until:
            return
        chosen = [c.site for c in commands if isinstance(c, Dispatch)]
        terms = f_terms(job.rank, self.candidates(job, view))
        self.decisions[job.id] = {
            "at": time.time(),
            "entry": self.site,
            "rank": job.rank,
            "chosen": chosen,
            "terms": [
                {
                    "site": t.site,
                    "transfer": t.transfer,
                    "free": t.free,
                    "load": t.load,
                    "value": t.value,
                    "waits": t.waits,
                    "transfer_time": t.transfer_time,
                }
                for t in terms
            ],
        }
        while len(self.decisions) > DECISIONS_KEPT:
            self.decisions.popitem(last=False)

    async def _decisions(self, request: web.Request) -> web.Response:
        from gbroker.daemon.guard import USER

        self.watched_until = time.monotonic() + WATCH_SECONDS
        user: User = request[USER]
        shown = {
            job_id: decision
            for job_id, decision in self.decisions.items()
            if user.admin or user.may_see(self.submitter_of(job_id))
        }
        return web.json_response({"site": self.site, "decisions": shown})

    async def _utilization(self, request: web.Request) -> web.Response:
        """This site's mean busy cores per bucket over the last :data:`HISTORY_SECONDS`."""
        series = self.utilization.series(time.time())
        return web.json_response(
            {
                "site": self.site,
                "cores": self.cores[self.site],
                "bucket": BUCKET_SECONDS,
                "series": [[start, busy] for start, busy in series],
            }
        )

    # -- the page and its sign-in ----------------------------------------------------------------

    def _signed_in(self, request: web.Request) -> tuple[User, str] | None:
        """The caller and their token: from ``Authorization`` (set by the guard) or a session."""
        from gbroker.daemon.guard import USER

        header = request.headers.get("Authorization", "")
        if USER in request and header.startswith("Bearer "):
            return request[USER], header.removeprefix("Bearer ").strip()
        return self.sessions.find(request.cookies.get(SESSION_COOKIE), time.time())

    async def _page(self, request: web.Request) -> web.Response:
        if self._signed_in(request) is None:
            return web.Response(
                text=_page("login.html"), content_type="text/html", headers=_HEADERS, status=401
            )
        return web.Response(text=_page("dashboard.html"), content_type="text/html",
                            headers=_HEADERS)  # fmt: skip

    async def _login(self, request: web.Request) -> web.Response:
        form = await request.post()
        token = form.get("token")
        session = self.sessions.start(token, time.time()) if isinstance(token, str) else None
        if session is None:
            page = _page("login.html").replace(
                "<!--error-->", '<p class="error">That token is not valid here.</p>'
            )
            return web.Response(text=page, content_type="text/html", headers=_HEADERS, status=401)
        response = web.HTTPSeeOther("/fleet")
        response.set_cookie(
            SESSION_COOKIE,
            session,
            max_age=int(SESSION_SECONDS),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.secure,
        )
        raise response

    async def _logout(self, request: web.Request) -> web.Response:
        self.sessions.end(request.cookies.get(SESSION_COOKIE))
        response = web.HTTPSeeOther("/fleet")
        response.del_cookie(SESSION_COOKIE, path="/")
        raise response

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        found = _ASSETS.get(request.match_info["name"])
        if found is None:
            return web.json_response({"error": "no such file"}, status=404)
        path, kind = found
        return web.Response(
            body=(STATIC / path).read_bytes(),
            content_type=kind,
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )

    # -- the fleet's facts -----------------------------------------------------------------------

    async def _fleet(self, request: web.Request) -> web.Response:
        found = self._signed_in(request)
        assert found is not None  # the guard let the request in
        user, token = found
        self.watched_until = time.monotonic() + WATCH_SECONDS
        urls = dict(self.sites)
        answers = await asyncio.gather(
            *(self._ask(url, token, user.admin) for url in urls.values())
        )
        sites: list[dict[str, Any]] = []
        jobs: list[dict[str, Any]] = []
        decisions: dict[str, Any] = {}
        busy: dict[float, list[float]] = {}  # bucket start -> [busy cores, their sites' cores]
        for site, (info, listing, decided, used) in zip(urls, answers, strict=True):
            sites.append(
                {
                    "name": site,
                    "url": urls[site],
                    "cores": self.cores[site],
                    "alive": info is not None,
                    "state": None if info is None else info.get("state"),
                    "draining": None if info is None else info.get("draining"),
                    "health": None if info is None else (info.get("health") or {}).get("ok"),
                    "neighbours": None if info is None else info.get("neighbours"),
                }
            )
            jobs.extend(listing or ())
            decisions.update(decided or {})
            if info is not None:  # the live sites' cores, as the graph's rings show them
                for start, cores in used or ():
                    if cores is not None:
                        total = busy.setdefault(start, [0.0, 0.0])
                        total[0] += cores
                        total[1] += self.cores[site]
        jobs.sort(key=lambda j: j.get("submitted_at") or 0.0)
        now = time.time()
        return web.json_response(
            {
                "served_by": self.site,
                "now": now,
                "user": user.name,
                "sites": sites,
                "arcs": self.arcs,
                "jobs": jobs[-LISTED:],
                "decisions": {j["id"]: decisions[j["id"]] for j in jobs if j["id"] in decisions},
                "utilization": _percent_busy(busy, now),
            },
            headers={"Cache-Control": "no-store"},
        )

    async def _ask(
        self, url: str, token: str, admin: bool
    ) -> tuple[dict[str, Any] | None, list[Any] | None, dict[str, Any] | None, list[Any] | None]:
        """One site's info, the jobs it owns, its decisions and its busy cores per bucket;
        Nones if it does not answer."""
        http = self.session()
        if http is None:
            return None, None, None, None
        headers = {"Authorization": f"Bearer {token}"}
        timeout = aiohttp.ClientTimeout(total=ASK_SECONDS)
        listing = f"/api/v1/jobs?limit={LISTED}" + ("&all=1" if admin else "")
        paths = ("/api/v1/info", listing, "/api/v1/decisions", "/api/v1/utilization")

        async def get(path: str) -> Any:
            async with http.get(url + path, headers=headers, timeout=timeout) as response:
                if response.status != 200:
                    return None
                return await response.json()

        try:
            info, jobs, decided, used = await asyncio.gather(*(get(p) for p in paths))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None, None, None, None
        return (
            info,
            None if jobs is None else jobs.get("jobs"),
            None if decided is None else decided.get("decisions"),
            None if used is None else used.get("series"),
        )


def _percent_busy(busy: dict[float, list[float]], now: float) -> list[list[float | None]]:
    """The live sites' busy share of their cores (%), per bucket of the last ten minutes up to
    ``now``'s: ``[bucket end, percent or None]`` (the page plots a bucket at its end)."""
    last = math.floor(now / BUCKET_SECONDS) * BUCKET_SECONDS
    out: list[list[float | None]] = []
    for start in range(last - HISTORY_SECONDS + BUCKET_SECONDS, last + 1, BUCKET_SECONDS):
        cores, total = busy.get(start, (0.0, 0.0))
        out.append([start + BUCKET_SECONDS, 100 * cores / total if total else None])
    return out
