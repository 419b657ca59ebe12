"""The fleet dashboard: one page at ``/fleet``, served by any broker, showing the whole fleet live.

Theory of operation. The page (``static/dashboard.html`` with its script and styles, and the
vendored charting library uPlot, ``static/uplot/``) is static: no build step, no template. Its
script polls this broker's ``GET /api/v1/fleet`` every two seconds, which gathers, in parallel and
with the caller's own token, each site's ``/api/v1/info`` (its cores, free cores, queue, health,
and how it sees its neighbours), the jobs it owns (``/api/v1/jobs``) and the F(j) terms of its
recent decisions (``/api/v1/decisions``); a site that does not answer within two seconds is shown
down. The script draws the neighbourhood graph (each site's cores, load and liveness, and the
jobs that just went from their entry broker to another site), plots throughput, wait and
utilization over time, lists the latest jobs, and tells one job's story on click (its history,
from its owner, and the terms of the decision that placed it).

Decisions are recorded (:meth:`Dashboard.record`, called by the driver for each submission) only
while someone watches, that is while any dashboard asked this broker for them in the last
:data:`WATCH_SECONDS`: the ranking is redone term by term (:func:`gbroker.core.ranking.f_terms`),
which a busy broker should not pay for nobody.

Who may look. Every page and every answer here is behind the client token, as the rest of the
client API (:mod:`gbroker.daemon.guard`); a browser cannot send an ``Authorization`` header by
itself, so ``/fleet`` without a valid session shows a sign-in form (no data, no script), which
posts the token to ``POST /fleet/login``. A valid token opens a session: a random id in an
``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over HTTPS) mapped, in this broker's memory
only, to the user and their token; the token itself never goes into a URL, a page or a script,
and the cookie opens ``GET`` requests only (nothing that changes state). The guard's Host and
Origin checks hold for all of it (a foreign page cannot post a login or read an answer). Every
value the page shows is set as text (``textContent``), never parsed as HTML, and the page is
served with a Content-Security-Policy that allows scripts from this broker only.
"""

from __future__ import annotations

import asyncio
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

__all__ = ["SESSION_COOKIE", "Dashboard", "Sessions"]

SESSION_COOKIE = "gbroker_session"  # gbroker.daemon.guard reads it too
SESSION_SECONDS = 12 * 3600.0
"""How long a dashboard session lasts (it also ends when the broker restarts)."""
WATCH_SECONDS = 120.0
DECISIONS_KEPT = 1000
ASK_SECONDS = 2.0
"""How long the dashboard's gathering waits for each site."""
LISTED = 200
"""The most jobs asked of each owner."""

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
        """The user of a live session (what the guard asks)."""
        found = self.find(session, time.time())
        return None if found is None else found[0]

    def end(self, session: str | None) -> None:
        self._open.pop(session or "", None)


def _page(name: str) -> str:
    return (STATIC / name).read_text()


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
    ) -> None:
        """``sites``: every site's URL (this broker's own included, as peers reach it);
        ``arcs``: the neighbourhood graph; ``session``: the HTTP session to ask sites with;
        ``broker_candidates``: the owner's candidates for a job (its view, adjusted);
        ``submitter_of``: who submitted a job this broker owns (None: unknown now)."""
        self.site = site
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
        for site, (info, listing, decided) in zip(urls, answers, strict=True):
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
        jobs.sort(key=lambda j: j.get("submitted_at") or 0.0)
        return web.json_response(
            {
                "served_by": self.site,
                "now": time.time(),
                "user": user.name,
                "sites": sites,
                "arcs": self.arcs,
                "jobs": jobs[-LISTED:],
                "decisions": {j["id"]: decisions[j["id"]] for j in jobs if j["id"] in decisions},
            },
            headers={"Cache-Control": "no-store"},
        )

    async def _ask(
        self, url: str, token: str, admin: bool
    ) -> tuple[dict[str, Any] | None, list[Any] | None, dict[str, Any] | None]:
        """One site's info, the jobs it owns and its decisions; Nones if it does not answer."""
        http = self.session()
        if http is None:
            return None, None, None
        headers = {"Authorization": f"Bearer {token}"}
        timeout = aiohttp.ClientTimeout(total=ASK_SECONDS)
        listing = f"/api/v1/jobs?limit={LISTED}" + ("&all=1" if admin else "")
        paths = ("/api/v1/info", listing, "/api/v1/decisions")

        async def get(path: str) -> Any:
            async with http.get(url + path, headers=headers, timeout=timeout) as response:
                if response.status != 200:
                    return None
                return await response.json()

        try:
            info, jobs, decided = await asyncio.gather(*(get(p) for p in paths))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None, None, None
        return (
            info,
            None if jobs is None else jobs.get("jobs"),
            None if decided is None else decided.get("decisions"),
        )
