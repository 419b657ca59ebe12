"""``gbroker jsdl``: check a job description without submitting it (as a broker would judge it,
and against the OGF schemas), and list the fields of the JSON/YAML form."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gbroker.cli.show import count

# What a fleet directory calls its topology (gbroker.fleet.files writes it).
_FLEET_TOPOLOGY = "topology.yaml"


def _fleet(topology: str | None) -> tuple[dict[str, Any] | None, dict[str, str], str]:
    """The sites to match requirements against, their brokers' URLs, and where they come from:
    ``--topology``, else the fleet ``gbroker submit`` would use (its topology), else none."""
    from gbroker.topology import load_topology

    source = topology
    if source is None:
        from gbroker.client import fleetdir

        try:
            directory = fleetdir.find()
        except fleetdir.NoFleet:
            return None, {}, ""
        found = Path(directory) / _FLEET_TOPOLOGY
        if not found.is_file():
            return None, {}, ""
        source = str(found)
    from gbroker.errors import InvalidInput

    try:
        loaded = load_topology(source)
    except OSError as exc:
        raise InvalidInput(source, "a readable topology file", exc.strerror or str(exc)) from exc
    peers = {name: spec.http for name, spec in loaded.sites.items() if spec.http}
    return dict(loaded.properties()), peers, source


def _schema_check(file: str, raw: bytes) -> list[Any] | None:
    """The schema violations of a JSDL file (None: not XML, or not well-formed)."""
    from gbroker.errors import GBrokerError
    from gbroker.jobs.documents import document_format
    from gbroker.jobs.jsdl_schema import schema_violations
    from gbroker.jobs.parsing import parse_xml

    if document_format(raw) != "jsdl":
        return None
    try:
        root = parse_xml(raw, file)
    except GBrokerError:
        return None
    return schema_violations(root)


def _cmd_check(args: argparse.Namespace) -> int:
    from gbroker.errors import GBrokerError, InvalidInput
    from gbroker.jobs.admission import refusals
    from gbroker.jobs.description import MAX_DOCUMENT_BYTES, JsdlError
    from gbroker.jobs.documents import document_format, summary
    from gbroker.jobs.mapping import to_mapping
    from gbroker.jobs.sweep import JobArray, load_submission

    try:
        sites, peers, fleet = _fleet(args.topology)
    except InvalidInput as exc:  # the topology to match against: named by the message
        print(f"gbroker jsdl check: {exc}", file=sys.stderr)
        return 2
    reports: list[dict[str, Any]] = []
    failed = False
    for file in args.files:
        try:
            loaded = load_submission(file)
            with open(file, "rb") as handle:  # what was read: within the size limit
                raw = handle.read(MAX_DOCUMENT_BYTES + 1)
            desc = loaded.elements[0] if isinstance(loaded, JobArray) else loaded
            job = desc.to_job(Path(file).stem or "job", args.site)
        except OSError as exc:
            error, path = f"{file}: cannot read: {exc.strerror or exc}", None
        except JsdlError as exc:  # names the file already
            error, path = str(exc), exc.path
        except GBrokerError as exc:
            error, path = f"{file}: {exc}", None
        else:
            xml = document_format(raw) == "jsdl"
            refused = refusals(
                desc, xml=xml, allow_private=True, peers=peers, sites=sites, site=args.site
            )
            violations = _schema_check(file, raw)
            invalid = bool(args.schema and violations)
            failed = failed or bool(refused) or invalid
            report = _report(file, desc, job, refused, violations, to_mapping(desc))
            report["sites_from"] = fleet or None
            report["ok"] = not refused and not invalid
            if isinstance(loaded, JobArray):
                report["array"] = {"size": loaded.size, "varying": loaded.varying()}
            reports.append(report)
            if args.json:
                continue
            verdicts = []
            if refused:
                verdicts.append("a broker would refuse it")
            if invalid:
                verdicts.append("not valid by the JSDL schemas")
            verdict = "; ".join(verdicts) or "ok"
            if isinstance(loaded, JobArray):
                print(f"{file}: {verdict}, a sweep of {count(loaded.size, 'job')}; the first:")
            else:
                print(f"{file}: {verdict}")
            for line in summary(desc):
                print(f"  {line}")
            if isinstance(loaded, JobArray):
                for key, values in loaded.varying().items():
                    shown = ", ".join(str(v) for v in values)
                    print(f"  varies      {key}: {shown}, ...")
            for refusal in refused:
                print(f"  refused     {refusal}")
            if sites is None and (job.requirements is not None or job.rank > 1):
                print("  fleet       not matched to sites: no fleet found (--topology FILE)")
            for violation in violations or ():
                if args.schema:
                    print(f"  schema      {violation}")
                else:
                    print(f"  warning     the JSDL schema disagrees: {violation}")
            continue
        failed = True
        violations = None
        if args.schema and path is not None:  # read, but not a job: still judged by the schemas
            with open(file, "rb") as handle:
                violations = _schema_check(file, handle.read(MAX_DOCUMENT_BYTES + 1))
        reports.append(
            {
                "file": file,
                "ok": False,
                "error": error,
                "path": path,
                "schema": None if violations is None else [_violation(v) for v in violations],
            }
        )
        if not args.json:
            print(error)
            for violation in violations or ():
                print(f"  schema      {violation}")
    if args.json:
        import json

        print(json.dumps(reports, indent=2))
    return 1 if failed else 0


def _violation(violation: Any) -> dict[str, str]:
    return {"path": violation.path, "reason": violation.reason}


def _report(
    file: str,
    desc: Any,
    job: Any,
    refused: list[Any],
    violations: list[Any] | None,
    mapping: dict[str, Any],
) -> dict[str, Any]:
    request = {
        "rank": job.rank,
        "max_rank": job.max_rank,
        "job_class": str(job.job_class),
        "requested_time": job.requested_time,
        "input_files": [{"name": f.name, "size": f.size, "site": f.site} for f in job.input_files],
    }
    report: dict[str, Any] = {"file": file, "ok": True, "job": mapping, "request": request}
    if desc.working_directory is not None:
        report["run_directory"] = desc.run_directory
    report["refused_by_brokers"] = [str(r) for r in refused]
    report["schema"] = None if violations is None else [_violation(v) for v in violations]
    return report


def _cmd_fields(args: argparse.Namespace) -> int:
    from gbroker.jobs.mapping import FIELDS, NESTED_FIELDS

    if args.json:
        import json

        listed = {
            key: {"jsdl": element, "means": means} for key, (element, means) in FIELDS.items()
        }
        print(json.dumps({"fields": listed, "nested": NESTED_FIELDS}, indent=2))
        return 0
    width = max(len(key) for key in FIELDS)
    print("The fields of a JSON/YAML job (docs/JSDL.md), and the JSDL element of each:")
    for key, (element, means) in FIELDS.items():
        print(f"  {key:<{width}}  {means}  [{element}]")
    print("Inside them:")
    for where, keys in NESTED_FIELDS.items():
        print(f"  {where}: {', '.join(keys)}")
    return 0


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
        help="parse job descriptions and say whether a broker would take them",
        description="Parse each file (JSDL .jsdl/.xml, .json, .yaml/.yml; others sniffed) and "
        "print its job: executable, arguments, cores, time limit, working directory, staging; "
        "or a one-line error naming the element and what was expected. Then run the checks a "
        "broker runs at submission (staging URLs it would never fetch or deliver to; "
        "requirements no site of the fleet meets, against --topology or the fleet gbroker "
        "submit would use) and print each reason it would refuse the job. A JSDL document is "
        "also validated against the OGF schemas (shipped with GBroker): a warning per place "
        "where they disagree with what GBroker accepts, or errors with --schema. Exit status "
        "1 if any file is invalid or would be refused.",
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
    cp.add_argument(
        "--schema",
        action="store_true",
        help="validate JSDL documents against the OGF schemas (jsdl.xsd, jsdl-posix.xsd, "
        "jsdl-spmd.xsd): print each violation with its element path; exit 1 if any",
    )
    cp.add_argument(
        "--topology",
        metavar="FILE",
        help="match requirements against this topology's sites (default: the fleet's, if "
        "one is found as gbroker submit finds it)",
    )
    cp.set_defaults(run=_cmd_check)
    fp = actions.add_parser(
        "fields",
        help="list the fields of a JSON/YAML job description",
        description="List the fields of a JSON/YAML job description, what each says and the "
        "JSDL element it stands for, and the keys of the mappings inside them.",
    )
    fp.add_argument("--json", action="store_true", help="print them as JSON")
    fp.set_defaults(run=_cmd_fields)
