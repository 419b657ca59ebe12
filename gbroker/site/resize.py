"""The site's side of malleable jobs: offer them cores, hear their answers, move their CPUs.

Theory of operation (ARCHITECTURE §7, resize protocol; the messages are
:mod:`gbroker.app.malleable`'s). The core's local scheduler decides a running malleable job's new
size (KOALA's FPSMA or EGS, under PRA or PWA: :mod:`gbroker.core.localsched`) and the site agent
says so with a ``Resized`` command. :class:`Resizer` carries it out for real, one change of a job at
a time:

1. the executor gives the job its new core slots (:meth:`Executor.resize_slots
   <gbroker.site.executor.Executor.resize_slots>`; for a grow, the extra slots are held from
   now on, so no other job takes them while the job decides);
2. if the job listens on its control socket (a :class:`ControlLink` is connected), it gets an
   ``offer`` of the new size and its CPUs, and answers within the ``deadline`` its description
   declares (default 30 s) with what it takes;
3. the outcome: on a grow, what the job took (in ``[old, offered]``); without an answer, nothing
   (``voluntary``) or all of it (``mandatory``). A grow offered before the job listens waits
   for it, at most its deadline from when the site began to follow the job (a job just
   started, or adopted by a restarted broker, may not listen yet). On a shrink, what the job
   kept (at most the offer), else the offer all the same: the cores were given to another job,
   so the shrink happens whatever the job does;
4. the executor moves every thread of the job's processes to exactly the CPUs of the outcome
   (:meth:`Executor.pin <gbroker.site.executor.Executor.pin>`), and the job hears the
   ``allocation`` now in force.

The outcome (cores, slots) is returned to the driver, which journals it, tells the job's owner,
and, when it differs from the scheduler's decision (a job that took less, or gave back more),
settles the scheduler on it. A job's own ``request`` (an evolving job) goes to the driver's
``on_request`` callback; the scheduler decides, and a change comes back here as any other.

Links: each malleable job started or adopted here gets one :class:`ControlLink`, which connects
to the job's socket once the job listens (tried every :data:`CONNECT_INTERVAL` seconds while the
job runs) and again if the connection breaks, and ends with the job. A job that never listens is
still resized, by its CPU affinity alone (its grows are then taken as declined unless mandatory).

Whose socket: a link connects only to a socket that is the job's own, listened on by a process
of the job's group (:func:`gbroker.site.control.open_control`, whose docs say how). A job serves
several connections at once: its resize link, and the checkpoint requests of :mod:`.appstate`;
the link hears the job's ``hello`` (:attr:`ControlLink.checkpoints`: whether it saves its own
state) and ignores the checkpoint answers, which go to the connection that asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.app.malleable import ChannelError, decode, encode
from gbroker.errors import InvalidInput
from gbroker.site.backend import Resizable
from gbroker.site.control import ControlRefused, open_control

__all__ = ["CONNECT_INTERVAL", "Change", "ControlLink", "ControlRefused", "Outcome", "Resizer"]

log = logging.getLogger("gbroker.daemon")

CONNECT_INTERVAL = 0.25
"""Seconds between attempts to reach a job's control socket."""


@dataclass(frozen=True, slots=True)
class Change:
    """A change begun (:meth:`Resizer.begin`): its number (a later change of the same job
    supersedes it), the job's cores before and after, and the CPUs offered."""

    number: int
    old: int
    cores: int
    offered: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a resize ended: the job's cores, slots and CPUs now, and whether it answered."""

    cores: int
    slots: tuple[int, ...]
    cpus: tuple[int, ...]
    answered: bool


class ControlLink:
    """The site's connection to one malleable job's control socket (see the module docs)."""

    def __init__(
        self,
        job_id: str,
        path: Path,
        allocation: Callable[[], tuple[int, tuple[int, ...]]],
        on_request: Callable[[str, int], None],
        leader: Callable[[], int | None],
    ) -> None:
        self.job_id = job_id
        self.path = path
        self._leader = leader  # the pid of the job's leader (its process group), None: not running
        self._allocation = allocation  # the job's (cores, cpus) now, sent on each connection
        self._on_request = on_request
        self._writer: asyncio.StreamWriter | None = None
        self._answers: dict[int, asyncio.Future[int]] = {}
        self._offers = 0
        self._task: asyncio.Task[None] | None = None
        self.since = 0.0  # when the site began to follow the job (the loop's clock)
        self.connected = asyncio.Event()
        self.checkpoints = False
        """Whether the job saves its own state (its ``hello``: :mod:`.appstate`)."""

    def start(self) -> None:
        self.since = asyncio.get_running_loop().time()
        self._task = asyncio.get_running_loop().create_task(
            self._follow(), name=f"gbroker.control:{self.job_id}"
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._drop()

    async def offer(
        self, cores: int, cpus: tuple[int, ...], old: int, deadline: float, mandatory: bool
    ) -> int | None:
        """Offer the job ``cores`` cores on ``cpus``; what it takes, or None without an answer
        within ``deadline`` seconds (or without a connection)."""
        if self._writer is None:
            return None
        self._offers += 1
        number = self._offers
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._answers[number] = answer
        message = {
            "op": "offer",
            "id": number,
            "cores": cores,
            "cpus": list(cpus),
            "old": old,
            "deadline": deadline,
            "mandatory": mandatory,
        }
        try:
            self._writer.write(encode(message))
            return await asyncio.wait_for(answer, deadline)
        except (TimeoutError, ConnectionError):
            return None
        finally:
            self._answers.pop(number, None)

    def tell(self, cores: int, cpus: tuple[int, ...]) -> None:
        """Tell the job the allocation now in force."""
        if self._writer is not None:
            with contextlib.suppress(ConnectionError):
                self._writer.write(encode({"op": "allocation", "cores": cores, "cpus": list(cpus)}))

    async def _follow(self) -> None:
        refused: str | None = None
        while True:
            try:
                reader, writer = await self._connect()
            except ControlRefused as exc:
                if str(exc) != refused:  # said once, not at every attempt
                    log.warning("job %s: control socket refused: %s", self.job_id, exc)
                    refused = str(exc)
                await asyncio.sleep(CONNECT_INTERVAL)
                continue
            except OSError:  # not listening (yet, or any more)
                await asyncio.sleep(CONNECT_INTERVAL)
                continue
            self._writer = writer
            cores, cpus = self._allocation()
            self.tell(cores, cpus)
            self.connected.set()
            try:
                while line := await reader.readline():
                    self._heard(decode(line))
            except (ChannelError, ConnectionError, ValueError) as exc:
                log.warning("job %s: control channel: %s", self.job_id, exc)
            finally:
                self._drop()
            await asyncio.sleep(CONNECT_INTERVAL)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the job's own socket, or :class:`ControlRefused`, or the OSError of a
        socket nobody listens on (:func:`~gbroker.site.control.open_control`)."""
        return await open_control(self.job_id, self.path, self._leader())

    def _heard(self, message: dict[str, Any]) -> None:
        if message["op"] == "accept":
            answer = self._answers.get(message["id"])
            if answer is not None and not answer.done():
                answer.set_result(message["cores"])
        elif message["op"] == "request":
            self._on_request(self.job_id, message["cores"])
        elif message["op"] == "hello":
            self.checkpoints = message["checkpoint"]
        elif message["op"] not in ("checkpointed", "refused", "resumed"):  # to whoever asked
            raise ChannelError(f"op: a job sends accept, request or hello, not {message['op']!r}")

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.connected.clear()
        for answer in self._answers.values():
            if not answer.done():  # no answer: the change goes on as for a job that is silent
                answer.set_exception(ConnectionResetError("the job closed its control channel"))


class Resizer:
    """Carries out the scheduler's resizes of a site's malleable jobs (see the module docs)."""

    def __init__(self, executor: Resizable, on_request: Callable[[str, int], None]) -> None:
        self.executor = executor
        self.on_request = on_request
        self.links: dict[str, ControlLink] = {}
        self._changes: dict[str, int] = {}  # job id -> the number of its latest change

    def follow(self, job_id: str) -> None:
        """A malleable job runs here (started, or adopted): reach its control socket."""
        if job_id in self.links:
            return

        def allocation() -> tuple[int, tuple[int, ...]]:
            slots = self.executor.slots_of(job_id)
            return len(slots), self.executor.cpus_of(job_id)

        def leader() -> int | None:
            running = self.executor.running_job(job_id)
            return None if running is None else running.pid

        link = ControlLink(
            job_id, self.executor.control_path(job_id), allocation, self.on_request, leader
        )
        self.links[job_id] = link
        link.start()

    async def forget(self, job_id: str) -> None:
        """The job has ended."""
        link = self.links.pop(job_id, None)
        self._changes.pop(job_id, None)
        if link is not None:
            await link.aclose()

    async def aclose(self) -> None:
        for job_id in list(self.links):
            await self.forget(job_id)

    def begin(self, job_id: str, cores: int) -> Change:
        """Step 1 of a change to ``cores`` cores, at once (before the scheduler's next start
        takes slots): a grow holds the extra slots, a shrink gives back the slots it drops.
        Raises :class:`InvalidInput` if the job does not run here."""
        executor = self.executor
        old = len(executor.slots_of(job_id))
        offered = executor.resize_slots(job_id, cores)
        self._changes[job_id] = number = self._changes.get(job_id, 0) + 1
        return Change(number, old, cores, offered)

    async def finish(
        self,
        job_id: str,
        change: Change,
        deadline: float,
        mandatory: bool,
        minimum: int,
    ) -> Outcome | None:
        """Steps 2-4 (see the module docs): offer, hear the answer, move the job's CPUs. The
        outcome, never below ``minimum`` (the job's rank); None if a later change of the job
        superseded this one (it decides) or the job has ended."""
        number, old, target, offered = change.number, change.old, change.cores, change.offered
        executor = self.executor
        link = self.links.get(job_id)
        if link is not None and target > old and not link.connected.is_set():
            # A job just started or adopted (a restarted broker's: after SD-Policy's shares
            # were lost with it, jobs are grown back at once) may not listen yet: a grow waits
            # for it, the deadline from when the site began to follow it; then, as before, a
            # job that does not listen declines. A shrink never waits: it happens anyway.
            left = link.since + deadline - asyncio.get_running_loop().time()
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(link.connected.wait(), left)
        taken = (
            None if link is None else await link.offer(target, offered, old, deadline, mandatory)
        )
        if self._changes.get(job_id) != number:
            return None  # superseded: that change offers, settles and pins
        answered = taken is not None
        if target > old:  # a grow: what it took of it, or nothing (all if mandatory)
            if taken is None:
                taken = target if mandatory else old
            taken = max(old, min(target, taken))
        else:  # a shrink happens, whatever the answer; the job may give back more
            taken = target if taken is None else max(minimum, min(target, taken))
        try:
            executor.resize_slots(job_id, taken)
            cpus = executor.pin(job_id)
            slots = executor.slots_of(job_id)
        except InvalidInput:
            return None  # it ended meanwhile
        if link is not None:
            link.tell(taken, cpus)
        return Outcome(taken, slots, cpus, answered)
