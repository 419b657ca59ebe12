"""Real broker daemons (three sites, HTTP between them, real processes, journals on disk) running
what real grids write: job arrays from sweeps, requirements matched to site properties, file
systems, staging-only jobs, HTTP staging in and out with sizes learned up front, CreationFlag and
DeleteOnTermination, and the refusals of what cannot run. A real HTTP server plays the users'
data server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import pytest_asyncio
from aiohttp import web

from gbroker.core.dispatch import Algorithm, DispatchPolicy
from gbroker.core.requirements import FileSystemSpec
from gbroker.daemon.server import BrokerDaemon
from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology
from tests.brokers import AUTH, daemon_config

FIXTURES = Path(__file__).parent.parent / "fixtures" / "jsdl"
MB = 1_000_000
GiB = 1 << 30

pytestmark = pytest.mark.network


@dataclass
class DataServer:
    """The users' own HTTP server: files to stage in (GET, HEAD), a place to stage out (PUT)."""

    files: dict[str, bytes] = field(default_factory=dict)
    heads: list[str] = field(default_factory=list)
    port: int = 0

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    async def get(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if request.method == "HEAD":
            self.heads.append(name)
        if name not in self.files:
            return web.Response(status=404)
        return web.Response(body=self.files[name])

    async def put(self, request: web.Request) -> web.StreamResponse:
        self.files[request.match_info["name"]] = await request.read()
        return web.Response(status=201)


@pytest_asyncio.fixture
async def data_server() -> AsyncIterator[DataServer]:
    server = DataServer()
    app = web.Application()
    app.router.add_get("/{name:.+}", server.get)  # HEAD too
    app.router.add_put("/{name:.+}", server.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


def scratch(root: Path, site: str) -> Path:
    """A site's SCRATCH file system: world-writable with the sticky bit, as /tmp is (jobs run
    as nobody when the broker runs as root), under a root any user can traverse."""
    mount = root / site / "scratch"
    mount.mkdir(parents=True)
    os.chmod(mount, 0o1777)
    os.chmod(mount.parent, 0o755)
    return mount


@pytest.fixture
def fs_root() -> Iterator[Path]:
    """Where the sites' file systems live: outside pytest's private (0700) temporary tree."""
    root = Path(tempfile.mkdtemp(prefix="gbroker-fs-"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def grid(fs_root: Path) -> Topology:
    """a: small memory, no file systems; b: 4 GiB per node, LINUX/x86_64, exclusive, SCRATCH;
    c: 512 MiB per node, SCRATCH."""

    def url() -> str:
        return f"http://127.0.0.1:{free_port()}"

    sites = [
        SiteSpec("a", 4, http=url(), memory_per_node=256 << 20, operating_system="LINUX"),
        SiteSpec(
            "b",
            4,
            http=url(),
            memory_per_node=4 * GiB,
            operating_system="LINUX",
            cpu_architecture="x86_64",
            nodes=2,
            exclusive=True,
            file_systems=(
                FileSystemSpec("SCRATCH", str(scratch(fs_root, "b")), "temporary", 10 * GiB),
            ),
        ),
        SiteSpec(
            "c",
            4,
            http=url(),
            memory_per_node=512 << 20,
            operating_system="LINUX",
            file_systems=(
                FileSystemSpec("SCRATCH", str(scratch(fs_root, "c")), "temporary", 10 * GiB),
            ),
        ),
    ]
    return Topology(sites, "full", name="features")


@pytest_asyncio.fixture
async def fleet(tmp_path: Path, fs_root: Path) -> AsyncIterator[dict[str, BrokerDaemon]]:
    topology = grid(fs_root)
    daemons = {
        name: BrokerDaemon(
            daemon_config(
                name,
                topology,
                tmp_path / name,
                DispatchPolicy(Algorithm.DLO),
                allow_private_sources=True,
            )
        )
        for name in topology.sites
    }
    for daemon in daemons.values():
        await daemon.__aenter__()
    try:
        yield daemons
    finally:
        for daemon in daemons.values():
            await daemon.__aexit__(None, None, None)


async def post(
    http: aiohttp.ClientSession, url: str, body: str | bytes, **kw: Any
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/api/v1/jobs", data=body, **kw) as response:
        return response.status, await response.json()


async def wait(http: aiohttp.ClientSession, url: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{url}/api/v1/jobs/{job_id}/wait?timeout=60") as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def output(http: aiohttp.ClientSession, url: str, job_id: str) -> str:
    async with http.get(f"{url}/api/v1/jobs/{job_id}/output/stdout") as response:
        return await response.text()


@pytest.mark.asyncio
async def test_a_sweep_is_an_array_of_jobs_with_their_values(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    text = (FIXTURES / "sweep_echo_100.jsdl").read_text().replace('end="100"', 'end="12"')
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, text)
        assert status == 201, body
        array_id = body["id"]
        assert body["size"] == 12
        assert body["elements"] == [f"{array_id}_1", f"{array_id}_12"]
        done = await wait(http, fleet["b"].url, array_id)  # any broker answers for it
        assert done["array"] is True
        assert (done["state"], done["counts"]) == ("done", {"done": 12})
        assert [e["id"] for e in done["elements"]] == [f"{array_id}_{i}" for i in range(1, 13)]
        for i in (1, 7, 12):  # its Output, out.txt, is its standard output
            assert await output(http, a.url, f"{array_id}_{i}") == f"value {i}\n"
        # Each element is an ordinary job with its own value.
        for i in range(1, 13):
            async with http.get(f"{a.url}/api/v1/jobs/{array_id}_{i}") as response:
                element = await response.json()
            assert element["name"] == f"echo-sweep-{i}"
            assert element["state"] == "done"
        async with http.get(f"{a.url}/api/v1/jobs", params={"array": array_id}) as response:
            listed = (await response.json())["jobs"]
        assert sorted(j["id"] for j in listed) == sorted(f"{array_id}_{i}" for i in range(1, 13))
        async with http.get(f"{a.url}/api/v1/jobs/{array_id}/history") as response:
            assert response.status == 400
            assert "name one, e.g." in (await response.json())["error"]
    specs = {r.id: msgpack.unpackb(r.spec) for r in await a.journal.all_jobs()}
    assert specs[f"{array_id}_5"]["arguments"] == ["value", "5"]


@pytest.mark.asyncio
async def test_an_array_is_idempotent_by_key_and_cancelled_whole(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    sleep = (
        "executable: /bin/sleep\narguments: ['30']\n"
        "sweep: {assignments: [{parameters: [name], values: [s1, s2, s3]}]}\nname: x\n"
    )
    async with aiohttp.ClientSession(headers=AUTH) as http:
        key = {"Idempotency-Key": '"array-key-1"'}
        status, first = await post(http, a.url, sleep, headers=key)
        assert status == 201, first
        status, again = await post(http, a.url, sleep, headers=key)
        assert (status, again["id"]) == (200, first["id"])
        status, other = await post(http, a.url, sleep.replace("s3", "s4"), headers=key)
        assert status == 422
        assert other["job"] == first["id"]
        status, _ = await post(http, a.url, "executable: /bin/true\n", headers=key)
        assert status == 422  # the key made an array
        async with http.delete(f"{a.url}/api/v1/jobs/{first['id']}") as response:
            cancelled = await response.json()
        assert cancelled["state"] == "cancelled"
        assert cancelled["counts"] == {"cancelled": 3}
    assert len(await a.journal.all_jobs()) == 3  # one array of three, not two


@pytest.mark.asyncio
async def test_an_arrays_key_is_still_held_after_a_restart(
    fleet: dict[str, BrokerDaemon],
) -> None:
    """The arrays' keys are answered from memory: a restarted broker reads them back."""
    a = fleet["a"]
    sweep = (
        "executable: /bin/true\nname: x\n"
        "sweep: {assignments: [{parameters: [name], values: [p, q]}]}\n"
    )
    key = {"Idempotency-Key": '"array-key-2"'}
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, first = await post(http, a.url, sweep, headers=key)
        assert status == 201, first
    config = a.config
    await a.__aexit__(None, None, None)
    restarted = BrokerDaemon(config)
    await restarted.__aenter__()
    fleet["a"] = restarted
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, single = await post(http, restarted.url, "executable: /bin/true\n", headers=key)
        assert (status, single["job"]) == (422, first["id"])  # the key made an array
        status, again = await post(http, restarted.url, sweep, headers=key)
        assert (status, again["id"]) == (200, first["id"])
        status, other = await post(http, restarted.url, sweep.replace("q]", "r]"), headers=key)
        assert (status, other["job"]) == (422, first["id"])


@pytest.mark.asyncio
async def test_an_array_left_half_submitted_is_completed_on_restart(
    fleet: dict[str, BrokerDaemon], tmp_path: Path
) -> None:
    a = fleet["a"]
    body = (
        b"executable: /bin/echo\narguments: [n]\n"
        b"sweep: {assignments: [{parameters: ['arguments[0]'],"
        b" loop_integer: {start: 1, end: 4}}]}\n"
    )
    from gbroker.jobs.sweep import JobArray, loads_submission

    array = loads_submission(body)
    assert isinstance(array, JobArray)
    # A broker killed after the array's record and its first element were durable: the record
    # says incomplete; the journal holds element 1 only.
    arrays = a.client_api.arrays
    record, _ = await arrays.submit(JobArray(array.elements[:1], "x"), "admin", None, body)
    await arrays._write("UPDATE arrays SET complete = 0, size = 4 WHERE id = ?", (record.id,))
    await asyncio.wait_for(a.driver.jobs[f"{record.id}_1"].done.wait(), 30)
    config = a.config
    await a.__aexit__(None, None, None)
    restarted = BrokerDaemon(config)
    await restarted.__aenter__()
    fleet["a"] = restarted
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for _ in range(100):
            async with http.get(f"{restarted.url}/api/v1/jobs/{record.id}") as response:
                state = await response.json()
            if state["complete"]:
                break
            await asyncio.sleep(0.1)
        done = await wait(http, restarted.url, record.id)
    assert (done["size"], done["state"], done["counts"]) == (4, "done", {"done": 4})
    ids = sorted(r.id for r in await restarted.journal.all_jobs())
    assert ids == [f"{record.id}_{i}" for i in range(1, 5)]  # element 1 once, 2-4 added


@pytest.mark.asyncio
async def test_a_job_that_needs_memory_never_goes_to_a_site_without_it(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    needs = "executable: /bin/true\nindividual_physical_memory: {lower: 1073741824}\n"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        jobs = []
        for _ in range(8):
            status, body = await post(http, a.url, needs)
            assert status == 201, body
            jobs.append(body["id"])
        sites = {(await wait(http, a.url, job_id))["site"] for job_id in jobs}
        assert sites == {"b"}  # a and c have less memory per node
        # The requirements fixture: LINUX on x86_64, exclusive, 2 nodes: b alone.
        status, body = await post(http, a.url, (FIXTURES / "requirements.jsdl").read_bytes())
        assert status == 201, body
        assert (await wait(http, a.url, body["id"]))["site"] == "b"
        # No site has 8 GiB per node: refused, naming the element and the closest site's value.
        status, body = await post(http, a.url, needs.replace("1073741824", str(8 * GiB)).encode())
        assert status == 400
        assert body["field"] == "individual_physical_memory"
        assert body["error"] == (
            "individual_physical_memory: expected a site of the fleet with >= 8 GiB memory per "
            "node, got '4 GiB memory per node at site b, the closest of 3'"
        )
        jsdl = (FIXTURES / "requirements.jsdl").read_text().replace("x86_64", "sparc")
        status, body = await post(http, a.url, jsdl)
        assert status == 400
        assert body["field"] == (
            "JobDefinition/JobDescription/Resources/CPUArchitecture/CPUArchitectureName"
        )
        # explain: b is the one candidate; a and c fail the memory requirement, named.
        async with http.get(f"{a.url}/api/v1/jobs/{jobs[0]}/explain") as response:
            explained = await response.json()
    verdicts = {c["site"]: c for c in explained["candidates"]}
    assert verdicts["b"]["feasible"]
    assert verdicts["b"]["best"]
    assert (verdicts["a"]["need"], verdicts["a"]["has"]) == (
        "individual_physical_memory",
        "256 MiB memory per node",
    )
    assert verdicts["c"]["has"] == "512 MiB memory per node"


@pytest.mark.asyncio
async def test_file_system_paths_land_where_the_site_mounts_them(
    fleet: dict[str, BrokerDaemon], fs_root: Path
) -> None:
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, (FIXTURES / "filesystems.jsdl").read_bytes())
        assert status == 201, body
        done = await wait(http, a.url, body["id"])
        async with http.get(f"{a.url}/api/v1/jobs/{body['id']}/output/stderr") as response:
            stderr = await response.text()
        assert done["state"] == "done", (done["error"], done["exit_code"], stderr)
        site = done["site"]
        assert site in ("b", "c")  # a has no SCRATCH
        out = fs_root / site / "scratch" / "results" / "out.txt"
        assert out.read_text() == "lines from the scratch file system\n"
        # Staged in there too, and read by the program through its absolute path.
        assert (out.parents[1] / "inputs" / "data.txt").is_file()
        assert await output(http, a.url, body["id"]) == "lines from the scratch file system\n"
        job_dir = fleet[site].executor.job_dir(body["id"])
        assert not (job_dir / "results").exists()  # not in the job's directory


@pytest.mark.asyncio
async def test_staging_only_jobs_stage_in_then_out_to_the_store(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, (FIXTURES / "staging_only.jsdl").read_bytes())
        assert status == 201, body
        done = await wait(http, a.url, body["id"])
        assert (done["state"], done["exit_code"]) == ("done", 0), done
        async with http.get(
            f"{fleet['c'].url}/api/v1/jobs/{body['id']}/files", params={"name": "report.txt"}
        ) as response:
            assert response.status == 200
            assert await response.text() == "first part\nsecond part\n"  # appended
        async with http.get(
            f"{a.url}/api/v1/jobs/{body['id']}/files", params={"name": "other.txt"}
        ) as response:
            assert response.status == 404
            assert "gbroker:store" in (await response.json())["error"]
    job_dir = fleet[done["site"]].executor.job_dir(body["id"])
    assert not (job_dir / "report.txt").exists()  # DeleteOnTermination


@pytest.mark.asyncio
async def test_http_staging_learns_sizes_up_front_and_delivers_outputs(
    fleet: dict[str, BrokerDaemon], data_server: DataServer
) -> None:
    a = fleet["a"]
    data_server.files["input.dat"] = b"z" * (3 * MB)
    job: dict[str, Any] = {
        "executable": "/bin/sh",
        "arguments": ["-c", "wc -c < input.dat > count.txt"],
        "staging": [
            {"file_name": "input.dat", "source": data_server.url("input.dat")},
            {"file_name": "count.txt", "target": data_server.url("out/count.txt")},
        ],
    }
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, json.dumps(job))
        assert status == 201, body
        assert data_server.heads == ["input.dat"]  # asked once, at submission
        done = await wait(http, a.url, body["id"])
        assert done["state"] == "done", done
        assert data_server.files["out/count.txt"].strip() == b"3000000"
        spec = msgpack.unpackb((await a.journal.get(body["id"])).spec)  # type: ignore[union-attr]
        assert spec["staging"][0]["size"] == 3 * MB  # what F(j)'s t_j counts
        # dontOverwrite: the target exists now, so the stage-out (and the job) fails.
        job["staging"][1]["creation_flag"] = "dontOverwrite"
        status, body = await post(http, a.url, json.dumps(job))
        failed = await wait(http, a.url, body["id"])
        assert failed["state"] == "failed"
        assert "staging[1]" in failed["error"]
        assert "dontOverwrite" in failed["error"]
        # An input that is not there is refused at submission.
        job["staging"][0]["source"] = data_server.url("missing.dat")
        status, body = await post(http, a.url, json.dumps(job))
        assert (status, body["field"]) == (400, "staging[0].source")
        assert "HTTP 404" in body["error"]


@pytest.mark.asyncio
async def test_an_input_in_another_sites_store_is_at_that_site_with_its_size(
    fleet: dict[str, BrokerDaemon], tmp_path: Path
) -> None:
    import hashlib

    a, c = fleet["a"], fleet["c"]
    data = b"d" * 200_000
    digest = hashlib.sha256(data).hexdigest()
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.put(f"{c.url}/files/{digest}", data=data) as response:
            assert response.status == 201
        job = {
            "executable": "/bin/sh",
            "arguments": ["-c", "wc -c < in.dat"],
            "staging": [{"file_name": "in.dat", "source": f"{c.url}/files/{digest}"}],
        }
        status, body = await post(http, a.url, json.dumps(job))
        assert status == 201, body
        assert (await wait(http, a.url, body["id"]))["state"] == "done"
        assert (await output(http, a.url, body["id"])).strip() == "200000"
    # The owner asked c (a signed HEAD) for the size: F(j)'s t_j counts 200 kB from c.
    spec = msgpack.unpackb((await a.journal.get(body["id"])).spec)  # type: ignore[union-attr]
    assert (spec["staging"][0]["size"], spec["staging"][0]["site"]) == (200_000, "c")


@pytest.mark.asyncio
async def test_a_file_staged_out_at_another_site_comes_back_through_the_owner(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    job = {
        "staging": [  # a staging-only job that needs SCRATCH: it runs at b or c, not a
            {"file_name": "note.txt", "filesystem": "SCRATCH", "inline_data": "from afar\n"},
            {"file_name": "note.txt", "filesystem": "SCRATCH", "target": "gbroker:store"},
        ]
    }
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, json.dumps(job))
        assert status == 201, body
        done = await wait(http, a.url, body["id"])
        assert (done["state"], done["site"] in ("b", "c")) == ("done", True), done["error"]
        async with http.get(
            f"{a.url}/api/v1/jobs/{body['id']}/files", params={"name": "note.txt"}
        ) as response:
            assert response.status == 200  # a asked the site that ran it, signed
            assert await response.text() == "from afar\n"


@pytest.mark.asyncio
async def test_unsupported_uris_and_application_kinds_are_refused_at_submission(
    fleet: dict[str, BrokerDaemon],
) -> None:
    a = fleet["a"]
    async with aiohttp.ClientSession(headers=AUTH) as http:
        status, body = await post(http, a.url, (FIXTURES / "unsupported_uris.jsdl").read_bytes())
        assert status == 400
        assert body["field"] == "JobDefinition/JobDescription/DataStaging[1]/Source/URI"
        assert "not ftp:" in body["error"]
        status, body = await post(
            http,
            a.url,
            "executable: /bin/true\nstaging: [{file_name: o, target: 'file:///tmp/o'}]\n",
        )
        assert (status, body["field"]) == (400, "staging[0].target")
        assert "not file:" in body["error"]
        status, body = await post(
            http,
            a.url,
            "executable: /bin/true\nstaging: [{file_name: o, target: 'gbroker:store',"
            " creation_flag: append}]\n",
        )
        assert (status, body["field"]) == (400, "staging[0].creation_flag")
        status, body = await post(http, a.url, (FIXTURES / "mpi_application.jsdl").read_bytes())
        assert status == 400
        assert body["field"].endswith("Application/MPIApplication")
        assert "urn:gridsam:mpi" in body["error"]
    assert await a.journal.all_jobs() == []


# Every document of shared/data/jsdl submitted to a live broker: accepted, or refused with a 400
# naming where (never a 5xx, never a traceback). No network here: a host name that does not
# resolve is refused at submission, as the HEAD that learns its size cannot reach it.
SHARED_ACCEPTED = {
    "unicorex/ems__big.jsdl",
    "unicorex/ems__date.jsdl",
    "unicorex/ems__date_with_inlinedata.jsdl",
    "unicorex/ems__date_with_redirect.jsdl",
    "unicorex/ems__date_with_resources.jsdl",
    "unicorex/ems__email.jsdl",
    "unicorex/ems__non-zero-exit-code.jsdl",
    "unicorex/ems__sleep.jsdl",
    "unicorex/jsdl__date.jsdl",
    "unicorex/jsdl__date2.jsdl",
    "unicorex/jsdl__date_simple.jsdl",
    "unicorex/jsdl__hpcp_sleep.jsdl",
    "unicorex/jsdl__hpcp_sleep_other_namespace.jsdl",
    "unicorex/jsdl__inline_data_staging.jsdl",
    "unicorex/jsdl__interactive.jsdl",
    "unicorex/jsdl__posix.jsdl",
    "unicorex/jsdl__prepost.jsdl",
    "unicorex/jsdl__sleep.jsdl",
    "unicorex/jsdl__spmd2.jsdl",
    "unicorex/jsdl__testConditional.jsdl",
    "unicorex/jsdl__testConditional2.jsdl",
}
SHARED_REFUSED_AT = {  # besides those that do not parse (tests/jobs/test_jsdl_read.py): where, why
    "unicorex/ems__ls_with_stagein.jsdl": ("DataStaging[1]/Source/URI", "not file:"),
    "unicorex/ems__stagein_problem.jsdl": ("DataStaging[1]/Source/URI", "not wrongscheme:"),
    "unicorex/ems__stageout_problem.jsdl": ("DataStaging[1]/Target/URI", "not wrongscheme:"),
    "unicorex/jsdl__ftp_with_wsse_ext.jsdl": ("DataStaging[1]/Source/URI", "not ftp:"),
    # Refused as they are read (tests/jobs/test_jsdl_read.py), naming the element.
    "unicorex/jsdl__ex_posix.jsdl": ("POSIXApplication/UserName", "no UserName"),
    "unicorex/jsdl__jsdl_sample_with_hpc_ext.jsdl": (
        "DataStaging[1]/StagingSchedule",
        "StagingSchedule is not JSDL's",
    ),
    "unicorex/jsdl__jsdl_sample_with_hpc_ext_nouser.jsdl": (
        "DataStaging[1]/StagingSchedule",
        "StagingSchedule is not JSDL's",
    ),
    "gridway/basicExample.xml": ("DataStaging[1]/Source/URI", "not gsiftp:"),
    "gridway/POSIXProfileExample.xml": ("DataStaging[1]/Source/URI", "not gsiftp:"),
    "unicorex/io__http1.jsdl": ("DataStaging[1]/Source/URI", "a URL whose host resolves"),
    "unicorex/jsdl__staging_credentials.jsdl": ("/Source/URI", "a URL whose host resolves"),
    # 8 processes; no site has 8 cores: named where r comes from.
    "unicorex/jsdl__spmd.jsdl": (
        "Application/SPMDApplication/NumberOfProcesses",
        "a site of the fleet with 8 cores",
    ),
}


@pytest.mark.asyncio
async def test_every_shared_document_is_taken_or_refused_precisely_by_a_broker(
    fleet: dict[str, BrokerDaemon],
) -> None:
    from tests.conftest import shared_data

    data = shared_data() / "jsdl"
    a = fleet["a"]
    accepted, refused = set(), {}
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for path in sorted(p for p in data.glob("*/*") if p.suffix in (".jsdl", ".xml")):
            name = f"{path.parent.name}/{path.name}"
            status, body = await post(http, a.url, path.read_bytes())
            assert status in (201, 400), (name, status, body)
            if status == 201:
                accepted.add(name)
            else:
                assert len(body["error"]) < 600
                refused[name] = body
    assert accepted == SHARED_ACCEPTED
    for name, (where, why) in SHARED_REFUSED_AT.items():
        assert refused[name]["field"].endswith(where), (name, refused[name])
        assert why in refused[name]["error"], (name, refused[name])
    assert len(accepted) + len(refused) == 43
