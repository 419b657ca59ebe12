"""Staging at a site (gbroker.daemon.staging, gbroker.daemon.files, gbroker.daemon.urls): targets
and their checks, HEAD and PUT against a real HTTP server, CreationFlag, file systems,
localization, stage-out to the store, and what a job plants where the stager goes (met with the
job's own account's rights, never followed)."""

from __future__ import annotations

import os
import pwd
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
from gbroker.site.safe_paths import Account, open_inside

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


ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody")
JOB = Account(NOBODY.pw_uid, NOBODY.pw_gid) if ROOT else Account(os.geteuid(), os.getegid())
"""The account the tests' jobs run as: nobody under a root broker."""
as_root = pytest.mark.skipif(not ROOT, reason="the job's account is the broker's own")


def job_directory(tmp_path: Path, job_id: str) -> Path:
    """A job's directory as an earlier run left it: 0700, its account's."""
    directory = tmp_path / "jobs" / job_id
    directory.mkdir(parents=True)
    directory.chmod(0o700)
    os.chown(directory, *JOB)
    return directory


def roots(path: Path, text: str = "root's own") -> Path:
    """A file of root's (0600) that no job may read or write."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def plant_link(target: Path, link: Path) -> None:
    """A symbolic link made by the job's account."""
    link.symlink_to(target)
    os.lchown(link, *JOB)


def shared_mount(tmp_path: Path) -> Path:
    """The SCRATCH file system as a site shares it: 1777, like /tmp."""
    mount = tmp_path / "scratch"
    mount.mkdir(exist_ok=True)
    mount.chmod(0o1777)
    return mount


def stager(tmp_path: Path, **kw: object) -> Stager:
    peers = PeerClient("a", {"a": "http://127.0.0.1:9"}, PeerSigner("a", "s"), lambda *_: None)
    fs = shared_mount(tmp_path)
    return Stager(
        lambda job_id: tmp_path / "jobs" / job_id,
        peers,
        owner_for=lambda submitter: JOB,
        allow_private=True,
        max_bytes=1 << 20,
        file_systems=(FileSystemSpec("SCRATCH", str(fs)),),
        store=FileStore(tmp_path / "files", 1 << 20),
        outputs=tmp_path / "staged-out",
        downloads=tmp_path / "downloads",
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
    job_dir = job_directory(tmp_path, "a.3")
    (job_dir / "result").write_text("42\n")
    os.chown(job_dir / "result", *JOB)
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


# -- what a job plants in its directory, or in a shared file system --------------------------
#
# A broker runs as root and its jobs as accounts of their own: whatever a job (or another
# process of its account) puts where the stager goes, the stager may do there only what the
# job itself could. Each test plants as root what a job could plant on some host (a hard link
# to a file it may not read is refused by fs.protected_hardlinks=1, but the kernel's default is
# 0), with the job's account as owner where the job made it.


@as_root
@pytest.mark.asyncio
async def test_a_download_never_lands_where_a_link_in_the_job_directory_points(
    tmp_path: Path, server: Server
) -> None:
    server.files["input.dat"] = b"downloaded"
    victim = roots(tmp_path / "victim")
    job_dir = job_directory(tmp_path, "a.5")
    plant_link(victim, job_dir / ".gbroker-staging-0")  # where a download used to go
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [{"file_name": "in.dat", "source": server.url("input.dat")}],
        }
    )
    await stager(tmp_path).stage_in("a.5", desc)
    assert victim.read_text() == "root's own"
    assert (job_dir / "in.dat").read_bytes() == b"downloaded"


@as_root
@pytest.mark.asyncio
async def test_file_system_links_follow_no_link_the_job_planted_for_their_directory(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    victim = roots(elsewhere / "SCRATCH")
    job_dir = job_directory(tmp_path, "a.6")
    plant_link(elsewhere, job_dir / LINK_DIR)
    shared_mount(tmp_path)
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [{"file_name": "log", "filesystem": "SCRATCH", "inline_data": "x"}],
        }
    )
    with pytest.raises(InvalidInput, match="not links"):
        await stager(tmp_path).stage_in("a.6", desc)
    assert not victim.is_symlink()
    assert victim.read_text() == "root's own"


@as_root
@pytest.mark.asyncio
async def test_stage_in_writes_only_what_the_job_could_in_a_shared_file_system(
    tmp_path: Path,
) -> None:
    mount = shared_mount(tmp_path)
    victim = roots(tmp_path / "victim")
    mine = mount / "mine"
    mine.mkdir()
    os.chown(mine, *JOB)
    os.link(victim, mine / "log")  # the job's hard link to root's file
    others = mount / "bob"  # another user's directory, 0755
    others.mkdir()
    data = roots(others / "data", "bob's results")
    data.chmod(0o644)
    s = stager(tmp_path)
    for name, flag in (("mine/log", "append"), ("bob/data", "overwrite"), ("bob/new", "overwrite")):
        desc = from_mapping(
            {
                "executable": "/bin/true",
                "staging": [
                    {
                        "file_name": name,
                        "filesystem": "SCRATCH",
                        "inline_data": "the job's\n",
                        "creation_flag": flag,
                    }
                ],
            }
        )
        with pytest.raises(PermissionError):
            await s.stage_in("a.7", desc)
    assert victim.read_text() == "root's own"
    assert data.read_text() == "bob's results"
    assert not (others / "new").exists()


@as_root
@pytest.mark.asyncio
async def test_stage_out_reads_and_deletes_only_what_the_job_could(tmp_path: Path) -> None:
    secret = roots(tmp_path / "secret", "root's secret")
    job_dir = job_directory(tmp_path, "a.8")
    os.link(secret, job_dir / "result")  # the job's hard link to a file it may not read
    mount = shared_mount(tmp_path)
    others = mount / "bob"
    others.mkdir()
    keep = roots(others / "keep", "bob's")
    desc = from_mapping(
        {
            "executable": "/bin/true",
            "staging": [
                {"file_name": "result", "target": STORE_TARGET},
                {
                    "file_name": "bob/keep",
                    "filesystem": "SCRATCH",
                    "target": STORE_TARGET,
                    "delete_on_termination": True,
                },
            ],
        }
    )
    s = stager(tmp_path)
    problem = await s.stage_out("a.8", desc)
    assert problem is not None
    assert "stage-out of staging[0] (result)" in problem
    assert "DeleteOnTermination of bob/keep" in problem
    assert "Permission denied" in problem
    assert s.stored("a.8", "result") is None
    assert s.stored("a.8", "bob/keep") is None
    assert keep.read_text() == "bob's"


@as_root
def test_output_is_read_only_as_the_job_could(tmp_path: Path) -> None:
    secret = roots(tmp_path / "secret", "root's secret")
    job_dir = job_directory(tmp_path, "a.9")
    os.link(secret, job_dir / "stdout")
    s = stager(tmp_path)
    with pytest.raises(PermissionError):
        os.close(s.open_output("a.9", "stdout"))
    (job_dir / "stderr").write_text("the job's own\n")
    os.chown(job_dir / "stderr", *JOB)
    with os.fdopen(s.open_output("a.9", "stderr"), "rb") as stream:
        assert stream.read() == b"the job's own\n"
