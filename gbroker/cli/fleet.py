"""``gbroker fleet``: bring a fleet up and down, look at it, act on its members; and ``gbroker
image build``, the container image of container fleets."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gbroker.cli.argtypes import positive_float, positive_int
from gbroker.cli.policy_args import (
    DAEMON_ALGORITHMS,
    add_malleability_arguments,
    add_sd_arguments,
    sd_arguments_fit,
    sd_serve_args,
)
from gbroker.cli.serve import (
    add_job_arguments,
    add_token_file_argument,
    client_token,
    job_serve_args,
)
from gbroker.cli.show import count


def _fleet_dir(args: argparse.Namespace) -> str:
    """The fleet directory a ``fleet`` action works on: ``--dir``, else the fleet found
    (:mod:`gbroker.client.fleetdir`); ``up`` and ``compose`` make one where :func:`for_up` says."""
    from gbroker.client import fleetdir
    from gbroker.errors import GBrokerError

    if args.dir:
        return str(args.dir)
    if args.action in ("up", "compose"):
        return fleetdir.for_up()
    try:
        directory, found = fleetdir.locate()
    except fleetdir.NoFleet as exc:
        raise GBrokerError(str(exc)) from None
    if found == "default" and args.action != "status":  # status names it on stdout
        action = " ".join(filter(None, (args.action, getattr(args, "user_action", None))))
        print(f"gbroker fleet {action}: {fleetdir.used_note(directory)}", file=sys.stderr)
    return directory


def _example_job() -> str | None:
    """The example job a hint names: ``examples/hello.yaml`` where it is here, else the shipped
    one by its absolute path, else none (an installation without the examples)."""
    import os

    import gbroker

    relative = os.path.join("examples", "hello.yaml")
    if os.path.isfile(relative):
        return relative
    source = os.path.dirname(os.path.dirname(os.path.abspath(gbroker.__file__)))
    shipped = os.path.join(source, relative)  # beside the package in a checkout
    return shipped if os.path.isfile(shipped) else None


_POLICY_FLAGS = ("--algorithm", "--malleability", "--sd-policy", "--sharing-factor", "--sd-mates",
                 "--sd-runtime")  # fmt: skip


def _policies(record: dict[str, Any]) -> str:
    """What ``fleet up`` gave every site to do with malleable jobs, from a site's command line
    (its recorded ``gbroker serve`` flags): SD-Policy's settings, --malleability's, or none."""
    members = list(record.get("sites", {}).values())
    command = [str(word) for word in (members[0].get("command") or [])] if members else []
    given = {flag: command[i + 1] for i, flag in enumerate(command[:-1]) if flag in _POLICY_FLAGS}
    said = []
    if "--sd-policy" in given:
        said.append(
            f"SD-Policy on (max slowdown {given['--sd-policy']}, sharing factor "
            f"{given.get('--sharing-factor', '0.5')}, up to {given.get('--sd-mates', '2')} mates, "
            f"{given.get('--sd-runtime', 'ideal')} run times): a waiting malleable job may start "
            "on cores its running mates give up"
        )
    if "--malleability" in given:
        said.append(f"malleable jobs resized ({given['--malleability']} malleability)")
    if not said:
        said.append("malleable jobs keep their size (no --sd-policy, no --malleability)")
    algorithm = given.get("--algorithm")
    return "every site: " + "; ".join(said) + (f"; dispatch {algorithm}" if algorithm else "")


def _fleet_up_report(directory: str, record: dict[str, Any], runtime: str) -> None:
    """What `fleet up` prints: the members, and how to reach the fleet with nothing typed."""
    import os

    from gbroker.client import fleetdir

    where = "" if runtime == "local" else f" ({runtime})"
    sites = len(record["sites"])
    print(f"fleet up in {directory}{where}: {count(sites, 'site')}, MQTT {record['mqtt_url']}")
    from gbroker.fleet import batch

    systems = {site: (manager, system) for manager, site, system in batch.systems(record)}
    for name, member in record["sites"].items():
        system = systems.get(name)
        where = "" if system is None else f"  {system[0]}: {system[1].setting()}"
        print(f"  {name:<12} {member['url']}  pid {member['pid']}{where}")
    print(_policies(record))
    root = os.path.dirname(os.path.abspath(directory))
    first = next(iter(record["sites"].values()))["url"]
    # What fleetdir.find does, in its order, said of this fleet.
    below = (
        f"from {root} and the directories under it (but where another running "
        f"{fleetdir.DIR_NAME} is nearer), and "
        if os.path.basename(os.path.abspath(directory)) == fleetdir.DIR_NAME
        else ""
    )
    print(
        f"\nClient commands use ${fleetdir.ENV} if set, else the nearest {fleetdir.DIR_NAME} "
        "walking up from their directory if it runs,\nelse the most recent fleet you brought up "
        f"that still runs. They find this one {below}from anywhere while it is that one,\nor with "
        f"{fleetdir.ENV}={os.path.abspath(directory)}, e.g.\n"
        + (f"  gbroker submit {example}\n" if (example := _example_job()) else "")
        + "  gbroker jobs\n"
        + f"Dashboard: {first}/fleet (sign in with the token in "
        f"{os.path.join(os.path.abspath(directory), 'tokens')})\n"
        "Stop it with `gbroker fleet down` (it stops the fleet's running jobs; --keep-jobs)."
    )


def _fleet_status(directory: str, as_json: bool) -> int:
    import json

    from gbroker import fleet
    from gbroker.cli import exits, show
    from gbroker.fleet.batch import KINDS

    rows = fleet.status(directory)
    policies = _policies(fleet.load(directory))
    healthy = all(
        r["alive"]
        and r["answers"] is not False
        and all(r.get(manager, {}).get("up", True) for manager in KINDS)
        for r in rows
    )
    if as_json:
        shown = {"directory": directory, "members": rows, "policies": policies, "ok": healthy}
        print(json.dumps(shown, indent=2))
    else:
        table = [
            (
                row["name"],
                row["url"],
                str(row["pid"]),
                "up" if row["alive"] else "DOWN",
                _http_column(row),
                _manager_column(row),
                _jobs_column(row.get("jobs")),
            )
            for row in rows
        ]
        print(f"fleet in {directory}")
        show.print_table(("MEMBER", "URL", "PID", "PROCESS", "HTTP", "MANAGER", "JOBS"), table)
        for row in rows:
            for manager in KINDS:
                if manager in row:
                    print(f"{row['name']}: {row[manager]['setting']}")
        print(policies)
    return exits.OK if healthy else exits.FAILED


_LIMIT_WORDS = {
    "memory": "memory",
    "processes": "processes",
    "file_size": "files up to",
    "cpu_time": "CPU s",
    "open_files": "open files",
}


def _jobs_column(jobs: dict[str, Any] | None) -> str:
    """A broker's jobs in ``fleet status``: how they are confined, and the site's limits."""
    from gbroker.core.requirements import format_bytes

    if not jobs:
        return "-"
    version = jobs.get("cgroups")
    said = ["a uid per user" if jobs.get("uid_per_user") else "one account"]
    manager = jobs.get("manager") or "local"
    if manager != "local":  # the batch system confines them (gbroker.site.slurm)
        said = ["mapped accounts" if "--accounts" in str(jobs.get("run_as")) else "one account"]
        said.append(f"{manager}'s own confinement")
    else:
        said.append(f"cgroup v{version}" if version else "no cgroups")
    limits = jobs.get("limits") or {}
    for name, value in limits.items():
        shown = format_bytes(value) if name in ("memory", "file_size") else f"{value:,}"
        said.append(f"{_LIMIT_WORDS.get(name, name)} {shown}")
    shares = jobs.get("shares") or {}  # what the site gives a job where nothing limits it
    if shares and "memory" not in limits:
        said.append(f"memory {format_bytes(shares['memory_per_core'])} a core")
    if shares and "processes" not in limits:
        said.append(f"processes {shares['processes_per_core']:,} a core")
    return ", ".join(said)


def _manager_column(row: dict[str, Any]) -> str:
    """How a broker's site runs its jobs in ``fleet status``: ``local``, or ``slurm`` or
    ``gridengine`` and whether its system's daemons run (``-`` for the MQTT broker)."""
    if "manager" not in row:
        return "-"
    manager = str(row["manager"])
    system = row.get(manager)
    if system is None:
        return manager
    down = [name for name, alive in system["daemons"].items() if not alive]
    if not down:
        return f"{manager}: {count(len(system['daemons']), 'daemon')} up"
    return f"{manager}: {', '.join(down)} DOWN"


def _http_column(row: dict[str, Any]) -> str:
    """A member's HTTP column in ``fleet status``: answers (healthy), not ok (and what), or no
    answer; ``-`` for the MQTT broker."""
    if row["answers"] is None:
        return "-"
    if row["answers"]:
        return "answers"
    if row.get("not_ok"):
        return "not ok: " + ", ".join(row["not_ok"])
    return "no answer"


def _fleet_down(args: argparse.Namespace) -> int:
    """``fleet down``; a fleet already down is nothing to stop (exit 0, as ``docker compose
    down`` does), while a fleet record that cannot be read stays an error."""
    import os

    from gbroker import fleet
    from gbroker.client import fleetdir

    # $GBROKER_FLEET, else the nearest .gbroker-fleet even if down (never another fleet found
    # beyond it: `fleet down` twice here must not stop the default fleet elsewhere), else the
    # default fleet.
    directory = str(args.dir) if args.dir else fleetdir.for_up()
    if not (args.dir or os.environ.get(fleetdir.ENV) or os.path.isdir(directory)):
        try:
            directory = fleetdir.find()
        except fleetdir.NoFleet:
            print(
                f"no fleet runs here (no {fleetdir.DIR_NAME} above this directory, and no fleet "
                "of yours runs elsewhere): nothing to stop"
            )
            return 0
    if not os.path.lexists(os.path.join(directory, fleetdir.FLEET_FILE)):
        fleetdir.forget_default(directory)
        default = None if args.dir else fleetdir.default_fleet()
        other = f" (your default fleet runs in {default}: --dir names it)" if default else ""
        print(f"no fleet runs in {directory}: nothing to stop{other}")
        return 0
    done = fleet.down(directory, keep_jobs=args.keep_jobs)

    def per_site(counts: dict[str, int]) -> str:
        return ", ".join(f"{site} {n}" for site, n in sorted(counts.items()))

    if done.stopped:
        stopped = count(sum(done.stopped.values()), "running job")
        print(f"stopped {stopped}: {per_site(done.stopped)}")
    if done.left:
        print(
            f"left {count(sum(done.left.values()), 'job')} running for the brokers to adopt "
            f"when the fleet comes up again: {per_site(done.left)}"
        )
    if not done.stopped and not done.left and not done.unanswered:
        print("no jobs were running")
    if done.unanswered:
        print(f"(no answer from {', '.join(done.unanswered)}: their jobs were not counted)")
    from gbroker.fleet.batch import KINDS

    for manager, stopped_in in done.systems.items():
        cancelled = sum(stopped_in.values())
        what = f", {count(cancelled, 'job')} in them cancelled" if cancelled else ""
        print(f"stopped the {KINDS[manager][1]} of {', '.join(sorted(stopped_in))}{what}")
    for space, killed in done.killed.items():
        print(f"killed {count(killed, 'process', 'processes')} still running in {space}")
    print(f"fleet in {directory} is down")
    return 0


def _cmd_fleet(args: argparse.Namespace) -> int:
    from gbroker import fleet
    from gbroker.cli import exits
    from gbroker.errors import InvalidInput

    try:
        if args.action in ("drain", "undrain"):  # with --broker, no fleet directory needed
            if not args.broker:
                args.dir = _fleet_dir(args)
            return _drain(args)
        if args.action == "down":
            return _fleet_down(args)
        directory = _fleet_dir(args)
        if args.action == "up":
            if not sd_arguments_fit(args, "fleet up", "easy"):  # a broker's queue is EASY's
                return exits.USAGE
            extra: tuple[str, ...] = ("--algorithm", args.algorithm) if args.algorithm else ()
            if args.malleability:  # every site resizes its malleable jobs
                extra += ("--malleability", args.malleability, "--initiative", args.initiative)
                extra += ("--reserve", str(args.reserve))
            extra += sd_serve_args(args)  # every site runs SD-Policy
            if args.allow_private_sources:
                extra += ("--allow-private-sources",)
            extra += job_serve_args(args)
            if args.read_budget is not None:
                extra += ("--read-budget", str(args.read_budget))
            if args.coalloc_timeout is not None:
                extra += ("--coalloc-timeout", str(args.coalloc_timeout))
            if args.coalloc_rounds is not None:
                extra += ("--coalloc-rounds", str(args.coalloc_rounds))
            if args.mqtt and args.mqtt_broker:
                raise InvalidInput("--mqtt", "either --mqtt URL or --mqtt-broker, not both")
            mqtt = args.mqtt or args.mqtt_broker
            record = fleet.up(
                args.topology,
                directory,
                mqtt,
                extra,
                tls=args.tls,
                runtime=args.runtime,
                image=args.image,
                remember=True,
            )
            _fleet_up_report(directory, record, args.runtime)
        elif args.action == "status":
            return _fleet_status(directory, args.json)
        elif args.action == "compose":
            path = fleet.compose(
                args.topology, directory, args.mqtt_broker or "amqtt", args.image, args.first_port
            )
            print(f"wrote {path}: run `docker-compose up -d` in {path.parent}")
        elif args.action == "shape":
            up = args.rate if args.up is None else args.up
            down = args.rate if args.down is None else args.down
            fleet.shape(directory, args.site, up, down)
            shown = {"out of it": up, "into it": down}
            text = ", ".join(
                f"{k} {'unshaped' if v is None else _rate_text(v)}" for k, v in shown.items()
            )
            print(f"{args.site}: {text}")
        elif args.action == "kill":
            alive, pid = fleet.site_alive(directory, args.site)
            if not alive:
                print(
                    f"gbroker fleet kill: {args.site} is not running (pid {pid} is gone); "
                    f"`gbroker fleet restart {args.site}` starts it",
                    file=sys.stderr,
                )
                return exits.FAILED
            print(f"killed {args.site} (pid {fleet.kill(directory, args.site)})")
        else:
            alive, pid = fleet.site_alive(directory, args.site)
            if alive and not args.force:
                print(
                    f"gbroker fleet restart: {args.site} is running (pid {pid}); --force kills "
                    "it first (its running jobs stay, for the new broker to adopt)",
                    file=sys.stderr,
                )
                return exits.FAILED
            print(f"restarted {args.site} (pid {fleet.restart(directory, args.site)})")
    except BrokenPipeError:  # the reader went away (`| head`): gbroker.cli.main ends quietly
        raise
    except OSError as exc:
        print(f"gbroker fleet {args.action}: {exits.os_error(exc)}", file=sys.stderr)
        return exits.USAGE
    return exits.OK


_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
               "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}  # fmt: skip


def _link_rate(text: str) -> float | None:
    """A link rate: ``100mbit``, ``12.5MB`` (bytes/s), a bare number of bytes/s, or ``off``."""
    if text.lower() == "off":
        return None
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ/")
    unit = text[len(number) :].lower().removesuffix("/s") or "b"
    try:
        value = float(number) * _RATE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"expected a rate such as 100mbit, 12.5MB (bytes/s) or off, got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a rate > 0, got {text!r}")
    return value


def _rate_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:g} Mbit/s"


def _drain(args: argparse.Namespace) -> int:
    """``fleet drain`` / ``undrain``: one line on stdout; progress on stderr on a terminal."""
    import json

    from gbroker import fleet

    # The caller's own token when they give one ($GBROKER_TOKEN, --token-file,
    # $GBROKER_TOKEN_FILE; a --broker's from the runtime directory); the fleet's admin token
    # only when none is given.
    given = _given_token(args)
    named = args.broker or given
    token = client_token(args.broker or "", args.token_file) if named else None
    target = fleet.drain_target(args.dir, args.site, args.broker, token, args.ca)

    watch = fleet.JobsWatch(target)
    shown = ""

    def progress(report: dict[str, Any]) -> None:
        """Each job's news on stderr (what moved where, what it waits for and why); the counts
        left too, on a terminal, as they change."""
        nonlocal shown
        for line in watch.lines(report):
            print(f"{report['site']}: {line}", file=sys.stderr)
        left = fleet.drain_left(report)
        if sys.stderr.isatty() and left != shown and not report["drained"]:
            print(f"{report['site']}: draining: {left}", file=sys.stderr)
            shown = left

    try:
        on = args.action == "drain"
        migrate = getattr(args, "migrate", False)
        report = fleet.drain(target, on, wait=on and not args.no_wait, timeout=args.timeout,
                             progress=progress, migrate=migrate)  # fmt: skip
    except fleet.FleetError as exc:
        refused = given and ": 403: " in str(exc)
        whose = f" (the token of {given} is not an admin's)" if refused else ""
        print(f"gbroker fleet {args.action}: {exc}{whose}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while waiting, most likely: the drain goes on without us
        from gbroker.cli import exits
        from gbroker.errors import GBrokerError

        try:
            now = target.call()  # did the drain begin before Ctrl-C?
        except (GBrokerError, OSError, KeyboardInterrupt):
            now = {}
        if not (on and now.get("draining")):
            raise  # gbroker.cli.main says "interrupted"
        site = now["site"]
        print(
            f"gbroker fleet drain: interrupted; {site} goes on draining: `gbroker fleet drain "
            f"{site}` waits again, `gbroker fleet undrain {site}` lets it take new work again",
            file=sys.stderr,
        )
        return exits.INTERRUPTED
    if args.json:
        print(json.dumps(report))
    elif report["drained"]:
        print(f"{report['site']}: drained")
    elif report["draining"]:
        print(f"{report['site']}: draining: {fleet.drain_left(report)}")
    else:
        print(f"{report['site']}: taking new work")
    return 0


def _given_token(args: argparse.Namespace) -> str:
    """Where the caller gave a token of their own (``$GBROKER_TOKEN``, ``--token-file``,
    ``$GBROKER_TOKEN_FILE``: the order :func:`client_token` reads them in); empty if nowhere."""
    import os

    if os.environ.get("GBROKER_TOKEN"):
        return "$GBROKER_TOKEN"
    if args.token_file:
        return f"--token-file {args.token_file}"
    if os.environ.get("GBROKER_TOKEN_FILE"):
        return "$GBROKER_TOKEN_FILE"
    return ""


def _cmd_user(args: argparse.Namespace) -> int:
    """``fleet user add|list|remove``: the fleet's users, in its token file, which its brokers
    read again when it changes (:class:`gbroker.security.auth.TokenFile`): no restart."""
    import json
    import os
    from pathlib import Path

    from gbroker.cli import exits, show
    from gbroker.errors import GBrokerError
    from gbroker.security import auth

    directory = _fleet_dir(args)
    path = Path(directory) / "tokens"  # gbroker.fleet.files.write_fleet_files
    if not path.is_file():
        raise GBrokerError(f"{directory} is not a fleet directory: it has no token file (tokens)")
    if args.user_action == "add":
        token = auth.add_user(path, args.name, admin=args.admin)
        print(token)
        role = "an admin" if args.admin else "a user"
        print(
            f"added {args.name} ({role}) to the fleet in {os.path.abspath(directory)}: its "
            f"brokers take the token at once. Use it:\n  GBROKER_TOKEN={token} gbroker "
            + (f"submit {example}" if (example := _example_job()) else "jobs"),
            file=sys.stderr,
        )
    elif args.user_action == "remove":
        auth.remove_user(path, args.name)
        print(f"removed {args.name}: its token is refused from now on")
    else:
        users = auth.read_users(path)
        if args.json:
            print(json.dumps([{"name": u.name, "admin": u.admin} for u in users], indent=2))
        else:
            show.print_table(
                ("USER", "ADMIN"), [(u.name, "admin" if u.admin else "-") for u in users]
            )
    return exits.OK


def _cmd_image(args: argparse.Namespace) -> int:
    from gbroker.fleet import image

    image.build(args.tag, force=args.force)
    return 0


def _add_image_parser(sub: Any) -> None:
    ip = sub.add_parser(
        "image",
        help="build the GBroker container image (no registry needed)",
        description="Build the image that `fleet up --runtime docker` runs: a Debian base made "
        "with mmdebstrap from this host's apt mirror, and GBroker installed offline from wheels "
        "built here. Kept when its sources have not changed.",
    )
    actions = ip.add_subparsers(dest="action", required=True, metavar="ACTION")
    bp = actions.add_parser("build", help="build (or keep) the image")
    bp.add_argument("--tag", default="gbroker:local", help="image tag (default gbroker:local)")
    bp.add_argument("--force", action="store_true", help="rebuild even if up to date")
    bp.set_defaults(run=_cmd_image)


def _add_fleet_parsers(sub: Any) -> None:
    fleet_brokers = (
        "amqtt",
        "mosquitto",
    )  # gbroker.fleet.MQTT_BROKERS, without importing it
    fp = sub.add_parser(
        "fleet", help="run a fleet: one broker per site (processes, namespaces, containers)"
    )
    actions = fp.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("up", "start an MQTT broker and one broker per site (see --runtime)"),
        ("status", "show each member's process and HTTP health (and Slurm sites' clusters)"),
        ("down", "stop the fleet and its running jobs (--keep-jobs to leave them)"),
        ("kill", "SIGKILL one site's broker"),
        ("restart", "start a stopped site's broker again (it resumes from its journal)"),
        ("shape", "change one site's access link rates (a netns or docker fleet)"),
        ("compose", "write a docker-compose file (and what it mounts) for a topology"),
        ("drain", "stop one site taking new work, move its queued jobs, wait for the rest"),
        ("undrain", "let a drained site take new work again"),
    ):
        ap = actions.add_parser(name, help=text, description=text)
        ap.add_argument(
            "--dir",
            help="fleet directory (default: $GBROKER_FLEET, else the nearest .gbroker-fleet "
            "walking up from here, else the most recent fleet you brought up that still runs; "
            "`up`: ./.gbroker-fleet if none is above; `down`: the nearest .gbroker-fleet even "
            "if it is down)",
        )
        ap.set_defaults(run=_cmd_fleet)
        if name == "status":
            ap.add_argument("--json", action="store_true", help="print the members as JSON")
        if name == "down":
            ap.add_argument(
                "--keep-jobs",
                action="store_true",
                help="leave the running jobs running, for the brokers to adopt when the fleet "
                "comes up again (default: stop them; a Slurm site's jobs end with its cluster, "
                "which down always stops)",
            )
        if name == "restart":
            ap.add_argument(
                "--force", action="store_true", help="kill the site's broker first if it runs"
            )
        if name == "compose":
            ap.add_argument("--topology", required=True, help="topology YAML file")
            ap.add_argument("--mqtt-broker", choices=fleet_brokers, help="default amqtt")
            ap.add_argument("--image", default="gbroker:local", help="default gbroker:local")
            ap.add_argument(
                "--first-port",
                type=positive_int,
                default=8701,
                help="site i is published on 127.0.0.1:FIRST_PORT+i (default 8701)",
            )
        if name == "up":
            ap.add_argument("--topology", required=True, help="topology YAML file")
            add_malleability_arguments(ap, fraction=False)
            add_sd_arguments(ap)
            ap.add_argument(
                "--mqtt-broker",
                choices=fleet_brokers,
                help="the MQTT broker the fleet runs, with passwords and a topic ACL "
                "(default amqtt, in a `gbroker mqtt-serve` process)",
            )
            ap.add_argument(
                "--mqtt",
                metavar="URL",
                help="use this external MQTT broker instead (the fleet passes no credentials)",
            )
            ap.add_argument("--algorithm", choices=DAEMON_ALGORITHMS, help="dispatch algorithm")
            add_job_arguments(ap.add_argument_group("every site's jobs: confinement and limits"))
            ap.add_argument(
                "--allow-private-sources",
                action="store_true",
                help="let the brokers stage from and to loopback and private hosts (a fleet "
                "on one host or LAN, with its own data servers)",
            )
            ap.add_argument(
                "--read-budget",
                type=positive_float,
                metavar="SECONDS",
                help="each broker's `serve --read-budget`: how long reading one submission "
                "(a sweep expanded, its XPaths evaluated) may take (default 5)",
            )
            ap.add_argument(
                "--coalloc-timeout",
                type=positive_float,
                metavar="SECONDS",
                help="each broker's `serve --coalloc-timeout`: how long a co-allocated job's "
                "components' claims are held for all to get their cores (default 60)",
            )
            ap.add_argument(
                "--coalloc-rounds",
                type=positive_int,
                metavar="N",
                help="each broker's `serve --coalloc-rounds`: rounds a co-allocated job is "
                "tried before it fails (default 10)",
            )
            ap.add_argument(
                "--runtime",
                choices=("local", "netns", "docker"),
                default="local",
                help="where members run: local processes on loopback (default); each in its "
                "own network namespace with its own address and its access link shaped as the "
                "topology says (root only); or each in its own container (see --image)",
            )
            ap.add_argument(
                "--image",
                default="gbroker:local",
                help="the image of a docker fleet (default gbroker:local, from "
                "`gbroker image build`)",
            )
            ap.add_argument(
                "--tls",
                action="store_true",
                help="HTTPS and mqtts between all members: a fleet CA and a certificate per "
                "site in DIR/tls (clients verify with DIR/tls/ca.crt)",
            )
        if name in ("kill", "restart", "shape"):
            ap.add_argument("site")
        if name == "shape":
            ap.add_argument(
                "rate", type=_link_rate, help="both ways: 100mbit, 12.5MB (bytes/s), off"
            )
            ap.add_argument("--up", type=_link_rate, help="out of the site only (default: RATE)")
            ap.add_argument("--down", type=_link_rate, help="into the site only (default: RATE)")
        if name in ("drain", "undrain"):
            ap.add_argument("site", nargs="?", help="the site (optional with --broker)")
            ap.add_argument("--broker", metavar="URL", help="drive this broker, not a fleet's")
            add_token_file_argument(ap)
            ap.add_argument("--ca", metavar="FILE", help="verify an https:// --broker with it")
            ap.add_argument("--json", action="store_true", help="print the last report as JSON")
            ap.add_argument(
                "--timeout",
                type=positive_float,
                default=3600.0,
                help="seconds to wait for drained (default 3600; exit 1 after, still draining)",
            )
        if name == "drain":
            ap.add_argument(
                "--no-wait", action="store_true", help="return once the drain has begun"
            )
            ap.add_argument(
                "--migrate",
                action="store_true",
                help="move the jobs running there to other sites by checkpoint, instead of "
                "waiting for them to end",
            )
        if name == "undrain":
            ap.set_defaults(no_wait=True)
    _add_user_parsers(actions)


def _add_user_parsers(actions: Any) -> None:
    text = "the fleet's users: add one (prints its token), list them, remove one"
    up = actions.add_parser("user", help=text, description=text + ". Its brokers take the "
                            "change at once, running or not (no restart).")  # fmt: skip
    ops = up.add_subparsers(dest="user_action", required=True, metavar="ACTION")
    for name, help_text in (
        ("add", "give a new user a client token (printed on stdout)"),
        ("list", "the users and whether each is an admin (never their tokens)"),
        ("remove", "take a user out: their token is refused (401) from the next request on"),
    ):
        op = ops.add_parser(name, help=help_text, description=help_text)
        op.add_argument("--dir", help="fleet directory (default: as for the other fleet actions)")
        op.set_defaults(run=_cmd_user)
        if name != "list":
            op.add_argument("name", metavar="NAME", help="the user's name (e.g. alice)")
        if name == "add":
            op.add_argument(
                "--admin", action="store_true", help="an admin sees and cancels every job"
            )
        if name == "list":
            op.add_argument("--json", action="store_true", help="print the users as JSON")


def add_parsers(sub: Any) -> None:
    _add_fleet_parsers(sub)
    _add_image_parser(sub)
