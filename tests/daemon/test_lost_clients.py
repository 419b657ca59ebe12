"""A client that goes away in the middle of its request's body: no traceback, nothing lost.

A peer stopping while its NetMon probe streams in, or a user's upload cut off, used to end in
aiohttp's "Error handling request" with the handler's ConnectionResetError: an error in the
log for what is the client's leaving (seen as a failure of tests/security/test_tls.py, whose
brokers stop while they probe each other). The broker answers nobody, logs one line, and goes
on serving.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology
from netmon.service import PROBE_PATH
from tests.brokers import AUTH, daemon_config, signed


async def cut_off(port: int, head: dict[str, str], path: str, method: str = "POST") -> None:
    """Send the head of a request announcing 1 MB, 100 bytes of it, and hang up."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Length: 1000000"]
    lines += [f"{name}: {value}" for name, value in head.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + b"x" * 100)
    await writer.drain()
    await asyncio.sleep(0.2)  # the handler is reading the body by now
    writer.transport.abort()  # a reset, as a killed process's socket gives
    await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_request_cut_off_mid_body_logs_no_error_and_the_broker_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    topology = Topology([SiteSpec("solo", 2, http=url)], (), name="one")
    daemon = BrokerDaemon(daemon_config("solo", topology, tmp_path / "data"))
    await daemon.__aenter__()
    try:
        with caplog.at_level(logging.INFO):
            await cut_off(port, dict(AUTH), "/api/v1/jobs")  # a client's submission
            probe = signed("solo", "POST", url + PROBE_PATH, None, to="solo")
            await cut_off(port, probe, PROBE_PATH)  # a peer's NetMon probe
            await cut_off(port, dict(AUTH), "/files/" + "0" * 64, "PUT")  # an upload
        async with aiohttp.ClientSession(headers=AUTH) as http:
            async with http.post(f"{url}/api/v1/jobs", data=b"executable: /bin/true\n") as r:
                assert r.status == 201, await r.text()
            async with http.get(f"{url}/api/v1/health") as r:
                assert (r.status, (await r.json())["ok"]) == (200, True)
    finally:
        await daemon.__aexit__(None, None, None)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    gone = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert len(gone) == 3, gone  # one line each, at INFO
