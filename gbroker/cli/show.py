"""What the client commands print for people: tables with local times and durations.

Programs pass ``--json`` and get the broker's answers as they are (Unix times in seconds). People
get tables drawn by texttable: times in the local time zone (the time of day for today, else the
date too), and how long a job waited and ran. Progress and notes go to stderr, results to stdout.

Why texttable and not rich: these commands are meant to start in well under 50 ms as processes
(``scripts/bench/bench_cli.py``), and importing rich's console and table alone would take most of
that; texttable costs little beyond the ``re`` module, which argparse loads anyway (the import
costs: docs/BENCHMARKS.md, "Benchmarking the CLI").
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

__all__ = [
    "count",
    "duration",
    "exit_text",
    "history_table",
    "job_card",
    "jobs_table",
    "local_time",
    "print_table",
]

TERMINAL = ("done", "failed", "cancelled")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 core``, ``2 cores``, ``1,000 jobs``: a number and its noun, singular for one."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def local_time(at: float | None, now: float | None = None) -> str:
    """``at`` (Unix seconds) in local time: ``14:03:07`` today, else ``Nov 24 14:03``."""
    if at is None:
        return "-"
    now = time.time() if now is None else now
    moment = time.localtime(at)
    if time.localtime(now)[:3] == moment[:3]:
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%b %d %H:%M", moment)


def duration(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``3m04s``, ``2h05m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def waited(job: Mapping[str, Any], now: float) -> float | None:
    """Submission to start (to now while it waits; None if it ended without starting)."""
    if job.get("submitted_at") is None:
        return None
    if job.get("started_at") is not None:
        return float(job["started_at"]) - float(job["submitted_at"])
    if job.get("state") in TERMINAL:
        return None
    return now - float(job["submitted_at"])


def ran(job: Mapping[str, Any], now: float) -> float | None:
    """Start to end (to now while it runs; None for a job that has ended, its end not known
    yet: a cancelled one whose site has not reported its processes gone)."""
    if job.get("started_at") is None:
        return None
    end = job.get("ended_at")
    if end is None and job.get("state") in TERMINAL:
        return None
    return (now if end is None else float(end)) - float(job["started_at"])


def exit_text(code: int | None) -> str:
    """An exit code; a negative one is the signal that ended the job: ``-15 (SIGTERM)``."""
    if code is None:
        return "-"
    if code >= 0:
        return str(code)
    import signal

    try:
        return f"{code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"{code} (signal {-code})"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table on stdout: a header, a rule, aligned columns, nothing cut."""
    from texttable import Texttable

    table = Texttable(max_width=0)
    table.set_deco(Texttable.HEADER)
    table.set_chars(["-", " ", " ", "-"])
    table.set_cols_dtype(["t"] * len(headers))  # text as given: no number formatting
    table.set_cols_align(["l"] * len(headers))
    table.set_header_align(["l"] * len(headers))
    table.header(list(headers))
    table.add_rows([list(row) for row in rows], header=False)
    print(table.draw())


def jobs_table(jobs: Sequence[Mapping[str, Any]], now: float | None = None) -> None:
    now = time.time() if now is None else now
    rows = (
        (
            str(job["id"]),
            str(job.get("name") or "-"),
            str(job["state"]),
            str(job.get("site") or "-"),
            local_time(job.get("submitted_at"), now),
            duration(waited(job, now)),
            duration(ran(job, now)),
            exit_text(job.get("exit_code")),
        )
        for job in jobs
    )
    headers = ("JOB", "NAME", "STATE", "SITE", "SUBMITTED", "WAITED", "RAN", "EXIT")
    print_table(headers, rows)


def job_card(job: Mapping[str, Any], now: float | None = None) -> None:
    """One job, a field a line."""
    now = time.time() if now is None else now
    rows = [
        ("job", str(job["id"])),
        ("name", str(job.get("name") or "-")),
        ("state", str(job["state"])),
        ("site", str(job.get("site") or "-")),
        ("cores", "-" if job.get("cores") is None else str(job["cores"])),
        ("submitted", local_time(job.get("submitted_at"), now)),
        ("started", local_time(job.get("started_at"), now)),
        ("ended", local_time(job.get("ended_at"), now)),
        ("waited", duration(waited(job, now))),
        ("ran", duration(ran(job, now))),
        ("exit code", exit_text(job.get("exit_code"))),
    ]
    limits, used = job.get("limits"), job.get("used")
    if limits:  # and what it used of them so far (a moved job: at every site it ran at)
        rows.append(("limits", limits_text(limits)))
    if used and (limits or used.get("moves")):
        rows.append(("used", used_text(used)))
    if job.get("error"):
        rows.append(("error", str(job["error"])))
    if job.get("array"):  # a job array: its size and how many of its jobs are in each state
        counts = ", ".join(f"{n} {state}" for state, n in sorted(job.get("counts", {}).items()))
        rows[0:1] = [("array", str(job["id"])), ("jobs", f"{job.get('size')}: {counts}")]
        dropped = ("site", "cores", "started", "ended", "ran", "waited")
        rows = [row for row in rows if row[0] not in dropped]
        if job.get("components"):  # a co-allocated job: its components, where, on what
            rows[0] = ("co-allocated", str(job["id"]))
            rows[1:1] = [
                (
                    f"component {i}",
                    f"{c['site']}, {c['cores']} cores"
                    + (f", {c['units']} units" if c.get("units") is not None else ""),
                )
                for i, c in enumerate(job["components"])
            ]
    if job.get("submitter"):
        rows.append(("submitter", str(job["submitter"])))
    from texttable import Texttable

    table = Texttable(max_width=0)
    table.set_deco(0)
    table.set_cols_dtype(["t", "t"])
    table.set_cols_align(["l", "l"])
    table.add_rows(rows, header=False)
    print(table.draw())


def limits_text(limits: Mapping[str, Any]) -> str:
    """``wall time 20s, CPU time 8s``: a job's limits (those it set)."""
    named = (("wall_time", "wall time"), ("cpu_time", "CPU time"))
    return ", ".join(f"{name} {duration(limits[key])}" for key, name in named if limits.get(key))


def used_text(used: Mapping[str, Any]) -> str:
    """``12s of wall time, over 2 moves (4.1s of CPU time before its latest)``: what a job
    used so far, in all."""
    text = f"{duration(used.get('wall_time'))} of wall time"
    moves = int(used.get("moves") or 0)
    if moves:
        cpu = (used.get("before_moves") or {}).get("cpu_time")
        text += f", over {count(moves, 'move')} ({duration(cpu)} of CPU time before its latest)"
    return text


def history_table(transitions: Sequence[Mapping[str, Any]], now: float | None = None) -> None:
    now = time.time() if now is None else now
    first = float(transitions[0]["at"]) if transitions else 0.0
    rows = (
        (
            local_time(t["at"], now),
            "+" + duration(float(t["at"]) - first),
            str(t["state"]),
            str(t.get("site") or "-"),
        )
        for t in transitions
    )
    print_table(("AT", "SINCE SUBMITTED", "STATE", "SITE"), rows)


def note(text: str) -> None:
    """A remark for a person (stderr), never mixed into what a program reads on stdout."""
    print(text, file=sys.stderr)
