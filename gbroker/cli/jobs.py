"""``gbroker submit``, ``status``, ``wait``, ``jobs``, ``output``, ``cancel`` and ``history``.

They start fast (a person types them, scripts call them per job): :func:`main` builds only these
commands' parsers, and they talk to brokers with :mod:`gbroker.client.quick` (``http.client``), not
aiohttp. rich is imported only to print a table. Exit statuses: :mod:`gbroker.cli.exits`.
"""

from __future__ import annotations

import os
import sys
import time

from gbroker.cli import CLIENT_COMMANDS as COMMANDS
from gbroker.cli import exits
from gbroker.client.quick import Connection, QuickError, connect

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

__all__ = ["COMMANDS", "add_parsers", "main"]


STATES = ("submitted", "staging", "queued", "running", "done", "failed", "cancelled")
JOB_SUFFIXES = (".jsdl", ".xml", ".json", ".yaml", ".yml")
"""What ``submit DIRECTORY`` takes from a directory."""
TERMINAL = ("done", "failed", "cancelled")


def _states(text: str) -> list[str]:
    import argparse

    states = [s.strip().lower() for s in text.split(",") if s.strip()]
    wrong = [s for s in states if s not in STATES]
    if wrong or not states:
        raise argparse.ArgumentTypeError(
            f"expected states among {', '.join(STATES)} (comma-separated), got {text!r}"
        )
    return states


class _Skipped:
    """A parser not built: :func:`main` builds only the command it runs."""

    def add_argument(self, *args: object, **kwargs: object) -> None:
        pass


def add_parsers(sub: Any, only: str | None = None) -> None:
    """Add the client commands to the ``gbroker`` subparsers ``sub`` (just ``only``, if named:
    a parser costs its arguments' checks at start)."""
    # Not at the top: `gbroker submit FILE...` builds no parser, and argparse costs ms.
    from gbroker.cli.argtypes import positive_float, positive_int

    def parser(name: str, help_text: str) -> Any:
        if only is not None and name != only:
            return _Skipped()
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=help_text, epilog=exits.EPILOG
        )
        p.add_argument(
            "--broker",
            metavar="URL",
            help="a broker's URL, http:// assumed (default $GBROKER_URL, else the fleet found: "
            "$GBROKER_FLEET, the nearest .gbroker-fleet up from here, your most recent fleet "
            "still running)",
        )
        p.add_argument(
            "--token-file",
            help="file holding the client token, or a broker's token file (default: "
            "$GBROKER_TOKEN, $GBROKER_TOKEN_FILE, the fleet's tokens, else the token of a "
            "broker of yours at that URL)",
        )
        p.add_argument(
            "--ca",
            metavar="FILE",
            help="verify an https:// broker against this CA (default $GBROKER_CA, else the "
            "fleet's tls/ca.crt)",
        )
        p.add_argument("--json", action="store_true", help="print the answers as JSON")
        p.set_defaults(run=run)
        return p

    p = parser(
        "submit",
        "submit JSDL, JSON or YAML jobs to any broker; prints their ids (a sweep: the array's "
        "id; its jobs are ID_1 .. ID_N)",
    )
    p.add_argument(
        "jobs",
        nargs="+",
        metavar="JOB",
        help="job description files, or directories (their *.jsdl, *.xml, *.json, *.yaml and "
        "*.yml files, in name order)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the jobs to end and show them; exit 0 if all are done, 1 if one failed "
        "or was cancelled, 3 if --timeout ran out",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="with --wait: seconds to wait in all (default 3600)",
    )
    p.add_argument(
        "--upload",
        action="append",
        metavar="FILE",
        help="upload FILE to the broker and stage it into each job's directory (repeatable)",
    )
    p = parser("status", "show jobs' status: state, site, local times, wait and run time")
    p.add_argument("ids", nargs="+", metavar="ID")
    p = parser("history", "show a job's states as its owner recorded them, with times")
    p.add_argument("id", metavar="ID")
    p = parser(
        "cancel",
        "cancel jobs; exit 1 if one had already ended (done, failed or cancelled: it says "
        "so), 2 or 4 if one cannot be asked (unknown, no broker)",
    )
    p.add_argument("ids", nargs="+", metavar="ID")
    p = parser(
        "migrate",
        "move a running job to another site by checkpoint (its owner, or an admin); exit 0 once "
        "it runs there, 1 if the move did not happen (the job runs on where it was: the reason "
        "is shown), 3 if --timeout ran out first",
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--to", metavar="SITE", help="where to (default: the best other site, by F(j))")
    p.add_argument(
        "--no-wait", action="store_true", help="return once the move has begun, not when it is over"
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="seconds to wait for the move (default 600)",
    )
    p = parser(
        "jobs",
        "list jobs, newest last: every broker of the fleet's (or the --broker's own jobs)",
    )
    p.add_argument(
        "--state",
        type=_states,
        action="extend",
        metavar="STATE[,STATE]",
        help=f"only jobs in these states ({', '.join(STATES)}; repeatable)",
    )
    p.add_argument("--site", action="append", metavar="SITE", help="only jobs that ran there")
    p.add_argument(
        "--mine", action="store_true", help="only your own jobs (an admin sees everyone's)"
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="the newest N jobs (default 50, and a line on stderr says when more were left out; "
        "with --array, all of them)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every job the brokers keep (each broker lists at most its newest 1000)",
    )
    p.add_argument("--array", metavar="ID", help="the jobs of this job array instead")
    p = parser(
        "wait",
        "wait until jobs end and show them; exit 0 if all are done, 1 if one failed or was "
        "cancelled, 3 if --timeout ran out first",
    )
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="seconds to wait in all (default 3600)",
    )
    p = parser("output", "print a job's standard output (or error, or a file it staged out)")
    p.add_argument("id", metavar="ID")
    p.add_argument("--stream", choices=["stdout", "stderr"], default="stdout")
    p.add_argument(
        "--file",
        metavar="NAME",
        help="print the file NAME the job staged out to gbroker:store (its DataStaging FileName)",
    )
    p = parser(
        "explain",
        "show how a job's owner ranks each candidate site for it now: F(j) term by term, or "
        "the requirement the site fails",
    )
    p.add_argument(
        "id", metavar="JOB", help="a job or array id, or a job description file (not submitted)"
    )


def main(argv: Sequence[str]) -> int:
    """``gbroker COMMAND ...`` for the client commands alone (the fast path of
    :func:`gbroker.cli.main`)."""

    from gbroker.cli.argtypes import CommandParser, TopParser

    parser = TopParser(prog="gbroker", epilog=exits.EPILOG)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    add_parsers(sub, only=argv[0] if argv and argv[0] in COMMANDS else None)
    return run(parser.parse_args(argv))


class _PlainSubmit:
    """What argparse makes of ``gbroker submit FILE...`` (no option): that command, the most
    frequent of all (a script's loop, one job at a time), starts without building a parser."""

    command = "submit"
    broker = token_file = ca = upload = None
    json = wait = False
    timeout = 3600.0

    def __init__(self, jobs: list[str]) -> None:
        self.jobs = jobs


def plain_submit(paths: list[str]) -> int:
    """``gbroker submit FILE...``: :func:`run` for it, with no parser built."""
    return run(_PlainSubmit(paths))  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    connection: Connection | None = None
    try:
        _check_ids(args)
        connection = connect(args.broker, args.token_file, args.ca)
        if connection.found == "default":  # it may be anywhere: say which
            from gbroker.client.fleetdir import used_note

            print(f"gbroker {args.command}: {used_note(str(connection.fleet))}", file=sys.stderr)
        try:
            return _COMMANDS[args.command](connection, args)
        finally:
            connection.close()
    except QuickError as exc:
        print(f"gbroker {args.command}: {exc}{_whose(exc, connection, args)}", file=sys.stderr)
        return exc.code
    except _Interrupted as exc:
        print(f"gbroker {args.command}: interrupted; {exc}", file=sys.stderr)
        return exits.INTERRUPTED
    except KeyboardInterrupt:
        print(f"gbroker {args.command}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED


def _whose(exc: QuickError, connection: Connection | None, args: argparse.Namespace) -> str:
    """`` (the fleet in DIR)`` after a broker's refusal (4xx) of a fleet's: which fleet said
    so (an id of another fleet's job is refused as no job of this one). Not after a refused
    submission, which names its file and field (and reads as the native front's)."""
    if connection is None or connection.fleet is None or args.command == "submit":
        return ""
    if exc.status is None or not 400 <= exc.status < 500 or connection.fleet in str(exc):
        return ""
    return f" (the fleet in {connection.fleet})"


_ID_ARGUMENTS = {
    "status": ("ids", "ID"),
    "wait": ("ids", "ID"),
    "cancel": ("ids", "ID"),
    "migrate": ("id", "ID"),
    "history": ("id", "ID"),
    "output": ("id", "ID"),
    "explain": ("id", "JOB"),
    "jobs": ("array", "--array"),
}
"""Where each command holds the job ids it was given, and the argument's name in its usage."""


def _check_ids(args: argparse.Namespace) -> None:
    """Each job id on the command line is checked before any request is made of it (an empty
    or malformed id made a request for the wrong path, answered 404): one line naming the
    argument and what a job id looks like (:data:`gbroker.core.names.JOB_ID`)."""
    attribute, label = _ID_ARGUMENTS.get(args.command, ("", ""))
    given = getattr(args, attribute, None) if attribute else None
    if given is None:
        return
    ids = given if isinstance(given, list) else [given]
    if args.command == "explain" and os.path.isfile(ids[0]):
        return  # a job description, not submitted
    from gbroker.core.names import check_job_id
    from gbroker.errors import InvalidInput

    for job_id in ids:
        try:
            check_job_id(job_id, field=label)
        except InvalidInput as exc:
            if args.command == "explain":  # a file name mistyped, as likely as an id
                expected = f"a job description file or {exc.expected}"
                raise QuickError(f"{label}: expected {expected}, got {job_id!r}") from None
            raise QuickError(str(exc)) from None


class _Interrupted(Exception):
    """Ctrl-C while waiting for jobs: they go on; the message says how to look at them again."""

    def __init__(self, ids: Sequence[str]) -> None:
        if len(ids) == 1:
            text = f"{ids[0]} goes on: `gbroker status {ids[0]}` shows it"
        elif len(ids) <= 5:
            text = f"the jobs go on: `gbroker status {' '.join(ids)}` shows them"
        else:
            text = f"the {len(ids)} jobs go on: `gbroker jobs` lists them"
        super().__init__(text)


# -- the commands ---------------------------------------------------------------------------------


def _job_files(paths: Sequence[str]) -> list[str]:
    """The files ``submit`` sends: each named file, and each directory's job files."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(
                os.path.join(path, name)
                for name in os.listdir(path)
                if name.endswith(JOB_SUFFIXES) and os.path.isfile(os.path.join(path, name))
            )
            if not found:
                suffixes = ", ".join(f"*{s}" for s in JOB_SUFFIXES)
                raise QuickError(f"{path}: a directory with no job files ({suffixes})")
            files.extend(found)
        else:
            files.append(path)
    return files


def _read(path: str, what: str = "") -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise QuickError(f"{what}{path}: cannot read: {exc.strerror or exc}") from None


def _submit(connection: Connection, args: argparse.Namespace) -> int:
    files = _job_files(args.jobs)
    descriptions = [(path, _read(path)) for path in files]
    uploads = [(path, _read(path, "--upload ")) for path in args.upload or ()]
    staged = _upload(connection, uploads) if uploads else []
    submitted: list[dict[str, Any]] = []
    try:
        for path, description in descriptions:
            if staged:
                description = _with_staging(path, description, staged)
            try:
                answer = connection.submit(description)
            except QuickError as exc:
                if exc.status is not None and 400 <= exc.status < 500:
                    message = str(exc).removeprefix("submission: ")
                    raise QuickError(f"{path}: {message}", exc.code, exc.status) from None
                raise
            submitted.append({"file": path, "id": answer["id"], "owner": answer.get("owner")})
            if not args.json and not args.wait:
                print(answer["id"] if len(files) == 1 else f"{answer['id']}  {path}", flush=True)
        if not args.wait:
            if args.json:
                _print_json(submitted if len(files) > 1 else submitted[0])
            return exits.OK
        if not args.json:
            for job in submitted:
                print(job["id"] if len(files) == 1 else f"{job['id']}  {job['file']}", flush=True)
    except KeyboardInterrupt:  # the jobs already taken go on: say which
        if submitted:
            raise _Interrupted([str(j["id"]) for j in submitted]) from None
        raise
    statuses = _wait_for(connection, [str(j["id"]) for j in submitted], args.timeout, args.command)
    return _report_ends(statuses, args)


def _upload(connection: Connection, uploads: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """Put each file into the broker's store; the stage-in entries that name them."""
    import hashlib

    info = connection.json("GET", "/api/v1/info")
    entries = []
    for path, data in uploads:
        sha = hashlib.sha256(data).hexdigest()
        connection.json("PUT", f"/files/{sha}", body=data)
        entries.append(
            {
                "name": os.path.basename(path),
                "source": f"{info['url']}/files/{sha}",
                "site": str(info["site"]),
                "size": len(data),
            }
        )
    return entries


def _with_staging(path: str, description: bytes, staged: list[dict[str, Any]]) -> bytes:
    """The description (a sweep's too) with the uploaded files staged in."""
    from gbroker.client.gclient import with_staging  # aiohttp's import: only with --upload
    from gbroker.errors import GBrokerError
    from gbroker.jobs.description import StagingEntry

    entries = [
        StagingEntry(e["name"], source=e["source"], site=e["site"], size=e["size"]) for e in staged
    ]
    try:
        return with_staging(description, entries)
    except GBrokerError as exc:
        raise QuickError(f"{path}: {exc}") from None


def _wait_for(
    connection: Connection, ids: list[str], timeout: float, command: str
) -> list[dict[str, Any]]:
    """Each job's status once it ended or ``timeout`` seconds (in all) passed. A broker that
    goes away meanwhile is left for another (the connection fails over); an owner that is down
    is asked again until the time is up, and the person waiting is told so once (stderr)."""
    deadline = time.monotonic() + timeout
    statuses = []
    told = False
    try:
        for job_id in ids:
            while True:
                left = max(0.0, deadline - time.monotonic())
                try:
                    status = connection.json(
                        "GET",
                        f"/api/v1/jobs/{job_id}/wait?timeout={left:.3f}",
                        timeout=left + 30,
                    )
                except QuickError as exc:
                    if exc.code != exits.UNREACHABLE or time.monotonic() >= deadline:
                        raise
                    if not told:
                        from gbroker.cli import show

                        show.note(
                            f"gbroker {command}: {exc}; asking again until the timeout "
                            f"({left:.0f} s left; Ctrl-C stops waiting, the jobs go on)"
                        )
                        told = True
                    time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                    continue
                if status.get("state") in TERMINAL or time.monotonic() >= deadline:
                    break
            statuses.append(status)
    except KeyboardInterrupt:  # the jobs go on: say so, and how to look again
        raise _Interrupted(ids) from None
    return statuses


def _report_ends(statuses: list[dict[str, Any]], args: argparse.Namespace) -> int:
    from gbroker.cli import show

    if args.json:
        _print_json(statuses if len(statuses) > 1 or args.command == "submit" else statuses[0])
    elif len(statuses) == 1:
        show.job_card(statuses[0])
    else:
        show.jobs_table(statuses)
    running = [s["id"] for s in statuses if s["state"] not in TERMINAL]
    if running:
        show.note(f"timed out after {args.timeout:g} s: {', '.join(running)} not ended yet")
        return exits.TIMEOUT
    if any(s["state"] != "done" for s in statuses):
        return exits.FAILED
    return exits.OK


def _wait(connection: Connection, args: argparse.Namespace) -> int:
    return _report_ends(_wait_for(connection, args.ids, args.timeout, args.command), args)


def _status(connection: Connection, args: argparse.Namespace) -> int:
    from gbroker.cli import show

    statuses = [connection.json("GET", f"/api/v1/jobs/{job_id}") for job_id in args.ids]
    if args.json:
        _print_json(statuses if len(statuses) > 1 else statuses[0])
    elif len(statuses) == 1:
        show.job_card(statuses[0])
    else:
        show.jobs_table(statuses)
    return exits.OK


def _cancel(connection: Connection, args: argparse.Namespace) -> int:
    """Each job cancelled now is shown; one that had already ended is named on stderr (exit 1:
    it was not cancelled), as is one that cannot be (its own status). Exit: the worst."""
    from gbroker.cli import show

    statuses, worst = [], exits.OK
    for job_id in args.ids:
        try:
            status = connection.json("DELETE", f"/api/v1/jobs/{job_id}")
        except QuickError as exc:
            print(f"gbroker cancel: {exc}", file=sys.stderr)
            worst = max(worst, exc.code)
            continue
        statuses.append(status)
        ended = _ended_before(status)
        if ended:
            print(f"gbroker cancel: {job_id}: {ended}", file=sys.stderr)
            worst = max(worst, exits.FAILED)
    if args.json:
        if statuses:
            _print_json(statuses if len(args.ids) > 1 else statuses[0])
    else:
        cancelled = [s for s in statuses if not _ended_before(s)]
        if cancelled:
            show.jobs_table(cancelled)
    return worst


def _migrate(connection: Connection, args: argparse.Namespace) -> int:
    """Ask the job's owner to move it; unless --no-wait, follow its status until it runs at the
    target (exit 0), the move is off (exit 1, with the owner's reason) or --timeout runs out."""
    import json
    import time

    body = json.dumps({} if args.to is None else {"to": args.to}).encode()
    headers = {"Content-Type": "application/json"}
    began = connection.json("POST", f"/api/v1/jobs/{args.id}/migrate", body=body, headers=headers)
    source, target = began["from"], began["to"]
    print(f"gbroker migrate: {args.id}: moving from {source} to {target}", file=sys.stderr)
    if args.no_wait:
        if args.json:
            _print_json(began)
        return exits.OK
    deadline = time.monotonic() + args.timeout
    pause = 0.1
    while True:
        status = connection.json("GET", f"/api/v1/jobs/{args.id}")
        move = status.get("move") or {}
        if status.get("state") in TERMINAL:
            print(f"gbroker migrate: {args.id} ended ({status['state']})", file=sys.stderr)
            break
        if not move and status.get("site") == target:
            print(f"gbroker migrate: {args.id} runs at {target}", file=sys.stderr)
            if args.json:
                _print_json(status)
            return exits.OK
        if not move:
            why = status.get("move_error") or "the move is off"
            print(f"gbroker migrate: {args.id}: not moved: {why}", file=sys.stderr)
            break
        if time.monotonic() > deadline:
            print(f"gbroker migrate: {args.id}: still moving after {args.timeout:g} s")
            return exits.TIMEOUT
        time.sleep(pause)
        pause = min(pause * 1.5, 1.0)
    if args.json:
        _print_json(status)
    return exits.FAILED


def _ended_before(status: dict[str, Any]) -> str | None:
    """Why a cancel did nothing: the job (or every job of an array) had already ended; None if
    this cancel cancelled it. (A broker that does not say ``cancelled_now``: a job it answers
    ``done`` or ``failed`` for had ended.)"""
    from gbroker.cli import show

    state = status.get("state")
    now = status.get("cancelled_now")
    if now or (now is None and state not in ("done", "failed")):
        return None
    at = f" at {show.local_time(status['ended_at'])}" if status.get("ended_at") else ""
    return f"already {state}{at}" + ("" if state == "cancelled" else ", not cancelled")


def _history(connection: Connection, args: argparse.Namespace) -> int:
    from gbroker.cli import show

    answer = connection.json("GET", f"/api/v1/jobs/{args.id}/history")
    if args.json:
        _print_json(answer["transitions"])
    else:
        show.history_table(answer["transitions"])
    return exits.OK


def _output(connection: Connection, args: argparse.Namespace) -> int:
    from gbroker.client.quick import answer

    path = f"/api/v1/jobs/{args.id}/output/{args.stream}"
    if args.file is not None:
        from urllib.parse import urlencode

        path = f"/api/v1/jobs/{args.id}/files?{urlencode({'name': args.file})}"
    status, body = connection.request("GET", path)
    if status >= 400:
        answer(status, body, f"output of {args.id}")
    sys.stdout.buffer.write(body)
    return exits.OK


def _jobs(connection: Connection, args: argparse.Namespace) -> int:
    """Every broker's listing (the fleet's), or the named broker's; then the filters."""
    from gbroker.cli import show

    if args.array:
        from urllib.parse import urlencode

        listing = connection.json("GET", f"/api/v1/jobs?{urlencode({'array': args.array})}")
        return _show_jobs(listing["jobs"], args)
    query = f"?limit={max(args.limit or 0, 1000)}"
    args.limit = None if args.all else args.limit or 50
    # An admin sees everyone's jobs unless --mine; others see their own in any case.
    everyone = not args.mine and connection.admin is not False
    brokers = [connection] if connection.fleet is None else _each_broker(connection)
    jobs: list[dict[str, Any]] = []
    for broker in brokers:
        try:
            try:
                listing = broker.json(
                    "GET", "/api/v1/jobs" + query + ("&all=1" if everyone else "")
                )
            except QuickError as exc:
                if exc.status != 403 or not everyone:
                    raise
                listing = broker.json("GET", "/api/v1/jobs" + query)
        except QuickError as exc:
            if connection.fleet is None or exc.code != exits.UNREACHABLE:
                raise
            if not args.json:
                show.note(f"({broker.url} did not answer: the jobs it owns are not listed)")
            continue
        finally:
            if broker is not connection:
                broker.close()
        jobs.extend(listing["jobs"])
    jobs.sort(key=lambda j: (j.get("submitted_at") or 0.0, j["id"]))
    return _show_jobs(jobs, args)


def _show_jobs(jobs: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """``jobs``' filters, then its table (or JSON)."""
    from gbroker.cli import show

    if args.state:
        jobs = [j for j in jobs if j["state"] in args.state]
    if args.site:
        jobs = [j for j in jobs if j.get("site") in args.site]
    if args.limit and len(jobs) > args.limit:
        # On stderr, with --json too: whoever reads the list learns that it was cut.
        show.note(
            f"(showing the newest {args.limit} of {len(jobs)} jobs: --limit N shows more, "
            "--all every one)"
        )
        jobs = jobs[-args.limit :]
    if args.json:
        _print_json(jobs)
    elif jobs:
        show.jobs_table(jobs)
    else:
        show.note("no jobs")
    return exits.OK


def _explain(connection: Connection, args: argparse.Namespace) -> int:
    """``gbroker explain``: a table of the candidate sites, or the broker's JSON."""
    from gbroker.cli import show

    described = os.path.isfile(args.id)
    if described:  # a job description, not submitted: the file names it
        try:
            answer = connection.json("POST", "/api/v1/explain", body=_read(args.id))
        except QuickError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                message = str(exc).removeprefix("POST /api/v1/explain: ")
                raise QuickError(f"{args.id}: {message}", exc.code, exc.status) from None
            raise
        sweep = f"the first job of a sweep of {answer['array']}, " if answer.get("array") else ""
        label = f"{args.id} ({sweep}not submitted)"
    else:
        answer = connection.json("GET", f"/api/v1/jobs/{args.id}/explain")
        label = str(answer["job"])
    if args.json:
        _print_json(answer)
        return exits.OK
    owner, algorithm = answer["owner"], answer["algorithm"]
    print(f"{label}: {show.count(answer['rank'], 'core')}, ranked by {owner} ({algorithm})")
    for line in answer["asks"]:
        print(f"  {line}")
    if answer.get("fleet"):
        print(f"  no site of the fleet fits: {answer['fleet']}")
    print(f"  {'site':<12} {'F(j)':>7} {'t_j/t_max':>9} {'c_max/c_j':>9} {'w_j/w_max':>9}  verdict")
    for c in answer["candidates"]:
        if c["feasible"]:
            verdict = ("best" if c["best"] else "") + (" waits" if c["waits"] else " starts now")
            if c["penalty"]:
                verdict += f", black-hole penalty {c['penalty']:.2f}"
            if c.get("hosts"):
                verdict += f", on its hosts {', '.join(c['hosts'])}"
            print(
                f"  {c['site']:<12} {c['F']:>7.3f} {c['transfer']:>9.3f} {c['free']:>9.3f}"
                f" {c['load']:>9.3f}  {verdict.strip()}"
            )
        else:
            blank = f"{'-':>7} {'':>9} {'':>9} {'':>9}"
            print(f"  {c['site']:<12} {blank}  not a candidate: {c['reason']}")
    if answer.get("plan_error"):
        print(f"AppLeS: no plan: {answer['plan_error']}")
    if answer.get("resources"):
        seen = ", ".join(
            f"{r['site']} ({r['cores']} idle, CPU {r['cpu']:.2f}, speed {r['speed']:g})"
            for r in answer["resources"]
        )
        print(f"AppLeS weighed {seen}")
    if answer.get("plan"):
        plan = answer["plan"]
        print(
            f"AppLeS plan from {plan['locus'] or '-'}: {', '.join(plan['sites'])},"
            f" units {', '.join(map(str, plan['units']))}, predicted {plan['predicted']:.2f} s"
        )
        print(f"  {'sites':<30} {'units':<24} predicted")
        for c in plan["candidates"]:
            told = f"{c['predicted']:.2f} s" if c["predicted"] is not None else c["reason"]
            units = ",".join(map(str, c["units"])) or "-"
            print(f"  {'+'.join(c['sites']):<30} {units:<24} {told}")
    return exits.OK


def _each_broker(connection: Connection) -> list[Connection]:
    """One connection per broker of the fleet (each fails alone: no failover here)."""
    return [
        Connection([url], connection.token, connection.ca, connection.fleet,
                   connection.timeout, connection.admin)
        for url in sorted(connection.urls)
    ]  # fmt: skip


def _print_json(value: object) -> None:
    import json

    print(json.dumps(value, indent=2))


_COMMANDS = {
    "submit": _submit,
    "status": _status,
    "wait": _wait,
    "jobs": _jobs,
    "output": _output,
    "cancel": _cancel,
    "migrate": _migrate,
    "history": _history,
    "explain": _explain,
}
