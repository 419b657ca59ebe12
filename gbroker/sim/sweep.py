"""Sweeps: the independent runs of an experiment, in this process or on Dask distributed.

A :class:`Run` is one seed of one configuration: a picklable function, its arguments and a name
that says which configuration and seed it is. A :class:`Sweep` runs a list of them where
``--dask`` says: ``serial`` (here, one after another), ``local[:N]`` (an embedded Dask
``LocalCluster`` of single-threaded worker processes: the runs are CPU-bound Python that threads
would not spread) or the address of an existing scheduler. :func:`resolve` gives the default,
which never starts a cluster for a single run or a sweep too small to repay its start (the
choices and the default in full: docs/SCALE.md).

Theory of operation. Each run draws its workload and every random decision from its own seeded
generator, so its value does not depend on where or when it runs; :meth:`Sweep.map` hands the
values back in the order the runs were given, so whatever is computed from them (means,
intervals, paired differences) is what the serial run computes for the same seeds, to the last
bit. :meth:`Sweep.as_completed` yields them as they finish instead, with their index. An
argument object that several runs share (a trace, a topology, a workload generator) is sent to
the cluster once (``scatter``), not with every run. A run that raises ends the sweep with
:class:`RunFailed`, which names the run (its configuration and seed) and the error, and the runs
not yet done are cancelled; the client and an embedded cluster are closed however the sweep ends,
Ctrl-C included. On a scheduler of its own, every run first checks that its worker imports the
same GBroker code as this process (a digest of the package's sources), since a worker with other
code would give other figures.

Dask is imported only when a sweep uses it (the ``sweep`` extra: ``pip install gbroker[sweep]``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

from gbroker.errors import GBrokerError, InternalError, InvalidInput

__all__ = [
    "LOCAL",
    "SERIAL",
    "WHERE_HELP",
    "Finished",
    "Run",
    "RunFailed",
    "Sweep",
    "code_digest",
    "dask_option",
    "parse_where",
    "resolve",
    "usable_cores",
]

T = TypeVar("T")

SERIAL = "serial"
LOCAL = "local"
WHERE_HELP = (
    "where the runs go: 'serial' (here, one after another), 'local' (an embedded Dask cluster, "
    "one single-threaded worker process per core; 'local:N' for N), or the address of a Dask "
    "scheduler, e.g. tcp://HOST:8786 (default: local when there is more than one run and more "
    "than one core and the sweep simulates 5,000 jobs or more, else serial)"
)
_EXPECTED = "serial, local, local:N (N >= 1) or a Dask scheduler address such as tcp://HOST:8786"
_ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
#: How long to wait for a scheduler to answer, and then for its first worker (seconds).
CONNECT_TIMEOUT = 10.0
WORKER_TIMEOUT = 60.0
#: How long closing the client, then an embedded cluster, may take (seconds).
CLOSE_TIMEOUT = 10.0


def parse_where(text: str) -> str:
    """``text`` as a ``--dask`` value (``serial``, ``local``, ``local:N``, an address), checked."""
    where = text.strip()
    if where in (SERIAL, LOCAL):
        return where
    if where.startswith(LOCAL + ":"):
        count = where.removeprefix(LOCAL + ":")
        if count.isdigit() and int(count) >= 1:
            return f"{LOCAL}:{int(count)}"
        raise InvalidInput("dask", _EXPECTED, text)
    if _ADDRESS.fullmatch(where):
        return where
    raise InvalidInput("dask", _EXPECTED, text)


def _where_type(text: str) -> str:
    import argparse

    try:
        return parse_where(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(f"expected {exc.expected}, got {text!r}") from None


def dask_option(default: str | None = None) -> dict[str, Any]:
    """The keywords of the ``--dask ADDRESS|local|serial`` option that every sweeping script
    shares: ``parser.add_argument("--dask", **dask_option())``. ``default`` None: :func:`resolve`
    decides from the number of runs."""
    text = (
        WHERE_HELP
        if default is None
        else f"{WHERE_HELP.rsplit(' (default', 1)[0]} (default {default})"
    )
    return {
        "type": _where_type,
        "default": default,
        "metavar": "ADDRESS|local|serial",
        "help": text,
    }


def usable_cores() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


LOCAL_WORTH = 5_000
"""The jobs a sweep must simulate in all before the default starts a local cluster for it:
starting one costs about what simulating 5,000 jobs of the paper's workload serially does
(docs/SCALE.md gives the figures and the command)."""


def resolve(where: str | None, runs: int, jobs: int | None = None) -> str:
    """``where``, or the default for ``runs`` runs that simulate ``jobs`` jobs in all (None:
    unknown): local with several runs and cores, unless the sweep is too small to repay the
    cluster's start (:data:`LOCAL_WORTH`). A local cluster of one worker per core gets no more
    workers than there are runs."""
    if where is None:
        several = runs > 1 and usable_cores() > 1
        worth = jobs is None or jobs >= LOCAL_WORTH
        where = LOCAL if several and worth and _have_dask() else SERIAL
    where = parse_where(where)
    if where == LOCAL:
        return f"{LOCAL}:{max(1, min(usable_cores(), runs))}"
    return where


def _have_dask() -> bool:
    """Whether Dask distributed is installed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("distributed") is not None


@dataclass(frozen=True, slots=True)
class Run(Generic[T]):
    """One independent run: ``function(*args)``, named for the reports of its failure.

    ``size`` is the work it stands for on a progress bar (the jobs it simulates; 1: itself).
    ``ticks``: the function takes a ``progress`` keyword, a callback of the units done so far
    within the run, which a serial sweep passes (a cluster's progress moves a run at a time).
    """

    name: str
    function: Callable[..., T]
    args: tuple[Any, ...] = ()
    size: int = 1
    ticks: bool = False


@dataclass(frozen=True, slots=True)
class Finished(Generic[T]):
    """A run done: its index in the list given, its value, and the wall time it took."""

    index: int
    value: T
    seconds: float


class RunFailed(GBrokerError):
    """A run raised: the message names the run (its configuration and seed) and the error."""

    def __init__(self, name: str, error: BaseException) -> None:
        self.name = name
        self.error = error
        what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        where = "" if isinstance(error, GBrokerError) else _innermost(error)
        super().__init__(f"{name} failed: {what}{where}")


def _innermost(error: BaseException) -> str:
    """`` (at FILE:LINE in FUNCTION)`` of the frame that raised, for a bug's report."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f" (at {Path(code.co_filename).name}:{tb.tb_lineno} in {code.co_name})"


@functools.cache
def code_digest() -> str:
    """A digest of the sources of GBroker's packages (gbroker, netmon, dcsmon) as imported here:
    two processes with the same digest run the same code."""
    import importlib.util

    digest = hashlib.sha256()
    for package in ("gbroker", "netmon", "dcsmon"):
        spec = importlib.util.find_spec(package)  # where it is, without importing it
        if spec is None or spec.origin is None:
            continue
        root = Path(spec.origin).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class _OtherCode(GBrokerError):
    """A worker imports other GBroker code than the client (raised on the worker)."""


def _on_worker(expected: str | None, function: Callable[..., T], *args: Any) -> tuple[T, float]:
    """What a cluster runs for each :class:`Run`: the code check, then the run, timed."""
    if expected is not None and code_digest() != expected:
        import socket

        raise _OtherCode(
            f"the worker on {socket.gethostname()} (pid {os.getpid()}) imports other GBroker "
            f"code (digest {code_digest()}) than the client ({expected}): install the same "
            "version of the package on every worker"
        )
    began = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - began


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile, in this process and the processes forked meanwhile."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and it gets the signals)
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A Ctrl-C meanwhile is held back and raised (KeyboardInterrupt) at the end of the block:
    for the short steps that must not stop half-way (sending the runs, closing the cluster)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: held.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | complex | str | bytes)


class Sweep:
    """Where runs go (``serial``, ``local[:N]``, a scheduler address), as a context manager:
    entering starts the embedded cluster or connects to the scheduler, leaving closes them."""

    def __init__(self, where: str = SERIAL) -> None:
        self.where = parse_where(where)
        self._client: Any = None
        self._cluster: Any = None

    @property
    def serial(self) -> bool:
        return self.where == SERIAL

    def __enter__(self) -> Sweep:
        if self.serial or self._client is not None:
            return self
        try:
            self._start()
        except BaseException:  # Ctrl-C while starting too: what was started stops
            self.close()
            raise
        return self

    def _start(self) -> None:
        try:
            from distributed import Client, LocalCluster
            from distributed.worker_memory import parse_memory_limit
        except ImportError as exc:
            raise InvalidInput(
                "dask",
                "serial, or Dask distributed installed (pip install 'gbroker[sweep]', which "
                "scripts/setup/setup.sh installs)",
                self.where,
            ) from exc
        import logging

        if self.where.startswith(LOCAL):
            _, _, count = self.where.partition(":")
            n = int(count) if count else usable_cores()
            self._cluster = LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=0,  # started below, with Ctrl-C ignored
                threads_per_worker=1,
                processes=True,
                # Each worker its share of the machine (what n_workers=n would give).
                memory_limit=parse_memory_limit(
                    "auto", 1, n, logger=logging.getLogger("distributed")
                ),
                host="127.0.0.1",
                # No dashboard, and its HTTP routes on any free port of the loopback (its
                # default, 8787, may be another cluster's: Dask would warn on stderr).
                dashboard_address=None,
                scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                # The workers' logs say nothing a sweep's report does not (a run's error
                # comes back to it); the scheduler's, in this process, only errors.
                silence_logs=logging.CRITICAL,
            )
            logging.getLogger("distributed").setLevel(logging.ERROR)
            self._client = Client(self._cluster, set_as_default=False)  # type: ignore[no-untyped-call]
            self._spawn_ignoring_ctrl_c(n)
            self._client.wait_for_workers(n, timeout=WORKER_TIMEOUT)
            return
        # Someone else's scheduler: quiet its client's logs, as the embedded one's are.
        logging.getLogger("distributed").setLevel(logging.ERROR)
        try:
            self._client = Client(  # type: ignore[no-untyped-call]
                self.where, timeout=CONNECT_TIMEOUT, set_as_default=False
            )
        except (OSError, TimeoutError) as exc:
            raise InvalidInput(
                "dask",
                f"the address of a Dask scheduler that answers within {CONNECT_TIMEOUT:g} s "
                f"({type(exc).__name__}: {exc})",
                self.where,
            ) from None
        try:
            self._client.wait_for_workers(1, timeout=WORKER_TIMEOUT)
        except TimeoutError:
            raise InvalidInput(
                "dask",
                f"a Dask scheduler that has a worker within {WORKER_TIMEOUT:g} s (start one with "
                f"'dask worker {self.where}' where GBroker is installed)",
                self.where,
            ) from None

    def _spawn_ignoring_ctrl_c(self, n: int) -> None:
        """Start the embedded cluster's ``n`` worker processes with SIGINT ignored, which they
        keep for good (an ignored signal stays ignored through exec, and Python leaves it so):
        a terminal's Ctrl-C, sent to every process of the foreground group, then reaches only
        this one, which closes the cluster in order, instead of each worker printing its
        traceback and dying at random. Only while they are forked is Ctrl-C ignored here (a
        Ctrl-C then, a fraction of a second, is lost)."""
        import psutil

        def workers() -> set[int]:  # multiprocessing's spawned children, once they exec
            found = set()
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if any("spawn_main" in part for part in child.cmdline()):
                        found.add(child.pid)
            return found

        before = workers()
        with _sigint_ignored():
            self._cluster.scale(n)  # the workers are forked from the cluster's thread
            deadline = time.monotonic() + WORKER_TIMEOUT
            while len(workers() - before) < n and time.monotonic() < deadline:
                time.sleep(0.01)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the client and the embedded cluster (if any); safe to call twice. A Ctrl-C
        meanwhile (a person pressing again) does not cut it short but comes after it: closing
        takes a second or two, at most ``CLOSE_TIMEOUT`` each."""
        client, cluster = self._client, self._cluster
        self._client = self._cluster = None
        if client is None and cluster is None:
            return
        import logging

        # Closing, the scheduler and the client complain of the workers and tasks they lose.
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        with _sigint_deferred():
            try:
                if client is not None:
                    client.close(timeout=CLOSE_TIMEOUT)
            finally:
                if cluster is not None:
                    cluster.close(timeout=CLOSE_TIMEOUT)

    def map(self, runs: Sequence[Run[T]], progress: Callable[[int], None] | None = None) -> list[T]:
        """Every run's value, in the order of ``runs``. ``progress`` gets the units done so far
        (the sum of the ``size`` of the runs done, plus the ticks of the one running here)."""
        values: list[Any] = [None] * len(runs)
        for done in self.as_completed(runs, progress):
            values[done.index] = done.value
        return values

    def as_completed(
        self, runs: Sequence[Run[T]], progress: Callable[[int], None] | None = None
    ) -> Iterator[Finished[T]]:
        """Each run as it finishes (serially: in order). Raises :class:`RunFailed` for the
        first run that raises; the others are then cancelled."""
        if self.serial:
            return self._here(runs, progress)
        if self._client is None:
            raise InternalError(f"a Dask sweep ({self.where}) runs inside 'with Sweep(...)'")
        return self._on_cluster(runs, progress)

    def _here(
        self, runs: Sequence[Run[T]], progress: Callable[[int], None] | None
    ) -> Iterator[Finished[T]]:
        before = 0
        for index, run in enumerate(runs):
            began = time.perf_counter()
            try:
                if run.ticks and progress is not None:
                    tick = functools.partial(_offset, progress, before)
                    value = run.function(*run.args, progress=tick)
                else:
                    value = run.function(*run.args)
            except Exception as exc:
                raise RunFailed(run.name, exc) from exc
            before += run.size
            if progress is not None:
                progress(before)
            yield Finished(index, value, time.perf_counter() - began)

    def _on_cluster(
        self, runs: Sequence[Run[T]], progress: Callable[[int], None] | None
    ) -> Iterator[Finished[T]]:
        from distributed import as_completed

        client = self._client
        expected = None if self.where.startswith(LOCAL) else code_digest()
        shared: dict[int, Any] = {}
        futures: list[Any] = []
        pending: set[str] = set()
        try:
            with _sigint_deferred():  # every run is sent, or a Ctrl-C cancels those sent
                shared = self._scatter(runs)
                batch = uuid.uuid4().hex[:12]
                for index, run in enumerate(runs):
                    futures.append(
                        client.submit(
                            _on_worker,
                            expected,
                            run.function,
                            *(shared.get(id(arg), arg) for arg in run.args),
                            key=f"gbroker-run-{batch}-{index}",
                            pure=False,
                            priority=-index,  # the first runs first, as in the serial order
                        )
                    )
                    pending.add(futures[-1].key)
            index_of = {future.key: index for index, future in enumerate(futures)}
            done = 0
            for future in as_completed(futures, loop=client.loop):  # type: ignore[no-untyped-call]
                index = index_of[future.key]
                try:
                    value, seconds = future.result()
                except Exception as exc:
                    raise RunFailed(runs[index].name, exc) from exc
                pending.discard(future.key)
                future.release()
                done += runs[index].size
                if progress is not None:
                    progress(done)
                yield Finished(index, value, seconds)
        finally:
            if pending:  # a run failed, the caller stopped early, or Ctrl-C
                client.cancel([f for f in futures if f.key in pending], force=True)
            for future in shared.values():
                future.release()

    def _scatter(self, runs: Sequence[Run[Any]]) -> dict[int, Any]:
        """Futures of the argument objects that more than one run shares, sent once."""
        seen: dict[int, int] = {}
        objects: dict[int, Any] = {}
        for run in runs:
            for arg in run.args:
                if not _scalar(arg):
                    seen[id(arg)] = seen.get(id(arg), 0) + 1
                    objects[id(arg)] = arg
        shared = [key for key, count in seen.items() if count > 1]
        if not shared:
            return {}
        # In a list, each object goes whole (scatter would send a list's items one by one).
        futures = self._client.scatter([objects[key] for key in shared], hash=False)
        return dict(zip(shared, futures, strict=True))


def _offset(progress: Callable[[int], None], before: int, done: int) -> None:
    progress(before + done)
