"""Idempotent submission (``Idempotency-Key``) against a live ``gbroker serve`` over real HTTP,
and the journal's half of it: the key and the job row are one transaction."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gbroker.client.gclient import Client
from gbroker.daemon.journal import Journal
from gbroker.errors import InvalidInput
from gbroker.fleet.ports import free_port
from gbroker.protocol.idempotency import HEADER, REPLAYED_HEADER, IdempotencyKey, parse_key
from gbroker.security import runtime
from gbroker.security.auth import bearer
from gbroker.topology import SiteSpec, Topology, save_topology

JOB = json.dumps({"executable": "/bin/true", "total_cpu_count": {"exact": 1}})
OTHER_JOB = json.dumps({"executable": "/bin/false", "total_cpu_count": {"exact": 1}})


class Serve:
    """One ``gbroker serve`` process that a test can SIGKILL and start again on its journal."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        topology = directory / "one.yaml"
        save_topology(Topology([SiteSpec("solo", 4, http=self.url)], (), name="one"), topology)
        self.command = [
            sys.executable,
            *("-m", "gbroker", "serve", "--site", "solo", "--topology", str(topology)),
            *("--data-dir", str(directory / "data"), *args),
        ]
        self.log = directory / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:  # listening, and its token recorded just after
                if s.connect_ex(("127.0.0.1", self.port)) == 0 and runtime.find_token(self.url):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"gbroker serve did not listen: {self.log.read_text()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    @property
    def headers(self) -> dict[str, str]:
        return bearer(runtime.find_token(self.url) or "")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    server = Serve(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def post(
    http: aiohttp.ClientSession, serve: Serve, body: str, key: str | None
) -> tuple[int, dict[str, object], str | None]:
    headers = dict(serve.headers)
    if key is not None:
        headers[HEADER] = key
    async with http.post(f"{serve.url}/api/v1/jobs", data=body, headers=headers) as response:
        answer = await response.json(content_type=None)
        return response.status, answer, response.headers.get(REPLAYED_HEADER)


async def owned(http: aiohttp.ClientSession, serve: Serve) -> list[str]:
    async with http.get(f"{serve.url}/api/v1/jobs", headers=serve.headers) as response:
        return [job["id"] for job in (await response.json())["jobs"]]


def test_a_repeat_answers_the_first_job_and_another_body_is_refused(serve: Serve) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            key = f'"{uuid.uuid4()}"'
            first = await post(http, serve, JOB, key)
            assert first[0] == 201
            assert first[2] is None
            again = await post(http, serve, JOB, key)
            assert again == (200, first[1], "true")
            reused = await post(http, serve, OTHER_JOB, key)
            assert reused[0] == 422, reused
            assert reused[1]["job"] == first[1]["id"]
            assert HEADER in str(reused[1]["error"])
            bare = await post(http, serve, JOB, "bare-key-1")  # not an sf-string: taken as is
            assert bare[0] == 201
            assert (await post(http, serve, JOB, '"bare-key-1"'))[1] == bare[1]
            other = await post(http, serve, JOB, f'"{uuid.uuid4()}"')  # a fresh key: a new job
            assert other[0] == 201
            assert other[1]["id"] != first[1]["id"]
            assert (await post(http, serve, JOB, None))[0] == 201  # no key: as before
            for bad in ('"' + "k" * 256 + '"', '"caf\\u00e9', '"unterminated', "tab\there"):
                status, answer, _ = await post(http, serve, JOB, bad)
                assert (status, answer["field"]) == (400, HEADER), (bad, answer)
            assert len(await owned(http, serve)) == 4

    asyncio.run(scenario())


def test_concurrent_repeats_of_one_key_make_one_job(serve: Serve) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            key = f'"{uuid.uuid4()}"'
            answers = await asyncio.gather(*(post(http, serve, JOB, key) for _ in range(32)))
            ids = {str(a[1]["id"]) for a in answers}
            assert len(ids) == 1, answers
            statuses = sorted(a[0] for a in answers)
            assert statuses == [200] * 31 + [201]
            assert sum(a[2] == "true" for a in answers) == 31
            assert await owned(http, serve) == list(ids)

    asyncio.run(scenario())


def test_a_retry_after_a_sigkill_that_followed_the_commit_returns_the_same_job(
    serve: Serve,
) -> None:
    key = str(uuid.uuid4())

    async def submit_then_kill() -> str:
        async with aiohttp.ClientSession() as http:
            status, answer, _ = await post(http, serve, JOB, f'"{key}"')
            serve.kill()  # the answer came: the job and its key are durable
            assert status == 201
            return str(answer["id"])

    first = asyncio.run(submit_then_kill())
    serve.start()

    async def retry() -> None:
        async with Client(serve.url) as client:
            assert await client.submit(JOB, key=key) == first
            assert client.replayed == 1
            assert [job["id"] for job in await client.jobs()] == [first]

    asyncio.run(retry())


def test_the_client_retries_with_the_same_key_until_the_broker_is_back(serve: Serve) -> None:
    serve.kill()

    async def scenario() -> None:
        async with Client(serve.url, attempts=20, retry_for=30) as client:
            submitting = asyncio.create_task(client.submit(JOB))
            await asyncio.sleep(1.0)  # refused meanwhile: no broker listens
            assert not submitting.done()
            await asyncio.to_thread(serve.start)
            job_id = await submitting
            assert [job["id"] for job in await client.jobs()] == [job_id]

    asyncio.run(scenario())


def test_an_expired_key_is_new_again(tmp_path: Path) -> None:
    server = Serve(tmp_path, "--idempotency-window", "0.5")
    server.start()
    try:

        async def scenario() -> None:
            async with aiohttp.ClientSession() as http:
                first = await post(http, server, JOB, '"k"')
                assert (await post(http, server, JOB, '"k"'))[:2] == (200, first[1])
                await asyncio.sleep(0.7)
                # Within the window another body was refused (422); past it, the key is free.
                again = await post(http, server, OTHER_JOB, '"k"')
                assert again[0] == 201
                assert again[1]["id"] != first[1]["id"]

        asyncio.run(scenario())
    finally:
        server.kill()


# -- the journal ---------------------------------------------------------------------------------


def test_the_journal_keeps_a_key_with_its_job_per_submitter_and_forgets_old_ones(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with Journal(tmp_path / "j.sqlite") as journal:
            key = IdempotencyKey("k", "f1", not_before=0.0)
            results = await asyncio.gather(
                *(journal.submit(f"a.{n}", "a", b"spec", 10.0, "alice", key) for n in range(20))
            )
            assert results.count(True) == 1  # one transaction or several: one job
            winner = f"a.{results.index(True)}"
            assert await journal.idempotent("alice", "k", 0.0) == (winner, "f1")
            assert [row.id for row in await journal.all_jobs()] == [winner]
            assert await journal.idempotent("bob", "k", 0.0) is None  # scoped to the submitter
            assert await journal.submit("a.bob", "a", b"spec", 11.0, "bob", key)
            # Past its window, a key is new again, and its row is replaced.
            later = IdempotencyKey("k", "f2", not_before=10.5)
            assert await journal.idempotent("alice", "k", 10.5) is None
            assert await journal.submit("a.new", "a", b"spec", 12.0, "alice", later)
            assert await journal.idempotent("alice", "k", 10.5) == ("a.new", "f2")
            assert await journal.forget_keys(11.5)  # bob's key, journaled at 11
            assert await journal.idempotent("bob", "k", 0.0) is None
            assert await journal.idempotent("alice", "k", 0.0) == ("a.new", "f2")

    asyncio.run(scenario())


def test_a_journal_refusing_the_job_keeps_no_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Journal(tmp_path / "j.sqlite") as journal:
            assert await journal.submit("a.1", "a", b"spec", 1.0, "alice")
            key = IdempotencyKey("k", "f", not_before=0.0)
            assert not await journal.submit("a.1", "a", b"spec", 2.0, "alice", key)  # same id
            assert await journal.idempotent("alice", "k", 0.0) is None

    asyncio.run(scenario())
    with sqlite3.connect(tmp_path / "j.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM idempotency").fetchone() == (0,)


@pytest.mark.parametrize(
    ("value", "key"),
    [('"abc"', "abc"), ("abc", "abc"), ('"a\\"b"', 'a"b'), ("x" * 255, "x" * 255)],
)
def test_parse_key_takes_an_sf_string_or_a_bare_key(value: str, key: str) -> None:
    assert parse_key(value) == key


@pytest.mark.parametrize("value", ["", '""', "x" * 256, '"x', "é", "a\x7fb", '"a";p=1x', '"a" b'])
def test_parse_key_names_the_header_when_it_refuses(value: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_key(value)
    assert refused.value.field == HEADER
