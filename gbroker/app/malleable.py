"""The application's side of a malleable job: hear the site's offers, answer them, ask for cores.

Theory of operation (ARCHITECTURE §7, resize protocol). A malleable job started by a GBroker site
finds in its environment ``GBROKER_CONTROL``, the path of a Unix socket in its own directory,
``GBROKER_CORES`` and ``GBROKER_CPUS``, its allocation at start. The application *listens* on that
socket (:class:`Channel` does) and the site connects to it: at once, and again after a broker
restart, since jobs outlive their broker. Only the job's user and root can reach the socket (the
job directory is 0700), so every message on it comes from the site. Several connections may be
open at once (the site's resize link, a checkpoint request); each is answered on itself, and
``accept`` and ``request`` go to the latest one that sent an ``allocation`` or an ``offer``.

Messages are JSON objects, one per line. The site sends the ``allocation`` in force and
``offer``s to grow or shrink; the job ``accept``s what it takes, or ``request``s a size of its
own (an evolving job). The site does not wait on the job: a shrink happens without an answer
(the job's CPU affinity is what makes it real), a grow only when it is ``mandatory``. So
applications should answer quickly and resize afterwards.

Checkpoints (a running job moves to another site without CRIU): a job that registers a hook
(``on_checkpoint``, returning its state as bytes) and calls :meth:`Channel.safe_point` (or
:func:`safe_point`, with :func:`serve`) between its units of work saves its state there when
asked and **stops** until ``resume`` or a kill, so it never runs at two sites; started again
elsewhere, :func:`restored` gives it those bytes back. Every message and its fields:
docs/MALLEABILITY.md ("The control channel") and docs/MIGRATION.md ("The protocol").

This module uses the standard library only, so that any Python a job runs can import it (it may
also be copied next to the application). :class:`Channel` is asyncio-based; :func:`serve` runs
one in a thread for applications that are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

__all__ = [
    "CONTROL_ENV",
    "RESTORE_ENV",
    "Allocation",
    "Channel",
    "ChannelError",
    "Offer",
    "decode",
    "encode",
    "restored",
    "safe_point",
    "serve",
]

CONTROL_ENV = "GBROKER_CONTROL"
"""The variable naming the job's control socket (set for malleable jobs only)."""
RESTORE_ENV = "GBROKER_RESTORE"
"""The variable naming the state file a restored job starts from (:func:`restored`)."""
MAX_LINE = 4096
"""The longest message either side accepts, in bytes."""
MAX_PATH = 1024
"""The longest state file path a ``checkpoint`` may name, in characters."""


class ChannelError(Exception):
    """The control channel cannot be used: not a malleable job, or a bad message."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """The cores a job holds: how many, and the host CPUs its processes may run on."""

    cores: int
    cpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Offer:
    """The site wants the job on ``cores`` cores instead of ``old``; answer within ``deadline``
    seconds with :meth:`Channel.accept`."""

    id: int
    cores: int
    cpus: tuple[int, ...]
    old: int
    deadline: float
    mandatory: bool

    @property
    def grow(self) -> bool:
        return self.cores > self.old


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line on the channel."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _count(message: dict[str, Any], key: str) -> int:
    value = message.get(key)
    if type(value) is not int or not 0 <= value <= 1 << 20:
        raise ChannelError(f"{key}: expected a count of cores, got {str(value)[:40]!r}")
    return value


def _cpus(message: dict[str, Any]) -> tuple[int, ...]:
    value = message.get("cpus")
    if not isinstance(value, list) or len(value) > 1 << 16:
        raise ChannelError("cpus: expected a list of CPU numbers")
    if not all(type(cpu) is int and 0 <= cpu < 1 << 16 for cpu in value):
        raise ChannelError("cpus: expected a list of CPU numbers")
    return tuple(value)


def decode(line: bytes) -> dict[str, Any]:
    """A message read from the channel, checked: its ``op`` and the fields that op carries.

    Raises :class:`ChannelError` for anything else (the channel is then closed by its reader).
    """
    if len(line) > MAX_LINE:
        raise ChannelError(f"a message of over {MAX_LINE} bytes")
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ChannelError(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ChannelError("expected a JSON object")
    op = message.get("op")
    if op == "allocation":
        _count(message, "cores")
        _cpus(message)
    elif op == "offer":
        for key in ("id", "cores", "old"):
            _count(message, key)
        _cpus(message)
        deadline = message.get("deadline")
        if not isinstance(deadline, int | float) or not 0 < deadline <= 86_400:
            raise ChannelError("deadline: expected seconds in (0, 86400]")
        if not isinstance(message.get("mandatory"), bool):
            raise ChannelError("mandatory: expected true or false")
    elif op == "accept":
        _count(message, "id")
        _count(message, "cores")
    elif op == "request":
        _count(message, "cores")
    elif op == "hello":
        if not isinstance(message.get("checkpoint"), bool):
            raise ChannelError("checkpoint: expected true or false")
        if message.get("held") is not None:
            _count(message, "held")
    elif op == "checkpoint":
        _count(message, "id")
        path = message.get("path")
        if not isinstance(path, str) or not 1 < len(path) <= MAX_PATH or path[0] != "/":
            raise ChannelError(f"path: expected an absolute path of at most {MAX_PATH} characters")
        if "\0" in path or path.endswith("/"):
            raise ChannelError("path: expected the path of a file")
    elif op == "checkpointed":
        _count(message, "id")
        size = message.get("bytes")
        if type(size) is not int or size < 0:
            raise ChannelError(f"bytes: expected a size in bytes, got {str(size)[:40]!r}")
    elif op == "refused":
        _count(message, "id")
        if not isinstance(message.get("reason"), str):
            raise ChannelError("reason: expected a string")
    elif op in ("resume", "resumed"):
        _count(message, "id")
    else:
        raise ChannelError(
            "op: expected allocation, offer, accept, request, hello, checkpoint, checkpointed, "
            f"refused, resume or resumed, got {str(op)[:40]!r}"
        )
    return message


def _from_environment() -> Allocation:
    cores = int(os.environ.get("GBROKER_CORES", "1"))
    text = os.environ.get("GBROKER_CPUS", "")
    cpus = tuple(int(cpu) for cpu in text.split(",") if cpu.isdigit())
    return Allocation(cores, cpus or tuple(sorted(os.sched_getaffinity(0))))


@dataclass(slots=True)
class _Request:
    """A checkpoint the site asked for (``id``, into ``path``), waiting for a safe point."""

    id: int
    path: str
    site: asyncio.StreamWriter


def _write_state(path: str, state: bytes) -> None:
    """``state`` into ``path`` atomically: a temporary file beside it, fsync, rename, then an
    fsync of the directory so that the rename itself survives a crash."""
    directory = os.path.dirname(path)
    descriptor, temporary = tempfile.mkstemp(prefix=".gbroker-state-", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(state)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def restored() -> bytes | None:
    """The state a restored job starts from: what its ``on_checkpoint`` hook returned at the site
    it ran at before (the file ``$GBROKER_RESTORE``); None when the job starts afresh.

    Raises :class:`ChannelError` if the variable names a file that cannot be read: a job that was
    moved must not start again from the beginning.
    """
    path = os.environ.get(RESTORE_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ChannelError(f"${RESTORE_ENV}: cannot read the saved state {path}: {exc}") from None


class Channel:
    """``async with Channel() as channel:`` listen on the job's control socket.

    ``async for event in channel:`` yields each :class:`Offer` (to be answered with
    :meth:`accept`) and each :class:`Allocation` now in force; :attr:`allocation` is the latest.
    :meth:`request` asks for a new size (evolving jobs). Messages that arrive while nobody
    iterates are kept, in order.

    ``on_checkpoint``: a function returning the job's state as bytes, called at a
    :meth:`safe_point` when the site asks for a checkpoint (see the module docs); without it, the
    job refuses checkpoints.
    """

    def __init__(
        self, path: str | None = None, on_checkpoint: Callable[[], bytes] | None = None
    ) -> None:
        path = path if path is not None else os.environ.get(CONTROL_ENV)
        if not path:
            raise ChannelError(f"${CONTROL_ENV} is not set: this is not a malleable GBroker job")
        self.path = path
        self.allocation = _from_environment()
        self._on_checkpoint = on_checkpoint
        self._events: asyncio.Queue[Offer | Allocation] = asyncio.Queue()
        self._site: asyncio.StreamWriter | None = None  # where accept and request go
        self._sites: set[asyncio.StreamWriter] = set()  # every open connection
        self._server: asyncio.AbstractServer | None = None
        self._directory: int | None = None
        self._requests: list[_Request] = []  # checkpoints asked for, not yet taken
        self._held: int | None = None  # the checkpoint the job is stopped at
        self._resumed = False
        self._wake = asyncio.Event()

    async def __aenter__(self) -> Self:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        address = self.path
        if len(os.fsencode(address)) > 100:  # a socket's path may not exceed 107 bytes
            self._directory = os.open(os.path.dirname(address) or ".", os.O_RDONLY)
            address = f"/proc/self/fd/{self._directory}/{os.path.basename(address)}"
        self._server = await asyncio.start_unix_server(self._site_connected, address)
        os.chmod(self.path, 0o600)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for site in list(self._sites):
            site.close()
        self._sites.clear()
        self._site = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._directory is not None:
            os.close(self._directory)
            self._directory = None

    def __aiter__(self) -> AsyncIterator[Offer | Allocation]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Offer | Allocation]:
        while True:
            yield await self._events.get()

    async def next(self, timeout: float | None = None) -> Offer | Allocation | None:
        """The next event, or None after ``timeout`` seconds without one."""
        try:
            return await asyncio.wait_for(self._events.get(), timeout)
        except TimeoutError:
            return None

    async def accept(self, offer: Offer, cores: int | None = None) -> None:
        """Answer ``offer``: take ``cores`` (default: all that is offered)."""
        self._send(
            {"op": "accept", "id": offer.id, "cores": offer.cores if cores is None else cores}
        )

    async def request(self, cores: int) -> None:
        """Ask the site for ``cores`` cores (an evolving job's own initiative)."""
        self._send({"op": "request", "cores": cores})

    @property
    def checkpoint_wanted(self) -> bool:
        """Whether the site waits for a checkpoint (taken at the next :meth:`safe_point`)."""
        return bool(self._requests)

    async def safe_point(self) -> None:
        """Call between units of work, where the job's state is whole. Returns at once unless the
        site asked for a checkpoint: then the ``on_checkpoint`` hook is called, its state written
        to the file the site named, the site told, and this waits until the site resumes the job
        (its move was abandoned); a job that moved is killed here, and never goes on."""
        while self._requests:
            request = self._requests.pop(0)
            if request.site.is_closing():
                continue  # the site gave up on it before the job got here
            self._held, self._resumed = request.id, False
            if not await self._take(request):
                self._held = None
                continue
            while not self._resumed:
                self._wake.clear()
                await self._wake.wait()
                while self._requests and not self._resumed:  # asked again while stopped
                    again = self._requests.pop(0)
                    if again.site.is_closing():
                        continue
                    before, self._held = self._held, again.id
                    if not await self._take(again):
                        self._held = before
            self._held = None

    async def _take(self, request: _Request) -> bool:
        """Save the job's state for ``request`` and tell the site; False if that failed (the
        site then hears why)."""
        try:
            if self._on_checkpoint is None:  # refused on arrival; never here
                raise ChannelError("no on_checkpoint hook")
            state = self._on_checkpoint()
            if not isinstance(state, bytes | bytearray):
                raise TypeError(f"on_checkpoint returned {type(state).__name__}, not bytes")
            await asyncio.to_thread(_write_state, request.path, bytes(state))
        except Exception as exc:  # the hook's or the file system's: the site hears it
            reason = f"the checkpoint failed: {type(exc).__name__}: {exc}"
            self._answer(request.site, {"op": "refused", "id": request.id, "reason": reason[:1000]})
            return False
        self._answer(request.site, {"op": "checkpointed", "id": request.id, "bytes": len(state)})
        return True

    def _asked(self, message: dict[str, Any], site: asyncio.StreamWriter) -> None:
        """A ``checkpoint`` from the site: kept for the next safe point, or refused."""
        if self._on_checkpoint is None:
            reason = "this job saves no checkpoints (it registered no on_checkpoint hook)"
            self._answer(site, {"op": "refused", "id": message["id"], "reason": reason})
            return
        self._requests.append(_Request(message["id"], message["path"], site))
        self._wake.set()

    def _resume(self, number: int, site: asyncio.StreamWriter) -> None:
        """A ``resume`` from the site: the job goes on (or never stops for ``number``)."""
        self._requests = [request for request in self._requests if request.id != number]
        if self._held is not None and self._held != number:
            reason = f"stopped at checkpoint {self._held}, not {number}"
            self._answer(site, {"op": "refused", "id": number, "reason": reason})
            return
        self._resumed = True
        self._wake.set()
        self._answer(site, {"op": "resumed", "id": number})

    def _answer(self, site: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        if not site.is_closing():
            with contextlib.suppress(ConnectionError):
                site.write(encode(message))

    def _send(self, message: dict[str, Any]) -> None:
        if self._site is None:
            raise ChannelError("no site is connected to the control channel yet")
        self._site.write(encode(message))

    async def _site_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A site connected: served until it closes (a restarted broker's resize link takes
        over ``accept`` and ``request`` with its first allocation)."""
        self._sites.add(writer)
        self._answer(
            writer,
            {"op": "hello", "checkpoint": self._on_checkpoint is not None, "held": self._held},
        )
        try:
            while line := await reader.readline():
                message = decode(line)
                op = message["op"]
                if op == "allocation":
                    self._site = writer
                    self.allocation = Allocation(message["cores"], _cpus(message))
                    await self._events.put(self.allocation)
                elif op == "offer":
                    self._site = writer
                    await self._events.put(
                        Offer(
                            message["id"],
                            message["cores"],
                            _cpus(message),
                            message["old"],
                            float(message["deadline"]),
                            message["mandatory"],
                        )
                    )
                elif op == "checkpoint":
                    self._asked(message, writer)
                elif op == "resume":
                    self._resume(message["id"], writer)
                else:
                    raise ChannelError(f"op: a site does not send {op!r}")
        except (ChannelError, ConnectionError, ValueError):
            pass  # a broken or broken-off site (a line over the reader's limit is a ValueError)
        finally:
            self._sites.discard(writer)
            if self._site is writer:
                self._site = None
            writer.close()


_served: list[tuple[Channel, asyncio.AbstractEventLoop]] = []
"""The channels :func:`serve` follows, for :func:`safe_point`."""


def serve(
    on_offer: Callable[[Offer], int | None] | None = None,
    on_allocation: Callable[[Allocation], None] | None = None,
    on_checkpoint: Callable[[], bytes] | None = None,
) -> Callable[[int], None]:
    """Follow the channel from a background thread, for applications that are not asyncio.

    ``on_offer(offer)`` returns the cores to take (None, or no ``on_offer``: all offered) and is
    answered at once; ``on_allocation(allocation)`` hears each allocation in force. Both run in
    that thread. ``on_checkpoint`` returns the job's state (see :class:`Channel`); it is called
    from that thread while the application waits in :func:`safe_point`, which it must call
    between its units of work. Returns a function that asks for a new size
    (:meth:`Channel.request`) from any thread. Raises :class:`ChannelError` if the job has no
    control socket (``$GBROKER_CONTROL``) or cannot listen on it.
    """
    channel = Channel(on_checkpoint=on_checkpoint)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failed: list[BaseException] = []

    async def follow() -> None:
        try:
            await channel.__aenter__()
        except OSError as exc:
            failed.append(exc)
            ready.set()
            return
        ready.set()
        try:
            async for event in channel:
                if isinstance(event, Offer):
                    await channel.accept(event, None if on_offer is None else on_offer(event))
                elif on_allocation is not None:
                    on_allocation(event)
        finally:
            await channel.aclose()

    thread = threading.Thread(target=loop.run_until_complete, args=(follow(),), daemon=True)
    thread.start()
    ready.wait()
    if failed:
        raise ChannelError(f"cannot listen on {channel.path}: {failed[0]}")
    _served.append((channel, loop))

    def request(cores: int) -> None:
        asyncio.run_coroutine_threadsafe(channel.request(cores), loop).result()

    return request


def safe_point() -> None:
    """:meth:`Channel.safe_point` for the channel :func:`serve` follows, from the application's
    thread: returns at once unless a checkpoint is wanted; then waits while the state is saved,
    and until the site resumes the job (or kills it). Without :func:`serve`, returns at once."""
    for channel, loop in _served:
        if channel.checkpoint_wanted:
            asyncio.run_coroutine_threadsafe(channel.safe_point(), loop).result()
