"""`fleet up` waits at most its timeout in all (docs/DEPLOY.md): every member's start and the
brokers' readiness share one deadline, counted from the start of up, not one each."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gbroker import fleet
from gbroker.fleet import launch
from gbroker.fleet.members import wait_port
from gbroker.topology import SiteSpec, Topology, save_topology


@pytest.mark.network
def test_up_waits_for_every_member_and_readiness_under_one_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadlines: dict[str, float] = {}
    wait_ready = launch._wait_ready

    def port(url: str, pid: int, timeout: float, since: float | None = None) -> None:
        deadlines[url] = (time.monotonic() if since is None else since) + timeout
        wait_port(url, pid, timeout, since)

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
