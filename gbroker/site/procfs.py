"""What ``/proc`` says of a process: the ``local`` back-end's eyes on jobs it did not fork.

Theory of operation. A job's leader is its launcher's child, so the launcher hears its exit; but
a broker that restarts, or a job whose launcher is gone, can only look. A process is named for
good by its pid *and* its start time (:attr:`ProcStat.starttime`, clock ticks after boot): a pid
alone may have been reused. A zombie has ended (:func:`alive`). A job's processes are its
process group (:func:`group_members`, a scan of every ``/proc/<pid>/stat``); a restored job's
leader is the first child of its PID namespace's init (:func:`child_of`).

Everything here reads and never writes; a process that is gone (or never was) reads as None,
zero or empty, never as an error: it may end between any two looks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, TypeGuard

__all__ = ["ProcStat", "alive", "child_of", "cmdline", "cpu_seconds", "group_members", "proc_stat"]


class ProcStat(NamedTuple):
    state: str
    ppid: int  # for a job's leader: its launcher, while that lives
    pgrp: int
    starttime: int  # clock ticks after boot: with the pid, names one process for good


def proc_stat(pid: int) -> ProcStat | None:
    """What ``/proc/<pid>/stat`` says, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:  # gone (or never was)
        return None
    # After the command name in parentheses (which may itself hold ") "): state, ppid, pgrp, ...
    fields = stat.rsplit(b")", 1)[1].split()
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def cpu_seconds(pid: int) -> float:
    """The CPU time of process ``pid`` and of the children it reaped (``/proc/<pid>/stat``:
    utime, stime, cutime, cstime), seconds; 0 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return 0.0
    ticks = stat.rsplit(b")", 1)[1].split()[11:15]
    return sum(int(tick) for tick in ticks) / os.sysconf("SC_CLK_TCK")


def alive(stat: ProcStat | None) -> TypeGuard[ProcStat]:
    """A process was there and has not ended (a zombie has)."""
    return stat is not None and stat.state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group, found by reading every ``/proc/<pid>/stat``."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if alive(stat) and stat.pgrp == pgid:
                members.append(int(entry.name))
    return members


def child_of(pid: int) -> int:
    """The first child of process ``pid`` (a restored job's, of its init), else ``pid``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return pid
    return int(children[0]) if children else pid


def cmdline(pid: int) -> tuple[str, ...]:
    """A process's argv (empty if it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)
