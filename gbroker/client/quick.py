"""A small synchronous client for the command line: one process, a few requests, fast start.

Theory of operation. ``gbroker submit``, ``status``, ``wait``, ``jobs``, ``output``, ``cancel``
and ``history`` each make one to a few requests and end, so what costs is the process's start:
this module imports only ``_socket`` and ``json`` (``http.client`` and ``ssl`` for an
``https://`` broker), not aiohttp, and nothing of the daemon. Each request is one HTTP/1.0
exchange on its own connection (:class:`_Plain`). :class:`gbroker.client.gclient.Client` stays
the library's asynchronous client; both speak the same API.

Which brokers (:func:`connect`): ``--broker URL`` (or ``$GBROKER_URL``) names one; otherwise the
fleet that :mod:`gbroker.client.fleetdir` finds gives every site's URL, tried from a different one
per process (submissions spread over the fleet, as GBroker means them to), moving on to the next
when one refuses the connection (the broker is down). A URL without a scheme gets ``http://``.

Which token: ``$GBROKER_TOKEN``, else ``--token-file`` (or ``$GBROKER_TOKEN_FILE``: a bare token, or
a broker's ``NAME TOKEN [admin]`` file), else the fleet's token file, else the one the user's broker
recorded for that URL (:mod:`gbroker.security.runtime`). Which CA for ``https://``: ``--ca``, else
``$GBROKER_CA``, else the fleet's ``tls/ca.crt``, else the system's.

Submissions carry an ``Idempotency-Key``: a broker that refused the connection never saw the
request, so the next one may take it; a broker that took the connection but whose answer was lost
(reset, timeout, 5xx) is asked again, with the same key, so a submission makes one job.

Errors are :class:`QuickError`, each with the exit status the CLI uses
(:mod:`gbroker.cli.exits`): 2 for the caller's mistakes (the broker's 4xx message names the
field), 4 when no broker answers.
"""

from __future__ import annotations

import os

from gbroker.client import fleetdir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
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


class _Plain:
    """One HTTP/1.0 exchange over a plain socket: the request, then the answer until the broker
    closes (HTTP/1.0: no chunked encoding, no keep-alive). ``http.client`` would do the same
    at the cost of importing ``ssl`` and the ``email`` package, tens of ms at every start
    (measured: most of what a submission process took beyond the interpreter's own start);
    ``_socket`` is the C module under ``socket``, whose enums cost more ms."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock: Any = None

    def connect(self) -> None:
        import _socket

        error: OSError | None = None
        # A bytes host: a str one makes the C code import the idna codec (ms at every start).
        for family, kind, proto, _, address in _socket.getaddrinfo(
            self.host.strip("[]").encode("ascii", "replace"), self.port, 0, _socket.SOCK_STREAM
        ):
            sock = _socket.socket(family, kind, proto)
            sock.settimeout(self.timeout)
            try:
                sock.connect(address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            self.sock = sock
            return
        raise error or OSError(f"no address for {self.host}")

    def exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        lines = [f"{method} {path} HTTP/1.0", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body or b'')}")
        self.sock.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b""))
        chunks = []
        while chunk := self.sock.recv(1 << 16):
            chunks.append(chunk)
        head, _, answer = b"".join(chunks).partition(b"\r\n\r\n")
        first, *fields = head.decode("latin-1").split("\r\n")
        status = first.split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
            raise ConnectionResetError(f"not an HTTP answer: {head[:60]!r}")
        named = (field.partition(":") for field in fields)
        return int(status[1]), {k.strip().lower(): v.strip() for k, _, v in named}, answer

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _Tls:
    """One exchange with an ``https://`` broker, through ``http.client`` and ``ssl``."""

    def __init__(self, host: str, timeout: float, ca: str | None) -> None:
        import http.client
        import ssl

        context = ssl.create_default_context(cafile=ca)
        self.conn = http.client.HTTPSConnection(host, timeout=timeout, context=context)

    def connect(self) -> None:
        self.conn.connect()

    def exchange(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        fields = {name.lower(): value for name, value in response.getheaders()}
        return response.status, fields, response.read()

    def close(self) -> None:
        self.conn.close()


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
        self.found = ""  # how the fleet was found: fleetdir.locate's "named", "near", "default"

    def _open(self, url: str, timeout: float) -> _Plain | _Tls:
        scheme, _, rest = url.partition("://")
        host = rest.split("/", 1)[0]
        if scheme == "https":
            return _Tls(host, timeout, self.ca)
        name, _, port = host.rpartition(":")
        if not name or "]" in port:
            name, port = host, "80"
        return _Plain(name, int(port), timeout)

    def close(self) -> None:
        """Nothing stays open between requests (each is one exchange)."""

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
        status, _, answer = self.exchange(method, path, body, headers, timeout)
        return status, answer

    def exchange(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """:meth:`request` with the answer's header fields (lower-cased names) too."""
        sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        sent.update(headers or {})
        failures = []
        at = self.urls.index(self.url)
        for url in self.urls[at:] + self.urls[:at]:
            self.url = url
            exchange = self._open(url, timeout or self.timeout)
            try:
                try:
                    exchange.connect()
                except OSError as exc:  # nothing was sent: the next broker may take it
                    if type(exc).__name__ == "SSLCertVerificationError":
                        trusted = f"the CA in {self.ca}" if self.ca else "the system's CAs"
                        raise QuickError(
                            f"{url}: its certificate does not verify against {trusted} "
                            f"({getattr(exc, 'verify_message', exc)}); name the fleet CA with "
                            "--ca FILE or $GBROKER_CA"
                        ) from None
                    failures.append(f"{url}: {_reason(exc)}")
                    continue
                try:
                    return exchange.exchange(method, path, body, sent)
                except OSError as exc:
                    raise _lost(url, exc) from None
            finally:
                exchange.close()
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
                status, fields, body = self.exchange(
                    "POST", "/api/v1/jobs", body=description, headers=headers
                )
            except QuickError as exc:
                if exc.status != 0 or attempt == _RETRIES:  # 0: sent, but the answer was lost
                    raise
                _sleep(delay)
                delay *= 2
                continue
            if status >= 500 and attempt < _RETRIES:
                _sleep(delay)
                delay *= 2
                continue
            location = fields.get("location", "")
            if status < 300 and location.startswith("/api/v1/jobs/"):  # no JSON to decode
                return {"id": location.removeprefix("/api/v1/jobs/")}
            result: dict[str, Any] = answer(status, body, "submission")
            return result
        raise AssertionError("unreachable")


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.strerror or str(exc) or type(exc).__name__


def _lost(url: str, exc: OSError) -> QuickError:
    """A broker took the connection but the exchange failed (reset, timeout): ``status`` 0."""
    hint = ""
    if url.startswith("http:") and "not an HTTP answer" in str(exc):
        hint = " (an https:// broker?)"
    return QuickError(f"{url}: {_reason(exc)}{hint}", UNREACHABLE, status=0)


def _where(fleet: str | None) -> str:
    return f" (the fleet in {fleet}: is it down? `gbroker fleet status`)" if fleet else ""


def answer(status: int, body: bytes, what: str) -> Any:
    """The decoded JSON body of a 2xx answer; else :class:`QuickError` with the broker's error
    (exit 2 for 4xx, 4 for 5xx: the broker, or the job's owner behind it, is unavailable)."""
    import json

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
    found = ""
    if named:
        urls = [normalize_url(named, "--broker" if broker else "$GBROKER_URL")]
        if ca is None and urls[0].startswith("https:"):  # the CA of the fleet found, if any
            try:
                tls: Any = fleetdir.read(fleetdir.find()).get("tls")
            except fleetdir.NoFleet:
                tls = None
            ca = str(tls["ca"]) if isinstance(tls, dict) else None
    else:
        try:
            fleet, found = fleetdir.locate()
            listed = fleetdir.brokers(fleet)
            # fleet.json only when needed (JSON costs ms at start): no list, or TLS.
            tls_dir = os.path.join(fleet, "tls")
            record = fleetdir.read(fleet) if listed is None or os.path.isdir(tls_dir) else {}
        except fleetdir.NoFleet as exc:
            raise QuickError(str(exc)) from None
        sites: Any = record.get("sites") or {}
        urls = [url for _, url in listed] if listed else [str(m["url"]) for m in sites.values()]
        if not urls:
            raise QuickError(f"{fleet}: the fleet has no sites")
        start = os.getpid() % len(urls)  # spread the processes' first tries over the fleet
        urls = urls[start:] + urls[:start]
        tls = record.get("tls")
        if ca is None and isinstance(tls, dict):
            ca = str(tls["ca"])
        tokens = os.path.join(fleet, "tokens")
        if token is None and token_file is None and os.path.isfile(tokens):
            token_file = tokens
            admin = True  # the fleet's file holds its admin token first
    if token is None and token_file is not None:
        token = _token_from_file(token_file)
    elif token is None:
        from gbroker.security import runtime

        token = runtime.find_token(urls[0])
    connection = Connection(urls, token, ca, fleet, timeout, admin)
    connection.found = found
    return connection
