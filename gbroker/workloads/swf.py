"""Reader for the Standard Workload Format of the Parallel Workloads Archive.

An SWF file is a header of ``;``-comment lines (``; MaxProcs: 100``) and one line per job with 18
whitespace-separated numeric fields, ``-1`` meaning unknown. The fields used here (1-based) are
1 job number, 2 submit time, 4 run time, 5 allocated processors, 8 requested processors,
9 requested time and 11 status (1 completed, 0 failed, 5 cancelled, 2-4 partial executions).
Plain and gzip files are both read (recognised by content, not by name).

Jobs that cannot be replayed are skipped, never silently: each skip is recorded in
:attr:`SwfTrace.skipped` with its line, job number and reason. A line that is not an SWF job line at
all (wrong field count, a non-number) is an error naming the file, line and field, because a
corrupt trace should not be replayed as if it were whole.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gbroker.errors import InvalidInput, TraceFormatError
from gbroker.workloads.trace import TraceJob

__all__ = ["ProcessorField", "SkippedJob", "SwfHeader", "SwfTrace", "read_swf"]

SWF_FIELDS = 18
_FIELD_NAMES = {
    1: "job number",
    2: "submit time",
    4: "run time",
    5: "allocated processors",
    8: "requested processors",
    9: "requested time",
    11: "status",
}
_HEADER_INTS = ("MaxJobs", "MaxRecords", "MaxNodes", "MaxProcs", "UnixStartTime")


class ProcessorField(StrEnum):
    """Which SWF field gives a job's processor count."""

    REQUESTED = "requested"  # field 8, falling back to 5 when unknown: what a scheduler knows
    ALLOCATED = "allocated"  # field 5, falling back to 8 when unknown: what the job really used


@dataclass(frozen=True, slots=True)
class SwfHeader:
    max_jobs: int | None = None
    max_records: int | None = None
    max_nodes: int | None = None
    max_procs: int | None = None
    unix_start_time: int | None = None
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def machine_cores(self) -> int | None:
        """Processors of the machine: MaxProcs, else MaxNodes."""
        return self.max_procs or self.max_nodes


@dataclass(frozen=True, slots=True)
class SkippedJob:
    line: int
    job: int
    reason: str


@dataclass(slots=True)
class SwfTrace:
    source: str
    header: SwfHeader
    jobs: list[TraceJob]
    skipped: list[SkippedJob]
    cores: int
    records: int

    def skip_summary(self) -> dict[str, int]:
        """How many jobs were skipped for each reason."""
        return dict(Counter(s.reason for s in self.skipped))


def _number(token: str, source: str, lineno: int, index: int) -> int:
    try:
        return int(token)
    except ValueError:
        pass
    try:
        value = float(token)
    except ValueError:
        raise TraceFormatError(
            source,
            lineno,
            f"field {index + 1} ({_FIELD_NAMES.get(index + 1, 'field')})",
            "a number",
            token,
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceFormatError(source, lineno, f"field {index + 1}", "a finite number", token)
    return round(value)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InvalidInput(str(path), "a readable gzip file", str(exc)) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _parse_header(lines: list[str]) -> SwfHeader:
    fields: dict[str, str] = {}
    for line in lines:
        body = line.lstrip(";").strip()
        key, sep, value = body.partition(":")
        if sep and key and " " not in key.strip():
            fields.setdefault(key.strip(), value.strip())
    ints: dict[str, int | None] = {}
    for key in _HEADER_INTS:
        raw = fields.get(key, "").split()
        try:
            ints[key] = int(raw[0]) if raw else None
        except ValueError:
            ints[key] = None
    return SwfHeader(
        max_jobs=ints["MaxJobs"],
        max_records=ints["MaxRecords"],
        max_nodes=ints["MaxNodes"],
        max_procs=ints["MaxProcs"],
        unix_start_time=ints["UnixStartTime"],
        fields=fields,
    )


def read_swf(
    path: str | Path,
    *,
    cores: int | None = None,
    processors: ProcessorField | str = ProcessorField.REQUESTED,
    statuses: frozenset[int] | None = None,
    limit: int | None = None,
) -> SwfTrace:
    """Read an SWF trace (plain or gzip).

    Args:
        path: the trace file.
        cores: the machine's processors; default the header's MaxProcs (else MaxNodes).
        processors: which field gives a job's processors (the other is the fallback). The
            default, requested, is what the scheduler saw at submission.
        statuses: keep only jobs with these status codes (default: every status).
        limit: stop after this many replayable jobs.

    Jobs skipped, each recorded with its reason: unknown submit time; unknown run time; no
    processor count (both fields unknown or zero); more processors than the machine has; a status
    not in ``statuses``.
    """
    path = Path(path)
    source = str(path)
    choice = ProcessorField(processors)
    prefer_requested = choice is ProcessorField.REQUESTED
    text = _read_text(path)
    header_lines: list[str] = []
    jobs: list[TraceJob] = []
    skipped: list[SkippedJob] = []
    records = 0
    machine: int | None = cores
    lines = text.splitlines()
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line[0] == ";":
            if records == 0:
                header_lines.append(line)
            continue
        if machine is None:
            machine = _parse_header(header_lines).machine_cores
            if machine is None:
                raise InvalidInput(
                    f"{source}: header MaxProcs/MaxNodes",
                    "the machine size (or give it: gbroker replay --cores N)",
                )
        tokens = line.split()
        if len(tokens) != SWF_FIELDS:
            raise TraceFormatError(source, lineno, "job line", f"{SWF_FIELDS} fields", len(tokens))
        records += 1
        try:  # fast path: SWF fields are integers
            number, submit, run_time = int(tokens[0]), int(tokens[1]), int(tokens[3])
            allocated, requested_procs = int(tokens[4]), int(tokens[7])
            requested, status = int(tokens[8]), int(tokens[10])
        except ValueError:  # floats, or garbage that _number reports precisely
            number, submit, run_time, allocated, requested_procs, requested, status = (
                _number(tokens[k], source, lineno, k) for k in (0, 1, 3, 4, 7, 8, 10)
            )
        procs = requested_procs if prefer_requested else allocated
        if procs <= 0:
            procs = allocated if prefer_requested else requested_procs
        reason = None
        if submit < 0:
            reason = "unknown submit time"
        elif run_time < 0:
            reason = "unknown run time"
        elif procs <= 0:
            reason = "no processor count"
        elif procs > machine:
            reason = f"more processors than the machine's {machine}"
        elif statuses is not None and status not in statuses:
            reason = f"status {status} not selected"
        if reason is not None:
            skipped.append(SkippedJob(lineno, number, reason))
            continue
        jobs.append(
            TraceJob(submit, procs, run_time, requested if requested >= 0 else None, number)
        )
        if limit is not None and len(jobs) >= limit:
            break
    header = _parse_header(header_lines)
    if machine is None:
        machine = header.machine_cores or 1
    return SwfTrace(source, header, jobs, skipped, machine, records)
