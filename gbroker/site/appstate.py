"""Application-level checkpoints: a job that saves its own state moves without CRIU.

Theory of operation (the job's side and the messages are :mod:`gbroker.app.malleable`'s). A job
that registered an ``on_checkpoint`` hook says so in the ``hello`` it sends on every connection
to its control socket (:func:`supports_checkpoint`). The site checkpoints it with
:func:`ask_checkpoint`: on a connection of its own (the job serves its resize link beside it),
it names the state file (:data:`STATE_FILE` in the job's directory); the job writes its state
there at its next safe point, answers with its size, and **stops** there. The site then either
:func:`ask_resume`\\ s it (the move was abandoned; also after a broker restart: the job's
``hello`` names the checkpoint it is stopped at) or kills it (it runs elsewhere now).

The state file is in the job's directory, so it moves with it. The checkpoint's image directory
holds a manifest (:data:`MANIFEST`: :class:`AppManifest`, written by :func:`write_manifest`) that
says what the target starts: the job again, its program and arguments, with
:data:`RESTORE_ENV` naming the state file in its new directory (:func:`restore_environment`).
:func:`take` does the whole source side for :meth:`Backend.checkpoint
<gbroker.site.backend.Backend.checkpoint>`.

Every failure is a :class:`~gbroker.site.checkpoints.CheckpointError` saying why, for people: the
job does not listen (it does not run, or has no control socket), has no hook, did not reach a
safe point in time (it is then told to go on), closed the channel, or sent something malformed.
A job whose checkpoint failed runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import stat
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.app.malleable import MAX_LINE, RESTORE_ENV, ChannelError, decode, encode
from gbroker.site.checkpoints import Checkpoint, CheckpointError
from gbroker.site.control import ControlRefused, open_control

__all__ = [
    "DEFAULT_TIMEOUT",
    "KIND",
    "MANIFEST",
    "RESTORE_ENV",
    "STATE_FILE",
    "AppManifest",
    "Hello",
    "ask_checkpoint",
    "ask_resume",
    "read_manifest",
    "restore_environment",
    "supports_checkpoint",
    "take",
    "write_manifest",
]

KIND = "application"
"""The :attr:`Checkpoint.kind <gbroker.site.checkpoints.Checkpoint.kind>` of these checkpoints."""
STATE_FILE = ".gbroker-state"
"""The job's saved state, in its directory (it moves with it)."""
MANIFEST = "application.json"
"""The manifest's name in a checkpoint's image directory."""
DEFAULT_TIMEOUT = 30.0
"""Seconds a job has to reach a safe point and save its state."""
_LIMIT = MAX_LINE + 64  # the reader's longest line: anything longer is malformed


@dataclass(frozen=True, slots=True)
class Hello:
    """What a job says when the site connects: whether it saves checkpoints (``checkpoint``),
    and the checkpoint it is stopped at (``held``; None: it runs)."""

    checkpoint: bool
    held: int | None


@dataclass(frozen=True, slots=True)
class AppManifest:
    """What an application-level checkpoint's image says (:data:`MANIFEST`).

    Attributes:
        job_id: the job.
        job_dir: its directory at the source.
        state: the state file's name in the job's directory (:data:`STATE_FILE`).
        argv: the program and its arguments, started again at the target.
        size: bytes of state.
    """

    job_id: str
    job_dir: Path
    state: str
    argv: tuple[str, ...]
    size: int


class _Link:
    """One connection of the site to a job's control socket, for one exchange."""

    def __init__(self, job_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.job_id = job_id
        self.reader = reader
        self.writer = writer

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionError):
            self.writer.write(encode(message))

    async def next(self) -> dict[str, Any]:
        """The job's next message, checked; :class:`CheckpointError` at its end or for a bad
        one (at most :data:`_LIMIT` bytes are read of a line)."""
        try:
            line = await self.reader.readline()
        except ValueError:  # longer than the reader's limit
            raise CheckpointError(
                f"job {self.job_id} sent a malformed message on its control channel: "
                f"a line of over {MAX_LINE} bytes"
            ) from None
        except ConnectionError as exc:
            raise CheckpointError(f"job {self.job_id}: its control channel broke: {exc}") from None
        if not line:
            raise CheckpointError(
                f"job {self.job_id} closed its control channel before answering (it ended, or "
                "its gbroker.app.malleable does not know checkpoints)"
            )
        try:
            return decode(line)
        except ChannelError as exc:
            raise CheckpointError(
                f"job {self.job_id} sent a malformed message on its control channel: {exc}"
            ) from None

    async def hello(self) -> Hello:
        message = await self.next()
        if message["op"] != "hello":
            raise CheckpointError(
                f"job {self.job_id} did not say hello on its control channel (it said "
                f"{message['op']!r}): its gbroker.app.malleable does not know checkpoints"
            )
        return Hello(message["checkpoint"], message.get("held"))

    async def answer(self, number: int) -> dict[str, Any]:
        """The job's answer to request ``number`` (anything else on the line is skipped)."""
        while True:
            message = await self.next()
            if message.get("id") == number and message["op"] in (
                "checkpointed",
                "refused",
                "resumed",
            ):
                return message

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def _connected(job_id: str, control: Path, leader: int | None) -> AsyncIterator[_Link]:
    try:
        reader, writer = await open_control(job_id, control, leader, limit=_LIMIT)
    except ControlRefused as exc:
        raise CheckpointError(f"job {job_id}: control socket refused: {exc}") from None
    except OSError as exc:
        raise CheckpointError(
            f"job {job_id} does not listen on its control socket {control} (it does not run, "
            f"or was not started with a control socket, or does not use gbroker.app.malleable): "
            f"{exc.strerror or exc}"
        ) from None
    link = _Link(job_id, reader, writer)
    try:
        yield link
    finally:
        await link.aclose()


async def supports_checkpoint(
    job_id: str, control: Path, leader: int | None, timeout: float = DEFAULT_TIMEOUT
) -> Hello:
    """What job ``job_id`` (its process group led by ``leader``) says of checkpoints when the
    site connects to its control socket ``control``. :class:`CheckpointError` if it cannot be
    asked (see the module docs)."""
    async with _connected(job_id, control, leader) as link:
        try:
            return await asyncio.wait_for(link.hello(), timeout)
        except TimeoutError:
            raise CheckpointError(
                f"job {job_id} said nothing on its control channel within {timeout:g} s"
            ) from None


async def ask_checkpoint(
    job_id: str,
    control: Path,
    leader: int | None,
    state: Path,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Have job ``job_id`` save its state into ``state`` (a file in its directory) and stop;
    the bytes it saved. The job then waits for :func:`ask_resume` or its end.

    :class:`CheckpointError` if it cannot: no hook, no answer within ``timeout`` seconds (it is
    then told to go on), the job gone, a malformed answer; the job then runs on."""
    async with _connected(job_id, control, leader) as link:
        try:
            hello = await asyncio.wait_for(link.hello(), timeout)
        except TimeoutError:
            raise CheckpointError(
                f"job {job_id} said nothing on its control channel within {timeout:g} s"
            ) from None
        if not hello.checkpoint:
            raise CheckpointError(
                f"job {job_id} saves no checkpoints: it registered no on_checkpoint hook "
                "(gbroker.app.malleable)"
            )
        number = random.randint(1, 1 << 20)
        link.send({"op": "checkpoint", "id": number, "path": str(state)})
        try:
            answer = await asyncio.wait_for(link.answer(number), timeout)
        except TimeoutError:
            link.send({"op": "resume", "id": number})  # not taken: dropped; taken: it goes on
            raise CheckpointError(
                f"job {job_id} did not save its state within {timeout:g} s (does it call "
                "safe_point() between its units of work?); it runs on"
            ) from None
        if answer["op"] == "refused":
            raise CheckpointError(f"job {job_id} refused the checkpoint: {answer['reason']}")
        if answer["op"] != "checkpointed":
            raise CheckpointError(f"job {job_id} answered {answer['op']!r} to a checkpoint")
    size = _state_size(job_id, state)
    if size != answer["bytes"]:
        raise CheckpointError(
            f"job {job_id} said it saved {answer['bytes']} bytes, but {state} holds {size}"
        )
    return size


def _state_size(job_id: str, state: Path) -> int:
    """The size of the state file the job wrote: a regular file (never a link followed)."""
    try:
        info = os.lstat(state)
    except OSError as exc:
        raise CheckpointError(f"job {job_id}: its state file {state}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"job {job_id}: its state file {state} is not a regular file")
    return info.st_size


async def ask_resume(
    job_id: str, control: Path, leader: int | None, timeout: float = DEFAULT_TIMEOUT
) -> bool:
    """Let job ``job_id`` go on from the checkpoint it is stopped at (its move was abandoned);
    also after a broker restart, since the job's ``hello`` names that checkpoint. False if it was
    not stopped (it runs). :class:`CheckpointError` if it cannot be told."""
    async with _connected(job_id, control, leader) as link:
        try:
            hello = await asyncio.wait_for(link.hello(), timeout)
            if hello.held is None:
                return False
            link.send({"op": "resume", "id": hello.held})
            answer = await asyncio.wait_for(link.answer(hello.held), timeout)
        except TimeoutError:
            raise CheckpointError(
                f"job {job_id} did not answer a resume within {timeout:g} s"
            ) from None
        if answer["op"] != "resumed":
            raise CheckpointError(f"job {job_id} did not resume: {answer.get('reason', answer)}")
        return True


def write_manifest(image: Path, manifest: AppManifest) -> Path:
    """Write ``manifest`` into the checkpoint's ``image`` directory (atomically); its path."""
    path = image / MANIFEST
    text = json.dumps(
        {
            "kind": KIND,
            "version": 1,
            "job_id": manifest.job_id,
            "job_dir": str(manifest.job_dir),
            "state": manifest.state,
            "argv": list(manifest.argv),
            "bytes": manifest.size,
        },
        indent=1,
    )
    temporary = path.with_name(f".{MANIFEST}.tmp")
    with open(temporary, "w") as file:
        file.write(text + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    return path


def read_manifest(image: Path) -> AppManifest:
    """The manifest of an application-level checkpoint's ``image``; :class:`CheckpointError`
    naming the field and what was expected if it is not one."""
    path = image / MANIFEST
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the manifest: {exc.strerror}") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")

    def wrong(field: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{path}: {field}: expected {expected}, got {data.get(field)!r}")

    if data.get("kind") != KIND:
        raise wrong("kind", repr(KIND))
    if data.get("version") != 1:
        raise wrong("version", "1")
    job_id, job_dir, state = data.get("job_id"), data.get("job_dir"), data.get("state")
    if not isinstance(job_id, str) or not job_id:
        raise wrong("job_id", "a job id")
    if not isinstance(job_dir, str) or not job_dir.startswith("/"):
        raise wrong("job_dir", "an absolute path")
    if not isinstance(state, str) or not state or "/" in state or state in (".", ".."):
        raise wrong("state", "a file name")
    argv = data.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise wrong("argv", "a non-empty list of strings")
    size = data.get("bytes")
    if type(size) is not int or size < 0:
        raise wrong("bytes", "a size in bytes")
    return AppManifest(job_id, Path(job_dir), state, tuple(argv), size)


def restore_environment(job_dir: Path, manifest: AppManifest) -> dict[str, str]:
    """What to add to the environment of the job started again in ``job_dir`` (its new
    directory, the old one's content in place) so that :func:`gbroker.app.malleable.restored`
    finds its state."""
    return {RESTORE_ENV: str(job_dir / manifest.state)}


async def take(
    job_id: str,
    control: Path,
    leader: int | None,
    job_dir: Path,
    argv: Sequence[str],
    into: Path,
    timeout: float = DEFAULT_TIMEOUT,
) -> Checkpoint:
    """The source's side of :meth:`Backend.checkpoint <gbroker.site.backend.Backend.checkpoint>`
    for a job that saves its own state: :func:`ask_checkpoint` into ``job_dir``'s
    :data:`STATE_FILE`, then the manifest into ``into``. The job is left stopped; on
    :class:`CheckpointError` it runs on."""
    began = time.monotonic()  # frozen_for: from the request to the state saved
    size = await ask_checkpoint(job_id, control, leader, job_dir / STATE_FILE, timeout)
    stopped = time.monotonic()
    try:
        write_manifest(into, AppManifest(job_id, job_dir, STATE_FILE, tuple(argv), size))
    except OSError as exc:
        await ask_resume(job_id, control, leader, timeout)
        raise CheckpointError(
            f"job {job_id}: cannot write the manifest into {into}: {exc}"
        ) from None
    return Checkpoint(job_id, KIND, into, job_dir, size, stopped - began)
