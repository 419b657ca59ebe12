"""The smaller attacks of issue 25, against a fleet of real broker processes from `fleet up`.

- a peer request captured on its way to one site, replayed to another;
- the dashboard's sign-in and session used from a page on another port of the same host;
- wrong client tokens by the thousand from one address.

Each test is the attack as it was made, asserting the refusal the broker now answers.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from gbroker.daemon.peers import PeerClient
from gbroker.daemon.throttle import FIRST_DELAY, FREE_FAILURES
from gbroker.protocol import wire
from gbroker.security.auth import PeerSigner, Tokens
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

pytestmark = pytest.mark.network

SLEEPER = "executable: /bin/sleep\narguments: ['30']\ntotal_cpu_count: {exact: 1}\n"
ATTACKER = "127.0.0.3"  # the address wrong tokens come from (loopback is all of 127/8)
BYSTANDER = "127.0.0.4"


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    token: str
    secret: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("small-attacks")
    topology = base / "three.yaml"
    sites = [SiteSpec("Xeon24", 2), SiteSpec("Opteron24", 2), SiteSpec("Owner", 2)]
    save_topology(Topology(sites, "full", name="three"), topology)
    directory = base / "fleet"
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield Fleet(
            directory,
            {name: m["url"] for name, m in record["sites"].items()},
            Tokens.load(Path(record["tokens"])).first_token(),
            (directory / "secret").read_text().strip(),
        )
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    source: str | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One real HTTP request from ``source`` (an address of this host): status, headers and
    the decoded JSON (or text) of the answer."""
    parsed = URL(url)
    assert parsed.host is not None
    assert parsed.port is not None
    connection = http.client.HTTPConnection(
        parsed.host, parsed.port, timeout=30, source_address=(source, 0) if source else None
    )
    try:
        connection.request(method, parsed.path_qs, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        status, fields = response.status, dict(response.headers)
    finally:
        connection.close()
    try:
        return status, fields, json.loads(raw)
    except ValueError:
        return status, fields, raw.decode(errors="replace")


def submit(fleet: Fleet, site: str) -> str:
    status, _, body = request(
        "POST",
        f"{fleet.urls[site]}/api/v1/jobs",
        SLEEPER.encode(),
        {"Authorization": f"Bearer {fleet.token}"},
    )
    assert status == 201, body
    return str(body["id"])


# --- a peer signature names its receiver ---------------------------------------------------------


def test_a_peer_request_captured_for_one_site_is_refused_by_another(fleet: Fleet) -> None:
    """Owner dispatches its job to Opteron24; the request, captured, is replayed to Xeon24.
    Before: Xeon24 answered 200 and took the job (it would have run twice). The request is made
    by the owner's own peer client, exactly as the owner sends it."""
    job_id = submit(fleet, "Owner")
    owner = PeerClient("Owner", fleet.urls, PeerSigner("Owner", fleet.secret), lambda *_: None)
    accept = {
        "id": job_id,
        "owner": "Owner",
        "replica": False,
        "lease": 30.0,
        "description": {"executable": "/bin/sleep", "arguments": ["30"]},
    }
    data = wire.encode_peer("accept", accept)
    captured = {
        **owner.headers("POST", fleet.urls["Opteron24"] + "/peer/v1/accept", data),
        "Content-Type": "application/msgpack",
    }
    status, _, answer = request("POST", fleet.urls["Xeon24"] + "/peer/v1/accept", data, captured)
    assert (status, answer) == (
        401,
        {"error": "unauthorized: peer request signed for site 'Opteron24', not for Xeon24"},
    )


# --- the dashboard: the exact origin --------------------------------------------------------------


def test_the_dashboard_refuses_a_page_on_another_port_of_this_host(fleet: Fleet) -> None:
    """A page served on another loopback port posts the token to the sign-in, and uses a
    session (cookies ignore ports, so SameSite=Strict sends them). Before: 303 and a cookie."""
    url = fleet.urls["Xeon24"]
    own = str(URL(url).origin())
    port = URL(url).port
    assert port is not None
    other = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}"
    form = urllib.parse.urlencode({"token": fleet.token}).encode()
    posted = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, answer = request(
        "POST", url + "/fleet/login", form, {**posted, "Origin": other}
    )
    assert (status, "Set-Cookie" in headers) == (403, False)
    assert answer == {
        "error": f"forbidden: Origin {other!r} is not this broker's ({own}): "
        "cross-origin requests are refused"
    }
    for wrong in ("https://127.0.0.1:" + str(port), "http://localhost:" + str(port), "null"):
        status, _, _ = request("POST", url + "/fleet/login", form, {**posted, "Origin": wrong})
        assert status == 403, wrong  # another scheme, another host: other origins too
    status, headers, _ = request("POST", url + "/fleet/login", form, {**posted, "Origin": own})
    assert status == 303  # the broker's own page signs in
    session = {"Cookie": headers["Set-Cookie"].split(";", 1)[0]}
    assert request("GET", url + "/api/v1/fleet", headers=session)[0] == 200
    status, _, answer = request("GET", url + "/api/v1/fleet", headers={**session, "Origin": other})
    assert status == 403, answer  # the session, ridden from the other port
    assert request("POST", url + "/fleet/logout", headers={**session, "Origin": other})[0] == 403


# --- wrong tokens, slowed per address -------------------------------------------------------------


def timed(source: str, url: str, token: str) -> tuple[float, int, Any]:
    started = time.monotonic()
    status, _, answer = request(
        "GET", url + "/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}, source=source
    )
    return time.monotonic() - started, status, answer


def test_wrong_tokens_from_one_address_are_slowed_and_no_one_else_is(fleet: Fleet) -> None:
    """Before: 2,000 wrong tokens in 3.7 s, each answered at once."""
    url = fleet.urls["Opteron24"]
    slowed = 4  # answers past the free ones: FIRST_DELAY, then twice, twice again...
    scheduled = [FIRST_DELAY * 2**n for n in range(slowed)]
    times, answers = [], []
    for n in range(FREE_FAILURES + slowed):
        seconds, status, answer = timed(ATTACKER, url, f"guess-{n:04d}-0123456789abcdef")
        assert status == 401, answer
        times.append(seconds)
        answers.append(answer["error"])
    # The free ones said nothing more; each slowed one waited at least its scheduled delay.
    assert all(a.endswith("(Authorization: Bearer TOKEN)") for a in answers[:FREE_FAILURES])
    for n, (seconds, delay) in enumerate(zip(times[FREE_FAILURES:], scheduled, strict=True)):
        count = FREE_FAILURES + n + 1
        assert answers[FREE_FAILURES + n].endswith(
            f"; {count} wrong from {ATTACKER}, answered after {delay:g} s"
        )
        assert seconds >= delay
    assert sum(times) >= sum(scheduled)
    # Another address is not slowed by the attacker's failures: its wrong token is one of its
    # free ones, answered sooner than the attacker's last (which waited 2 s).
    seconds, status, answer = timed(BYSTANDER, url, "bystander-typo-0123456789")
    assert (status, answer["error"].endswith("(Authorization: Bearer TOKEN)")) == (401, True)
    assert seconds < scheduled[-1]
    # The right token, from the attacker's own address, is served at once (its next wrong
    # one would wait 4 s).
    seconds, status, answer = timed(ATTACKER, url, fleet.token)
    assert status == 200, answer
    assert seconds < scheduled[-1]
    # Peers are not slowed: a forged signature from the attacker's address, answered at once.
    status, _, answer = request("POST", url + "/peer/v1/report", b"\x80", source=ATTACKER)
    assert (status, answer) == (
        401,
        {"error": "unauthorized: peer request without a site signature"},
    )
