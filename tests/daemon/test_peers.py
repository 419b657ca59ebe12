"""The peer client's notion of a peer's URL (gbroker.daemon.peers.PeerClient.peer_of) and its
retries' waits (pause, heard_online)."""

from __future__ import annotations

import asyncio

import pytest

from gbroker.daemon.peers import Forbidden, PeerClient
from gbroker.security.auth import PeerSigner


def _client() -> PeerClient:
    peers = {"Core16": "http://gb5895-Core16:8700", "a": "http://127.0.0.1:9000/"}
    return PeerClient("a", peers, PeerSigner("a", "s" * 64), lambda site, path: None)


def test_a_peer_url_is_recognised_whatever_the_case_of_its_host() -> None:
    """A topology may spell a host with capitals (a container named after its site); a parsed
    URL, as a staged file's source comes back, spells it in lower case: still that peer's."""
    client = _client()
    assert client.peer_of("http://gb5895-core16:8700/files/ab") == "Core16"
    assert client.peer_of("http://gb5895-Core16:8700/files/ab") == "Core16"
    assert client.peer_of("http://127.0.0.1:9000/files/ab") == "a"


@pytest.mark.parametrize(
    "url",
    [
        "http://gb5895-core16:8701/files/ab",  # another port
        "https://gb5895-core16:8700/files/ab",  # another scheme
        "http://gb5895-core16.evil:8700/files/ab",
        "http://127.0.0.1:9000",  # the base itself, nothing under it
        "http://[::1/files",  # not a URL
    ],
)
def test_anything_else_is_no_peer_and_gets_no_credentials(url: str) -> None:
    client = _client()
    assert client.peer_of(url) is None
    with pytest.raises(Forbidden):
        client.headers("GET", url)


@pytest.mark.asyncio
async def test_a_retry_waits_its_backoff_unless_the_peer_is_heard_online_again() -> None:
    """A report kept for a restarted owner went after the last backoff (up to 5 s), so the
    owner still showed a job running that had ended (a CI run of test_coalloc); it now goes
    as soon as MQTT says the peer is online."""
    client = _client()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await client.pause("Core16", 0.05)  # nobody says it is back: the whole backoff
    assert loop.time() - began >= 0.05
    waiting = asyncio.create_task(client.pause("Core16", 30))
    other = asyncio.create_task(client.pause("a", 30))
    await asyncio.sleep(0.01)
    began = loop.time()
    client.heard_online("Core16")
    await asyncio.wait_for(waiting, 1)
    assert loop.time() - began < 1
    assert not other.done()  # another peer's retries wait on
    other.cancel()
