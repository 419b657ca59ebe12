"""A fleet in network namespaces (``gbroker fleet up --runtime netns``), end to end.

Each site has its own namespace, address and tbf-shaped access link. The tests go through the
user's path (``gbroker.fleet`` as the CLI calls it, the client as ``gbroker submit`` uses it): a
job whose input is uploaded to one site runs at another and its output comes back through its
owner; a measured transfer matches its link's shaping; a killed owner restarts from its journal
with nothing forgotten; ``down`` leaves no namespace, link, bridge or process behind; a partition
under a job stream loses nothing and runs nothing twice.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker import fleet
from gbroker.client.gclient import Client
from gbroker.fleet import netns
from gbroker.tools.chaos import ChaosPlan, parse_partition, run_chaos
from gbroker.topology import SiteSpec, Topology, save_topology

# Alone, after the others (scripts/test.sh): its fleets take the host's namespaces, time
# shaped links.
pytestmark = pytest.mark.serial

# a cannot run a 4-core job: what is uploaded to a must be staged to b or c.
SITES = [SiteSpec("a", 2, uplink=12.5e6, downlink=12.5e6),
         SiteSpec("b", 4, uplink=2.5e6, downlink=2.5e6),
         SiteSpec("c", 4, uplink=12.5e6, downlink=12.5e6)]  # fmt: skip


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


@pytest.fixture
def netns_fleet(tmp_path: Path) -> Iterator[Path]:
    topology = tmp_path / "topology.yaml"
    save_topology(Topology(SITES, "full", name="ns"), topology)
    directory = tmp_path / "fleet"
    # No NetMon: its test transfers would share the measured link.
    serve = ("--dcsmon-period", "0.2", "--lease", "3", "--no-netmon")
    fleet.up(topology, directory, None, serve, runtime="netns")
    try:
        yield directory
    finally:
        if (directory / fleet.FLEET_FILE).exists():
            fleet.down(directory)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory the jobs' user (nobody) can read and write (tmp_path is root's only)."""
    directory = Path(tempfile.mkdtemp(prefix="gbroker-netns-test-"))
    directory.chmod(0o777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _url(directory: Path, site: str) -> str:
    return str(fleet.load(directory)["sites"][site]["url"])


def test_members_have_their_own_addresses_and_shaped_links(netns_fleet: Path) -> None:
    record = fleet.load(netns_fleet)
    assert record["runtime"] == "netns"
    spaces = netns.NetnsFleet.from_dict(record["netns"])
    assert {m.netns for m in spaces.members.values()} <= _namespaces()
    addresses = {name: m.address for name, m in spaces.members.items()}
    assert len(set(addresses.values())) == 4  # three sites and MQTT
    for name in ("a", "b", "c"):
        assert _url(netns_fleet, name) == f"http://{addresses[name]}:8700"
    assert record["mqtt_url"] == f"mqtt://{addresses['mqtt']}:1883"
    shaped = subprocess.run(
        ["tc", "qdisc", "show", "dev", spaces.members["b"].port], capture_output=True, text=True
    ).stdout
    assert "tbf" in shaped
    assert "rate 20Mbit" in shaped  # b's downlink, 2.5e6 B/s
    deadline = time.monotonic() + 30  # a broker is healthy once it has joined MQTT
    while not all(r["alive"] and r["answers"] is not False for r in fleet.status(netns_fleet)):
        assert time.monotonic() < deadline, fleet.status(netns_fleet)
        time.sleep(0.2)
    # Each site's jobs get a cgroup each, as on the host (`ip netns exec` hid /sys/fs/cgroup
    # from the brokers it started: their jobs had no cpuset, memory or process limit).
    jobs = {r["name"]: r["jobs"] for r in fleet.status(netns_fleet) if r["name"] != "mqtt"}
    assert all(j["cgroups"] in (1, 2) for j in jobs.values()), jobs


def test_a_staged_job_runs_elsewhere_a_transfer_matches_its_shaping_and_nothing_is_left(
    netns_fleet: Path, world_dir: Path
) -> None:
    token = fleet.client_token(netns_fleet)
    payload = world_dir / "input.bin"
    payload.write_bytes(bytes(range(256)) * 4096 * 5)  # 5 MiB
    job = (
        '{"name": "staged", "executable": "/bin/sh", "min_cores": 4,'
        ' "arguments": ["-c", "wc -c < input.bin; hostname -I"]}'
    )

    async def scenario() -> tuple[str, float, str, dict[str, object]]:
        async with Client(_url(netns_fleet, "b"), token=token) as to_b:
            began = time.perf_counter()
            await to_b.upload(payload)  # into b: its downlink, 20 Mbit/s
            into_b = payload.stat().st_size / (time.perf_counter() - began)
        async with Client(_url(netns_fleet, "a"), token=token) as to_a:
            job_id = await to_a.submit_with_files(job.encode(), [payload])
            status = await to_a.wait(job_id, timeout=120)
            output = await to_a.output(job_id, "stdout")
        return job_id, into_b, output.decode(), status

    job_id, into_b, output, status = asyncio.run(scenario())
    assert 0.75 * 2.5e6 <= into_b <= 1.05 * 2.5e6, f"{into_b / 1e6:.2f} MB/s into b"
    assert status["state"] == "done", status
    ran_at = str(status["site"])
    assert ran_at in ("b", "c")  # a has 2 cores
    size, address = output.split()
    assert int(size) == payload.stat().st_size  # staged across sites, whole
    assert f"http://{address}:8700" == _url(netns_fleet, ran_at)  # it ran in that namespace

    # The owner is SIGKILLed and restarted: its journal holds the finished job.
    fleet.kill(netns_fleet, "a")
    fleet.restart(netns_fleet, "a")

    async def after_restart() -> dict[str, object]:
        async with Client(_url(netns_fleet, "a"), token=token) as to_a:
            return await to_a.status(job_id)

    assert asyncio.run(after_restart())["state"] == "done"

    spaces = netns.NetnsFleet.from_dict(fleet.load(netns_fleet)["netns"])
    fleet.down(netns_fleet)
    assert not {m.netns for m in spaces.members.values()} & _namespaces()
    assert spaces.prefix not in _links()


def test_a_partition_under_a_stream_loses_nothing_and_runs_nothing_twice(
    netns_fleet: Path, world_dir: Path
) -> None:
    plan = ChaosPlan(
        jobs=40, rate=4.0, partition=parse_partition("b:8"), job_seconds=(1.0, 2.0), settle=90
    )
    report = asyncio.run(run_chaos(netns_fleet, plan, world_dir / "run"))
    events = [e["event"] for e in report.events]
    assert "partitioned" in events
    assert "healed" in events
    counts = report.counts
    assert counts["accepted"] == 40, counts
    assert (counts["lost"], counts["ran_twice"], counts["forgotten"]) == (0, 0, 0), report.stories
    assert report.ok, counts


def test_a_netns_fleet_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match="needs root"):
        netns.check_host()
