"""The daemons' commands: ``gbroker serve`` (a site's broker), ``gbroker netmon serve`` and
``gbroker dcsmon serve`` (standalone monitors), ``gbroker mqtt serve`` (the embedded MQTT
broker)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gbroker.cli.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from gbroker.cli.policy_args import (
    add_malleability_arguments,
    add_policy_arguments,
    add_sd_arguments,
    read_dispatch_policy,
    read_malleability_policy,
    read_sd_policy,
    refuse_sim_only,
    sd_arguments_fit,
)

if TYPE_CHECKING:
    from gbroker.topology import Topology


def add_token_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        help="file holding the client token, or a broker's token file (default: "
        "$GBROKER_TOKEN, $GBROKER_TOKEN_FILE, else the token of a broker of yours at that URL)",
    )


def client_token(broker: str, token_file: str | None) -> str | None:
    """The client token: $GBROKER_TOKEN, a token file (a bare token, or a broker's
    'NAME TOKEN [admin]' file), else what the runtime directory says of the broker's URL."""
    import os
    from pathlib import Path

    from gbroker.security import runtime
    from gbroker.security.auth import Tokens

    if os.environ.get("GBROKER_TOKEN"):
        return os.environ["GBROKER_TOKEN"]
    path = token_file or os.environ.get("GBROKER_TOKEN_FILE")
    if path:
        text = Path(path).read_text().strip()
        return text if len(text.split()) == 1 else Tokens.parse(text, path).first_token()
    return runtime.find_token(broker)


def _accounts(path: str) -> dict[str, str]:
    """``SUBMITTER ACCOUNT`` lines: which local account runs each user's jobs."""
    from gbroker.errors import InvalidInput

    accounts: dict[str, str] = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2:
                raise InvalidInput(f"{path}:{number}", "SUBMITTER ACCOUNT", line.strip())
            accounts[fields[0]] = fields[1]
    return accounts


def _size(text: str) -> int:
    from gbroker.errors import InvalidInput
    from netmon.service import parse_size

    try:
        return parse_size(text)
    except InvalidInput as exc:  # argparse names the option: "argument --max-upload: ..."
        raise argparse.ArgumentTypeError(f"expected {exc.expected}, got {text!r}") from None


def _migration_policy(text: str) -> str:
    from gbroker.core.dynamite import parse_migration_policy
    from gbroker.errors import InvalidInput

    try:
        parse_migration_policy(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


JOB_ARGUMENTS = (
    "job_cgroups",
    "job_memory",
    "job_processes",
    "job_file_size",
    "job_cpu_time",
    "job_open_files",
    "migrate_running",
)
"""The flags of :func:`add_job_arguments`, as argparse names them."""


def add_job_arguments(jobs: Any) -> None:
    """The site's confinement and default limits of a job (``serve``, and ``fleet up`` for
    every site)."""
    jobs.add_argument(
        "--job-cgroups",
        choices=("on", "off"),
        default="on",
        help="a cgroup per job (its cores, memory and processes held by the kernel, all it "
        "forks killed with it) where the host allows it (default on; a root broker only)",
    )
    jobs.add_argument(
        "--job-memory",
        type=_size,
        metavar="SIZE",
        help="memory of a job, e.g. 4GiB (its cgroup's memory.max; without cgroups, the "
        "address space of each of its processes)",
    )
    jobs.add_argument(
        "--job-processes",
        type=positive_int,
        metavar="N",
        help="processes of a job (its cgroup's pids.max; without, RLIMIT_NPROC of its user)",
    )
    jobs.add_argument("--job-file-size", type=_size, metavar="SIZE", help="largest file written")
    jobs.add_argument("--job-cpu-time", type=positive_int, metavar="S", help="CPU seconds")
    jobs.add_argument("--job-open-files", type=positive_int, metavar="N", help="open files")
    jobs.add_argument(
        "--migrate-running",
        type=_migration_policy,
        metavar="off|threshold=T,interval=S",
        help="move running jobs between sites by Dynamite's rule (docs/MIGRATION.md): every S "
        "seconds, a job of this owner moves from the most loaded site (load > T) to the freest "
        "(capacity > 1 - T) when the time saved exceeds the move's cost; default off",
    )


def job_serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    """:func:`add_job_arguments`' flags as given, as ``gbroker serve`` arguments."""
    out: list[str] = []
    for name in JOB_ARGUMENTS:
        value = getattr(args, name, None)
        if value is not None and not (name == "job_cgroups" and value == "on"):
            out += ["--" + name.replace("_", "-"), str(value)]
    return tuple(out)


def _read_secret(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path) as f:
        return f.read().strip() or None


def _add_mqtt_credential_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mqtt-password-file",
        help="file (mode 600) holding the site's MQTT password, for an MQTT broker with access "
        "control (e.g. FLEET/mqtt/SITE.password); never give a password on the command line",
    )
    parser.add_argument(
        "--mqtt-username", help="MQTT user name with --mqtt-password-file (default: the site)"
    )


def _mqtt_credentials(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(username, password)`` from ``--mqtt-username``/``--mqtt-password-file``, else Nones.

    The password is also kept out of every log line from now on.
    """
    from gbroker.errors import InvalidInput
    from gbroker.mqtt.accounts import read_password_file

    if args.mqtt_password_file is None:
        if args.mqtt_username is not None:
            raise InvalidInput("--mqtt-password-file", "a password file for --mqtt-username")
        return None, None
    password = read_password_file(args.mqtt_password_file)
    _redact_in_logs(password)
    return args.mqtt_username or args.site, password


class _Redacting:
    """A logging filter that masks one secret in every record it passes."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def filter(self, record: Any) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "***"), None
        return True


def _redact_in_logs(secret: str) -> None:
    import logging

    for handler in logging.getLogger().handlers:
        handler.addFilter(_Redacting(secret))


def _slurm_conf(args: argparse.Namespace) -> Any:
    """``--slurm-conf`` as a Path (None for a local site), checked against ``--manager``."""
    from pathlib import Path

    from gbroker.errors import InvalidInput

    if args.manager != "slurm":
        if args.slurm_conf is not None:
            raise InvalidInput("--manager", "slurm with --slurm-conf", args.manager)
        return None
    if args.slurm_conf is None:
        raise InvalidInput(
            "--slurm-conf", "the Slurm cluster's slurm.conf with --manager slurm, but it is missing"
        )
    path = Path(args.slurm_conf)
    if not path.is_file():
        raise InvalidInput("--slurm-conf", "an existing slurm.conf file", args.slurm_conf)
    return path.resolve()


def _cell_environment(args: argparse.Namespace) -> dict[str, str] | None:
    """A ``--manager gridengine`` site's Grid Engine client environment, taken as Grid Engine's
    users give it: from the broker's own environment (what sourcing a cell's
    ``SGE_ROOT/SGE_CELL/common/settings.sh`` sets). None for another manager."""
    import os
    from pathlib import Path

    from gbroker.errors import InvalidInput
    from gbroker.site.gridengine import ENVIRONMENT

    if args.manager != "gridengine":
        return None
    environment = {name: os.environ[name] for name in ENVIRONMENT if os.environ.get(name)}
    root = environment.get("SGE_ROOT")
    if root is None:
        raise InvalidInput(
            "SGE_ROOT",
            "the Grid Engine cell's root in the environment with --manager gridengine (source "
            "the cell's settings.sh), but it is not set",
        )
    cell = environment.get("SGE_CELL", "default")
    if not (Path(root) / cell / "common" / "act_qmaster").is_file():
        raise InvalidInput(
            "SGE_ROOT", f"the root of a Grid Engine cell {cell} (holding {cell}/common)", root
        )
    return environment


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os
    import signal
    from pathlib import Path

    from gbroker.core.dynamite import parse_migration_policy
    from gbroker.core.health import HealthPolicy
    from gbroker.core.liveness import HeartbeatPolicy
    from gbroker.daemon.bounded import Budget
    from gbroker.daemon.config import Retention
    from gbroker.daemon.server import BrokerDaemon, DaemonConfig
    from gbroker.site.backend import Limits
    from gbroker.site.identity import parse_range
    from gbroker.topology import load_topology

    refuse_sim_only(args.algorithm, "serve")
    if not sd_arguments_fit(args, "serve", "easy"):  # a broker's queue is EASY's
        return 2
    slurm_conf = _slurm_conf(args)
    cell_environment = _cell_environment(args)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.site} %(message)s")
    username, password = _mqtt_credentials(args)
    try:
        topology = load_topology(args.topology)
        policy = read_dispatch_policy(args)
        config = DaemonConfig(
            args.site,
            topology,
            Path(args.data_dir or f"gbroker-data/{args.site}"),
            policy,
            host=args.host,
            port=args.port,
            mqtt_url=args.mqtt,
            mqtt_username=username,
            mqtt_password=password,
            token_file=Path(args.token_file) if args.token_file else None,
            token=os.environ.get("GBROKER_TOKEN") or None,
            secret=_read_secret(args.secret_file),
            malleability=read_malleability_policy(args),
            sd_policy=read_sd_policy(args),
            migrate_running=parse_migration_policy(args.migrate_running or "off"),
            lease=args.lease,
            idempotency_window=args.idempotency_window,
            black_hole=None if args.black_hole == "off" else HealthPolicy.parse(args.black_hole),
            heartbeat=HeartbeatPolicy(args.heartbeat) if args.heartbeat > 0 else None,
            neighbour_grace=args.neighbour_grace,
            dcsmon_period=args.dcsmon_period,
            stop_jobs_on_exit=args.stop_jobs_on_exit,
            netmon=not args.no_netmon,
            netmon_period=args.netmon_period,
            netmon_sizes=args.netmon_sizes,
            forecaster=args.forecaster,
            dcsmon=not args.no_dcsmon,
            tls_cert=Path(args.tls_cert) if args.tls_cert else None,
            tls_key=Path(args.tls_key) if args.tls_key else None,
            tls_ca=Path(args.tls_ca) if args.tls_ca else None,
            run_as=args.run_as,
            allow_root=args.allow_root,
            allow_private_sources=args.allow_private_sources,
            accounts=_accounts(args.accounts) if args.accounts else {},
            uid_range=parse_range(args.uid_range),
            retention=Retention(days=args.retain_days, jobs=args.retain_jobs),
            **({} if args.max_upload is None else {"max_upload": args.max_upload}),
            **({} if args.max_bundle is None else {"max_bundle": args.max_bundle}),
            read_budget=Budget(args.read_budget, args.read_max_bytes, args.readers),
            coalloc_timeout=args.coalloc_timeout,
            coalloc_rounds=args.coalloc_rounds,
            job_limits=Limits(
                memory=args.job_memory,
                processes=args.job_processes,
                file_size=args.job_file_size,
                cpu_time=args.job_cpu_time,
                open_files=args.job_open_files,
            ),
            job_cgroups=args.job_cgroups == "on",
            manager=args.manager,
            slurm_conf=slurm_conf,
            cell_environment=cell_environment,
            jobs_dir=None if args.jobs_dir is None else Path(args.jobs_dir).absolute(),
        )
        daemon = BrokerDaemon(config)
    except OSError as exc:  # the topology, or what the broker keeps (its data, the uids')
        where = exc.filename or args.topology
        print(f"gbroker serve: cannot use {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

        def stop_with_jobs() -> None:  # `fleet down` without --keep-jobs
            daemon.stop_jobs_on_exit = True
            stop.set()

        loop.add_signal_handler(signal.SIGUSR1, stop_with_jobs)
        async with daemon:
            logging.info("broker %s serving on %s", args.site, daemon.url)
            await stop.wait()
            logging.info("broker %s shutting down", args.site)

    asyncio.run(serve())
    return 0


def _add_serve_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "serve",
        help="run one site's broker daemon",
        description="Run the broker daemon of one site of a topology: the client and peer HTTP "
        "APIs, the local scheduler running real processes, and the journal. Stops on SIGINT or "
        "SIGTERM (leaving running jobs for the next start to adopt, unless "
        "--stop-jobs-on-exit), or on SIGUSR1 stopping its running jobs too.",
    )
    sp.add_argument("--site", required=True, help="this broker's site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file")
    add_policy_arguments(sp, required=False)
    add_malleability_arguments(sp, fraction=False)
    add_sd_arguments(sp)
    sp.add_argument("--data-dir", help="journal and job directories (default gbroker-data/SITE)")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    sp.add_argument(
        "--port",
        type=non_negative_int,
        default=0,
        help="port (default: the one in the site's http endpoint)",
    )
    sp.add_argument("--mqtt", help="MQTT broker URL for DCSMon and liveness")
    _add_mqtt_credential_arguments(sp)
    sp.add_argument(
        "--token-file",
        help="client tokens, one 'NAME TOKEN [admin]' a line (default: $GBROKER_TOKEN, else "
        "DATA_DIR/tokens, generated with one admin token on first start)",
    )
    sp.add_argument(
        "--secret-file",
        help="file holding the fleet secret peers sign with (default DATA_DIR/secret, generated; "
        "every broker of a fleet needs the same)",
    )
    manager = sp.add_argument_group("the site's resource manager")
    manager.add_argument(
        "--manager",
        choices=("local", "slurm", "gridengine"),  # gbroker.topology.model.MANAGERS
        default="local",
        help="how the site runs its jobs: local, the broker's own processes (default); "
        "slurm, the jobs submitted to a Slurm cluster (sbatch, squeue, scancel; needs "
        "--slurm-conf); or gridengine, to a Grid Engine cell (qsub, qstat, qacct, qdel; the "
        "cell from the broker's environment: SGE_ROOT, SGE_CELL, SGE_QMASTER_PORT and "
        "SGE_EXECD_PORT, as its settings.sh sets them)",
    )
    manager.add_argument(
        "--slurm-conf",
        metavar="PATH",
        help="the slurm.conf of the site's Slurm cluster (required with --manager slurm; "
        "`fleet up` passes the one of the cluster it starts for a site with manager: slurm)",
    )
    manager.add_argument(
        "--jobs-dir",
        metavar="DIR",
        help="where job directories live (default DATA_DIR/jobs); for a batch-system site, a "
        "directory of a file system the cluster's nodes share, which jobs' accounts can reach "
        "(`fleet up` gives a Slurm or Grid Engine site one beside its cluster or cell)",
    )
    jobs = sp.add_argument_group("jobs: who they run as, and their default limits")
    jobs.add_argument(
        "--run-as",
        metavar="USER",
        help="run the jobs of every user not in --accounts as this one local account, when "
        "the broker runs as root (they then share it; default: a uid of each user's own, "
        "from --uid-range)",
    )
    jobs.add_argument(
        "--allow-root",
        action="store_true",
        help="let jobs run as root (only if --run-as root or an account map says so)",
    )
    jobs.add_argument(
        "--uid-range",
        metavar="FIRST-LAST",
        default="1879048192-1879113727",  # gbroker.site.identity.DEFAULT_RANGE
        help="the uids a root broker gives users not in --accounts, one of its own each, "
        "stable across restarts (no passwd entry needed; default 1879048192-1879113727, "
        "above every range a Linux host assigns; brokers on one host need ranges apart: a "
        "fleet gives each site its own)",
    )
    jobs.add_argument(
        "--accounts", metavar="FILE", help="'SUBMITTER ACCOUNT' lines: whose jobs run as whom"
    )
    jobs.add_argument(
        "--allow-private-sources",
        action="store_true",
        help="let jobs stage inputs from loopback, private and link-local hosts (default: "
        "public hosts and the fleet's file stores only)",
    )
    add_job_arguments(jobs)
    sp.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate")
    sp.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    sp.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="the fleet CA (PEM) that peers, their client certificates and an mqtts:// broker "
        "are verified against (default: the system's CAs)",
    )
    sp.add_argument(
        "--lease",
        type=positive_float,
        default=30.0,
        help="seconds a site may start a job dispatched to it without asking the owner again; "
        "a lost site's waiting jobs move elsewhere once it runs out (default 30)",
    )
    sp.add_argument(
        "--retain-days",
        type=positive_float,
        default=30.0,
        metavar="D",
        help="keep finished jobs (status, history, output) queryable D days (default 30)",
    )
    sp.add_argument(
        "--retain-jobs",
        type=non_negative_int,
        default=1_000_000,
        metavar="N",
        help="keep at most N finished jobs, purging the oldest first (default 1000000)",
    )
    sp.add_argument(
        "--max-upload",
        type=_size,
        metavar="SIZE",
        help="largest file in the broker's file store: an upload (PUT /files) larger gets 413, "
        "a job's stage-out to gbroker:store larger (by its length, sparse or not) fails the job; "
        "e.g. 8GiB (default 1GiB)",
    )
    sp.add_argument(
        "--max-bundle",
        type=_size,
        metavar="SIZE",
        help="largest bundle (checkpoint image and job directory, files at their apparent "
        "size) of a running job moved from or to this site: a larger move is refused and the "
        "job runs on (default: --max-upload)",
    )
    sp.add_argument(
        "--coalloc-timeout",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="how long this broker holds the claims of a co-allocated job's components for all "
        "of them to get their cores; then each queues again (default 60)",
    )
    sp.add_argument(
        "--coalloc-rounds",
        type=positive_int,
        default=10,
        metavar="N",
        help="rounds of --coalloc-timeout a co-allocated job is tried before it fails (default 10)",
    )
    sp.add_argument(
        "--read-budget",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="how long reading one submission may take (a sweep expanded, its XPaths evaluated, "
        "a large document parsed), in a worker process killed past it: the submission gets a "
        "400 naming the budget (default 5)",
    )
    sp.add_argument(
        "--read-max-bytes",
        type=_size,
        default=64 << 20,
        metavar="SIZE",
        help="the most one submission's jobs may weigh once read (a sweep's elements, pickled); "
        "a larger one gets a 400 naming it (default 64MiB)",
    )
    sp.add_argument(
        "--readers",
        type=positive_int,
        default=2,
        metavar="N",
        help="worker processes reading sweeps and large submissions at once (default 2)",
    )
    sp.add_argument(
        "--idempotency-window",
        type=positive_float,
        default=24 * 3600.0,
        metavar="SECONDS",
        help="how long a submission's Idempotency-Key is remembered: a retry within it returns "
        "the first job (default 86400)",
    )
    sp.add_argument(
        "--black-hole",
        metavar="SPEC",
        default="",
        help="black-hole protection: 'off', or name=value pairs overriding the defaults "
        "(fast=10 s, window=600 s, min_outcomes=5, suspect_excess=0.3, penalty=2, "
        "exclude_excess=0.6, cooldown=300 s), e.g. 'fast=5,cooldown=60'",
    )
    sp.add_argument(
        "--heartbeat",
        metavar="S",
        type=non_negative_float,
        default=2.0,
        help="ping the neighbours MQTT does not vouch for (all of them while the MQTT link is "
        "down) every S s; 3 missed in a row make one lost (default 2; 0 = off)",
    )
    sp.add_argument(
        "--neighbour-grace",
        metavar="S",
        type=non_negative_float,
        default=None,
        help="after S s, take a neighbour never heard from (no DCSMon state, no online word "
        "over MQTT, no heartbeat answer) as idle, as the topology describes it (default: "
        "never: only neighbours heard from are candidates, so a broker alone runs its own "
        "jobs at once)",
    )
    sp.add_argument(
        "--dcsmon-period",
        type=positive_float,
        default=1.0,
        help="publish the site's state at most this often, in s (default 1)",
    )
    sp.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="stop the jobs running here when the broker stops (default: leave them running; "
        "the restarted broker adopts them)",
    )
    _add_netmon_arguments(sp, prefix="--netmon-")
    sp.add_argument(
        "--no-netmon",
        action="store_true",
        help="do not run NetMon in-process (e.g. run `gbroker netmon serve` instead)",
    )
    sp.add_argument(
        "--no-dcsmon",
        action="store_true",
        help="do not publish the site's state in-process (e.g. run `gbroker dcsmon serve`)",
    )
    sp.set_defaults(run=_cmd_serve)


def _sizes(text: str) -> tuple[int, ...]:
    from gbroker.errors import InvalidInput
    from netmon.service import parse_sizes

    try:
        return parse_sizes(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_netmon_arguments(parser: argparse.ArgumentParser, prefix: str) -> None:
    """NetMon's period and test sizes: ``--netmon-period`` for serve, ``--period`` standalone."""
    parser.add_argument(
        f"{prefix}period",
        type=positive_float,
        default=300.0,
        help="seconds between NetMon probe rounds (default 300)",
    )
    parser.add_argument(
        f"{prefix}sizes",
        type=_sizes,
        default=(1 << 20, 8 << 20),
        metavar="SIZES",
        help="NetMon test sizes, comma-separated, e.g. 64KiB,1MiB,8MB (default 1MiB,8MiB)",
    )
    add_forecaster_argument(parser)


def add_forecaster_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--forecaster",
        choices=("table", "ensemble"),  # netmon.ensemble.FORECASTERS, without importing it
        default="table",
        help="transfer-time forecaster: the paper's piecewise-linear table of NetMon's probes "
        "(default), or an NWS-style ensemble per test size interpolated the same way",
    )


async def _until_signalled(service: Any) -> None:
    """Run ``service`` until it ends, or until SIGINT/SIGTERM cancels it."""
    import asyncio
    import signal

    task = asyncio.ensure_future(service)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise


def _monitor_site(args: argparse.Namespace) -> tuple[Topology, str]:
    """The topology and this monitor's MQTT URL (``--mqtt``, else the site's in the topology)."""
    from gbroker.errors import InvalidInput
    from gbroker.topology import load_topology

    topology = load_topology(args.topology)
    if args.site not in topology.sites:
        raise InvalidInput("--site", f"a site of {topology.name}", args.site)
    mqtt = args.mqtt or topology.sites[args.site].mqtt
    if mqtt is None:
        raise InvalidInput("--mqtt", "an MQTT URL (the topology names none for the site)")
    return topology, mqtt


def _cmd_monitor(args: argparse.Namespace) -> int:
    """``gbroker dcsmon serve`` and ``gbroker netmon serve``: a monitor as its own process."""
    import asyncio
    import logging

    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {args.site} {args.command} %(message)s"
    )
    try:
        topology, mqtt = _monitor_site(args)
    except OSError as exc:
        print(
            f"gbroker {args.command}: cannot read {args.topology}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    username, password = _mqtt_credentials(args)
    if args.command == "dcsmon":
        from gbroker.daemon.monitors import serve_dcsmon
        from gbroker.errors import InvalidInput

        broker = args.broker_url or topology.sites[args.site].http
        if broker is None:
            raise InvalidInput("--broker-url", "the site's broker URL (the topology names none)")
        service = serve_dcsmon(
            args.site,
            broker,
            mqtt,
            period=args.period,
            token=client_token(broker, args.token_file),
            mqtt_username=username,
            mqtt_password=password,
        )
        logging.info("dcsmon of %s: sampling %s, publishing on %s", args.site, broker, mqtt)
    else:
        from gbroker.daemon.monitors import serve_netmon
        from gbroker.daemon.peers import PeerClient
        from gbroker.errors import InvalidInput
        from gbroker.security.auth import PeerSigner
        from netmon.ensemble import make_forecaster

        secret = _read_secret(args.secret_file)
        if secret is None:
            raise InvalidInput("--secret-file", "the fleet secret (probes are peer requests)")
        peers = {name: spec.http for name, spec in topology.sites.items() if spec.http}
        # Signs a probe for the site whose URL it goes to (and for nothing else).
        signer = PeerClient(args.site, peers, PeerSigner(args.site, secret), lambda *_: None)
        service = serve_netmon(
            args.site,
            topology.neighbours(args.site),
            peers,
            mqtt,
            make_forecaster(args.forecaster, topology.default_link.bandwidth),
            mqtt_username=username,
            mqtt_password=password,
            sizes=args.sizes,
            period=args.period,
            sign=signer.headers,
        )
        logging.info(
            "netmon of %s: probing %s every %g s, publishing on %s",
            args.site,
            ", ".join(topology.neighbours(args.site)) or "no neighbours",
            args.period,
            mqtt,
        )
    asyncio.run(_until_signalled(service))
    return 0


def _add_monitor_parsers(sub: Any) -> None:
    dp = sub.add_parser(
        "dcsmon",
        help="run a site's DCSMon on its own (it runs inside `gbroker serve` by default)",
    )
    actions = dp.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser(
        "serve",
        help="sample the site's broker over HTTP and publish its state on MQTT",
        description="Sample the site's broker (GET /api/v1/state) every period and publish "
        "the state (retained) on MQTT when it changes. Run the broker with --no-dcsmon. "
        "Stops on SIGINT or SIGTERM.",
    )
    sp.add_argument("--site", required=True, help="the monitored site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file")
    sp.add_argument("--broker-url", help="the site's broker (default: its http endpoint)")
    sp.add_argument("--mqtt", help="MQTT broker URL (default: the site's mqtt endpoint)")
    _add_mqtt_credential_arguments(sp)
    sp.add_argument(
        "--period", type=positive_float, default=1.0, help="seconds between samples (default 1)"
    )
    add_token_file_argument(sp)
    sp.set_defaults(run=_cmd_monitor)

    np = sub.add_parser(
        "netmon",
        help="run a site's NetMon on its own (it runs inside `gbroker serve` by default)",
    )
    actions = np.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser(
        "serve",
        help="probe the neighbours over HTTP and publish the forecast table on MQTT",
        description="Every period, upload test blobs of the configured sizes to each "
        "neighbour's probe endpoint, time them, and publish the site's piecewise-linear "
        "forecast table (retained) on MQTT. Run the broker with --no-netmon. Stops on SIGINT "
        "or SIGTERM.",
    )
    sp.add_argument("--site", required=True, help="the measuring site (a name in the topology)")
    sp.add_argument("--topology", required=True, help="topology YAML file (neighbours, URLs)")
    sp.add_argument("--mqtt", help="MQTT broker URL (default: the site's mqtt endpoint)")
    _add_mqtt_credential_arguments(sp)
    _add_netmon_arguments(sp, prefix="--")
    sp.add_argument(
        "--secret-file", help="file holding the fleet secret peers sign with (required)"
    )
    sp.set_defaults(run=_cmd_monitor)


def _cmd_mqtt_serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    from pathlib import Path

    from gbroker.errors import InvalidInput
    from gbroker.mqtt.accounts import TopicAcl, read_amqtt_password_file
    from gbroker.mqtt.broker import EmbeddedBroker
    from gbroker.security.tls import server_context

    if args.password_file is None:
        if args.acl_file is not None:
            raise InvalidInput("--acl-file", "a --password-file to go with it")
        if not args.allow_anonymous:
            raise InvalidInput(
                "--password-file", "a password file (or --allow-anonymous, for tests only)"
            )
        users, acl = None, None
    else:
        if args.allow_anonymous:
            raise InvalidInput("--allow-anonymous", "no --password-file with it")
        users = read_amqtt_password_file(args.password_file)
        acl = TopicAcl.load(args.acl_file) if args.acl_file else None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidInput("--tls-cert", "both --tls-cert and --tls-key, or neither")
    tls = server_context(Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with EmbeddedBroker(
            args.host, args.port, users=users, acl=acl, ssl_context=tls
        ) as broker:
            access = "anyone" if users is None else f"{len(users)} users"
            print(f"embedded MQTT broker on {broker.url} ({access})", flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0


def _add_mqtt_serve_parser(sub: Any) -> None:
    mp = sub.add_parser(
        "mqtt-serve",
        help="run an embedded MQTT broker (amqtt) until SIGTERM",
        description="Run an amqtt MQTT broker. Only the users of --password-file may connect "
        "(lines user:<argon2 hash>, as `gbroker fleet up` writes in FLEET/mqtt/passwords), "
        "each under the topic ACL of --acl-file (YAML: publish/subscribe: {user: [filters]}; "
        "default: each user is a site that publishes under gbroker/v1/site/<user>/# and "
        "reads gbroker/v1/site/+/#).",
    )
    mp.add_argument("--host", default="127.0.0.1")
    mp.add_argument("--port", type=non_negative_int, default=1883)
    mp.add_argument("--password-file", help="user:<argon2 hash> lines (FLEET/mqtt/passwords)")
    mp.add_argument("--acl-file", help="topic ACL, YAML (FLEET/mqtt/acl.yaml)")
    mp.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="let anyone connect and publish anywhere, without --password-file (tests only)",
    )
    mp.add_argument("--tls-cert", metavar="FILE", help="listen with TLS (mqtts) with this cert")
    mp.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    mp.set_defaults(run=_cmd_mqtt_serve)


def add_parsers(sub: Any) -> None:
    _add_serve_parser(sub)
    _add_monitor_parsers(sub)
    _add_mqtt_serve_parser(sub)
