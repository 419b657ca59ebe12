"""A local fleet of real broker processes with an embedded MQTT broker, driven by the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.client import Client, ClientError
from gbroker.topology import SiteSpec, Topology, save_topology

BIG_JOB = "executable: /bin/echo\narguments: [big]\ntotal_cpu_count: {exact: 8}\n"


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def fleet(tmp_path: Path, fleet_mqtt: str | None) -> Iterator[tuple[Path, dict[str, str]]]:
    """Three sites; with the fleet's embedded MQTT broker, then with a mosquitto."""
    topology = tmp_path / "three.yaml"
    sites = [SiteSpec("a", 2), SiteSpec("b", 2), SiteSpec("c", 8)]
    save_topology(Topology(sites, "full", name="three"), topology)
    directory = tmp_path / "fleet"
    mqtt = ("--mqtt", fleet_mqtt) if fleet_mqtt else ()
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory), *mqtt)
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield directory, {name: m["url"] for name, m in record["sites"].items()}
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


async def submit_big(url: str) -> dict[str, object]:
    async with Client(url) as client:
        job_id = await client.submit(BIG_JOB)
        return await client.wait(job_id, timeout=30)


def test_a_killed_broker_is_seen_through_its_last_will_and_gets_no_more_jobs(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    directory, urls = fleet
    assert gbroker("fleet", "status", "--dir", str(directory)).returncode == 0
    status = asyncio.run(submit_big(urls["a"]))  # only c has 8 cores
    assert (status["state"], status["site"]) == ("done", "c")

    killed = gbroker("fleet", "kill", "c", "--dir", str(directory))
    assert killed.returncode == 0, killed.stderr
    assert gbroker("fleet", "status", "--dir", str(directory)).returncode == 1

    async def refused_everywhere() -> list[int]:
        # The last-will reaches the neighbours within milliseconds; allow a loaded machine 10 s.
        for site in ("a", "b"):
            async with Client(urls[site]) as client, asyncio.timeout(10):
                while True:
                    try:
                        await client.submit(BIG_JOB)  # still sent to c: it fails there
                    except ClientError as refused:
                        codes.append(refused.status)
                        break
                    await asyncio.sleep(0.1)
        return codes

    codes: list[int] = []
    assert asyncio.run(refused_everywhere()) == [400, 400]

    restarted = gbroker("fleet", "restart", "c", "--dir", str(directory))
    assert restarted.returncode == 0, restarted.stderr

    async def accepted_again() -> dict[str, object]:
        for _ in range(100):  # until a hears c's online and state again
            try:
                return await submit_big(urls["a"])
            except ClientError:
                await asyncio.sleep(0.1)
        raise AssertionError("a never sent work to the restarted c")

    status = asyncio.run(accepted_again())
    assert (status["state"], status["site"]) == ("done", "c")


def test_fleet_commands_report_errors(tmp_path: Path) -> None:
    missing = gbroker("fleet", "status", "--dir", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "no fleet" in missing.stderr


def test_the_demo_serves_every_job_and_tears_down() -> None:
    done = gbroker("demo", "--jobs", "8", "--rate", "4", "--seed", "2")
    assert done.returncode == 0, done.stderr
    assert "(8 of 8 done)" in done.stdout
    assert "B = " in done.stdout
    assert "fleet down" in done.stderr
