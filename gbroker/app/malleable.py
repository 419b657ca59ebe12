"""The application's side of a malleable job: hear the site's offers, answer them, ask for cores.

Theory of operation (ARCHITECTURE §7, resize protocol). A malleable job started by a GBroker site
finds in its environment ``GBROKER_CONTROL``, the path of a Unix socket in its own directory,
``GBROKER_CORES`` and ``GBROKER_CPUS``, its allocation at start. The application *listens* on that
socket (:class:`Channel` does) and the site connects to it: at once, and again after a broker
restart, since jobs outlive their broker. Only the job's user and root can reach the socket (the
job directory is 0700), so every message on it comes from the site.

Messages are JSON objects, one per line:

- site → job ``{"op": "allocation", "cores": n, "cpus": [...]}``: the allocation in force, sent
  when the site connects and after every change (the site has moved the CPU affinity of every
  process of the job to exactly ``cpus`` by then);
- site → job ``{"op": "offer", "id": k, "cores": n, "cpus": [...], "old": m, "deadline": s,
  "mandatory": b}``: the site wants the job on ``n`` cores instead of ``m`` (a grow when n > m,
  a shrink when n < m) and asks for an answer within ``deadline`` seconds;
- job → site ``{"op": "accept", "id": k, "cores": c}``: what the job takes. On a grow, any ``c``
  in ``[m, n]`` (a *voluntary* offer may be taken in part: KOALA's applications that only run on
  powers of two take the largest they can use); on a shrink, ``c <= n`` (a job may give back more
  than asked, down to its minimum);
- job → site ``{"op": "request", "cores": c}``: an *evolving* job asks to grow or shrink; the
  site decides (down to the job's minimum, up to its maximum and what is free) and answers with an
  ``allocation`` if its size changes.

What the site does without an answer in time: a shrink happens all the same (the cores already
went to another job: the site confines the job's processes to the smaller set of CPUs, and the
job runs on, slower); a grow does not, unless ``mandatory`` (the job keeps its cores, and the
offered ones go back to the site). Applications should answer quickly and resize afterwards: the
affinity change is what makes a shrink real, whatever the application does.

This module uses the standard library only, so that any Python a job runs can import it (it may
also be copied next to the application). :class:`Channel` is asyncio-based; :func:`serve` runs
one in a thread for applications that are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

__all__ = [
    "CONTROL_ENV",
    "Allocation",
    "Channel",
    "ChannelError",
    "Offer",
    "decode",
    "encode",
    "serve",
]

CONTROL_ENV = "GBROKER_CONTROL"
"""The variable naming the job's control socket (set for malleable jobs only)."""
MAX_LINE = 4096
"""The longest message either side accepts, in bytes."""


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
    else:
        raise ChannelError(f"op: expected allocation, offer, accept or request, got {op!r}")
    return message


def _from_environment() -> Allocation:
    cores = int(os.environ.get("GBROKER_CORES", "1"))
    text = os.environ.get("GBROKER_CPUS", "")
    cpus = tuple(int(cpu) for cpu in text.split(",") if cpu.isdigit())
    return Allocation(cores, cpus or tuple(sorted(os.sched_getaffinity(0))))


class Channel:
    """``async with Channel() as channel:`` listen on the job's control socket.

    ``async for event in channel:`` yields each :class:`Offer` (to be answered with
    :meth:`accept`) and each :class:`Allocation` now in force; :attr:`allocation` is the latest.
    :meth:`request` asks for a new size (evolving jobs). Messages that arrive while nobody
    iterates are kept, in order.
    """

    def __init__(self, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get(CONTROL_ENV)
        if not path:
            raise ChannelError(f"${CONTROL_ENV} is not set: this is not a malleable GBroker job")
        self.path = path
        self.allocation = _from_environment()
        self._events: asyncio.Queue[Offer | Allocation] = asyncio.Queue()
        self._site: asyncio.StreamWriter | None = None
        self._server: asyncio.AbstractServer | None = None
        self._directory: int | None = None

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
        if self._site is not None:
            self._site.close()
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

    def _send(self, message: dict[str, Any]) -> None:
        if self._site is None:
            raise ChannelError("no site is connected to the control channel yet")
        self._site.write(encode(message))

    async def _site_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A site connected (a restarted broker replaces the one before)."""
        if self._site is not None:
            self._site.close()
        self._site = writer
        try:
            while line := await reader.readline():
                message = decode(line)
                if message["op"] == "allocation":
                    self.allocation = Allocation(message["cores"], _cpus(message))
                    await self._events.put(self.allocation)
                elif message["op"] == "offer":
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
        except (ChannelError, ConnectionError):
            pass  # a broken or broken-off site: it connects again when it can
        finally:
            if self._site is writer:
                self._site = None
            writer.close()


def serve(
    on_offer: Callable[[Offer], int | None], on_allocation: Callable[[Allocation], None]
) -> Callable[[int], None]:
    """Follow the channel from a background thread, for applications that are not asyncio.

    ``on_offer(offer)`` returns the cores to take (None: all offered) and is answered at once;
    ``on_allocation(allocation)`` hears each allocation in force. Both run in that thread.
    Returns a function that asks for a new size (:meth:`Channel.request`) from any thread.
    """
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: list[Channel] = []

    async def follow() -> None:
        async with Channel() as channel:
            holder.append(channel)
            ready.set()
            async for event in channel:
                if isinstance(event, Offer):
                    await channel.accept(event, on_offer(event))
                else:
                    on_allocation(event)

    thread = threading.Thread(target=loop.run_until_complete, args=(follow(),), daemon=True)
    thread.start()
    ready.wait()

    def request(cores: int) -> None:
        asyncio.run_coroutine_threadsafe(holder[0].request(cores), loop).result()

    return request
