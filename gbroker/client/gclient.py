"""GClient: submit jobs to any broker and follow them (ARCHITECTURE §3).

Any broker accepts any job and answers for any job: it forwards requests about another broker's
job to its owner. A client therefore needs only one broker's URL.

    async with Client("http://127.0.0.1:8701") as client:
        job_id = await client.submit(Path("job.jsdl").read_bytes())
        status = await client.wait(job_id)
        print(await client.output(job_id, "stdout"))

Every request carries a client token (``Authorization: Bearer``): ``token``, else
``$GBROKER_TOKEN``, else the token file a broker of the same user recorded for that URL in the
runtime directory (:mod:`gbroker.security.runtime`), so a user's own brokers and fleets need no
copying. An ``https://`` broker is verified against ``ca`` (``--ca``), else ``$GBROKER_CA``, else
the CA of the fleet directory found (:mod:`gbroker.client.fleetdir`;
:func:`gbroker.client.fleetdir.find_ca`), else the system's CAs; the host name is checked.

Submissions are idempotent (:mod:`gbroker.protocol.idempotency`): :meth:`Client.submit` sends a
fresh ``Idempotency-Key`` (a uuid4) for each logical submission, and when it cannot tell whether
the broker took it (no connection, a reset or a timeout, a 5xx) it sends it again with the same
key, up to ``attempts`` times with exponential backoff and jitter (at most ``retry_for`` seconds
in all), so a retried submission makes one job.

Errors: the broker's 4xx answers (bad JSDL, an unknown job, ...) raise :class:`ClientError` with
the broker's message, which names the field and what was expected; a broker that cannot be
reached raises :class:`BrokerUnreachable`, and one whose certificate the CA did not sign
:class:`BrokerUntrusted`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlencode

import aiohttp
import tenacity

from gbroker.client.fleetdir import find_ca
from gbroker.errors import GBrokerError
from gbroker.jobs.description import StagingEntry
from gbroker.protocol.idempotency import HEADER, REPLAYED_HEADER, header_value
from gbroker.security import runtime
from gbroker.security.auth import bearer
from gbroker.security.tls import client_context

__all__ = ["BrokerUnreachable", "BrokerUntrusted", "Client", "ClientError", "with_staging"]


class ClientError(GBrokerError):
    """The broker refused the request (the caller's fault): its message says why."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{status}: {body.get('error', body)}")


class BrokerUnreachable(GBrokerError, ConnectionError):
    """No answer from the broker."""


class BrokerUntrusted(BrokerUnreachable):
    """The broker's TLS certificate does not verify against the CA we trust."""


def _worth_retrying(exc: BaseException) -> bool:
    """Whether a failed submission may have been lost in transit (so: send it again)."""
    if isinstance(exc, BrokerUntrusted):
        return False
    return isinstance(exc, BrokerUnreachable) or (
        isinstance(exc, ClientError) and exc.status >= 500
    )


class Client:
    def __init__(
        self,
        broker: str,
        timeout: float = 30.0,
        token: str | None = None,
        ca: str | Path | None = None,
        attempts: int = 8,
        retry_for: float = 60.0,
    ) -> None:
        self.broker = broker.rstrip("/")
        self.attempts = attempts
        self.retry_for = retry_for
        self.replayed = 0  # submissions the broker answered as repeats of an earlier attempt
        token = token or os.environ.get("GBROKER_TOKEN") or runtime.find_token(self.broker)
        self._headers = bearer(token) if token else {}
        self.ca = find_ca(ca) if self.broker.startswith("https:") else None
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(ssl=client_context(Path(self.ca)) if self.ca else True)
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, headers=self._headers, connector=connector
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        data: Any = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        assert self._session is not None, "use Client as an async context manager"
        try:
            response = await self._session.request(
                method,
                self.broker + path,
                data=data,
                timeout=aiohttp.ClientTimeout(total=timeout) if timeout else None,
                headers=headers,
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            trusted = f"the CA in {self.ca}" if self.ca else "the system's CAs"
            raise BrokerUntrusted(
                f"{self.broker}: its certificate does not verify against {trusted} "
                f"({exc.certificate_error}); name the fleet CA with --ca FILE or $GBROKER_CA"
            ) from exc
        except aiohttp.ServerDisconnectedError as exc:
            hint = " (an https:// broker?)" if self.broker.startswith("http:") else ""
            raise BrokerUnreachable(f"{self.broker}: closed the connection{hint}") from exc
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise BrokerUnreachable(f"{self.broker}: {exc}") from exc
        if response.status >= 400:
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = {"error": await response.text()}
            raise ClientError(response.status, body if isinstance(body, dict) else {"error": body})
        return response

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        response = await self._request(method, path, **kw)
        body: dict[str, Any] = await response.json()
        return body

    async def info(self) -> dict[str, Any]:
        """The broker's site name and URL."""
        return await self._json("GET", "/api/v1/info")

    async def upload(self, path: Path) -> StagingEntry:
        """Put a file into the broker's content-addressed store, streaming it; returns the
        stage-in entry that names it (its URL, the broker's site, its size)."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                digest.update(chunk)
        sha = digest.hexdigest()
        with path.open("rb") as f:
            await self._request("PUT", f"/files/{sha}", data=f)
        info = await self.info()
        return StagingEntry(
            path.name,
            source=f"{info['url']}/files/{sha}",
            site=str(info["site"]),
            size=path.stat().st_size,
        )

    async def submit_with_files(self, description: bytes, files: list[Path]) -> str:
        """Upload ``files`` and submit the job (every job of a sweep) with them staged into
        its directory."""
        entries = [await self.upload(path) for path in files]
        return await self.submit(with_staging(description, entries))

    async def submit(self, description: bytes | str, key: str | None = None) -> str:
        """Submit a JSDL, JSON or YAML job description; returns the job id (durable by then).

        ``key`` is the submission's ``Idempotency-Key`` (default: a fresh uuid4); every retry
        of this call sends the same one (see the module docstring)."""
        data = description.encode() if isinstance(description, str) else description
        headers = {HEADER: header_value(key or str(uuid.uuid4()))}
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(_worth_retrying),
            stop=tenacity.stop_after_attempt(self.attempts)
            | tenacity.stop_after_delay(self.retry_for),
            wait=tenacity.wait_random_exponential(multiplier=0.2, max=5.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await self._request("POST", "/api/v1/jobs", data=data, headers=headers)
                body: dict[str, Any] = await response.json()
        if response.headers.get(REPLAYED_HEADER) == "true":
            self.replayed += 1
        return str(body["id"])

    async def status(self, job_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/api/v1/jobs/{job_id}")

    async def history(self, job_id: str) -> list[dict[str, Any]]:
        """The job's states as its owner recorded them: state, site and time of each."""
        return list((await self._json("GET", f"/api/v1/jobs/{job_id}/history"))["transitions"])

    async def jobs(self) -> list[dict[str, Any]]:
        """The jobs this broker owns."""
        return list((await self._json("GET", "/api/v1/jobs"))["jobs"])

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._json("DELETE", f"/api/v1/jobs/{job_id}")

    async def wait(self, job_id: str, timeout: float = 3600.0) -> dict[str, Any]:
        """Block until the job ends (or ``timeout`` passes); returns its last status."""
        path = f"/api/v1/jobs/{job_id}/wait?timeout={timeout}"
        return await self._json("GET", path, timeout=timeout + 30)

    async def output(self, job_id: str, stream: str = "stdout") -> bytes:
        response = await self._request("GET", f"/api/v1/jobs/{job_id}/output/{stream}")
        return await response.read()

    async def output_file(self, job_id: str, name: str) -> bytes:
        """A file the job staged out to the store of the site that ran it (``gbroker:store``)."""
        response = await self._request(
            "GET", f"/api/v1/jobs/{job_id}/files?{urlencode({'name': name})}"
        )
        return await response.read()

    async def array_jobs(self, array_id: str) -> list[dict[str, Any]]:
        """The jobs of a job array."""
        path = f"/api/v1/jobs?{urlencode({'array': array_id})}"
        return list((await self._json("GET", path))["jobs"])

    async def explain(self, job_id: str) -> dict[str, Any]:
        """How the job's owner ranks each candidate site for it now."""
        return await self._json("GET", f"/api/v1/jobs/{job_id}/explain")

    async def explain_description(self, description: bytes) -> dict[str, Any]:
        """How this broker would rank each candidate site for a job not submitted."""
        return await self._json("POST", "/api/v1/explain", data=description)


def with_staging(description: bytes, entries: list[StagingEntry]) -> bytes:
    """``description`` (any form, a sweep included) with ``entries`` added to its staging:
    JSDL gets DataStaging elements at the end of its JobDescription (an XPath of its sweep
    still finds what it found), JSON and YAML entries in ``staging``."""
    if not entries:
        return description
    from gbroker.jobs.description import GBROKER_NS, JSDL_NS
    from gbroker.jobs.documents import document_format
    from gbroker.jobs.parsing import parse_json, parse_xml, parse_yaml

    fmt = document_format(description)
    if fmt != "jsdl":
        text = description.decode("utf-8-sig")
        parsed = parse_json(text, "job") if fmt == "json" else parse_yaml(text, "job")
        if not isinstance(parsed, dict):
            return description  # the broker says what is wrong with it
        entries_ = list(parsed.get("staging") or [])
        entries_ += [
            {"file_name": e.file_name, "source": e.source, "site": e.site, "size": e.size}
            for e in entries
        ]
        return json.dumps({**parsed, "staging": entries_}).encode()
    import xml.etree.ElementTree as ET

    root = parse_xml(description, "job")
    job = root.find(f"{{{JSDL_NS}}}JobDescription")
    if job is None:
        return description
    for entry in entries:
        element = ET.SubElement(job, f"{{{JSDL_NS}}}DataStaging")
        ET.SubElement(element, f"{{{JSDL_NS}}}FileName").text = entry.file_name
        ET.SubElement(element, f"{{{JSDL_NS}}}CreationFlag").text = "overwrite"
        source = ET.SubElement(element, f"{{{JSDL_NS}}}Source")
        ET.SubElement(source, f"{{{JSDL_NS}}}URI").text = entry.source
        ET.SubElement(element, f"{{{GBROKER_NS}}}Site").text = entry.site
        ET.SubElement(element, f"{{{GBROKER_NS}}}Size").text = str(entry.size)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
