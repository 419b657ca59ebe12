"""`fleet up` waits at most its timeout in all (docs/DEPLOY.md): every member's start and the
brokers' readiness share one deadline, counted from the start of up, not one each; and a member
that could not take its port is an error of up, not a fleet with a broker missing."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from gbroker import fleet
from gbroker.fleet import launch
from gbroker.fleet.members import FleetError, wait_port
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology, save_topology


@pytest.mark.network
def test_up_waits_for_every_member_and_readiness_under_one_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadlines: dict[str, float] = {}
    wait_ready = launch._wait_ready

    def port(
        url: str, pid: int, timeout: float, since: float | None = None, owned: bool = False
    ) -> None:
        deadlines[url] = (time.monotonic() if since is None else since) + timeout
        wait_port(url, pid, timeout, since, owned)

    def ready(record: dict[str, Any], token: str, context: Any, deadline: float) -> None:
        deadlines["ready"] = deadline
        wait_ready(record, token, context, deadline)

    monkeypatch.setattr(launch, "wait_port", port)
    monkeypatch.setattr(launch, "_wait_ready", ready)
    topology = tmp_path / "pair.yaml"
    save_topology(Topology([SiteSpec("a", 2), SiteSpec("b", 2)], "full", name="pair"), topology)
    began = time.monotonic()
    record = fleet.up(topology, tmp_path / "fleet", timeout=25.0)
    try:
        ended = time.monotonic()
        urls = {record["mqtt_url"], *(member["url"] for member in record["sites"].values())}
        assert set(deadlines) == {*urls, "ready"}
        assert len(set(deadlines.values())) == 1, deadlines  # one deadline for all
        (deadline,) = set(deadlines.values())
        assert began + 25.0 <= deadline <= ended + 25.0  # 25 s from the start of up
    finally:
        fleet.down(tmp_path / "fleet")


@pytest.mark.network
def test_a_broker_whose_port_another_process_took_fails_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is chosen before its broker binds it; another process can bind it in between
    (two fleets on a host chose the same one). That broker exits ("address already in use")
    while the port answers for the other process: up said the fleet was up, after waiting out
    its timeout for a broker that was gone, and every request to that site was refused."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        chosen = iter([taken])
        monkeypatch.setattr(launch, "free_port", lambda: next(chosen, None) or free_port())
        topology = tmp_path / "pair.yaml"
        save_topology(Topology([SiteSpec("a", 2), SiteSpec("b", 2)], "full", name="pair"), topology)
        began = time.monotonic()
        with pytest.raises(FleetError, match=f"127.0.0.1:{taken} exited during start-up"):
            fleet.up(topology, tmp_path / "fleet", timeout=25.0)
        assert time.monotonic() - began < 20  # at once, not at the end of the timeout
    assert "address already in use" in (tmp_path / "fleet" / "a.log").read_text().lower()
