"""A fleet in containers (``gbroker fleet up --runtime docker``), end to end, with a real dockerd.

The image is built once per test session through ``gbroker image build`` (kept when its sources
have not changed). Then, through the user's path: a job whose input is uploaded to one site runs
at another and its output comes back through its owner; a broker SIGKILLed inside its container
while a job runs there is restarted and adopts the job, which runs once and ends done; a measured
transfer matches its link's shaping; ``down`` leaves no container, network or volume.
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
from gbroker.fleet import image
from gbroker.fleet.ports import free_port
from gbroker.security.auth import Tokens
from gbroker.topology import SiteSpec, Topology, save_topology

# Alone, after the others (scripts/test.sh): its fleets take the host's Docker, time shaped
# links.
pytestmark = pytest.mark.serial

# a cannot run a 4-core job: what is uploaded to a must be staged to b or c.
SITES = [SiteSpec("a", 2, uplink=12.5e6, downlink=12.5e6),
         SiteSpec("b", 4, uplink=2.5e6, downlink=2.5e6),
         SiteSpec("c", 4, uplink=12.5e6, downlink=12.5e6)]  # fmt: skip


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def built_image() -> str:
    subprocess.run(
        ["bash", "scripts/setup/ensure_docker.sh"], check=True, cwd=Path(__file__).parents[2]
    )
    image.build(image.DEFAULT_TAG)
    return image.DEFAULT_TAG


@pytest.fixture
def docker_fleet(tmp_path: Path, built_image: str) -> Iterator[Path]:
    topology = tmp_path / "topology.yaml"
    save_topology(Topology(SITES, "full", name="dk"), topology)
    directory = tmp_path / "fleet"
    # No NetMon: its test transfers would share the measured link.
    serve = ("--dcsmon-period", "0.2", "--lease", "3", "--no-netmon")
    fleet.up(topology, directory, None, serve, runtime="docker", image=built_image)
    try:
        yield directory
    finally:
        if (directory / fleet.FLEET_FILE).exists():
            fleet.down(directory)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gbroker-docker-test-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _url(directory: Path, site: str) -> str:
    return str(fleet.load(directory)["sites"][site]["url"])


def test_a_container_fleet_stages_adopts_shapes_and_leaves_nothing(
    docker_fleet: Path, world_dir: Path
) -> None:
    record = fleet.load(docker_fleet)
    docker = record["docker"]
    assert record["runtime"] == "docker"
    deadline = time.monotonic() + 30
    while not all(r["alive"] and r["answers"] is not False for r in fleet.status(docker_fleet)):
        assert time.monotonic() < deadline, fleet.status(docker_fleet)
        time.sleep(0.2)
    for site in ("a", "b", "c"):  # published on loopback only
        assert _url(docker_fleet, site).startswith("http://127.0.0.1:")
    token = fleet.client_token(docker_fleet)
    payload = world_dir / "input.bin"
    payload.write_bytes(bytes(range(256)) * 4096 * 5)  # 5 MiB
    staged = (
        '{"name": "staged", "executable": "/bin/sh", "min_cores": 4,'
        ' "arguments": ["-c", "wc -c < input.bin; hostname"]}'
    )
    long = (
        '{"name": "long", "executable": "/bin/sh", "min_cores": 4,'
        ' "arguments": ["-c", "echo run >> /tmp/runs-$GBROKER_JOB_ID; sleep 6;'
        ' cat /tmp/runs-$GBROKER_JOB_ID"]}'
    )

    async def stage() -> tuple[float, str, dict[str, object]]:
        async with Client(_url(docker_fleet, "b"), token=token) as to_b:
            began = time.perf_counter()
            await to_b.upload(payload)  # into b: its downlink, 20 Mbit/s
            into_b = payload.stat().st_size / (time.perf_counter() - began)
        async with Client(_url(docker_fleet, "a"), token=token) as to_a:
            job_id = await to_a.submit_with_files(staged.encode(), [payload])
            status = await to_a.wait(job_id, timeout=120)
            output = (await to_a.output(job_id, "stdout")).decode()
        return into_b, output, status

    into_b, output, status = asyncio.run(stage())
    assert 0.75 * 2.5e6 <= into_b <= 1.05 * 2.5e6, f"{into_b / 1e6:.2f} MB/s into b"
    assert status["state"] == "done", status
    ran_at = str(status["site"])
    assert ran_at in ("b", "c")
    size, host = output.split()
    assert int(size) == payload.stat().st_size
    assert host == f"{docker['prefix']}-{ran_at}"  # it ran in that container

    async def submit_long() -> str:
        async with Client(_url(docker_fleet, "a"), token=token) as to_a:
            job_id = await to_a.submit(long)
            for _ in range(200):
                if (await to_a.status(job_id))["state"] == "running":
                    return job_id
                await asyncio.sleep(0.1)
        raise AssertionError("the long job never started")

    job_id = asyncio.run(submit_long())

    async def where() -> str:
        async with Client(_url(docker_fleet, "a"), token=token) as to_a:
            return str((await to_a.status(job_id))["site"])

    site = asyncio.run(where())
    fleet.kill(docker_fleet, site)  # the broker only: the job runs on in its container
    time.sleep(1.0)
    fleet.restart(docker_fleet, site)

    async def finish() -> tuple[dict[str, object], str]:
        async with Client(_url(docker_fleet, "a"), token=token) as to_a:
            status = await to_a.wait(job_id, timeout=120)
            return status, (await to_a.output(job_id, "stdout")).decode()

    status, output = asyncio.run(finish())
    assert status["state"] == "done", status
    assert output.split() == ["run"]  # it ran once: adopted, not started again
    log = Path(fleet.load(docker_fleet)["sites"][site]["log"]).read_text()
    assert f"job {job_id}: adopted process group" in log

    fleet.down(docker_fleet)
    names = _docker("ps", "-a", "--format", "{{.Names}}").split()
    assert not [n for n in names if n.startswith(docker["prefix"])]
    assert docker["network"] not in _docker("network", "ls", "--format", "{{.Name}}").split()
    volumes = _docker("volume", "ls", "--format", "{{.Name}}").split()
    assert not set(docker["volumes"]) & set(volumes)


def test_a_compose_file_runs_as_is_with_debian_s_docker_compose(
    tmp_path: Path, built_image: str
) -> None:
    topology = tmp_path / "topology.yaml"
    save_topology(Topology(SITES, "full", name="dk"), topology)
    first = free_port()
    out = fleet.compose(topology, tmp_path / "compose", image=built_image, first_port=first)
    project = f"gbtest{first}"
    compose = ["docker-compose", "-p", project, "-f", str(out)]
    subprocess.run([*compose, "up", "-d"], check=True, capture_output=True)
    try:
        token = Tokens.load(tmp_path / "compose" / "tokens").first_token()

        async def run_one() -> dict[str, object]:
            url = f"http://127.0.0.1:{first + 1}"  # b
            async with Client(url, token=token) as client:
                for _ in range(100):
                    try:
                        await client.info()
                        break
                    except Exception:  # not up yet
                        await asyncio.sleep(0.2)
                job_id = await client.submit('{"executable": "/bin/true"}')
                return await client.wait(job_id, timeout=60)

        assert asyncio.run(run_one())["state"] == "done"
    finally:
        subprocess.run([*compose, "down", "-v"], check=True, capture_output=True)
    names = _docker("ps", "-a", "--format", "{{.Names}}").split()
    assert not [n for n in names if n.startswith(project)]
    assert not [v for v in _docker("volume", "ls", "-q").split() if v.startswith(project)]
