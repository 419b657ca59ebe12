"""Staging at a site (gbroker.daemon.staging, gbroker.daemon.files, gbroker.daemon.urls): targets
and their checks, HEAD and PUT against a real HTTP server, CreationFlag, file systems (links
planted in a shared one are never followed), localization, stage-out to the store."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from gbroker.core.requirements import FileSystemSpec
from gbroker.daemon.files import FileStore
from gbroker.daemon.peers import PeerClient
from gbroker.daemon.staging import LINK_DIR, Stager
from gbroker.daemon.urls import (
    STORE_TARGET,
    Source,
    TargetKind,
    check_source,
    check_target,
    deliver,
    exists,
    head_size,
)
from gbroker.errors import InvalidInput
from gbroker.jobs.mapping import from_mapping
from gbroker.security.auth import PeerSigner
from gbroker.site.safe_paths import open_inside

# -- targets ---------------------------------------------------------------------------------


def test_targets_are_the_store_or_checked_http_urls() -> None:
    assert check_target(STORE_TARGET, allow_private=False).kind is TargetKind.STORE
    public = check_target("https://example.org/out/x.dat", allow_private=False)
    assert (public.kind, public.host, public.port) == (TargetKind.PUBLIC, "example.org", 443)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///tmp/x", "not file: a file: URL names the broker's own disk"),
        ("ftp://example.org/x", "not ftp: GBroker fetches no ftp"),
        ("gsiftp://example.org/x", "not gsiftp: GBroker speaks no GridFTP"),
        ("rns:/home/x", "not rns: a scheme GBroker does not stage"),
        ("http://127.0.0.1/x", "a URL of a public host"),
        ("gbroker:elsewhere", f"the store target {STORE_TARGET}"),
    ],
)
def test_bad_targets_name_their_field_and_scheme(url: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_target(url, allow_private=False, field="staging[3].target")
    assert caught.value.field == "staging[3].target"
    assert expected in caught.value.expected


class Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {"here.dat": b"12345"}
        self.port = 0

    async def get(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name == "nohead" and request.method == "HEAD":
            return web.Response(status=405)
        if name == "moved":
            raise web.HTTPFound("http://169.254.169.254/")
        if name not in self.files:
            return web.Response(status=404)
        return web.Response(body=self.files[name])

    async def put(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name == "forbidden":
            return web.Response(status=403)
        self.files[name] = await request.read()
        return web.Response(status=204)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_get("/{name}", state.get)
    app.router.add_put("/{name}", state.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_head_learns_a_size_or_says_the_file_is_missing(server: Server) -> None:
    def source(name: str) -> Source:
        return check_source(server.url(name), allow_private=True, peers={})

    assert await head_size(source("here.dat"), allow_private=True) == 5
    assert await head_size(source("nohead"), allow_private=True) is None
    for name, status in (("missing", "HTTP 404"), ("moved", "HTTP 302")):
        with pytest.raises(InvalidInput) as caught:
            await head_size(source(name), allow_private=True, field="f")
        assert caught.value.found == f"127.0.0.1: {status}"
    with pytest.raises(InvalidInput, match="public host"):
        await head_size(  # a private host, not allowed: refused before any connection
            check_source(server.url("here.dat"), allow_private=True, peers={}),
            allow_private=False,
        )


@pytest.mark.asyncio
async def test_deliver_puts_the_file_and_exists_sees_it(server: Server, tmp_path: Path) -> None:
    target = check_target(server.url("result.txt"), allow_private=True)
    assert not await exists(target, allow_private=True)
    path = tmp_path / "r"
    path.write_bytes(b"result\n" * 1000)
    with path.open("rb") as body:
        await deliver(target, body, path.stat().st_size, allow_private=True)
    assert server.files["result.txt"] == b"result\n" * 1000
    assert await exists(target, allow_private=True)
    refused = check_target(server.url("forbidden"), allow_private=True)
    with path.open("rb") as body, pytest.raises(InvalidInput, match="HTTP 403"):
        await deliver(refused, body, 1, allow_private=True)


# -- the store ------------------------------------------------------------------------------


def test_the_store_keeps_an_open_file_under_its_digest(tmp_path: Path) -> None:
    import hashlib

    store = FileStore(tmp_path / "files", 1 << 20)
    source = tmp_path / "out"
    source.write_bytes(b"output" * 100)
    digest, size = store.keep(os.open(source, os.O_RDONLY))
    assert (digest, size) == (hashlib.sha256(b"output" * 100).hexdigest(), 600)
    assert store.path(digest).read_bytes() == b"output" * 100
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [digest]


# -- the stager ------------------------------------------------------------------------------


def stager(tmp_path: Path, **kw: object) -> Stager:
    peers = PeerClient("a", {"a": "http://127.0.0.1:9"}, PeerSigner("a", "s"), lambda *_: None)
    fs = tmp_path / "scratch"
    fs.mkdir(exist_ok=True)
    return Stager(
        lambda job_id: tmp_path / "jobs" / job_id,
        peers,
        allow_private=True,
        max_bytes=1 << 20,
        file_systems=(FileSystemSpec("SCRATCH", str(fs)),),
        store=FileStore(tmp_path / "files", 1 << 20),
        outputs=tmp_path / "staged-out",
        **kw,  # type: ignore[arg-type]
    )


def test_localize_makes_file_system_paths_the_sites(tmp_path: Path) -> None:
    s = stager(tmp_path)
    desc = from_mapping(
        {
            "executable": "bin/run",
            "arguments": ["plain", "in/data"],
            "environment": {"DATA": "in/data"},
            "output": "out/log",
            "working_directory": "work",
            "filesystem_names": {
                "executable": "SCRATCH",
                "arguments[1]": "SCRATCH",
                "environment.DATA": "SCRATCH",
                "output": "SCRATCH",
                "working_directory": "SCRATCH",
            },
        }
    )
    mount = tmp_path / "scratch"
    local = s.localize(desc)
    assert local.executable == f"{mount}/bin/run"
    assert local.arguments == ("plain", f"{mount}/in/data")
    assert local.output == f"{LINK_DIR}/SCRATCH/out/log"
    assert local.working_directory == f"{LINK_DIR}/SCRATCH/work"
    assert dict(local.environment) == {"DATA": f"{mount}/in/data", "GBROKER_FS_SCRATCH": str(mount)}
    assert local.filesystem_names == {}
    assert s.stream_name(desc, "stdout") == f"{LINK_DIR}/SCRATCH/out/log"
    assert s.stream_name(desc, "stderr") == "stderr"
    plain = from_mapping({"executable": "/bin/true"})
    assert s.localize(plain) is plain
    with pytest.raises(InvalidInput, match="a file system of site a"):
        s.localize(
            from_mapping({"executable": "x", "output": "o", "filesystem_names": {"output": "HOME"}})
        )


@pytest.mark.asyncio
async def test_stage_in_honours_creation_flags_in_a_shared_file_system(tmp_path: Path) -> None:
    s = stager(tmp_path)
    mount = tmp_path / "scratch"
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [
                {"file_name": "log", "filesystem": "SCRATCH", "inline_data": "one\n"},
                {
                    "file_name": "log",
                    "filesystem": "SCRATCH",
                    "inline_data": "two\n",
                    "creation_flag": "append",
                },
                {"file_name": "here", "inline_data": "in the job directory"},
            ],
        }
    )
    await s.stage_in("a.1", desc)
    assert (mount / "log").read_text() == "one\ntwo\n"
    assert (tmp_path / "jobs" / "a.1" / "here").read_text() == "in the job directory"
    assert (tmp_path / "jobs" / "a.1" / LINK_DIR / "SCRATCH").resolve() == mount.resolve()
    keep = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [
                {
                    "file_name": "log",
                    "filesystem": "SCRATCH",
                    "inline_data": "three\n",
                    "creation_flag": "dontOverwrite",
                }
            ],
        }
    )
    with pytest.raises(InvalidInput) as caught:
        await s.stage_in("a.2", keep)
    assert caught.value.field == "staging[0]"
    assert "dontOverwrite" in caught.value.expected
    assert (mount / "log").read_text() == "one\ntwo\n"


@pytest.mark.asyncio
async def test_stage_out_to_the_store_and_delete_on_termination(tmp_path: Path) -> None:
    s = stager(tmp_path)
    job_dir = tmp_path / "jobs" / "a.3"
    job_dir.mkdir(parents=True)
    (job_dir / "result").write_text("42\n")
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [
                {"file_name": "result", "target": STORE_TARGET, "delete_on_termination": True},
                {"file_name": "never-made", "target": STORE_TARGET},
            ],
        }
    )
    problem = await s.stage_out("a.3", desc)
    assert problem is not None
    assert problem.startswith("stage-out of staging[1] (never-made)")
    found = s.stored("a.3", "result")
    assert found is not None
    assert found[0].read_text() == "42\n"
    assert not (job_dir / "result").exists()  # DeleteOnTermination, after it was stored
    assert s.stored("a.3", "never-made") is None
    fd = open_inside(found[0].parent, found[0].name)
    os.close(fd)


def test_check_refuses_append_to_a_target_and_names_the_element(tmp_path: Path) -> None:
    s = stager(tmp_path)
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [{"file_name": "o", "target": STORE_TARGET, "creation_flag": "append"}],
        }
    )
    with pytest.raises(InvalidInput) as caught:
        s.check(desc, xml=True)
    assert caught.value.field == "JobDefinition/JobDescription/DataStaging[1]/CreationFlag"
    with pytest.raises(InvalidInput) as caught:
        s.check(desc)
    assert caught.value.field == "staging[0].creation_flag"


def test_the_store_counts_a_sparse_file_by_its_length_and_keeps_nothing_of_it(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "files", 1 << 20)
    store.root.mkdir()  # as the broker makes it when it starts
    sparse = tmp_path / "out.bin"
    with sparse.open("wb") as out:
        out.truncate(3 << 20)  # 3 MiB long, no block allocated
    assert sparse.stat().st_blocks == 0
    descriptor = os.open(sparse, os.O_RDONLY)
    with pytest.raises(InvalidInput) as refused:
        store.keep(descriptor, "staging[0].target")
    assert refused.value.field == "staging[0].target"
    assert "a file of at most 1048576 bytes (the file store's limit" in str(refused.value)
    assert "3145728 bytes" in str(refused.value)
    # the descriptor was closed all the same
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(descriptor)
    assert list(store.root.iterdir()) == []
    exactly = tmp_path / "exactly.bin"
    with exactly.open("wb") as out:
        out.truncate(1 << 20)
    _, size = store.keep(os.open(exactly, os.O_RDONLY))
    assert size == 1 << 20
