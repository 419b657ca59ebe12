"""Stop what a script started, however it ends: its normal end, an exception, Ctrl-C (SIGINT),
SIGTERM (a timeout, a supervisor) or SIGHUP (its terminal gone).

The benchmarks start things that outlive them unless stopped: fleets of brokers (each broker in
a session of its own, with its launchers), a single-node Slurm (munged, slurmctld and slurmd:
scripts/bench/bench_slurm.py), network namespaces (scripts/experiments/netmon_accuracy.py). Each
script runs its ``main`` through :func:`run` and starts each such thing with :func:`started` (or a
helper built on it: :func:`fleet`, :func:`bench_slurm.running`), a context manager that stops it on
the way out::

    from scripts import orderly  # the script runs as a module: python -m scripts.bench.X

    def main() -> int:
        with orderly.fleet(topology, directory) as record, bench_slurm.running(...) as slurm:
            ...
        return 0

    if __name__ == "__main__":
        orderly.run(main)

Theory of operation. :func:`run` turns SIGINT, SIGTERM and SIGHUP into :class:`Stopped`, raised
in the main thread wherever it is, so that the stack unwinds through every ``finally`` and
``with`` as an exception would; the script then exits 128 + the signal's number, with one line
on stderr. ``Stopped`` is a ``SystemExit``: no ``except Exception`` catches it, and asyncio lets
only ``SystemExit`` and ``KeyboardInterrupt`` out of its tasks and callbacks (any other exception
raised in a callback is logged and dropped: the signal would be lost, and the benchmark would
wait for a callback that never came, its Slurm running). A signal that lands while something
starts or stops (:func:`held`) waits until that is done: inside ``fleet.up`` it could leave
processes started but not yet recorded, inside a stop some still running. Only the first signal
raises; later ones, while the script unwinds, are ignored so that they cannot cut a cleanup short
(SIGKILL still kills). Blocking the signals with ``pthread_sigmask`` instead would be inherited by
the processes started meanwhile, which would then ignore the SIGTERM that stops them.

A signal sent to the script's whole process group (``timeout`` does that) also reaches its
children in that group (``sbatch``, a ``gbroker submit``, scripts/bench/bench_spawn.py), which end
with it; what lives longer runs in sessions of its own and is stopped here.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(SystemExit):
    """A signal asked the script to stop; its exit status is 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


class _State:
    installed = False
    held = 0  # nested held() blocks
    pending: int | None = None  # a signal that arrived while held
    stopping = False  # a Stopped was raised: the script unwinds


_STATE = _State()


def _handler(signum: int, frame: object) -> None:
    if _STATE.stopping:
        return
    if _STATE.held:
        _STATE.pending = _STATE.pending or signum
        return
    _STATE.stopping = True
    raise Stopped(signum)


def install() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Stopped` from now on (main thread only).

    A SIGHUP the script was started ignoring stays ignored: ``nohup`` means it should outlive
    its terminal. (SIGINT is taken even when ignored, as a shell ignores it for a background
    job: whoever sends it to the script by its pid means it.)"""
    if not _STATE.installed:
        for signum in SIGNALS:
            if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _handler)
        _STATE.installed = True


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block no signal interrupts: one that arrives meanwhile is raised when it ends (by the
    caller's :func:`deliver`)."""
    _STATE.held += 1
    try:
        yield
    finally:
        _STATE.held -= 1


def deliver() -> None:
    """Raise the signal that arrived while held, if any, once no block holds it back."""
    if _STATE.pending is not None and not _STATE.held and not _STATE.stopping:
        signum, _STATE.pending = _STATE.pending, None
        _STATE.stopping = True
        raise Stopped(signum)


@contextlib.contextmanager
def started(start: Callable[[], T], stop: Callable[[T], object]) -> Iterator[T]:
    """``start()``'s result for the block's duration; ``stop(it)`` however the block ends.

    Neither is interrupted by a signal; ``start`` must undo what it did if it fails (it raises:
    there is nothing to stop). Installs the signal handlers if :func:`run` did not.
    """
    install()
    with held():
        value = start()
    try:
        deliver()
        yield value
    finally:
        with held():
            stop(value)
        deliver()


def temporary_directory(
    prefix: str, under: Path | None = None
) -> contextlib.AbstractContextManager[Path]:
    """A new directory (``tempfile.mkdtemp``) for the block's duration, removed with what it
    holds however the block ends."""
    return started(
        lambda: Path(tempfile.mkdtemp(prefix=prefix, dir=under)),
        lambda path: shutil.rmtree(path, ignore_errors=True),
    )


def fleet(topology: Path, directory: Path, **up: Any) -> contextlib.AbstractContextManager[Any]:
    """A fleet (:func:`gbroker.fleet.up`, with ``up``'s options) for the block's duration; what
    ``fleet.json`` records. Always brought down."""
    from gbroker import fleet as fleets

    return started(lambda: fleets.up(topology, directory, **up), lambda _: fleets.down(directory))


def run_process(
    command: list[str], grace: float = 10.0, **options: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(command, capture_output=True, **options)``, but a script that stops
    meanwhile sends the child SIGTERM (a script of ours then stops what it started) and SIGKILL
    only past ``grace`` seconds; ``subprocess.run`` would SIGKILL it at once."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options
    ) as process:
        try:
            out, err = process.communicate()
        except BaseException:
            with held():
                process.terminate()
                try:
                    process.wait(grace)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a script's ``main`` with the signals handled; exit with its status, or 128 + the
    signal's number once everything it started has been stopped."""
    install()
    try:
        code = main()
    except Stopped as stopped:
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print(
                f"{Path(sys.argv[0]).name}: interrupted by {stopped.name}; "
                "everything it started was stopped",
                file=sys.stderr,
            )
        code = stopped.signum + 128
    sys.exit(code)


__all__ = [
    "SIGNALS",
    "Stopped",
    "deliver",
    "fleet",
    "held",
    "install",
    "run",
    "run_process",
    "started",
    "temporary_directory",
]
