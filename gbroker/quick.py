"""A small synchronous client for the command line: one process, a few requests, fast start.

Theory of operation. ``gbroker submit``, ``status``, ``wait``, ``jobs``, ``output``, ``cancel``
and ``history`` each make one to a few requests and end, so what costs is the process's start:
this module imports only the standard library's ``http.client`` and ``json`` (``ssl`` for an
``https://`` broker), not aiohttp, and nothing of the daemon. :class:`gbroker.client.Client` stays
the library's asynchronous client; both speak the same API.

Which brokers (:func:`connect`): ``--broker URL`` (or ``$GBROKER_URL``) names one; otherwise the
fleet that :mod:`gbroker.fleetdir` finds gives every site's URL, tried from a different one per
process (submissions spread over the fleet, as GBroker means them to), moving on to the next when
one refuses the connection (the broker is down). A URL without a scheme gets ``http://``.

Which token: ``$GBROKER_TOKEN``, else ``--token-file`` (or ``$GBROKER_TOKEN_FILE``: a bare token,
or a broker's ``NAME TOKEN [admin]`` file), else the fleet's token file, else the one the user's
broker recorded for that URL (:mod:`gbroker.runtime`). Which CA for ``https://``: ``--ca``, else
``$GBROKER_CA``, else the fleet's ``tls/ca.crt``, else the system's.

Submissions carry an ``Idempotency-Key``: a broker that refused the connection never saw the
request, so the next one may take it; a broker that took the connection but whose answer was lost
(reset, timeout, 5xx) is asked again, with the same key, so a submission makes one job.

Errors are :class:`QuickError`, each with the exit status the CLI uses
(:mod:`gbroker.cli.exits`): 2 for the caller's mistakes (the broker's 4xx message names the
field), 4 when no broker answers.
"""

from __future__ import annotations

import json
import os
import time

from gbroker import fleetdir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import http.client
    from typing import Any

__all__ = ["Connection", "QuickError", "connect", "normalize_url"]

USAGE = 2  # gbroker.cli.exits, without importing it
UNREACHABLE = 4
IDEMPOTENCY_HEADER = "Idempotency-Key"
_RETRIES = 5  # a submission whose answer was lost is sent again this often (same key)


class QuickError(Exception):
    """A request failed; ``code`` is the exit status, the message says what and where."""

    def __init__(self, message: str, code: int = USAGE, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def normalize_url(text: str, what: str = "--broker") -> str:
    """``text`` as a broker URL: ``http://`` added when there is no scheme; a URL without a
    host, or with another scheme, is refused naming ``what``."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if scheme not in ("http", "https") or not host or host.startswith(":"):
        raise QuickError(f"{what}: expected a broker URL such as http://HOST:PORT, got {text!r}")
    port = host.rsplit("]", 1)[-1].rpartition(":")[2] if ":" in host else ""
    if ":" in host.rsplit("]", 1)[-1] and not port.isdigit():
        raise QuickError(f"{what}: expected a port number after ':', got {text!r}")
    return url


def _token_from_file(path: str) -> str:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as exc:
        raise QuickError(f"{path}: cannot read the token file: {exc.strerror or exc}") from None
    if len(text.split()) == 1:
        return text
    first = admin = None
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            first = first or fields[1]
            if len(fields) == 3 and fields[2] == "admin" and admin is None:
                admin = fields[1]
    if admin or first:
        return str(admin or first)
    raise QuickError(f"{path}: expected a token, or 'NAME TOKEN [admin]' lines")


class Connection:
    """Requests to one of ``urls`` (failing over in order); see the module docstring."""

    def __init__(
        self,
        urls: list[str],
        token: str | None,
        ca: str | None = None,
        fleet: str | None = None,
        timeout: float = 30.0,
        admin: bool | None = None,
    ) -> None:
        self.urls = urls
        self.token = token
        self.ca = ca
        self.fleet = fleet
        self.timeout = timeout
        self.admin = admin  # whether the token is an admin's, when its file says
        self.url = urls[0]
        self._conn: http.client.HTTPConnection | None = None

    def _open(self, url: str, timeout: float) -> http.client.HTTPConnection:
        import http.client

        scheme, _, rest = url.partition("://")
        host = rest.split("/", 1)[0]
        if scheme == "https":
            import ssl

            context = ssl.create_default_context(cafile=self.ca)
            return http.client.HTTPSConnection(host, timeout=timeout, context=context)
        return http.client.HTTPConnection(host, timeout=timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """``(status, body)`` of the first broker that takes the connection; the others are
        tried in turn when one refuses it. Raises :class:`QuickError` (exit 4) if none does."""
        sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        sent.update(headers or {})
        failures = []
        at = self.urls.index(self.url)
        for url in self.urls[at:] + self.urls[:at]:
            if url != self.url:
                self.close()
                self.url = url
            if self._conn is None:
                self._conn = self._open(url, timeout or self.timeout)
            elif timeout is not None:
                self._conn.timeout = timeout
            fresh = self._conn.sock is None
            if fresh:
                try:
                    self._conn.connect()
                except OSError as exc:  # nothing was sent: the next broker may take it
                    if type(exc).__name__ == "SSLCertVerificationError":
                        trusted = f"the CA in {self.ca}" if self.ca else "the system's CAs"
                        raise QuickError(
                            f"{url}: its certificate does not verify against {trusted} "
                            f"({getattr(exc, 'verify_message', exc)}); name the fleet CA with "
                            "--ca FILE or $GBROKER_CA"
                        ) from None
                    failures.append(f"{url}: {_reason(exc)}")
                    self.close()
                    continue
            for reused in (not fresh, False):
                try:
                    assert self._conn is not None
                    self._conn.request(method, path, body=body, headers=sent)
                    response = self._conn.getresponse()
                    return response.status, response.read()
                except OSError as exc:
                    self.close()
                    if not reused:  # a kept-alive connection the broker closed: once more
                        raise _lost(url, exc) from None
                    self._conn = self._open(url, timeout or self.timeout)
        raise QuickError(
            "no broker answers: " + "; ".join(failures) + _where(self.fleet), UNREACHABLE
        )

    def json(self, method: str, path: str, **options: Any) -> Any:
        """The JSON answer of a request; a 4xx/5xx raises :class:`QuickError` with the broker's
        message (its ``error``)."""
        status, body = self.request(method, path, **options)
        return answer(status, body, f"{method} {path}")

    def submit(self, description: bytes) -> dict[str, Any]:
        """Submit a job description (its bytes as read); returns ``{"id", "owner"}``."""
        key = os.urandom(16).hex()  # a fresh Idempotency-Key (sf-string: quoted)
        headers = {IDEMPOTENCY_HEADER: f'"{key}"', "Content-Type": "application/octet-stream"}
        delay = 0.2
        for attempt in range(_RETRIES + 1):
            try:
                status, body = self.request("POST", "/api/v1/jobs", body=description,
                                            headers=headers)  # fmt: skip
            except QuickError as exc:
                if exc.status != 0 or attempt == _RETRIES:  # 0: sent, but the answer was lost
                    raise
                time.sleep(delay)
                delay *= 2
                continue
            if status >= 500 and attempt < _RETRIES:
                time.sleep(delay)
                delay *= 2
                continue
            result: dict[str, Any] = answer(status, body, "submission")
            return result
        raise AssertionError("unreachable")


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.strerror or str(exc) or type(exc).__name__


def _lost(url: str, exc: OSError) -> QuickError:
    """A broker took the connection but the exchange failed (reset, timeout): ``status`` 0."""
    hint = ""
    if url.startswith("http:") and type(exc).__name__ == "RemoteDisconnected":
        hint = " (an https:// broker?)"
    return QuickError(f"{url}: {_reason(exc)}{hint}", UNREACHABLE, status=0)


def _where(fleet: str | None) -> str:
    return f" (the fleet in {fleet}: is it down? `gbroker fleet status`)" if fleet else ""


def answer(status: int, body: bytes, what: str) -> Any:
    """The decoded JSON body of a 2xx answer; else :class:`QuickError` with the broker's error
    (exit 2 for 4xx, 4 for 5xx: the broker, or the job's owner behind it, is unavailable)."""
    try:
        decoded = json.loads(body) if body else {}
    except ValueError:
        decoded = {"error": body[:300].decode(errors="replace")}
    if status < 400:
        return decoded
    error = decoded.get("error", decoded) if isinstance(decoded, dict) else decoded
    code = UNREACHABLE if status >= 500 else USAGE
    raise QuickError(f"{what}: {status}: {error}", code, status=status)


def connect(
    broker: str | None = None,
    token_file: str | None = None,
    ca: str | None = None,
    timeout: float = 30.0,
) -> Connection:
    """A :class:`Connection` to the named broker, else to the fleet found (module docstring)."""
    named = broker or os.environ.get("GBROKER_URL")
    token = os.environ.get("GBROKER_TOKEN") or None
    token_file = token_file or os.environ.get("GBROKER_TOKEN_FILE") or None
    ca = ca or os.environ.get("GBROKER_CA") or None
    admin: bool | None = None
    fleet = None
    if named:
        urls = [normalize_url(named, "--broker" if broker else "$GBROKER_URL")]
    else:
        try:
            fleet = fleetdir.find()
            record = fleetdir.read(fleet)
        except fleetdir.NoFleet as exc:
            raise QuickError(str(exc)) from None
        sites: Any = record.get("sites") or {}
        urls = [str(member["url"]) for member in sites.values()]
        if not urls:
            raise QuickError(f"{fleet}: the fleet has no sites")
        start = os.getpid() % len(urls)  # spread the processes' first tries over the fleet
        urls = urls[start:] + urls[:start]
        tls: Any = record.get("tls")
        if ca is None and isinstance(tls, dict):
            ca = str(tls["ca"])
        if token is None and token_file is None and record.get("tokens"):
            token_file = str(record["tokens"])
            admin = True  # the fleet's file holds its admin token first
    if token is None and token_file is not None:
        token = _token_from_file(token_file)
    elif token is None:
        from gbroker import runtime

        token = runtime.find_token(urls[0])
    return Connection(urls, token, ca, fleet, timeout, admin)
