"""A private Grid Engine cell per site: what ``fleet up`` starts for a ``manager: gridengine``
site of a local fleet, and ``fleet down`` stops.

Theory of operation. Debian's Grid Engine 8.1.9 is made to run a cell that lives entirely in one
directory: ``SGE_ROOT`` is ``<directory>/root`` (links to the packaged programs), the cell
``gbroker`` spooled there in plain files, with its qmaster and execd on ports of their own
(:func:`gbroker.fleet.ports.free_port`). So several cells run side by side on one host, and
nothing of the system's is read or touched. The cell is made as Debian's own ``init_cluster``
makes one, then gets a parallel environment ``gbroker`` and a queue of the site's slots on this
host; :func:`start_cell` returns once the queue offers its slots.

Both daemons run as root, as Grid Engine's do: the execd starts each job as the user who
submitted it. What a back-end needs to reach the cell is its :attr:`Cell.environment`: a fleet
hands it to the site's broker (:mod:`gbroker.site.gridengine`). :func:`stop_cell` asks the execd,
then the qmaster, to end, and SIGKILLs whatever of the cell is left soon after. A fleet's site
runs its cell as a :class:`SiteCell`: the cell and the site's job directories in a directory of
their own under ``/tmp`` (:func:`gbroker.fleet.members.shared_directory`), which the jobs'
accounts reach wherever the fleet's directory is: the shared file system of a real cluster.

The cell's configuration step by step, and why: docs/SITES.md, "The clusters a local fleet
starts".
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbroker.fleet.members import FleetError, shared_directory
from gbroker.fleet.ports import free_port

__all__ = [
    "CELL",
    "ENSURE",
    "PE",
    "QUEUE",
    "TOOLS",
    "Cell",
    "GridEngineError",
    "SiteCell",
    "daemons",
    "missing_tools",
    "start_cell",
    "stop_cell",
]

CELL = "gbroker"
"""The name of every cell started here (``SGE_CELL``); cells differ by their ``SGE_ROOT``."""

QUEUE = "gbroker.q"
"""The cell's one queue."""

PE = "gbroker"
"""The cell's parallel environment: a job's slots all on one host (``$pe_slots``)."""

TOOLS = ("sge_qmaster", "sge_execd", "qsub", "qstat", "qdel", "qrls", "qhost", "qconf", "qacct")
ENSURE = "scripts/setup/ensure_gridengine.sh"

_PACKAGED = Path("/var/lib/gridengine")  # gridengine-common's SGE_ROOT: bin, lib, utilbin links
_SHARE = Path("/usr/share/gridengine")
_UTILBIN = Path("/usr/lib/gridengine")
# Debian installs the daemons in /usr/sbin, which may be missing from a user's PATH.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_COMMAND_TIMEOUT = 30.0


class GridEngineError(FleetError):
    """A Grid Engine cell could not be made, started or stopped; the message says what."""


def missing_tools() -> list[str]:
    """The Grid Engine programs this host lacks (empty: :func:`start_cell` can run)."""
    missing = [tool for tool in TOOLS if shutil.which(tool, path=_SEARCH_PATH) is None]
    helpers = ("spoolinit", "spooldefaults")
    missing.extend(h for h in helpers if not os.access(_UTILBIN / h, os.X_OK))
    return missing


@dataclass(frozen=True, slots=True)
class Cell:
    """A running private cell: where it lives, its ports and its size."""

    directory: Path
    qmaster_port: int
    execd_port: int
    slots: int
    host: str

    @property
    def root(self) -> Path:
        """The cell's ``SGE_ROOT``."""
        return self.directory / "root"

    @property
    def spool(self) -> Path:
        return self.directory / "spool"

    @property
    def environment(self) -> dict[str, str]:
        """What a client (``qsub``, ``qstat``...) needs to reach this cell."""
        return {
            "SGE_ROOT": str(self.root),
            "SGE_CELL": CELL,
            "SGE_QMASTER_PORT": str(self.qmaster_port),
            "SGE_EXECD_PORT": str(self.execd_port),
        }

    def as_dict(self) -> dict[str, Any]:
        """What ``fleet.json`` records of it."""
        return {
            "directory": str(self.directory),
            "qmaster_port": self.qmaster_port,
            "execd_port": self.execd_port,
            "slots": self.slots,
            "host": self.host,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Cell:
        return cls(
            Path(record["directory"]),
            int(record["qmaster_port"]),
            int(record["execd_port"]),
            int(record["slots"]),
            str(record["host"]),
        )


def _host_names() -> tuple[str, tuple[str, ...]]:
    """This host's name as Grid Engine knows it, and the names its addresses resolve back to
    (``localhost`` where ``/etc/hosts`` puts the host's name on 127.0.0.1): the cell's aliases
    for it."""
    host = socket.gethostname().split(".")[0]
    aliases: set[str] = {"localhost"}
    with contextlib.suppress(OSError):
        for address in socket.gethostbyname_ex(host)[2]:
            with contextlib.suppress(OSError):
                name, others, _ = socket.gethostbyaddr(address)
                aliases.update([name, *others])
    aliases.discard(host)
    return host, tuple(sorted(aliases))


def _bootstrap(root: Path, spool: Path) -> str:
    return "\n".join(
        [
            "admin_user              none",
            "default_domain          none",
            "ignore_fqdn             true",
            "spooling_method         classic",
            "spooling_lib            libspoolc",
            f"spooling_params         {root / CELL / 'common'};{spool / 'qmaster'}",
            "binary_path             /usr/sbin",
            f"qmaster_spool_dir       {spool / 'qmaster'}",
            "security_mode           none",
            "listener_threads        2",
            "worker_threads          2",
            "scheduler_threads       1",
            "",
        ]
    )


def _configuration(spool: Path) -> str:
    """Debian's default global configuration, with the execd spooling in the cell's directory
    and accounting written at once (``qacct`` then knows a job's exit status a second after)."""
    changed = {
        "execd_spool_dir": str(spool / "execd"),
        "reporting_params": (
            "accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00"
        ),
        "load_report_time": "00:00:05",
        "mailer": "/bin/true",
    }
    lines = []
    for line in (_SHARE / "default-configuration").read_text().splitlines():
        name = line.split(maxsplit=1)[0] if line.strip() else ""
        lines.append(f"{name} {changed[name]}" if name in changed else line)
    return "\n".join(lines) + "\n"


def _parallel_environment(slots: int) -> str:
    return "\n".join(
        [
            f"pe_name            {PE}",
            f"slots              {slots}",
            "user_lists         NONE",
            "xuser_lists        NONE",
            "start_proc_args    NONE",
            "stop_proc_args     NONE",
            "allocation_rule    $pe_slots",
            "control_slaves     TRUE",
            "job_is_first_task  TRUE",
            "urgency_slots      min",
            "accounting_summary TRUE",
            "qsort_args         NONE",
            "",
        ]
    )


class _Commands:
    """Grid Engine's commands against one cell."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.env = {**os.environ, "PATH": _SEARCH_PATH, **cell.environment}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        tool = shutil.which(argv[0], path=_SEARCH_PATH) or argv[0]
        try:
            done = subprocess.run(
                [tool, *argv[1:]],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GridEngineError(f"{' '.join(argv)}: {exc}") from exc
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip().replace("\n", " / ")
            raise GridEngineError(f"{' '.join(argv)} failed (exit {done.returncode}): {said}")
        return done


def start_cell(directory: Path, slots: int, timeout: float = 60.0) -> Cell:
    """Make and start a cell of ``slots`` slots in ``directory`` (created; it must not hold a
    cell yet); returns once its queue offers its slots. Raises :class:`GridEngineError` (having
    stopped what it started) if Grid Engine is missing or the cell does not come up within
    ``timeout`` seconds."""
    missing = missing_tools()
    if missing:
        raise GridEngineError(
            f"Grid Engine is not installed ({', '.join(missing)} missing): run `bash {ENSURE}`"
        )
    if slots < 1:
        raise GridEngineError(f"a cell needs at least one slot, not {slots}")
    directory = Path(directory).resolve()
    if (directory / "root").exists():
        raise GridEngineError(f"{directory} already holds a Grid Engine cell")
    host, aliases = _host_names()
    cell = Cell(directory, free_port(), free_port(), slots, host)
    try:
        _make(cell, aliases)
        _start(cell, time.monotonic() + timeout)
    except BaseException:
        stop_cell(cell, grace=2.0)
        raise
    return cell


def _make(cell: Cell, aliases: tuple[str, ...]) -> None:
    common = cell.root / CELL / "common"
    common.mkdir(parents=True)
    (cell.spool / "qmaster").mkdir(parents=True)
    (cell.spool / "execd").mkdir(parents=True)
    for name in ("bin", "lib", "utilbin"):
        (cell.root / name).symlink_to(_PACKAGED / name)
    (cell.root / "util").symlink_to(_SHARE / "util")
    (common / "bootstrap").write_text(_bootstrap(cell.root, cell.spool))
    (common / "act_qmaster").write_text(cell.host + "\n")
    (common / "host_aliases").write_text(" ".join((cell.host, *aliases)) + "\n")
    configuration = cell.directory / "configuration"
    configuration.write_text(_configuration(cell.spool))
    commands = _Commands(cell)
    spooling = f"{common};{cell.spool / 'qmaster'}"
    commands.run(str(_UTILBIN / "spoolinit"), "classic", "libspoolc", spooling, "init")
    defaults = str(_UTILBIN / "spooldefaults")
    resources = _SHARE / "util" / "resources"
    commands.run(defaults, "configuration", str(configuration))
    commands.run(defaults, "complexes", str(resources / "centry"))
    commands.run(defaults, "usersets", str(resources / "usersets"))
    managers = {"root", _user_name()}
    commands.run(defaults, "managers", *sorted(managers))


def _user_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _start(cell: Cell, deadline: float) -> None:
    commands = _Commands(cell)
    commands.run("sge_qmaster")
    _until(deadline, "its qmaster to answer", lambda: commands.run("qconf", "-sh", check=False))
    # The qmaster host is an administrative host already; it submits too.
    commands.run("qconf", "-as", cell.host)
    pe_file = cell.directory / "pe"
    pe_file.write_text(_parallel_environment(cell.slots))
    commands.run("qconf", "-Ap", str(pe_file))
    queue_file = cell.directory / "queue"
    queue_file.write_text(_queue(cell))
    commands.run("qconf", "-Aq", str(queue_file))
    scheduler = commands.run("qconf", "-ssconf").stdout
    quick = {"schedule_interval": "0:0:1", "flush_submit_sec": "1", "flush_finish_sec": "1"}
    lines = []
    for line in scheduler.splitlines():
        name = line.split(maxsplit=1)[0] if line.strip() else ""
        lines.append(f"{name} {quick[name]}" if name in quick else line)
    scheduler_file = cell.directory / "scheduler"
    scheduler_file.write_text("\n".join(lines) + "\n")
    commands.run("qconf", "-Msconf", str(scheduler_file))
    commands.run("sge_execd")
    _until(deadline, f"its queue {QUEUE} to offer {cell.slots} slots", lambda: _offered(commands))


_QUEUE_DEFAULTS = {
    "seq_no": "0",
    "load_thresholds": "NONE",
    "suspend_thresholds": "NONE",
    "nsuspend": "1",
    "suspend_interval": "00:05:00",
    "priority": "0",
    "min_cpu_interval": "00:05:00",
    "processors": "UNDEFINED",
    "qtype": "BATCH",
    "ckpt_list": "NONE",
    "rerun": "FALSE",
    "tmpdir": "/tmp",
    "shell": "/bin/sh",
    "prolog": "NONE",
    "epilog": "NONE",
    "shell_start_mode": "posix_compliant",
    "starter_method": "NONE",
    "suspend_method": "NONE",
    "resume_method": "NONE",
    "terminate_method": "NONE",
    "notify": "00:00:60",
    "owner_list": "NONE",
    "user_lists": "NONE",
    "xuser_lists": "NONE",
    "subordinate_list": "NONE",
    "complex_values": "NONE",
    "projects": "NONE",
    "xprojects": "NONE",
    "calendar": "NONE",
    "initial_state": "default",
    **{
        f"{kind}_{limit}": "INFINITY"
        for limit in ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem")
        for kind in ("s", "h")
    },
}


def _queue(cell: Cell) -> str:
    """The cell's queue: ``slots`` slots on this host, batch jobs, the cell's parallel
    environment, no load threshold (a busy test machine must not close it)."""
    fields = {
        "qname": QUEUE,
        "hostlist": cell.host,
        "pe_list": PE,
        "slots": str(cell.slots),
        **_QUEUE_DEFAULTS,
    }
    return "\n".join(f"{name} {value}" for name, value in fields.items()) + "\n"


def _offered(commands: _Commands) -> bool:
    """Whether the queue's instance on this host is up (no state: not unknown, not
    disabled), i.e. the execd has reported."""
    done = commands.run("qstat", "-f", "-q", QUEUE, check=False)
    for line in done.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == f"{QUEUE}@{commands.cell.host}":
            return len(parts) == 5  # name, type, used/total, load, arch: no states column
    return False


def _until(deadline: float, what: str, ready: Any) -> None:
    while True:
        outcome = ready()
        if outcome is True or (
            isinstance(outcome, subprocess.CompletedProcess) and outcome.returncode == 0
        ):
            return
        if time.monotonic() >= deadline:
            raise GridEngineError(f"the Grid Engine cell did not come up: waited for {what}")
        time.sleep(0.1)


def _pids(cell: Cell) -> list[int]:
    """The cell's daemons (by their pid files) and every process carrying its ``SGE_ROOT``."""
    found: set[int] = set()
    for pid_file in [cell.spool / "qmaster" / "qmaster.pid", *cell.spool.glob("execd/*/execd.pid")]:
        with contextlib.suppress(OSError, ValueError):
            found.add(int(pid_file.read_text().split()[0]))
    marker = b"SGE_ROOT=" + os.fsencode(str(cell.root))
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.add(int(entry))
        except OSError:
            continue
    return sorted(pid for pid in found if _alive(pid))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def stop_cell(cell: Cell, grace: float = 10.0) -> int:
    """Stop the cell: its execd kills its jobs and ends (within ``grace`` seconds), then its
    qmaster is asked to end, and whatever of the cell is left a second later is killed (a
    qmaster takes seconds over a controlled shutdown; the cell is thrown away). Idempotent; its
    directory stays. Returns how many jobs the cell still had (0 if its qmaster did not say)."""
    commands = _Commands(cell)
    qmaster = _qmaster_pid(cell)
    listed = commands.run("qstat", "-u", "*", "-xml", check=False) if qmaster else None
    jobs = listed.stdout.count("<JB_job_number>") if listed and listed.returncode == 0 else 0
    with contextlib.suppress(GridEngineError):
        commands.run("qconf", "-kej", cell.host, check=False)
    deadline = time.monotonic() + grace
    while set(_pids(cell)) - {qmaster} and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(GridEngineError):
        commands.run("qconf", "-km", check=False)
    deadline = time.monotonic() + min(grace, 1.0)
    while _pids(cell) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _pids(cell):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # a SIGKILLed process is gone soon, not at once
    while _pids(cell) and time.monotonic() < deadline:
        time.sleep(0.05)
    return jobs


def daemons(cell: Cell) -> dict[str, bool]:
    """Whether the cell's ``sge_qmaster`` and ``sge_execd`` run (by their pid files, each
    checked to be the cell's: a pid in an old file may be another process's)."""
    ours = set(_pids(cell))
    execd = [*cell.spool.glob("execd/*/execd.pid")]
    found = {"sge_qmaster": _qmaster_pid(cell), "sge_execd": _pid_in(execd[0]) if execd else None}
    return {name: pid is not None and pid in ours for name, pid in found.items()}


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class SiteCell:
    """A fleet site's cell and its job directories, in a directory of their own (see the
    module's docstring); what ``fleet.json`` records of it (:meth:`record`) is enough to stop it
    from another process (:meth:`from_record`)."""

    def __init__(self, shared: Path, cell: Cell) -> None:
        self.shared = shared
        self.cell = cell

    @classmethod
    def start(cls, slots: int, deadline: float) -> SiteCell:
        """Make and start a cell of ``slots`` slots, up by ``deadline`` (a ``time.monotonic()``
        value); on failure, nothing of it is left."""
        shared = shared_directory("gbroker-ge-")
        try:
            (shared / "jobs").mkdir(mode=0o711)
            timeout = max(deadline - time.monotonic(), 1.0)
            return cls(shared, start_cell(shared / "cell", slots, timeout))
        except BaseException:
            shutil.rmtree(shared, ignore_errors=True)
            raise

    @property
    def jobs_dir(self) -> Path:
        """The job directories of the site in front of the cell (``serve --jobs-dir``)."""
        return self.shared / "jobs"

    def record(self) -> dict[str, Any]:
        return {"shared": str(self.shared), **self.cell.as_dict(), "sge_root": str(self.cell.root)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SiteCell:
        return cls(Path(record["shared"]), Cell.from_dict(record))

    def serve_args(self) -> tuple[str, ...]:
        """``gbroker serve``'s arguments for the site in front of this cell (the cell itself
        comes in the broker's environment: :meth:`environment`)."""
        return ("--manager", "gridengine", "--jobs-dir", str(self.jobs_dir))

    def environment(self) -> dict[str, str]:
        """The site's broker's environment: the cell's, as sourcing its settings.sh sets it."""
        return self.cell.environment

    def setting(self) -> str:
        """Where the cell is, as its users would set it (``fleet status``)."""
        return f"SGE_ROOT={self.cell.root}"

    def wait_idle(self, deadline: float) -> None:
        """Nothing to wait for: :meth:`start` returned once the cell's queue offered its slots."""

    def alive(self) -> dict[str, bool]:
        return daemons(self.cell)

    def stop(self, grace: float = 10.0, cancel: bool = True) -> int:
        """Stop the cell (its jobs killed, ``cancel`` or not: a cell outliving its fleet would be
        nobody's) and remove its directory; how many jobs it still had."""
        jobs = stop_cell(self.cell, grace)
        shutil.rmtree(self.shared, ignore_errors=True)
        return jobs


def _qmaster_pid(cell: Cell) -> int | None:
    try:
        return int((cell.spool / "qmaster" / "qmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
