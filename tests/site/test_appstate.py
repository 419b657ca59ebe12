"""Application-level checkpoints (gbroker.site.appstate) against real processes, without CRIU.

Each job is a real process (a session of its own, as the executor starts them, so the site's
checks of the socket's owner and listening process group hold) with ``GBROKER_CONTROL`` in its
directory: the examples (examples/counter_checkpoint.py, examples/malleable_pi.py) or small
programs written here. The test plays the site: it checkpoints a job through appstate, kills it,
starts it again with ``GBROKER_RESTORE`` in another directory, and reads what both runs printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from gbroker.app.malleable import CONTROL_ENV, RESTORE_ENV
from gbroker.site import appstate
from gbroker.site.checkpoints import CheckpointError

LIMIT = 60.0
ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "examples" / "counter_checkpoint.py"
PI = ROOT / "examples" / "malleable_pi.py"


class Job:
    """A job's process in its directory: its control socket and what it printed."""

    def __init__(self, directory: Path, argv: list[str], restore: Path | None = None) -> None:
        directory.mkdir(mode=0o700, parents=True)
        self.directory = directory
        self.control = directory / ".gbroker-control"
        self.out = directory / "stdout"
        env = dict(os.environ, **{CONTROL_ENV: str(self.control), "PYTHONPATH": str(ROOT)})
        env.pop(RESTORE_ENV, None)
        if restore is not None:
            env[RESTORE_ENV] = str(restore)
        with open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, *argv],
                cwd=directory,
                env=env,
                stdout=out,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, as a site's job
            )
        self.pid = self.process.pid

    @property
    def state(self) -> Path:
        return self.directory / appstate.STATE_FILE

    def printed(self) -> list[str]:
        return self.out.read_text().split()

    async def listening(self) -> None:
        while not self.control.exists():
            assert self.process.poll() is None, self.process.stderr.read()  # type: ignore[union-attr]
            await asyncio.sleep(0.01)

    async def until(self, condition: str, check: Callable[[], bool]) -> None:
        """Poll until ``check()`` is true (the deadline is the test's)."""
        while not check():
            assert self.process.poll() is None, f"ended before {condition}"
            await asyncio.sleep(0.01)

    async def ended(self) -> int:
        while (code := self.process.poll()) is None:
            await asyncio.sleep(0.02)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


@contextlib.asynccontextmanager
async def deadline() -> AsyncIterator[None]:
    async with asyncio.timeout(LIMIT):
        yield


def counted(*outputs: list[str]) -> list[int]:
    return [int(word) for output in outputs for word in output]


@pytest.mark.asyncio
async def test_a_counter_moves_by_its_own_checkpoint_and_prints_each_number_once(
    tmp_path: Path, jobs: list[Job]
) -> None:
    async with deadline():
        source = Job(tmp_path / "source", [str(COUNTER), "--pause", "0.05"])
        jobs.append(source)
        await source.listening()
        hello = await appstate.supports_checkpoint("c", source.control, source.pid)
        assert hello == appstate.Hello(checkpoint=True, held=None)
        await source.until("it printed 5", lambda: len(source.printed()) >= 5)
        size = await appstate.ask_checkpoint("c", source.control, source.pid, source.state, 10)
        assert size == source.state.stat().st_size
        saved = json.loads(source.state.read_bytes())
        assert 5 < saved["next"] <= 40
        held = await appstate.supports_checkpoint("c", source.control, source.pid)
        assert held.held is not None  # a restarted site would learn it waits
        source.kill()  # released: it runs elsewhere now
        first = source.printed()
        assert counted(first) == list(range(1, saved["next"]))  # it stopped at its safe point
        target = Job(tmp_path / "target", [str(COUNTER), "--pause", "0.05"], restore=source.state)
        jobs.append(target)
        assert await target.ended() == 0
        assert counted(first, target.printed()) == list(range(1, 41))


@pytest.mark.asyncio
async def test_a_checkpointed_job_makes_no_progress(tmp_path: Path, jobs: list[Job]) -> None:
    """Without a pause the counter prints thousands of numbers a second: once it answered the
    checkpoint, not one more until it is killed."""
    async with deadline():
        job = Job(tmp_path / "fast", [str(COUNTER), "--to", "100000000", "--pause", "0"])
        jobs.append(job)
        await job.listening()
        await job.until("it printed 1000", lambda: job.out.stat().st_size > 4000)
        await appstate.ask_checkpoint("f", job.control, job.pid, job.state, 10)
        following = json.loads(job.state.read_bytes())["next"]
        await appstate.supports_checkpoint("f", job.control, job.pid)  # a round trip later
        assert counted(job.printed()) == list(range(1, following))


@pytest.mark.asyncio
async def test_a_resumed_job_goes_on_where_it_stopped(tmp_path: Path, jobs: list[Job]) -> None:
    async with deadline():
        job = Job(tmp_path / "r", [str(COUNTER), "--to", "30", "--pause", "0.02"])
        jobs.append(job)
        await job.listening()
        await job.until("it printed 3", lambda: len(job.printed()) >= 3)
        await appstate.ask_checkpoint("r", job.control, job.pid, job.state, 10)
        stopped_at = json.loads(job.state.read_bytes())["next"]
        assert counted(job.printed()) == list(range(1, stopped_at))
        assert await appstate.ask_resume("r", job.control, job.pid, 10) is True
        # After a broker restart the site asks again: nothing is held any more.
        assert await appstate.ask_resume("r", job.control, job.pid, 10) is False
        assert await job.ended() == 0
        assert counted(job.printed()) == list(range(1, 31))


NO_HOOK = """
import os, sys, time
from gbroker.app import malleable
malleable.serve()  # no on_checkpoint: it cannot save its state
while not os.path.exists("stop"):
    malleable.safe_point()
    time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_a_job_without_a_hook_is_refused_with_the_reason(
    tmp_path: Path, jobs: list[Job]
) -> None:
    async with deadline():
        job = Job(tmp_path / "n", ["-c", NO_HOOK])
        jobs.append(job)
        await job.listening()
        hello = await appstate.supports_checkpoint("n", job.control, job.pid)
        assert hello == appstate.Hello(checkpoint=False, held=None)
        with pytest.raises(CheckpointError, match="job n saves no checkpoints: it registered no"):
            await appstate.ask_checkpoint("n", job.control, job.pid, job.state, 10)
        assert not job.state.exists()
        (job.directory / "stop").touch()
        assert await job.ended() == 0  # it ran on


NEVER_SAFE = """
import os, sys, time
from gbroker.app import malleable
malleable.serve(on_checkpoint=lambda: b"state")
while not os.path.exists("go"):  # no safe point until the test says go
    time.sleep(0.01)
malleable.safe_point()
print("went on", flush=True)
"""


@pytest.mark.asyncio
async def test_a_job_that_reaches_no_safe_point_in_time_runs_on(
    tmp_path: Path, jobs: list[Job]
) -> None:
    async with deadline():
        job = Job(tmp_path / "t", ["-c", NEVER_SAFE])
        jobs.append(job)
        await job.listening()
        with pytest.raises(CheckpointError, match=r"did not save its state within 0\.3 s"):
            await appstate.ask_checkpoint("t", job.control, job.pid, job.state, 0.3)
        (job.directory / "go").touch()  # its next safe point: the request was withdrawn
        assert await job.ended() == 0
        assert job.printed() == ["went", "on"]
        assert not job.state.exists()


MALFORMED = """
import os, socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind("binding")
listener.listen()
os.rename("binding", os.path.basename(os.environ["GBROKER_CONTROL"]))  # there once it listens
for answer in sys.argv[1:]:
    site, _ = listener.accept()
    try:
        if answer:  # hex, or "long" for a line of 200 kB
            site.sendall(b"x" * 200_000 + b"\\n" if answer == "long" else bytes.fromhex(answer))
            site.recv(65536)  # the request, if any, or the site's close
    except OSError:
        pass  # the site hung up on it
    site.close()
while not os.path.exists("stop"):
    pass
"""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("sent", "why"),
    [
        (b"long", "a line of over 4096 bytes"),
        (b"not json\n", "malformed message on its control channel: not JSON"),
        (b'{"op": "hello", "checkpoint": "yes"}\n', "checkpoint: expected true or false"),
        (b'{"op": "accept", "id": 1, "cores": 1}\n', "did not say hello"),
        (
            b'{"op": "hello", "checkpoint": true, "held": null}\n'
            b'{"op": "checkpointed", "id": -1, "bytes": 0}\n',
            "id: expected a count",
        ),
        (b"", "closed its control channel before answering"),
    ],
)
async def test_a_malformed_job_is_a_checkpoint_error_not_a_crash(
    tmp_path: Path, jobs: list[Job], sent: bytes, why: str
) -> None:
    async with deadline():
        answer = "long" if sent == b"long" else sent.hex()
        job = Job(tmp_path / "m", ["-c", MALFORMED, answer, answer])
        jobs.append(job)
        await job.listening()
        with pytest.raises(CheckpointError, match=why):
            await appstate.ask_checkpoint("m", job.control, job.pid, job.state, 5)
        with pytest.raises(CheckpointError, match=why):  # and the next time, the same
            await appstate.ask_checkpoint("m", job.control, job.pid, job.state, 5)


@pytest.mark.asyncio
async def test_a_job_that_does_not_listen_is_a_checkpoint_error(tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    directory.mkdir()
    with pytest.raises(CheckpointError, match="job g does not listen on its control socket"):
        await appstate.ask_checkpoint("g", directory / "s", os.getpid(), directory / "x", 1)
    with pytest.raises(CheckpointError, match=r"job g does not listen.*job g does not run"):
        await appstate.ask_checkpoint("g", directory / "s", None, directory / "x", 1)


def expected_hits(batches: int, samples: int) -> int:
    spec = importlib.util.spec_from_file_location("malleable_pi", PI)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sum(module.batch(index, samples)[1] for index in range(batches))


@pytest.mark.asyncio
async def test_malleable_pi_moves_by_its_own_checkpoint_and_counts_every_batch_once(
    tmp_path: Path, jobs: list[Job]
) -> None:
    batches, samples = 3000, 2000
    argv = [str(PI), "--batches", str(batches), "--samples", str(samples)]
    async with deadline():
        source = Job(tmp_path / "source", argv)
        jobs.append(source)
        await source.listening()
        await source.until("its first line", lambda: "done=" in source.out.read_text())
        checkpoint = await appstate.take(
            "pi", source.control, source.pid, source.directory, argv, tmp_path, 20
        )
        assert (checkpoint.kind, checkpoint.job_dir) == ("application", source.directory)
        manifest = appstate.read_manifest(tmp_path)
        assert (manifest.argv, manifest.size) == (tuple(argv), checkpoint.size)
        saved = json.loads(source.state.read_bytes())["hits"]
        assert 0 < len(saved) < batches
        source.kill()
        target = Job(tmp_path / "target", argv, restore=source.state)
        jobs.append(target)
        assert await target.ended() == 0
    result = json.loads((target.directory / "result.json").read_text())
    assert result["batches"] == batches
    assert result["hits"] == expected_hits(batches, samples)


def test_the_manifest_says_what_the_target_starts(tmp_path: Path) -> None:
    manifest = appstate.AppManifest("j1", Path("/jobs/j1"), ".gbroker-state", ("python3", "x"), 7)
    appstate.write_manifest(tmp_path, manifest)
    assert appstate.read_manifest(tmp_path) == manifest
    assert appstate.restore_environment(Path("/new/j1"), manifest) == {
        RESTORE_ENV: "/new/j1/.gbroker-state"
    }
    good = json.loads((tmp_path / appstate.MANIFEST).read_text())
    for field, value, why in [
        ("kind", "criu", "kind: expected 'application'"),
        ("job_dir", "relative", "job_dir: expected an absolute path"),
        ("state", "../etc/passwd", "state: expected a file name"),
        ("argv", [], "argv: expected a non-empty list of strings"),
        ("bytes", -1, "bytes: expected a size in bytes"),
    ]:
        (tmp_path / appstate.MANIFEST).write_text(json.dumps({**good, field: value}))
        with pytest.raises(CheckpointError, match=why):
            appstate.read_manifest(tmp_path)
    (tmp_path / appstate.MANIFEST).write_text("{")
    with pytest.raises(CheckpointError, match="not JSON"):
        appstate.read_manifest(tmp_path)


def test_restored_reads_the_state_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gbroker.app.malleable import ChannelError, restored

    monkeypatch.delenv(RESTORE_ENV, raising=False)
    assert restored() is None
    (tmp_path / "s").write_bytes(b"\x00state")
    monkeypatch.setenv(RESTORE_ENV, str(tmp_path / "s"))
    assert restored() == b"\x00state"
    monkeypatch.setenv(RESTORE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ChannelError, match="GBROKER_RESTORE: cannot read the saved state"):
        restored()
