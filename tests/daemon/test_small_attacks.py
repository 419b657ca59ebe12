"""The smaller attacks of issue 25, against a fleet of real broker processes from `fleet up`.

- a peer request captured on its way to one site, replayed to another;

Each test is the attack as it was made, asserting the refusal the broker now answers.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from gbroker.daemon.peers import PeerClient
from gbroker.protocol import wire
from gbroker.security.auth import PeerSigner, Tokens
from gbroker.topology import SiteSpec, Topology, save_topology

pytestmark = pytest.mark.network

SLEEPER = "executable: /bin/sleep\narguments: ['30']\ntotal_cpu_count: {exact: 1}\n"


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    token: str
    secret: str


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args], capture_output=True, text=True, timeout=120
    )


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
