"""One exit-status convention for every ``gbroker`` command (shown in ``gbroker --help``).

A reader that goes away early (``gbroker jobs | head -1``) is normal, not an error: the command
ends silently, the way a C tool does when SIGPIPE kills it (:func:`reader_gone`; the shell sees
141). :func:`gbroker.cli.main` does that once for every command."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import NoReturn

OK = 0
"""Done: the command did what was asked; a job waited for ended ``done``."""
FAILED = 1
"""A job ended ``failed`` or ``cancelled``; a check found a problem (``fleet status``: a member
is down; ``chaos``: an anomaly; ``jsdl check``: an invalid file; ``cancel``: a job had already
ended, so it was not cancelled)."""
USAGE = 2
"""The caller's mistake: bad arguments, a file that cannot be read, an invalid job, an unknown
job id (argparse uses 2 too)."""
TIMEOUT = 3
"""``--timeout`` ran out before the job ended (it goes on)."""
UNREACHABLE = 4
"""No broker answered (or the job's owner is down)."""
INTERRUPTED = 130
"""Interrupted (Ctrl-C, SIGINT) while waiting: the jobs go on (128 + SIGINT, as shells report
it)."""
READER_GONE = 141
"""The reader of the output went away (``| head``): 128 + SIGPIPE, what the shell reports for a
process SIGPIPE ended (:func:`reader_gone`)."""

EPILOG = """\
exit status: 0 done; 1 a job failed or was cancelled (or a check found a problem: `cancel` of a
job that had already ended); 2 usage or input error (bad arguments, unreadable file, invalid job,
unknown job); 3 timed out waiting; 4 no broker answered; 130 interrupted (Ctrl-C): the jobs go
on. A reader that goes away early (`gbroker jobs | head -1`) ends the command silently, as
SIGPIPE ends a C tool (the shell sees 141).

Client commands find the fleet by themselves: $GBROKER_FLEET, else the nearest .gbroker-fleet
walking up from here, else the most recent fleet you brought up that still runs; --broker URL
(or $GBROKER_URL) names a broker instead."""


def os_error(exc: OSError) -> str:
    """An OSError for a person: the file it concerns first, when it names one."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def reader_gone() -> NoReturn:
    """End the process as SIGPIPE ends a C tool whose reader went away: silently, with the
    status a shell shows as 141.

    Python ignores SIGPIPE (a write to a closed pipe raises :class:`BrokenPipeError` instead),
    and GBroker keeps it so while it runs (``fleet up`` and ``serve`` write to sockets). Here
    the output is pointed at ``/dev/null`` first (the interpreter's last flush of what is still
    buffered cannot fail again), then SIGPIPE gets its default action back and is raised on
    ourselves."""
    import os
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    raise SystemExit(READER_GONE)  # SIGPIPE blocked by whoever started us: the same status
