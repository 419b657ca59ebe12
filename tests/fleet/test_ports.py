"""Ports named before their server binds them: outside the ephemeral range, never twice, not
even by two processes of one user."""

from __future__ import annotations

import os
import socket
from pathlib import Path

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


def test_a_port_another_process_of_the_user_handed_out_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes scanning from the same point (two fleets going up at once) used to name
    the same port, and the broker that bound it second exited."""
    reservations = str(tmp_path / "ports")
    monkeypatch.setattr(ports, "_reservations", lambda: reservations)
    monkeypatch.setattr(ports, "_LOWEST", 41_000)
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: 41_010)
    monkeypatch.setattr(ports._rng, "randrange", lambda span: 0)
    monkeypatch.setattr(ports, "_handed_out", set())
    first = free_port()
    monkeypatch.setattr(ports, "_handed_out", set())  # as another process would start
    assert free_port() == first + 1
    assert oct(os.stat(reservations).st_mode & 0o777) == "0o600"
    # Past its time, a reservation is free again.
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "RESERVED_FOR", -1.0)
    Path(reservations).write_text(f"{first} 0\n{first + 1} 0\n")
    assert free_port() == first


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user (CI is root)")
def test_a_reservation_file_of_another_user_is_not_used(tmp_path: Path) -> None:
    planted = tmp_path / "ports"
    planted.write_text("41000 99999999999\n")
    os.chown(planted, 65534, 65534)  # another user's: it cannot keep us from any port
    assert ports._reserve(41_000, str(planted))
    assert planted.read_text() == "41000 99999999999\n"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert ports._reserve(41_000, str(link))
    assert not (tmp_path / "elsewhere").exists()
