"""The broker's end of its launchers (:mod:`.launcher`): the ``local`` back-end's way to fork.

Theory of operation. A root's launcher is a long-lived process that forks every job of the
root; brokers talk to it over a Unix socket, one JSON object a line. A :class:`LauncherLink` is
one such connection: a request carries an id and gets one reply; messages without a reply
(:meth:`LauncherLink.post`) go out together once the event loop's round is over, since each
write wakes the launcher. The launcher also says, unasked, how each of its children ended
(``exit``): the link keeps a future per running pid, made *inside* the reader when a
``started`` or ``watching`` reply names it, so no exit passes unheard between a reply and its
caller resuming. A lost connection fails every request waiting (:class:`LaunchFailed`) and
settles every exit as unknown (None: the job must then be polled, :mod:`.procfs`).

A new launcher tells that it is ready on a pipe (:func:`read_to_end`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

__all__ = ["Exited", "LaunchFailed", "LauncherLink", "read_to_end"]

log = logging.getLogger(__name__)


class LaunchFailed(Exception):
    """A launch step failed; the message says which and why, for
    :attr:`~gbroker.site.backend.ExitResult.error`."""


async def read_to_end(fd: int) -> bytes:
    """Everything written to a pipe until its last writer closes it; closes ``fd``."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    closed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            chunks.append(data)
        elif not closed.done():
            closed.set_result(None)

    try:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
        try:
            await closed
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return b"".join(chunks)


Exited = dict[str, Any] | None
"""What the launcher said of a job's end (``exit_code``, ``signal``, ``ended_at``), or None if
the launcher went away first (the job must then be polled)."""


class LauncherLink:
    """The broker's end of its connection to the root's launcher (see :mod:`.launcher`).

    Requests carry an id and get one reply each; ``exit`` messages are dispatched by pid to the
    futures made, inside the reader, when a ``started`` or a ``watching`` reply said the pid is
    the launcher's running child, so no exit can pass unheard between the reply and its caller
    resuming.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int
    ) -> None:
        self.pid = pid
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, tuple[asyncio.Future[dict[str, Any]], int | None]] = {}
        self.exits: dict[int, asyncio.Future[Exited]] = {}
        self.sequence = 0
        self.lost = False
        self._outbox: list[bytes] = []  # lines sent together once the loop's round is over
        self.task = asyncio.get_running_loop().create_task(
            self._read(), name="gbroker.executor:launcher"
        )

    def post(self, message: dict[str, Any]) -> None:
        """Send a message that has no reply: with the others of this round of the loop, in
        one write (each write to the launcher's socket wakes it: a costly switch, per job)."""
        if self.lost:
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(json.dumps(message).encode() + b"\n")

    def _flush(self) -> None:
        lines, self._outbox = self._outbox, []
        if lines and not self.lost:
            self.writer.write(b"".join(lines))

    async def request(self, message: dict[str, Any], watch: int | None = None) -> dict[str, Any]:
        """Send ``message`` and wait for its reply; raises :class:`LaunchFailed` if lost."""
        if self.lost:
            raise LaunchFailed("the launcher has gone away")
        self.sequence += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.sequence] = (future, watch)
        self.post({**message, "id": self.sequence})
        return await future

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while line := await self.reader.readline():
                message = json.loads(line)
                if message["op"] == "exit":
                    # Left for its watcher to take (Executor._until_ended): a short job's end
                    # comes in the same read as its start, before its watcher looks.
                    exited = self.exits.get(message["pid"])
                    if exited is not None and not exited.done():
                        exited.set_result(message)
                    continue
                entry = self.pending.pop(message.get("id"), None)
                if entry is None:
                    log.warning("launcher: unexpected message %r", message)
                    continue
                future, watch = entry
                pid = message.get("pid") if message["op"] == "started" else watch
                running = message["op"] in ("started", "watching") and message.get("running", True)
                if running and pid is not None:
                    self.exits[pid] = loop.create_future()
                if not future.done():
                    future.set_result(message)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("launcher connection broken: %s", exc)
        finally:
            self.lost = True
            for future, _ in self.pending.values():
                if not future.done():
                    future.set_exception(LaunchFailed("the launcher has gone away"))
            for exited in self.exits.values():
                if not exited.done():
                    exited.set_result(None)
            self.pending.clear()
            self.writer.close()

    async def aclose(self) -> None:
        self.writer.close()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
