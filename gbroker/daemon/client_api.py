"""The client API (JSON over HTTP, ``/api/v1``) and what a broker shows an operator.

Theory of operation. A user may talk to any broker. Submitting makes that broker the job's
owner (:meth:`~gbroker.daemon.driver.Driver.submit`; answered 201 only once the job is durable).
Every other request names a job, and a job id names its owner (``<site>.<n>``): a broker answers
for its own jobs and forwards requests about another broker's jobs to it, so a client needs to
know one broker only. A job's output lives at the site that ran it; the owner fetches it from
there over the peer API, naming the file (a site that restarted since no longer knows it).

A job that finished before the owner last started is not in its memory: its status, history and
output are read from the journal when asked (:mod:`gbroker.daemon.history`), until the retention
policy purges it; then its id is unknown (404, naming the policy). A forwarded request whose
owner does not answer within a few seconds is answered 503, naming the owner.

A submission is checked before anything is journaled: its staging URLs (a scheme no broker
stages is a 400 naming the element), the sizes of its external inputs (learned with ``HEAD``, so
F(j) counts them), and its requirements against every site of the fleet (a job no site could
ever run is a 400 naming the requirement and the closest site's value). The checks that need no
network are :mod:`gbroker.jobs.admission`'s, which ``gbroker jsdl check`` runs offline too. A
submission with a parameter sweep is a job array (:mod:`gbroker.daemon.arrays`): its id answers
for all its elements (status, wait, cancel, ``?array=`` listings), each element's ``<id>_<i>``
for itself. A cancel answers the job's status with ``cancelled_now``: false when the job had
already ended (nothing was done). ``/api/v1/jobs/<id>/explain`` (and ``POST /api/v1/explain``
for a description not submitted, whose ``job`` is null: it has no id) shows how the owner ranks
each candidate site for the job now: F(j) term by term, or the requirement the site fails.
``/api/v1/jobs/<id>/files?name=`` returns a file the job staged out to the executing site's
store.

Beside the jobs: ``/api/v1/info`` and the status page at ``/`` (the site's facts,
:mod:`gbroker.daemon.metrics`), ``/metrics`` (Prometheus), and DCSMon's sample of the site at
:data:`~dcsmon.service.STATE_PATH` (what a standalone ``gbroker dcsmon serve`` reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from yarl import URL

from dcsmon.service import STATE_PATH, state_document
from gbroker.core.arrays import element_id
from gbroker.core.model import Observation
from gbroker.core.names import check_job_id, job_owner
from gbroker.core.requirements import closest_unmet
from gbroker.core.states import TERMINAL_STATES
from gbroker.daemon.arrays import ArrayRecord, Arrays
from gbroker.daemon.bounded import Readers
from gbroker.daemon.config import Retention
from gbroker.daemon.driver import Driver, JobStatus, status_of
from gbroker.daemon.explain import explained
from gbroker.daemon.files import bad_request
from gbroker.daemon.guard import PEER, USER
from gbroker.daemon.metrics import CONTENT_TYPE, describe, status_page
from gbroker.daemon.peers import PeerClient
from gbroker.daemon.submissions import Submissions
from gbroker.errors import GBrokerError, InvalidInput
from gbroker.jobs.admission import requirement_refusal
from gbroker.jobs.description import JobDescription
from gbroker.jobs.documents import document_format
from gbroker.jobs.mapping import from_mapping
from gbroker.jobs.sweep import JobArray
from gbroker.protocol.idempotency import HEADER, REPLAYED_HEADER, KeyReused, parse_key
from gbroker.security.auth import User

__all__ = ["ClientApi", "status_of"]

CONNECT_SECONDS = 3.0
"""How long a forwarded request (or an output fetch) waits to reach the owner (or the site)."""
ANSWER_SECONDS = 5.0
"""How long it then waits for each part of the answer (a wait: its own timeout more)."""
MAX_LISTED = 100_000
"""The most jobs one listing shows (``?limit=``; default :data:`LISTED`)."""
LISTED = 1000


def _unreachable(what: str, exc: BaseException) -> web.Response:
    reason = type(exc).__name__ if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
    return web.json_response({"error": f"{what} unreachable ({reason})"[:300]}, status=503)


class ClientApi:
    """The client routes of one broker; ``url()`` is where it serves (for ``/api/v1/info``)."""

    def __init__(
        self,
        driver: Driver,
        peers: PeerClient,
        url: Callable[[], str],
        health: Callable[[], dict[str, Any]],
        retention: Retention | None = None,
        arrays: Arrays | None = None,
        jobs_run_as: str = "",
        readers: Readers | None = None,
    ) -> None:
        self.driver = driver
        self.jobs_run_as = jobs_run_as  # who this site's jobs run as, in words
        # Who reads submissions: sweeps and large documents in worker processes, under the
        # read budget (gbroker.daemon.bounded), never on the event loop.
        self.readers = readers or Readers()
        self.arrays = arrays or Arrays(driver.config.data_dir / "arrays.sqlite", driver)
        self.peers = peers
        self.url = url
        self.health = health
        self.retention = retention or Retention()
        self.submissions = Submissions(driver, driver.config.idempotency_window)
        # What every site of the fleet offers jobs (static): what submissions are checked against.
        self._sites = driver.config.topology.properties()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/info", self._info),
            web.get("/metrics", self._metrics),
            web.get("/", self._status_page),
            web.get("/status", self._status_page),
            web.get(STATE_PATH, self._state),
            web.post("/api/v1/jobs", self._submit),
            web.get("/api/v1/jobs", self._list),
            web.get("/api/v1/jobs/{id}", self._status),
            web.delete("/api/v1/jobs/{id}", self._cancel),
            web.post("/api/v1/jobs/{id}/migrate", self._migrate),
            web.get("/api/v1/jobs/{id}/wait", self._wait),
            web.get("/api/v1/jobs/{id}/history", self._history),
            web.get("/api/v1/jobs/{id}/output/{stream}", self._output),
            web.get("/api/v1/jobs/{id}/files", self._file),
            web.get("/api/v1/jobs/{id}/explain", self._explain),
            web.post("/api/v1/explain", self._explain_description),
            web.get("/peer/v1/output/{id}/{stream}", self._peer_output),
            web.get("/peer/v1/files/{id}", self._peer_file),
        ]

    # -- the site ------------------------------------------------------------------------------

    def _describe(self, user: User) -> dict[str, Any]:
        """The site's facts, with the jobs ``user`` may see, and its health."""
        driver = self.driver
        neighbours = driver.config.topology.neighbours(driver.site)
        state = driver.site_state()
        jobs = [s for s in driver.jobs.values() if user.may_see(s.submitter)]
        info = describe(
            driver.site, self.url(), state, neighbours, driver.view, jobs, time.time(),
            lost=driver.lost,
        )  # fmt: skip
        info["draining"] = state.draining
        info["jobs_run_as"] = self.jobs_run_as
        info["health"] = self.health()
        return info

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self._describe(request[USER]))

    async def _status_page(self, request: web.Request) -> web.Response:
        page = status_page(self._describe(request[USER]))
        return web.Response(text=page, content_type="text/html")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.driver.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _state(self, request: web.Request) -> web.Response:
        """DCSMon's sample of this site: what a standalone ``gbroker dcsmon serve`` reads."""
        observation = Observation(self.driver.site_state(), time.time())
        return web.json_response(state_document(self.driver.site, observation))

    # -- jobs ----------------------------------------------------------------------------------

    async def _submit(self, request: web.Request) -> web.Response:
        began = time.perf_counter()
        metrics = self.driver.metrics
        metrics.submission_received()
        raw = await request.read()
        user = request[USER]
        replayed = False
        try:
            header = request.headers.get(HEADER)
            key = None if header is None else parse_key(header)
            xml = document_format(raw) == "jsdl"
            loaded = await self.readers.load(raw)
            if isinstance(loaded, JobArray):
                return await self._submit_array(loaded, user, key, raw, xml, began)
            if loaded.component_of is not None:
                raise InvalidInput(
                    "component_of", "nothing (the owner broker sets it on a job's components)"
                )
            if loaded.components or loaded.model is not None:
                return await self._submit_components(loaded, user, key, raw, xml, began)
            desc = await self._admissible([loaded], xml)
            if key is None:
                submitted = await self.driver.submit(desc[0], user.name)
                assert submitted is not None  # None only for a key the journal holds
                job_id = submitted
            else:
                await self.arrays.key_taken(user.name, key, raw)
                job_id, replayed = await self.submissions.submit(desc[0], user.name, key, raw)
        except KeyReused as exc:
            return web.json_response({"error": str(exc), "job": exc.job_id}, status=422)
        except GBrokerError as exc:
            return bad_request(exc)
        body = {"id": job_id, "owner": self.driver.site}
        where = {"Location": f"/api/v1/jobs/{job_id}"}  # what a client reads without JSON
        if replayed:
            return web.json_response(body, headers={REPLAYED_HEADER: "true", **where})
        metrics.submission_accepted(time.perf_counter() - began)
        return web.json_response(body, status=201, headers=where)

    async def _admissible(
        self, descs: list[JobDescription], xml: bool, neighbourhood: bool = False
    ) -> list[JobDescription]:
        """The descriptions, with their inputs' sizes learned, if the fleet can run them:
        staging URLs it stages, requirements some site meets (and, with ``neighbourhood``,
        some site this broker may send the job to). Raises the 400's error otherwise."""
        stager = self.driver.stager
        for desc in descs:
            stager.check(desc, xml=xml)  # sources and targets we would never stage: refused
        seen = set()
        for desc in descs:
            job = desc.to_job(f"{self.driver.site}.0", self.driver.site)
            if (job.requirements, job.rank) in seen:
                continue
            seen.add((job.requirements, job.rank))
            unmet = requirement_refusal(desc, xml=xml, sites=self._sites, site=self.driver.site)
            if unmet is not None:
                raise unmet
            if neighbourhood:
                self.driver.broker.check(job, self.driver.decision_view)
        return await stager.learn_sizes(descs, xml=xml)

    async def _submit_array(
        self,
        array: JobArray,
        user: User,
        key: str | None,
        raw: bytes,
        xml: bool,
        began: float,
    ) -> web.Response:
        """A sweep: every element checked (each kind of job against the neighbourhood too),
        then the array made durable, element by element (:mod:`gbroker.daemon.arrays`)."""
        elements = await self._admissible(list(array.elements), xml, neighbourhood=True)
        array = JobArray(tuple(elements), array.document, array.mapping)
        record, replayed = await self.arrays.submit(array, user.name, key, raw)
        body = {
            "id": record.id,
            "owner": self.driver.site,
            "array": True,
            "size": record.size,
            "elements": [element_id(record.id, 1), element_id(record.id, record.size)],
        }
        return self._created(body, replayed, began)

    def _created(self, body: dict[str, Any], replayed: bool, began: float) -> web.Response:
        """The answer to a submission of several jobs: 201, or 200 for a repeat of its key."""
        if replayed:
            return web.json_response(body, headers={REPLAYED_HEADER: "true"})
        self.driver.metrics.submission_accepted(time.perf_counter() - began)
        return web.json_response(body, status=201)

    async def _submit_components(
        self,
        desc: JobDescription,
        user: User,
        key: str | None,
        raw: bytes,
        xml: bool,
        began: float,
    ) -> web.Response:
        """A co-allocated job: its components placed now by its policy (KOALA's), or by the
        AppLeS planner from its performance model (sites, cores and units of work), then the
        job made durable with its placement, component by component, as an array is; each
        component claims its start and the owner grants them all at once or none."""
        [desc] = await self._admissible([desc], xml)
        driver = self.driver
        job = desc.to_job(f"{driver.site}.0", driver.site)
        plan: list[tuple[str, int, int | None]]
        if desc.model is not None:
            planned = driver.broker.plan_model(job, desc.model, driver.decision_view, driver.speeds)
            plan = list(zip(planned.sites, planned.cores, planned.units, strict=True))
        else:
            placed = driver.broker.place_components(
                job,
                [(c.cores, c.site) for c in desc.components],
                desc.coallocation or "worst-fit",
                driver.decision_view,
            )
            plan = [(site, cores, None) for site, cores in placed]
        record, replayed = await self.arrays.submit(desc, user.name, key, raw, plan)
        body = {
            "id": record.id,
            "owner": driver.site,
            "components": [
                {"id": element_id(record.id, i + 1), "site": site, "cores": cores}
                | ({} if units is None else {"units": units})
                for i, (site, cores, units) in enumerate(record.plan or plan)
            ],
        }
        return self._created(body, replayed, began)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        """The caller's jobs; every user's with ``?all=1`` (admins only)."""
        user = request[USER]
        everyone = request.query.get("all", "0") not in ("0", "", "false")
        if everyone and not user.admin:
            return web.json_response(
                {"error": "all: only an admin lists every user's jobs"}, status=403
            )
        try:
            limit = int(request.query.get("limit", LISTED))
            if not 1 <= limit <= MAX_LISTED:
                raise ValueError
        except ValueError:
            bad = InvalidInput("limit", f"a number of jobs in [1, {MAX_LISTED}]")
            return bad_request(bad)
        if "array" in request.query:  # the elements of one array
            array = await self._mine(request, request.query["array"])
            if not isinstance(array, ArrayRecord):
                if isinstance(array, JobStatus):
                    error = f"{array.id} is a job, not an array"
                    return web.json_response({"error": error}, status=400)
                return array
            return web.json_response({"jobs": (await self.arrays.listing(array))[:limit]})
        # The journal has every job (unfinished ones also in memory, the freshest there).
        rows = await self.driver.journal.listing(None if everyone else user.name, limit)
        jobs = self.driver.jobs
        remembered = [r.id for r in rows if r.id not in jobs]
        allocations = await self.driver.journal.allocations_of(remembered)
        listed = []
        for row in rows:
            status = jobs.get(row.id)
            if status is None:
                status = status_of(row)
                status.allocations = allocations.get(row.id, [])
            listed.append(status.as_dict())
        return web.json_response({"jobs": listed})

    def _job_id(self, request: web.Request) -> str:
        """The job id of the request's path, checked before anything is done with it."""
        sites = self.driver.config.topology.sites
        return check_job_id(request.match_info["id"], field="job id", known_sites=sites)

    async def _forward(self, request: web.Request, job_id: str) -> web.StreamResponse:
        """The owner's answer about its job, asked with the caller's own token."""
        owner = job_owner(job_id)
        base = self.peers.peers.get(owner)
        if base is None:
            return web.json_response({"error": f"unknown job {job_id}"}, status=404)
        assert self.peers.session is not None
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
        answer = ANSWER_SECONDS
        if request.path.endswith("/wait"):  # the owner answers when the job ends, or then
            with contextlib.suppress(ValueError):
                answer += max(0.0, float(request.query.get("timeout", "60")))
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_SECONDS, sock_read=answer)
        try:
            async with self.peers.session.request(
                request.method,
                base + request.rel_url.path_qs,
                data=await request.read(),
                headers=headers,
                timeout=timeout,
            ) as upstream:
                return web.Response(
                    body=await upstream.read(),
                    status=upstream.status,
                    content_type=upstream.content_type,
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return _unreachable(f"{job_id}: owner site {owner}", exc)

    async def _mine(
        self, request: web.Request, named: str | None = None
    ) -> JobStatus | ArrayRecord | web.StreamResponse:
        """The status of a job (or the record of an array) this broker owns, or the response
        to send instead: the owner's answer (forwarded) for another broker's job, 404 for an
        unknown one, 403 for another user's. ``named``: the id, if not the path's."""
        try:
            if named is None:
                job_id = self._job_id(request)
            else:
                sites = self.driver.config.topology.sites
                job_id = check_job_id(named, field="array", known_sites=sites)
        except InvalidInput as exc:
            return bad_request(exc)
        if job_owner(job_id) != self.driver.site:
            return await self._forward(request, job_id)
        array = self.arrays.records.get(job_id)
        if array is not None:
            if not request[USER].may_see(array.submitter):
                return web.json_response({"error": f"{job_id} belongs to another user"}, status=403)
            return array
        status = self.driver.jobs.get(job_id) or await self._remembered(job_id)
        if status is None:
            return web.json_response(
                {
                    "error": f"unknown job {job_id}: never submitted, or finished and purged"
                    f" ({self.retention.describe()})"
                },
                status=404,
            )
        user = request[USER]
        if not user.may_see(status.submitter):
            return web.json_response({"error": f"{job_id} belongs to another user"}, status=403)
        return status

    async def _remembered(self, job_id: str) -> JobStatus | None:
        """A job not in memory (it finished before the broker started), from the journal."""
        row = await self.driver.journal.get(job_id)
        # A submission journaled but not yet taken in memory is there by now.
        held = self.driver.jobs.get(job_id)
        if held is not None or row is None:
            return held
        status = status_of(row)
        status.allocations = await self.driver.journal.allocations(job_id)
        return status

    @staticmethod
    def _one_job(
        found: JobStatus | ArrayRecord | web.StreamResponse,
    ) -> JobStatus | web.StreamResponse:
        """A single job's status, or the answer to send: an array has no single history,
        output or files (400 saying how to name an element)."""
        if isinstance(found, ArrayRecord):
            example = element_id(found.id, 1)
            return web.json_response(
                {"error": f"{found.id} is an array of {found.size} jobs: name one, e.g. {example}"},
                status=400,
            )
        return found

    async def _history(self, request: web.Request) -> web.StreamResponse:
        """A job's states as its owner recorded them, each with the site and the time."""
        status = self._one_job(await self._mine(request))
        if not isinstance(status, JobStatus):
            return status
        transitions = await self.driver.journal.transitions(status.id)
        return web.json_response(
            {
                "id": status.id,
                "transitions": [
                    {"state": state, "site": site, "at": at} for state, site, at in transitions
                ],
            }
        )

    async def _status(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if isinstance(status, ArrayRecord):
            return web.json_response(await self.arrays.status(status))
        if not isinstance(status, JobStatus):
            return status
        return web.json_response(self._shown(status))

    async def _wait(self, request: web.Request) -> web.StreamResponse:
        status = await self._mine(request)
        if not isinstance(status, JobStatus | ArrayRecord):
            return status
        try:
            timeout = float(request.query.get("timeout", "60"))
        except ValueError:
            return web.json_response({"error": "timeout: expected seconds"}, status=400)
        if isinstance(status, ArrayRecord):
            await self.arrays.wait(status, timeout)
            return web.json_response(await self.arrays.status(status))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(status.done.wait(), timeout)
        return web.json_response(self._shown(status))

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        """Cancel a job (an array: each of its jobs not ended yet). The answer is its status,
        with ``cancelled_now``: whether this request cancelled it (false: it had already
        ended, ``done``, ``failed`` or ``cancelled``, and nothing was done)."""
        status = await self._mine(request)
        by = request[USER].name
        if isinstance(status, ArrayRecord):
            cancelled = await self.arrays.cancel(status, by)
            return web.json_response(
                await self.arrays.status(status) | {"cancelled_now": cancelled > 0}
            )
        if not isinstance(status, JobStatus):
            return status
        # Not in memory: it ended before this broker started.
        live = self.driver.jobs.get(status.id) is status
        cancelling = live and status.state not in TERMINAL_STATES
        if cancelling:
            await self.driver.cancel(status, by)
        return web.json_response(status.as_dict() | {"cancelled_now": cancelling})

    async def _migrate(self, request: web.Request) -> web.StreamResponse:
        """Move a running job to another site by checkpoint (body ``{"to": SITE}``, optional:
        else the best other site by F(j)): 202 with ``from`` and ``to`` once the move has
        begun; 409 if the job cannot move now (not running, moving already), 400 for a bad
        body or site. ``GET /api/v1/jobs/<id>`` then shows ``move`` until it is over, or
        ``move_error`` if it did not happen."""
        status = self._one_job(await self._mine(request))
        if not isinstance(status, JobStatus):
            return status
        try:
            body = await request.json() if await request.read() else {}
        except ValueError:
            return bad_request(InvalidInput("body", 'a JSON object such as {"to": "SITE"}', None))
        if not isinstance(body, dict) or not set(body) <= {"to"}:
            return bad_request(InvalidInput("body", 'a JSON object such as {"to": "SITE"}', body))
        to = body.get("to")
        sites = self.driver.config.topology.sites
        if to is not None and (not isinstance(to, str) or to not in sites):
            return bad_request(
                InvalidInput("to", f"a site of the topology ({', '.join(sites)})", to)
            )
        moves = self.driver.moves
        if moves is None:
            return web.json_response({"error": "this broker does not move jobs"}, status=501)
        source = status.site
        try:
            target = await moves.migrate(status, to)
        except InvalidInput as exc:
            code = 409 if exc.field == "job" else 400
            reply = {"error": str(exc), "field": exc.field, "expected": exc.expected}
            return web.json_response(reply, status=code)
        return web.json_response({"id": status.id, "from": source, "to": target}, status=202)

    def _shown(self, status: JobStatus) -> dict[str, Any]:
        """A job's status as clients see it: its limits and what it used of them so far (a
        moved job: in all) while it is not finished (a finished job's end names the limit that
        ended it; its description is not kept in memory after a restart, and its status must
        read the same before and after one), its move under way, or why its last did not
        happen."""
        shown = status.as_dict()
        desc = self.driver.descriptions.get(status.id)
        live = status.state not in TERMINAL_STATES
        if live and desc is not None and (desc.wall_time_limit or desc.cpu_time_limit):
            shown["limits"] = {
                "wall_time": desc.wall_time_limit or None,
                "cpu_time": desc.cpu_time_limit or None,
            }
        ran = status.run_time(time.time()) if live else None
        if ran is not None:  # what it used so far, a moved job's before its latest move too
            used = status.used
            shown["used"] = {
                "wall_time": round(ran, 3),
                "moves": used.moves,
                "before_moves": {"wall_time": used.wall, "cpu_time": used.cpu},
            }
        move = self.driver.broker.moving_of(status.id)
        if move is not None:
            shown["move"] = {"from": move.source, "to": move.target, "frozen": move.ready}
        error = None if self.driver.moves is None else self.driver.moves.errors.get(status.id)
        if error is not None:
            shown["move_error"] = error
        return shown

    async def _output(self, request: web.Request) -> web.StreamResponse:
        status = self._one_job(await self._mine(request))
        if not isinstance(status, JobStatus):
            return status
        if status.site is None:
            return web.json_response({"error": f"no output for {status.id} (yet)"}, status=404)
        stream = request.match_info["stream"]
        if stream not in ("stdout", "stderr"):
            return bad_request(InvalidInput("stream", "stdout or stderr", stream))
        try:
            names = await self._output_files(status.id)
        except GBrokerError as exc:
            return web.json_response({"error": f"output of {status.id}: {exc}"}, status=404)
        name = names[stream == "stderr"]
        if status.site == self.driver.site:
            return await self._read_output(request, status.id, stream, name)
        return await self._from_site(status, f"/peer/v1/output/{status.id}/{stream}", name)

    async def _from_site(self, status: JobStatus, path: str, name: str) -> web.StreamResponse:
        """What the site that ran an owned job answers to a signed GET of ``path?name=``."""
        assert status.site is not None
        assert self.peers.session is not None
        url = str(URL(f"{self.peers.peers[status.site]}{path}").with_query(name=name))
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_SECONDS, sock_read=ANSWER_SECONDS)
        try:
            headers = self.peers.headers("GET", url)
            async with self.peers.session.get(url, headers=headers, timeout=timeout) as upstream:
                return web.Response(body=await upstream.read(), status=upstream.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return _unreachable(f"{status.id}: site {status.site}", exc)

    async def _description(self, job_id: str) -> JobDescription:
        """An owned job's description (in memory, or journaled for a job that ended before
        the broker started)."""
        desc = self.driver.descriptions.get(job_id)
        if desc is None:
            row = await self.driver.journal.get(job_id)
            if row is None:
                raise InvalidInput("job id", "a job on record", job_id)
            desc = from_mapping(msgpack.unpackb(row.spec), document=f"journaled job {job_id}")
        return desc

    async def _output_files(self, job_id: str) -> tuple[str, str]:
        """The files an owned job's stdout and stderr went to (in its directory, or in the
        file system it named: :meth:`~gbroker.daemon.staging.Stager.stream_name`)."""
        desc = await self._description(job_id)
        stream = self.driver.stager.stream_name
        return stream(desc, "stdout"), stream(desc, "stderr")

    async def _read_output(
        self, request: web.Request, job_id: str, stream: str, name: str | None
    ) -> web.StreamResponse:
        """A job's output stream, read here, where it ran, without following links: from the
        file this site ran it with, else the file ``name`` its owner names (we restarted)."""
        names = self.driver.outputs.get(job_id)
        if names is not None:
            name = names[stream == "stderr"]
        if stream not in ("stdout", "stderr") or not name:
            return web.json_response(
                {"error": f"{stream[:20]}: expected stdout or stderr of a job run here"},
                status=404,
            )
        try:  # never through a link, non-blocking, a regular file only; off the event loop
            descriptor = await asyncio.to_thread(self.driver.stager.open_output, job_id, name)
        except FileNotFoundError:
            return web.json_response({"error": f"no {stream} for {job_id}"}, status=404)
        except (InvalidInput, OSError) as exc:
            return web.json_response({"error": f"{stream} of {job_id}: {exc}"}, status=403)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        with os.fdopen(descriptor, "rb") as source:
            left = response.content_length = os.fstat(source.fileno()).st_size  # as of now
            await response.prepare(request)
            # At most its length when opened (a job still writing cannot make it endless).
            while left > 0 and (chunk := await asyncio.to_thread(source.read, min(left, 1 << 16))):
                left -= len(chunk)
                await response.write(chunk)
        await response.write_eof()
        return response

    async def _peer_output(self, request: web.Request) -> web.StreamResponse:
        """The owner's read of its job's output stream (a peer route: signed by the owner)."""
        job_id = request.match_info["id"]
        if job_owner(job_id) != request[PEER]:
            return web.json_response(
                {"error": f"{request[PEER]} does not own {job_id}"}, status=403
            )
        name = request.query.get("name")
        return await self._read_output(request, job_id, request.match_info["stream"], name)

    # -- files staged out to the store, and how the owner ranks a job's sites --------------------

    async def _file(self, request: web.Request) -> web.StreamResponse:
        """A file a job staged out to the executing site's store (``gbroker output --file``)."""
        status = self._one_job(await self._mine(request))
        if not isinstance(status, JobStatus):
            return status
        name = request.query.get("name", "")
        if not name or len(name) > 1024 or "\0" in name:
            return bad_request(InvalidInput("name", "the FileName of a staged-out file", name))
        if status.site is None:
            return web.json_response({"error": f"no files for {status.id} (yet)"}, status=404)
        if status.site == self.driver.site:
            return self._stored(status.id, name)
        return await self._from_site(status, f"/peer/v1/files/{status.id}", name)

    def _stored(self, job_id: str, name: str) -> web.StreamResponse:
        found = self.driver.stager.stored(job_id, name)
        if found is None:
            error = (
                f"no file {name[:100]!r} of {job_id} in the store of {self.driver.site}: a job's "
                "file comes back only if its DataStaging sends it to gbroker:store"
            )
            return web.json_response({"error": error}, status=404)
        return web.FileResponse(found[0])

    async def _peer_file(self, request: web.Request) -> web.StreamResponse:
        """The owner's read of a file its job staged out here (a peer route)."""
        job_id = request.match_info["id"]
        if job_owner(job_id) != request[PEER]:
            return web.json_response(
                {"error": f"{request[PEER]} does not own {job_id}"}, status=403
            )
        return self._stored(job_id, request.query.get("name", ""))

    async def _explain(self, request: web.Request) -> web.StreamResponse:
        """How the owner ranks each candidate site for a job now (an array: its first job)."""
        found = await self._mine(request)
        if isinstance(found, ArrayRecord):
            job_id = element_id(found.id, 1)
        elif isinstance(found, JobStatus):
            job_id = found.id
        else:
            return found
        try:
            desc = await self._description(job_id)
            if isinstance(found, ArrayRecord) and found.plan is not None:
                desc = await self.arrays.description(found)  # the whole co-allocated job
        except GBrokerError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        status = self.driver.jobs.get(job_id)
        body = explained(self.driver, desc.to_job(job_id, self.driver.site), desc)
        body["state"] = None if status is None else str(status.state)
        return web.json_response(body)

    async def _explain_description(self, request: web.Request) -> web.StreamResponse:
        """How this broker would rank each candidate site for a description, not submitted."""
        raw = await request.read()
        try:
            xml = document_format(raw) == "jsdl"
            loaded = await self.readers.load(raw)
            desc = loaded.elements[0] if isinstance(loaded, JobArray) else loaded
            self.driver.stager.check(desc, xml=xml)
            [desc] = await self.driver.stager.learn_sizes([desc], xml=xml)
        except GBrokerError as exc:
            return bad_request(exc)
        job = desc.to_job(f"{self.driver.site}.0", self.driver.site)
        body = explained(self.driver, job, desc)
        body["job"] = None  # not submitted: it has no id (the one above is the core's need)
        closest = closest_unmet(job.requirements, job.rank, self._sites)
        body["fleet"] = None if closest is None else str(closest)
        if isinstance(loaded, JobArray):
            body["array"] = loaded.size
        return web.json_response(body)
