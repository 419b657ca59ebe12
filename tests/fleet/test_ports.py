"""Ports named before their server binds them: outside the ephemeral range, never twice."""

from __future__ import annotations

import socket

import pytest

from gbroker.fleet import ports
from gbroker.fleet.ports import free_port


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    chosen = [free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    assert all(20_000 <= port < ports._ephemeral_start() for port in chosen)


def test_a_port_somebody_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Make the allowed range end just past the taken port and start the scan on it.
        monkeypatch.setattr(ports, "_LOWEST", port)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: port + 50)
        monkeypatch.setattr(ports._rng, "randrange", lambda span: 0)
        monkeypatch.setattr(ports, "_handed_out", set())
        assert port < free_port() < port + 50


def test_an_exhausted_range_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_LOWEST", 40_000)
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: 40_002)
    monkeypatch.setattr(ports, "_handed_out", {40_000, 40_001})
    with pytest.raises(OSError, match=r"no free TCP port on 127\.0\.0\.1 between 40000 and 40001"):
        free_port()


def test_a_forked_process_chooses_its_ports_independently_of_its_parent() -> None:
    """A fork (mutmut's workers, a forking server) must not replay its parent's choices: two
    siblings would name the same port, and one would fail with "address already in use"."""
    import json
    import os

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        os.write(write, json.dumps([free_port() for _ in range(3)]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = json.loads(pipe.read())
    os.waitpid(child, 0)
    ours = [free_port() for _ in range(3)]
    assert theirs != ours
