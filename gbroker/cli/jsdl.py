"""``gbroker jsdl``: check a job description without submitting it, convert it, summarize it."""

from __future__ import annotations

import argparse
from typing import Any

from gbroker.cli.show import count


def _staging_notes(desc: Any) -> list[str]:
    """What a broker would refuse of a description's staging URLs (checked offline: private
    hosts allowed, no DNS), one line each."""
    from gbroker.daemon.urls import check_source, check_target
    from gbroker.errors import InvalidInput

    notes = []
    for i, entry in enumerate(desc.staging):
        try:
            if entry.source is not None and entry.inline_data is None:
                check_source(
                    entry.source, allow_private=True, peers={}, field=f"staging[{i}].source"
                )
            if entry.target is not None:
                check_target(entry.target, allow_private=True, field=f"staging[{i}].target")
        except InvalidInput as exc:
            notes.append(str(exc))
    return notes


def _cmd_jsdl(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gbroker.errors import GBrokerError
    from gbroker.jobs.description import JsdlError
    from gbroker.jobs.documents import summary
    from gbroker.jobs.mapping import to_mapping
    from gbroker.jobs.sweep import JobArray, load_submission

    reports: list[dict[str, Any]] = []
    failed = False
    for file in args.files:
        try:
            loaded = load_submission(file)
            desc = loaded.elements[0] if isinstance(loaded, JobArray) else loaded
            job = desc.to_job(Path(file).stem or "job", args.site)
        except OSError as exc:
            error, path = f"{file}: cannot read: {exc.strerror or exc}", None
        except JsdlError as exc:  # names the file already
            error, path = str(exc), exc.path
        except GBrokerError as exc:
            error, path = f"{file}: {exc}", None
        else:
            request = {
                "rank": job.rank,
                "max_rank": job.max_rank,
                "job_class": str(job.job_class),
                "requested_time": job.requested_time,
                "input_files": [
                    {"name": f.name, "size": f.size, "site": f.site} for f in job.input_files
                ],
            }
            notes = _staging_notes(desc)
            report = {"file": file, "ok": True, "job": to_mapping(desc), "request": request}
            if notes:
                report["refused_by_brokers"] = notes
            if isinstance(loaded, JobArray):
                report["array"] = {"size": loaded.size, "varying": loaded.varying()}
            reports.append(report)
            if not args.json:
                if isinstance(loaded, JobArray):
                    print(f"{file}: ok, a sweep of {count(loaded.size, 'job')}; the first:")
                else:
                    print(f"{file}: ok")
                for line in summary(desc):
                    print(f"  {line}")
                if isinstance(loaded, JobArray):
                    for key, values in loaded.varying().items():
                        shown = ", ".join(str(v) for v in values)
                        print(f"  varies      {key}: {shown}, ...")
                for note in notes:
                    print(f"  refused     by brokers: {note}")
            continue
        failed = True
        reports.append({"file": file, "ok": False, "error": error, "path": path})
        if not args.json:
            print(error)
    if args.json:
        import json

        print(json.dumps(reports, indent=2))
    return 1 if failed else 0


def add_parsers(sub: Any) -> None:
    jp = sub.add_parser(
        "jsdl",
        help="check job descriptions (JSDL 1.0, or the JSON/YAML equivalent)",
        description="Work with job descriptions: JSDL 1.0 documents with the POSIX, HPC Profile "
        "Application, SPMD and GBroker extensions, or the equivalent JSON/YAML.",
    )
    actions = jp.add_subparsers(dest="action", required=True, metavar="ACTION")
    cp = actions.add_parser(
        "check",
        help="parse job descriptions and print the jobs or precise errors",
        description="Parse each file (JSDL .jsdl/.xml, .json, .yaml/.yml; others sniffed) and "
        "print its job: executable, arguments, cores, time limit, staging; or a one-line "
        "error naming the element and what was expected. Exit status 1 if any file is invalid.",
    )
    cp.add_argument("files", nargs="+", metavar="FILE", help="job description files")
    cp.add_argument(
        "--json", action="store_true", help="print a JSON list with one object per file"
    )
    cp.add_argument(
        "--site",
        default="local",
        help="site of input files whose location is not given (default: local)",
    )
    cp.set_defaults(run=_cmd_jsdl)
