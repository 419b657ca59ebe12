"""Two real broker daemons on loopback: HTTP between them, real processes, a real journal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.daemon.config import DaemonConfig
from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.security.auth import bearer
from gbroker.topology import SiteSpec, Topology
from tests.brokers import AUTH, TOKEN, daemon_config


def pair(cores_a: int = 2, cores_b: int = 8) -> Topology:
    sites = [
        SiteSpec("a", cores_a, http=f"http://127.0.0.1:{free_port()}"),
        SiteSpec("b", cores_b, http=f"http://127.0.0.1:{free_port()}"),
    ]
    return Topology(sites, "full", name="pair")


async def running_pair(
    tmp_path: Path, policy: DispatchPolicy
) -> AsyncIterator[dict[str, BrokerDaemon]]:
    """Daemons for the sites of :func:`pair`, serving until the iteration ends."""
    topology = pair()
    daemons = {
        site: BrokerDaemon(daemon_config(site, topology, tmp_path / site, policy))
        for site in topology.sites
    }
    for daemon in daemons.values():
        await daemon.__aenter__()
    try:
        yield daemons
    finally:
        for daemon in daemons.values():
            await daemon.__aexit__(None, None, None)


@pytest_asyncio.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[dict[str, BrokerDaemon]]:
    async for daemons in running_pair(tmp_path, DispatchPolicy(Algorithm.DLO)):
        yield daemons


JOB = """
name: hello
executable: /bin/sh
arguments: ["-c", "echo hello from $GBROKER_SITE on $GBROKER_CORES cores"]
total_cpu_count: {exact: 4}
wall_time_limit: 60
"""


@pytest.mark.asyncio
async def test_a_job_too_big_for_its_entry_site_runs_next_door(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a, b = fleet["a"], fleet["b"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{a.url}/api/v1/jobs", data=JOB) as response:
            assert response.status == 201, await response.text()
            job_id = (await response.json())["id"]
        assert job_id.startswith("a.")
        async with http.get(f"{b.url}/api/v1/jobs/{job_id}/wait?timeout=20") as response:
            status = await response.json()  # asked b; a owns the job and answers
        assert status["state"] == "done", status
        assert status["site"] == "b"
        assert status["exit_code"] == 0
        async with http.get(f"{a.url}/api/v1/jobs/{job_id}/output/stdout") as response:
            assert (await response.text()) == "hello from b on 4 cores\n"
        rows = await a.journal.all_jobs()
        assert [(r.id, str(r.state), r.site) for r in rows] == [(job_id, "done", "b")]


@pytest.mark.asyncio
async def test_bad_submissions_get_a_precise_400_and_nothing_is_journaled(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{a.url}/api/v1/jobs", data="<JobDefinition") as response:
            assert response.status == 400
            assert "XML" in (await response.json())["error"]
        too_big = JOB.replace("exact: 4", "exact: 64")
        async with http.post(f"{a.url}/api/v1/jobs", data=too_big) as response:
            body = await response.json()
            assert response.status == 400
            # No site of the fleet has 64 cores: refused before anything is journaled, naming
            # the field and the closest site's value.
            assert body["field"] == "total_cpu_count"
            assert body["error"].endswith("got '8 cores at site b, the closest of 2'")
        async with http.get(f"{a.url}/api/v1/jobs/a.nope") as response:
            assert response.status == 400
            assert (await response.json())["field"] == "job id"
        async with http.get(f"{a.url}/api/v1/jobs/a.404") as response:
            assert response.status == 404
    assert await a.journal.all_jobs() == []


@pytest.mark.asyncio
async def test_cancel_kills_a_running_job(fleet: dict[str, BrokerDaemon]) -> None:
    a = fleet["a"]
    sleepy = JOB.replace(
        '["-c", "echo hello from $GBROKER_SITE on $GBROKER_CORES cores"]', '["-c", "sleep 30"]'
    ).replace("exact: 4", "exact: 1")
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{a.url}/api/v1/jobs", data=sleepy) as response:
            job_id = (await response.json())["id"]
        for _ in range(100):
            async with http.get(f"{a.url}/api/v1/jobs/{job_id}") as response:
                if (await response.json())["state"] == "running":
                    break
            await asyncio.sleep(0.05)
        async with http.delete(f"{a.url}/api/v1/jobs/{job_id}") as response:
            assert (await response.json())["state"] == "cancelled"
        for _ in range(100):
            if not a.executor.running() and not fleet["b"].executor.running():
                break
            await asyncio.sleep(0.1)
        assert not a.executor.running()
        assert not fleet["b"].executor.running()


@pytest.mark.asyncio
async def test_a_job_that_cannot_run_here_fails_and_frees_its_cores(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    one_core = JOB.replace("exact: 4", "exact: 1")
    # A path outside the job directory is refused at submission (it could never run).
    absolute = one_core + "output: /etc/passwd\n"
    # One inside it that cannot be opened at launch: its directory "out" is a staged file.
    blocked = one_core + 'output: out/log\nstaging: [{file_name: out, inline_data: "x"}]\n'
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{a.url}/api/v1/jobs", data=absolute) as response:
            assert response.status == 400
            assert (await response.json())["field"] == "<job>: output"
        async with http.post(f"{a.url}/api/v1/jobs", data=blocked) as response:
            job_id = (await response.json())["id"]
        async with http.get(f"{a.url}/api/v1/jobs/{job_id}/wait?timeout=10") as response:
            status = await response.json()
    assert status["state"] == "failed"
    assert "stdout" in status["error"] or "output" in status["error"].lower()
    for daemon in fleet.values():
        assert daemon.agent.state().free_cores == daemon.agent.local.total_cores


@pytest.mark.asyncio
async def test_neighbours_follow_dcsmon_and_stop_sending_to_a_broker_gone_offline(
    tmp_path: Path,
) -> None:
    from gbroker.mqtt.broker import EmbeddedBroker

    topology = pair()
    async with EmbeddedBroker() as mqtt:
        daemons = {
            site: BrokerDaemon(
                daemon_config(site, topology, tmp_path / site, mqtt_url=mqtt.url, dcsmon_period=0.1)
            )
            for site in topology.sites
        }
        a, b = daemons["a"], daemons["b"]
        await a.__aenter__()
        await b.__aenter__()
        try:
            async with asyncio.timeout(10):
                while (seen := a.view.get("b")) is None or seen.observed_at == 0.0:
                    await asyncio.sleep(0.05)  # b's own publication replaced the seeded guess
        finally:
            await b.__aexit__(None, None, None)  # a clean close publishes offline
        try:
            async with asyncio.timeout(10):
                while a.view.get("b") is not None:
                    await asyncio.sleep(0.05)
            async with (
                aiohttp.ClientSession(headers=AUTH) as http,
                http.post(f"{a.url}/api/v1/jobs", data=JOB) as response,
            ):
                assert response.status == 400  # 4 cores: only b had them, and b is gone
        finally:
            await a.__aexit__(None, None, None)


@pytest.mark.asyncio
async def test_uploaded_inputs_are_staged_to_the_executing_site(
    fleet: dict[str, BrokerDaemon], tmp_path: Path
) -> None:
    from gbroker.client.gclient import Client

    a = fleet["a"]
    data = tmp_path / "input.dat"
    data.write_bytes(b"x" * 100_000)
    job = (
        'executable: /bin/sh\narguments: ["-c", "wc -c < input.dat"]\ntotal_cpu_count: {exact: 4}\n'
    )
    async with Client(a.url, token=TOKEN) as client:
        job_id = await client.submit_with_files(job.encode(), [data])
        status = await client.wait(job_id, timeout=20)
        assert (status["state"], status["site"]) == ("done", "b")  # staged from a to b
        assert (await client.output(job_id)).strip() == b"100000"


@pytest.mark.asyncio
async def test_the_file_store_verifies_what_it_keeps(fleet: dict[str, BrokerDaemon]) -> None:
    import hashlib

    a = fleet["a"]
    body = b"hello"
    good = hashlib.sha256(body).hexdigest()
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.put(f"{a.url}/files/{'0' * 64}", data=body) as response:
            assert response.status == 400
            assert "sha256 mismatch" in (await response.json())["error"]
        async with http.put(f"{a.url}/files/nothex", data=body) as response:
            assert response.status == 400
            assert (await response.json())["field"] == "sha256"
        async with http.put(f"{a.url}/files/{good}", data=body) as response:
            assert response.status == 201
        async with http.get(f"{a.url}/files/{good}") as response:
            assert await response.read() == body
        async with http.get(f"{a.url}/files/{'1' * 64}") as response:
            assert response.status == 404
    assert sorted(p.name for p in a.files.root.iterdir()) == [good]  # no partial files left


@pytest.mark.asyncio
async def test_oversized_uploads_are_refused(tmp_path: Path) -> None:
    topology = pair()
    config = daemon_config("a", topology, tmp_path / "a", max_upload=1000)
    async with BrokerDaemon(config) as a, aiohttp.ClientSession(headers=AUTH) as http:
        body = b"y" * 5000
        import hashlib

        digest = hashlib.sha256(body).hexdigest()
        async with http.put(f"{a.url}/files/{digest}", data=body) as response:
            assert response.status == 413
            assert "1000 bytes" in (await response.json())["error"]
        assert list(a.files.root.iterdir()) == []


@pytest.mark.asyncio
async def test_tokens_and_peer_signatures_guard_the_apis(tmp_path: Path) -> None:
    import msgpack

    from gbroker.client.gclient import Client, ClientError

    topology = pair()
    async with (
        BrokerDaemon(daemon_config("a", topology, tmp_path / "a")) as a,
        BrokerDaemon(daemon_config("b", topology, tmp_path / "b")) as b,
    ):
        async with Client(a.url, token="not-the-token-at-all") as stranger:
            with pytest.raises(ClientError) as info:
                await stranger.submit(JOB)
            assert info.value.status == 401
        async with Client(a.url, token=TOKEN) as client:
            job_id = await client.submit(JOB)
            status = await client.wait(job_id, timeout=20)  # a and b signed their calls
            assert (status["state"], status["site"]) == ("done", "b")
        async with aiohttp.ClientSession(headers=AUTH) as http:
            forged = msgpack.packb({"id": job_id, "site": "b", "kind": "finished", "ok": False})
            async with http.post(f"{a.url}/peer/v1/report", data=forged) as response:
                assert response.status == 401  # the client token opens no peer route
            async with http.get(f"{b.url}/api/v1/jobs/{job_id}") as response:
                assert (await response.json())["state"] == "done"  # forwarded with the token


@pytest.mark.asyncio
async def test_a_broker_with_no_credentials_configured_generates_them(tmp_path: Path) -> None:
    from gbroker.client.gclient import Client
    from gbroker.security import runtime
    from gbroker.security.auth import Tokens

    topology = pair()
    config = DaemonConfig("a", topology, tmp_path / "a")  # no token, no secret: none given
    async with BrokerDaemon(config) as a:
        tokens = tmp_path / "a" / "tokens"
        secret = tmp_path / "a" / "secret"
        assert tokens.stat().st_mode & 0o777 == 0o600
        assert secret.stat().st_mode & 0o777 == 0o600
        async with aiohttp.ClientSession() as http, http.get(f"{a.url}/api/v1/jobs") as response:
            assert response.status == 401
        token = Tokens.load(tokens).first_token()
        assert runtime.find_token(a.url) == token  # a client of this user finds it
        async with Client(a.url) as client:  # with no token named
            assert await client.jobs() == []
    assert runtime.find_token(a.url) is None  # a stopped broker is no longer listed


@pytest.mark.asyncio
async def test_a_job_is_its_submitters_and_the_admins_only(tmp_path: Path) -> None:
    from gbroker.client.gclient import Client, ClientError

    tokens = tmp_path / "tokens"
    tokens.write_text(
        "alice alice-token-0123456789\nbob bob-token-0123456789\nops ops-token-0123456789 admin\n"
    )
    topology = pair()
    configs = [daemon_config(s, topology, tmp_path / s, token_file=tokens) for s in "ab"]
    async with BrokerDaemon(configs[0]) as a, BrokerDaemon(configs[1]) as b:
        async with Client(a.url, token="alice-token-0123456789") as alice:
            job_id = await alice.submit(JOB)
            assert (await alice.wait(job_id, timeout=20))["submitter"] == "alice"
            assert [j["id"] for j in await alice.jobs()] == [job_id]
            assert (await alice.output(job_id)).startswith(b"hello from b")
        async with Client(b.url, token="bob-token-0123456789") as bob:  # asked at b: forwarded
            assert await bob.jobs() == []
            for call in (bob.status(job_id), bob.cancel(job_id), bob.output(job_id)):
                with pytest.raises(ClientError) as refused:
                    await call
                assert refused.value.status == 403
                assert "belongs to another user" in str(refused.value)
        async with Client(a.url, token="ops-token-0123456789") as ops:
            assert (await ops.status(job_id))["state"] == "done"
            assert await ops.jobs() == []  # an admin's own jobs by default...
        ops_http = aiohttp.ClientSession(headers=bearer("ops-token-0123456789"))
        async with ops_http as http, http.get(f"{a.url}/api/v1/jobs?all=1") as response:
            assert [j["id"] for j in (await response.json())["jobs"]] == [job_id]  # ...all
        async with aiohttp.ClientSession(headers=bearer("bob-token-0123456789")) as http:
            async with http.get(f"{a.url}/api/v1/jobs?all=1") as response:
                assert response.status == 403
            async with http.get(f"{a.url}/api/v1/info") as response:
                assert (await response.json())["jobs"]["latest"] == []  # not even its name


@pytest.mark.asyncio
async def test_a_broker_bound_to_every_interface_advertises_a_reachable_url(
    tmp_path: Path,
) -> None:
    topology = pair()
    config = daemon_config("a", topology, tmp_path / "a", host="0.0.0.0")
    async with BrokerDaemon(config) as a, aiohttp.ClientSession(headers=AUTH) as http:
        assert a.url == topology.sites["a"].http  # its topology URL, never 0.0.0.0
        async with http.get(f"{a.url}/api/v1/info") as response:
            assert (await response.json())["url"] == topology.sites["a"].http
    alone = Topology([SiteSpec("solo", 1)], "full", name="solo")  # no URL in the topology
    config = daemon_config("solo", alone, tmp_path / "solo", host="0.0.0.0")
    async with BrokerDaemon(config) as solo:
        assert "0.0.0.0" not in solo.url
