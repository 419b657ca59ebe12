"""Reading a submission whose cost its size does not bound: in worker processes, under a budget.

Theory of operation. What a broker does for a request mostly costs in proportion to the
request's bytes, and those are capped (1 MiB). Reading a submission is the exception: XPath is
not linear (a sweep's ``Match`` can be cubic in the template's elements), a sweep of a few lines
makes 10,000 jobs, and PyYAML reads a large document slowly. Done on the event loop, each held
every other request of the broker (HTTP, peers, heartbeats) for as long (the figures:
docs/JSDL.md, "The read budget", and docs/BENCHMARKS.md).

So :class:`Readers` keeps a few worker processes, started with the broker, each reading one
document at a time (:func:`~gbroker.jobs.sweep.loads_submission`) and sending back the jobs,
pickled. The :class:`Budget` bounds each reading:

* ``seconds``: a worker that has not answered by then is killed (a thread could not be
  stopped) and a new one started in its place; the request gets a 400 naming the budget.
* ``result_bytes``: the jobs read, as sent back; more is refused the same way (10,000 elements
  of a large template would otherwise be gigabytes in the broker and its journal). A worker's
  address space is limited to its size at start plus :data:`WORKER_MEMORY`, so a reading that
  would take more fails there (a ``MemoryError``), not in the broker.
* A worker that dies while reading (a signal, the memory limit at a bad moment) is replaced;
  the request gets a 400 saying so, never a 500 and never a hung request.

Only what needs it goes to a worker: a small document without a sweep (:data:`INLINE_BYTES`)
is read on the loop as before. The pickles crossing the pipe are made by our own code in the
worker from parsed data, never from a client's bytes, and unpickled in a thread.

The worker side is this module run as a program (``python -m gbroker.daemon.bounded``): frames
of a 4-byte length and a body on its stdin and stdout (its own stdout goes to stderr, so a
stray print cannot corrupt a frame).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copyreg
import io
import logging
import os
import pickle
import resource
import signal
import sys
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, BinaryIO

from gbroker.errors import InternalError, InvalidInput
from gbroker.jobs.description import JobDescription, JsdlError
from gbroker.jobs.sweep import JobArray, loads_job, loads_submission

__all__ = ["INLINE_BYTES", "WORKER_MEMORY", "Budget", "Readers"]

log = logging.getLogger("gbroker.daemon")

INLINE_BYTES = 16 << 10
"""A document of at most this many bytes and without a sweep is read on the event loop (even
PyYAML's slowest reading of it holds the loop only briefly: docs/JSDL.md, "The read budget");
anything larger, and any sweep, in a worker."""
WORKER_MEMORY = 1 << 30
"""What a worker's address space may grow by while it reads (beyond what it had at start)."""
_STARTING_SECONDS = 60.0  # a worker that cannot start within this is our failure, said as such
_HEADER = 4


@dataclass(frozen=True, slots=True)
class Budget:
    """What one submission's reading may cost (``gbroker serve --read-budget --read-max-bytes
    --readers``): wall-clock ``seconds`` in a worker, ``result_bytes`` of jobs read, and how many
    ``workers`` read at once."""

    seconds: float = 5.0
    result_bytes: int = 64 << 20
    workers: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= 3600:  # also refuses NaN
            raise InvalidInput("read budget", "seconds in (0, 3600]", self.seconds)
        if self.result_bytes < 1 << 10:
            raise InvalidInput("read max bytes", "at least 1 KiB", self.result_bytes)
        if not 1 <= self.workers <= 64:
            raise InvalidInput("readers", "1 to 64 worker processes", self.workers)

    def over_time(self) -> InvalidInput:
        return InvalidInput(
            "job",
            f"a document read (sweep expanded, XPath evaluated) within {self.seconds:g} s, "
            "the broker's read budget",
            f"more than {self.seconds:g} s: refused",
        )


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(_HEADER, "big") + body


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (is neither gone nor a zombie), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None
        assert process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout

    async def frame(self) -> bytes:
        header = await self.stdout.readexactly(_HEADER)
        return await self.stdout.readexactly(int.from_bytes(header, "big"))

    async def read(self, raw: bytes) -> bytes:
        self.stdin.write(_frame(raw))
        await self.stdin.drain()
        return await self.frame()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class Readers:
    """The broker's pool of reading workers (see the module docstring), started when the
    first document needs one (most brokers never read a sweep: a worker's start costs most of
    a second of CPU, and a fleet of test brokers starting two each starved the machine) and
    stopped by leaving ``async with``. A worker that ends, however, is replaced."""

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget()
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._busy: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._started = False

    async def __aenter__(self) -> Readers:
        return self

    def start(self) -> None:
        """Start the workers, once (the first :meth:`load_in_worker` does)."""
        if not self._started:
            self._started = True
            for _ in range(self.budget.workers):
                self._spawn(self._start(), "reader-start")

    async def __aexit__(self, *exc: object) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.kill() for w in self._workers), return_exceptions=True)
        self._workers.clear()

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (``/api/v1/health`` shows them)."""
        return sorted(w.process.pid for w in self._workers if w.process.returncode is None)

    @property
    def busy_pids(self) -> list[int]:
        """The process ids of the workers reading a document now."""
        return sorted(w.process.pid for w in self._busy)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self) -> None:
        """Start a worker; it joins the idle ones once it says it is ready (its imports take
        most of a second, which must not count against a request's budget)."""
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                "--max-bytes",
                str(self.budget.result_bytes),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            log.error("a submission reader could not start: %s", exc)
            return
        worker = _Worker(process)
        self._workers.add(worker)
        self._spawn(self._watch(worker), "reader-watch")
        try:
            async with asyncio.timeout(_STARTING_SECONDS):
                await worker.frame()  # the empty frame that says it is ready
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            log.error("a submission reader did not start: killed")
            await worker.kill()  # its watcher starts another
            return
        self._idle.put_nowait(worker)

    async def _watch(self, worker: _Worker) -> None:
        """When ``worker`` ends (killed past the budget, crashed, killed by anyone), start
        another in its place."""
        await worker.process.wait()
        self._workers.discard(worker)
        self._spawn(self._start(), "reader-start")

    async def load(self, raw: bytes) -> JobDescription | JobArray:
        """The submission in ``raw``: read here if small and plain, else by a worker within the
        budget. Raises :class:`InvalidInput` for a bad document and one over the budget."""
        if len(raw) <= INLINE_BYTES:
            desc = loads_job(raw)
            if desc is not None:
                return desc
        return await self.load_in_worker(raw)

    async def _worker(self) -> _Worker:
        """The next idle worker that still runs (one killed while idle may not be known dead
        to asyncio yet: the kernel says whether it is, a zombie or gone)."""
        async with asyncio.timeout(_STARTING_SECONDS):
            while True:
                worker = await self._idle.get()
                if worker.process.returncode is None and _running(worker.process.pid):
                    return worker

    async def load_in_worker(self, raw: bytes, again: bool = True) -> JobDescription | JobArray:
        """``raw`` read by a worker, whatever its size (see :meth:`load`). A worker that dies
        reading it is replaced and the reading tried ``again`` once (it may have died just
        before, while idle); twice, and the document is refused."""
        self.start()
        try:
            worker = await self._worker()
        except TimeoutError:
            raise InternalError("no submission reader could be started") from None
        self._busy.add(worker)
        try:
            async with asyncio.timeout(self.budget.seconds):
                answer = await worker.read(raw)
        except TimeoutError:
            await worker.kill()
            raise self.budget.over_time() from None
        except (asyncio.IncompleteReadError, ConnectionError):
            await worker.kill()
            if again:
                return await self.load_in_worker(raw, again=False)
            code = worker.process.returncode or -signal.SIGKILL
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            raise InvalidInput(
                "job", "a document its reading worker survives", f"the worker ended ({how})"
            ) from None
        except BaseException:  # cancelled (the client went away): the worker may be mid-read
            await worker.kill()
            raise
        finally:
            self._busy.discard(worker)
        self._idle.put_nowait(worker)
        kind, value = await asyncio.to_thread(pickle.loads, answer)
        if kind == "ok":
            assert isinstance(value, JobDescription | JobArray)
            return value
        if kind == "jsdl":
            raise JsdlError(*value)
        if kind == "internal":
            raise InternalError(value)
        raise InvalidInput(*value)


# -- the worker process ----------------------------------------------------------------------


def _mapping_proxy(mapping: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(mapping)


def _pickled(value: object) -> bytes:
    """``value`` pickled, read-only mappings (a description's environment) included."""
    table = copyreg.dispatch_table.copy()
    table[MappingProxyType] = lambda proxy: (_mapping_proxy, (dict(proxy),))
    out = io.BytesIO()
    pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = table
    pickler.dump(value)
    return out.getvalue()


def _answer(raw: bytes, max_bytes: int) -> bytes:
    """The pickled answer to one document: ("ok", jobs), ("jsdl", args), ("invalid", args), or
    ("internal", message) for our own failure (logged on stderr, the broker's log)."""
    result: tuple[str, Any]
    try:
        result = ("ok", loads_submission(raw))
    except JsdlError as exc:
        result = ("jsdl", (exc.document, exc.path, exc.expected, exc.found))
    except InvalidInput as exc:
        result = ("invalid", (exc.field, exc.expected, exc.found))
    except MemoryError:
        result = ("invalid", ("job", f"a document read in {WORKER_MEMORY >> 20} MiB", "more"))
    except RecursionError:
        result = ("invalid", ("job", "a document nested less deeply", "too deep"))
    except Exception as exc:  # our bug: said in the broker's log, answered 500
        traceback.print_exc()
        result = ("internal", f"reading the submission failed: {type(exc).__name__}")
    body = _pickled(result)
    if len(body) > max_bytes:
        size = f"{len(body)} bytes"
        if isinstance(result[1], JobArray):
            size = f"{size} ({result[1].size} jobs)"
        expected = f"jobs of at most {max_bytes} bytes in all, the broker's read budget"
        body = pickle.dumps(("invalid", ("job", expected, size)))
    return body


def _limit_memory() -> None:
    pages = int(open("/proc/self/statm").read().split()[0])  # noqa: SIM115 (read once at start)
    limit = pages * os.sysconf("SC_PAGE_SIZE") + WORKER_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _serve(source: BinaryIO, out: BinaryIO, max_bytes: int) -> None:
    while True:
        header = source.read(_HEADER)
        if len(header) < _HEADER:
            return  # the broker closed the pipe: it is stopping
        raw = source.read(int.from_bytes(header, "big"))
        out.write(_frame(_answer(raw, max_bytes)))
        out.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gbroker.daemon.bounded")
    parser.add_argument("--max-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the broker's group: the broker decides
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into a frame
    with contextlib.suppress(OSError):  # no /proc: no limit
        _limit_memory()
    out.write(_frame(b""))  # ready
    out.flush()
    _serve(sys.stdin.buffer, out, args.max_bytes)


if __name__ == "__main__":  # run as the module itself, so that its pickles name it
    from gbroker.daemon.bounded import main as module_main

    module_main()
