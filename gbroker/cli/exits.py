"""One exit-status convention for every ``gbroker`` command (shown in ``gbroker --help``)."""

from __future__ import annotations

OK = 0
"""Done: the command did what was asked; a job waited for ended ``done``."""
FAILED = 1
"""A job ended ``failed`` or ``cancelled``; a check found a problem (``fleet status``: a member
is down; ``chaos``: an anomaly; ``jsdl check``: an invalid file)."""
USAGE = 2
"""The caller's mistake: bad arguments, a file that cannot be read, an invalid job, an unknown
job id (argparse uses 2 too)."""
TIMEOUT = 3
"""``--timeout`` ran out before the job ended (it goes on)."""
UNREACHABLE = 4
"""No broker answered (or the job's owner is down)."""

EPILOG = """\
exit status: 0 done; 1 a job failed or was cancelled (or a check found a problem); 2 usage or
input error (bad arguments, unreadable file, invalid job, unknown job); 3 timed out waiting;
4 no broker answered.

Client commands find the fleet by themselves: $GBROKER_FLEET, else the nearest .gbroker-fleet
walking up from here, else the fleet you brought up last; --broker URL (or $GBROKER_URL) names a
broker instead."""


def os_error(exc: OSError) -> str:
    """An OSError for a person: the file it concerns first, when it names one."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason
