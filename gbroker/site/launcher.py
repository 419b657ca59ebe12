"""The launchers: a few long-lived processes per job root that fork every job and outlive brokers.

Theory of operation. Each job root has one or more small launchers (``python -I -S launcher.py
<root>``: standard library only, nothing of the broker's packages), each in a session of its own
so that a broker's ``killpg`` never reaches it, reached on a Unix socket of the root (mode 0600:
only the broker's user may speak to a launcher that can run jobs as anyone) and made the root's
only launcher of its number by an exclusive ``flock``. The launcher *is* the jobs' supervisor:
each job is its direct child, so it sees every exit status whether or not a broker is there; it
holds no state a broker needs but its children, so brokers come and go. Why not a ``python``
supervisor per job, or a fork of the broker: both cost several times the CPU per start.

Per job it prepares the job's directory, opens the job's streams under the job's *effective*
ids only, and spawns the job (:func:`_spawn`: ``gbroker-exec`` by ``posix_spawn``, else a fork)
into a new session and the job's cgroup, as the job's account. Its *real* uid never becomes a
job's: the kernel lets a process signal another only if its real or effective uid is the
target's real or saved one, so no job can signal (or kill) the launcher. rlimits are never set
on the launcher itself (a lowered hard limit could not be raised back), and the signals it
passes on are caught, never ignored, so every ``exec`` sets them back to their defaults.

When a child ends it kills what is left of its group and cgroup, records how the job ended in
the job's launch record, reaps it, and tells the connection that started (or last watches) it.
Launch records (``<root>/.gbroker-launches/<token>``, created with ``O_EXCL`` before the job's
process exists) make a start exactly-once across broker crashes (ARCHITECTURE §6); they live
where no job reaches, so a job cannot forge or erase how it ended. The launcher ends when it has
neither children nor connections: while it lives it is the parent of every job it started.

docs/SITES.md ("The launchers, in detail", under "The `local` back-end") has the spawn paths,
the requests, the launch records' protocol, the measured figures and what a lost launcher costs.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import gc
import importlib
import importlib.util
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
import traceback
from typing import Any

PROTOCOL = 5
"""Bumped whenever a request or reply changes; a broker retires a launcher that differs."""

SOCKET_NAME = ".gbroker-launcher.sock"
LOCK_NAME = ".gbroker-launcher.lock"


def socket_name(index: int) -> str:
    """The socket of the root's launcher number ``index`` (0: :data:`SOCKET_NAME`)."""
    return SOCKET_NAME if index == 0 else f".gbroker-launcher-{index}.sock"


def lock_name(index: int) -> str:
    """The lock that makes a launcher the root's only one of its number."""
    return LOCK_NAME if index == 0 else f".gbroker-launcher-{index}.lock"


LOG_NAME = ".gbroker-launcher.log"  # its standard error, where the broker puts it
LAUNCHES = ".gbroker-launches"
"""The root's directory of launch records (the broker's user's, 0700), one file per launch token."""

_SEND_TIMEOUT = 5.0  # seconds a broker may take to read what the launcher tells it
IDLE_RETIRE = 30.0
"""Seconds a launcher with no job and no broker waits for one before it leaves."""

_PRLIMIT_OPTIONS = {
    "memory": "as",
    "processes": "nproc",
    "file_size": "fsize",
    "cpu_time": "cpu",
    "open_files": "nofile",
}

RLIMITS = {
    "memory": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "file_size": resource.RLIMIT_FSIZE,
    "cpu_time": resource.RLIMIT_CPU,
    "open_files": resource.RLIMIT_NOFILE,
}
"""Names of :class:`~gbroker.site.executor.Limits` fields to the rlimit each sets."""

_PASSED_ON = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
    signal.SIGXFSZ,
)
"""Signals the launcher ignores (they are meant for jobs, or for nobody) and a job gets back."""
_signal: Any = importlib.import_module("_signal")  # what `signal` wraps, minus the enums
_DEFAULTED = tuple(int(number) for number in (*_PASSED_ON, signal.SIGCHLD))


def _soft_hard(name: str, value: int) -> tuple[int, int]:
    """A limit's soft and hard values: the same, but for CPU time, whose hard limit is a second
    later, so that the kernel first sends SIGXCPU (which says why) and SIGKILL only to a job
    that goes on past it (with soft = hard it sends SIGKILL at once)."""
    return (value, value + 1) if name == "cpu_time" else (value, value)


def _child(request: dict[str, Any], report: int) -> None:
    """In the forked child: become the job, or write ``"<step> <errno>"`` to ``report``."""
    step = "setsid"
    try:
        os.setsid()
        uid, gid = request["uid"], request["gid"]
        _enter_job_directory(request)
        group = request.get("group")
        if group is not None:  # born outside it (a fork), joined before anything runs
            step = "cgroup"
            for path in group.joined():
                with open(os.path.join(path, "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
        step = "limits"
        for name, value in request["limits"].items():
            resource.setrlimit(RLIMITS[name], _soft_hard(name, value))
        step = "affinity"
        if request["cpus"]:
            os.sched_setaffinity(0, request["cpus"])
        step = "user"
        if os.geteuid() == 0:
            os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        streams: list[int] = []
        _open_streams(request, None, streams)
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
        for number in _DEFAULTED:  # the built-in module: `signal` adds enums and their cost
            _signal.signal(number, _signal.SIG_DFL)
        step = "exec"
        _exec(request["argv"], request["env"])
    except BaseException as exc:
        if isinstance(exc, _Failed):
            step = exc.step
        try:
            os.write(report, b"%s\0%d" % (step.encode(), getattr(exc, "errno", 0) or 0))
        finally:
            os._exit(127)


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """``os.execvpe``, but a ``PATH`` directory the job's user may not search is one where the
    program is not: a broker's ``PATH`` may name its own private directories."""
    name = argv[0]
    if "/" in name:
        os.execve(name, argv, env)
    found: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        try:
            os.execve(path, argv, env)
        except OSError as exc:
            if exc.errno == errno.EACCES:
                try:
                    os.stat(path)
                except OSError:
                    continue  # the directory is closed to us: nothing found there
            elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            found = found or exc
    raise found or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


class _Failed(Exception):
    """A step of a spawn failed: ``step`` names it, ``errno`` says why."""

    def __init__(self, step: str, number: int) -> None:
        super().__init__(step, number)
        self.step = step
        self.errno = number


def _find(name: str, env: dict[str, str]) -> str:
    """The program ``os.execvp`` would run, judged as the effective user (the job's, by
    then)."""
    if "/" in name:
        return name
    denied = False
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.access(path, os.X_OK, effective_ids=True) and not os.path.isdir(path):
            return path
        denied = denied or os.path.exists(path)  # there, but not ours to run
    raise _Failed("exec", errno.EACCES if denied else errno.ENOENT)


def _enter_job_directory(request: dict[str, Any]) -> None:
    """Make (0700) or reuse the job's directory, enter it and give it to the job's user."""
    uid, gid = request["uid"], request["gid"]
    try:
        try:
            os.mkdir(request["job_dir"], 0o700)
            fresh = True
        except FileExistsError:  # staged into, or run before
            fresh = False
        os.chdir(request["job_dir"])
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.chown(".", uid, gid)
        if not fresh:
            os.chmod(".", 0o700)
    except OSError as exc:
        raise _Failed("job directory", exc.errno or 0) from exc


def _open_streams(request: dict[str, Any], dev_null: int | None, streams: list[int]) -> None:
    """Open the job's standard input, output and error (in its directory, as its user, never
    through a link) onto ``streams``, then enter its working directory. ``dev_null``: a shared
    descriptor of /dev/null for a job with no input (None: open one)."""
    step = f"stdin file {request['stdin']!r}"
    try:
        if request["stdin"] is None:
            streams.append(os.open(os.devnull, os.O_RDONLY) if dev_null is None else dev_null)
        else:  # non-blocking: a FIFO must not hold the launcher, which waits for our exec
            streams.append(os.open(request["stdin"], os.O_RDONLY | os.O_NONBLOCK))
            os.set_blocking(streams[-1], True)
        for key in ("stdout", "stderr"):
            name = request[key]
            step = f"{key} file {name!r}"
            if key == "stderr" and name == request["stdout"]:
                streams.append(streams[1])
                continue
            parent = os.path.dirname(name)
            if parent:
                os.makedirs(parent, exist_ok=True)
            # A job started again after its move appends to what it wrote before it.
            again = os.O_APPEND if request.get("append") else os.O_TRUNC
            # Non-blocking: a FIFO the job's account left by that name (its directory is its
            # own between runs) held the launcher in open(2), and every start after it.
            flags = os.O_WRONLY | os.O_CREAT | again | os.O_NOFOLLOW | os.O_NONBLOCK
            try:
                streams.append(os.open(name, flags, 0o600))
            except OSError as exc:  # ENXIO: a FIFO nobody reads, a socket
                if exc.errno == errno.ENXIO:
                    raise _Failed(f"{step}: not a regular file", exc.errno) from None
                raise
            if not stat.S_ISREG(os.fstat(streams[-1]).st_mode):
                raise _Failed(f"{step}: not a regular file", errno.EINVAL)
            os.set_blocking(streams[-1], True)
        if request["cwd"] is not None:
            step = "working directory"
            os.makedirs(request["cwd"], exist_ok=True)
            os.chdir(request["cwd"])
    except OSError as exc:
        raise _Failed(step, exc.errno or 0) from exc


class _Affinity:
    """The launcher's own CPU affinity, changed only when a spawn needs another one.

    A spawned job inherits the affinity of the thread that spawns it, so the launcher takes the
    job's CPUs for the moment of the spawn. Moving to a set that excludes the CPU it runs on
    makes the kernel migrate it there and wait for that CPU: a latency that, paid per job,
    stalled the whole launcher (most of its time under load, measured). So the set is left as
    it is between the spawns of one round, whose starts are taken grouped by CPU set
    (:meth:`Launcher._receive`), and widened back once per round (:meth:`Launcher.run`).
    """

    def __init__(self) -> None:
        self.all = frozenset(os.sched_getaffinity(0))
        self.now = self.all

    def take(self, cpus: frozenset[int]) -> None:
        if cpus != self.now:
            os.sched_setaffinity(0, cpus)
            self.now = cpus

    def widen(self) -> None:
        self.take(self.all)


def _spawn(
    request: dict[str, Any],
    root: int,
    affinity: _Affinity,
    prlimit: str | None,
    dev_null: int,
    tree: Any = None,
) -> int:
    """Start a job (see the module docstring): its directory, its streams opened as its
    user, then ``gbroker-exec`` spawned (``request["report"]`` is then its report pipe, for the
    caller to read), else a fork by ``subprocess``'s C code. Its *real* ids stay root's
    throughout. A program is found, and checked as executable by the job's user, before.
    """
    uid, gid = request["uid"], request["gid"]
    switch = os.geteuid() == 0 and (uid, gid) != (0, 0)
    streams: list[int] = []
    step = "job directory"
    entered = False
    try:
        _enter_job_directory(request)
        step = "user"
        if switch:  # effective ids only: the real and saved ones stay root's
            os.setresgid(-1, gid, -1)
            os.setresuid(-1, uid, -1)
        try:
            _open_streams(request, dev_null, streams)
            step = "exec"
            argv, env = request["argv"], request["env"]
            program = _find(argv[0], env)
        finally:
            if switch:
                os.setresuid(-1, 0, -1)
                os.setresgid(-1, 0, -1)
        group = request.get("group")
        helper = request.get("helper")
        if helper is not None and (switch or group is not None or request["limits"]):
            # gbroker-exec joins the job's cgroups, sets its rlimits, takes its ids, executes
            # it: spawned (vfork), the launcher changing nothing of its own but its CPUs.
            options: list[str] = []
            for path in () if group is None else group.joined():
                options += ["-c", path]
            for name, value in request["limits"].items():
                options += ["-r", str(int(RLIMITS[name])), *map(str, _soft_hard(name, value))]
            argv = [helper, str(uid), str(gid), "-p", "3", *options, "--", program, *argv]
            program = helper
            if group is None:
                step = "affinity"
                affinity.take(frozenset(request["cpus"]) or affinity.all)
            step = "exec"
            # Its report pipe as fd 3: closed by the job's exec, or told which step failed.
            report, told = os.pipe2(os.O_CLOEXEC)
            try:
                pid = os.posix_spawn(
                    program,
                    argv,
                    env,
                    file_actions=[
                        *((os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(streams)),
                        (os.POSIX_SPAWN_DUP2, told, 3),
                    ],
                    setsid=True,
                    setsigdef=_DEFAULTED,
                )
            except BaseException:
                os.close(report)
                raise
            finally:
                os.close(told)
            request["report"] = report
            return pid
        if request["limits"]:  # prlimit(1) sets them on itself, then executes the program
            assert prlimit is not None
            options = [
                "--{}={}:{}".format(_PRLIMIT_OPTIONS[name], *_soft_hard(name, value))
                for name, value in request["limits"].items()
            ]
            argv = [prlimit, *options, "--", program, *argv[1:]]
            program = prlimit
        if group is not None:
            step = "cgroup"
            tree.enter(group)
            entered = True
        else:
            step = "affinity"
            affinity.take(frozenset(request["cpus"]) or affinity.all)
        step = "exec"
        # Without gbroker-exec: forked by subprocess's C code, which takes the job's ids in
        # the child (a fork, not a vfork: about 0.45 ms more of the launcher's CPU per job).
        child = subprocess.Popen(
            argv,
            executable=program,
            env=env,
            stdin=streams[0],
            stdout=streams[1],
            stderr=streams[2],
            close_fds=True,
            start_new_session=True,
            user=uid if switch else None,
            group=gid if switch else None,
            extra_groups=[] if switch else None,
        )
        # The launcher reaps its children itself (waitid in _reap): a Popen object left to
        # the garbage collector would reap it in our place, so it is kept with the job.
        request["process"] = child
        return child.pid
    except _Failed:
        raise
    except OSError as exc:
        raise _Failed(step, exc.errno or 0) from exc
    finally:
        if entered:
            tree.leave()
        for fd in set(streams) - {dev_null}:
            os.close(fd)
        os.fchdir(root)


def _sibling(name: str) -> Any:
    """The module ``gbroker.site.<name>``, loaded by its path (the launcher imports no
    package)."""
    key = f"gbroker_site_{name}"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, _sibling_path(name))
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return module


def _sibling_path(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")


def _cgroups() -> Any:
    """:mod:`gbroker.site.cgroups`, loaded by its path."""
    return _sibling("cgroups")


def _signal_group(group: Any, number: int) -> None:
    """Send signal ``number`` to every process of a job's cgroup (SIGKILL: kill it all)."""
    try:
        if number == signal.SIGKILL:
            group.kill()
            return
        for pid in group.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
    except OSError as exc:
        print(f"gbroker launcher: signal {number} to cgroup {group.paths}: {exc}", file=sys.stderr)


def _exit_facts(pid: int, code: int) -> dict[str, int | None]:
    """How a job ended, as recorded: its exit code or the signal that ended it, and its pid."""
    return {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "pid": pid,
    }


def _grouped(requests: list[Any]) -> list[Any]:
    """``requests`` with each run of consecutive starts ordered by CPU set (stably), so that a
    round of starts moves the launcher's affinity once per set, not once per job; every other
    request keeps its place. Starts are independent of one another, each answered by its id."""
    out: list[Any] = []
    run: list[Any] = []
    for request in [*requests, None]:
        if isinstance(request, dict) and request.get("op") == "start":
            run.append(request)
            continue
        run.sort(key=lambda start: str(start.get("cpus")))
        out.extend(run)
        run = []
        if request is not None:
            out.append(request)
    return out


class Launcher:
    """The launcher's state and loop; see the module docstring."""

    def __init__(self, root: str, listener: socket.socket, lock: int, index: int = 0) -> None:
        self.root = root
        self.socket_name = socket_name(index)
        self.root_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.affinity = _Affinity()
        self.prlimit = shutil.which("prlimit")
        self.tree: Any = None  # the site's cgroups (cgroups.Tree), found at the first job's
        self.stale_groups: list[Any] = []  # cgroups of ended jobs, not yet empty
        self.pool: list[Any] = []  # empty cgroups of ended jobs, for the next ones
        self.groups_made = 0
        # The names of this launcher's cgroups: its number and pid, unique on the host.
        self.group_prefix = f"l{index}-{os.getpid()}"
        self.dev_null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # spawned jobs' stdin
        with contextlib.suppress(FileExistsError):
            os.mkdir(LAUNCHES, 0o700)
        directory = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        self.launches = os.open(LAUNCHES, directory)
        self.listener: socket.socket | None = listener
        self.socket_inode = os.stat(self.socket_name).st_ino
        self.lock: int | None = lock
        self.selector = selectors.DefaultSelector()
        self.jobs: dict[int, dict[str, Any]] = {}  # pid -> its start request
        # pid -> (report pipe, client, request, what the pipe said so far), until it closes
        self.starting: dict[int, tuple[int, socket.socket, dict[str, Any], bytearray]] = {}
        self.clients: dict[socket.socket, bytearray] = {}
        self.outbox: dict[socket.socket, list[bytes]] = {}
        # pid -> the connection that started or last watched the job: who hears of its end
        self.owners: dict[int, socket.socket] = {}
        wake_read, wake_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        self.wake = wake_read
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda number, frame: None)
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(wake_read, selectors.EVENT_READ)

    def run(self) -> None:
        while self.listener is not None or self.jobs or self.starting or self.clients:
            # Idle (its broker died before it connected, say): leave after IDLE_RETIRE seconds
            # with nothing to do, not never.
            busy = self.jobs or self.starting or self.clients
            for key, _ in self.selector.select(None if busy else IDLE_RETIRE):
                try:
                    self._ready(key)
                except Exception:  # a bug of ours must not orphan every job: say it, go on
                    traceback.print_exc()
            self.affinity.widen()
            self._flush()
            if self.stale_groups:
                self._remove_groups()
            if self.listener is not None and not (self.jobs or self.starting or self.clients):
                self._retire()  # nobody to serve and nothing to watch: leave the root free
        for _ in range(200):  # the last jobs' cgroups, once their killed members are gone
            self._remove_groups(all_of_them=True)
            if not self.stale_groups:
                break
            time.sleep(0.01)

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.fileobj is self.listener:
            self._accept()
        elif key.fileobj == self.wake:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake, 256):
                    pass
            self._reap()
        elif isinstance(key.data, int):
            self._reported(key.data)
        elif key.fileobj in self.clients:  # not dropped earlier in this round
            assert isinstance(key.fileobj, socket.socket)
            self._receive(key.fileobj)

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        client.setblocking(False)
        self.clients[client] = bytearray()
        self.selector.register(client, selectors.EVENT_READ)
        self._send(client, {"op": "hello", "version": PROTOCOL, "pid": os.getpid()})

    def _drop(self, client: socket.socket) -> None:
        if client not in self.clients:
            return
        self.selector.unregister(client)
        del self.clients[client]
        self.outbox.pop(client, None)
        client.close()
        for pid in [pid for pid, owner in self.owners.items() if owner is client]:
            del self.owners[pid]

    def _send(self, client: socket.socket | None, message: dict[str, Any]) -> None:
        """Queue a message; :meth:`_flush` sends each client's queue in one write per round."""
        if client is not None and client in self.clients:
            self.outbox.setdefault(client, []).append(json.dumps(message).encode() + b"\n")

    def _flush(self) -> None:
        for client, chunks in list(self.outbox.items()):
            del self.outbox[client]
            try:
                # A broker that stops reading must not stop the launcher: it is dropped.
                client.settimeout(_SEND_TIMEOUT)
                client.sendall(b"".join(chunks))
                client.setblocking(False)
            except OSError:
                self._drop(client)

    def _receive(self, client: socket.socket) -> None:
        try:
            data = client.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        buffer = self.clients[client]
        buffer += data
        *lines, rest = buffer.split(b"\n")
        buffer[:] = rest
        requests: list[Any] = []
        for line in lines:
            try:
                requests.append(json.loads(line))
            except ValueError as exc:
                self._send(client, {"op": "error", "error": repr(exc)})
        for request in _grouped(requests):
            try:
                self._handle(client, request)
            except Exception as exc:  # a broker's bug must not end every job's supervisor
                self._send(client, {"op": "error", "error": repr(exc)})

    def _handle(self, client: socket.socket, request: dict[str, Any]) -> None:
        op = request["op"]
        if op == "start":
            self._start(client, request)
        elif op == "watch":
            running = request["pid"] in self.jobs
            if running:
                self.owners[request["pid"]] = client
            self._send(client, {"op": "watching", "id": request["id"], "running": running})
        elif op == "signal":
            job = self.jobs.get(request["pid"])
            if job is not None:  # unreaped: its id cannot name a stranger yet
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(request["pid"], request["signal"])
                group = job.get("group")
                if group is not None:  # and all it forked, whatever its session
                    _signal_group(group, request["signal"])
        elif op == "restore":
            self._restore(client, request)
        elif op == "release":
            self._release(request["pid"])
        elif op == "retire":
            self._retire()
            self._send(client, {"op": "retired", "id": request["id"]})
        else:
            self._send(client, {"op": "error", "id": request.get("id"), "error": f"op {op!r}"})

    def _start(self, client: socket.socket, request: dict[str, Any]) -> None:
        """Spawn the job, or fork it if it has rlimits and no ``prlimit`` is here; its launch
        record first, so that no job of a token runs unless the record was ours to make."""
        if not self._open_record(client, request):
            return
        if request.get("cgroup") is not None:
            try:
                request["group"] = self._make_group(request)
            except Exception as exc:  # an OSError, or cgroups.Unavailable: said, not started
                print(f"gbroker launcher: job {request['job_id']}: cgroup: {exc}", file=sys.stderr)
                self._failed(client, request, ["cgroup", getattr(exc, "errno", 0) or 0])
                return
        if not request["limits"] or self.prlimit is not None or request.get("helper"):
            try:
                pid = _spawn(
                    request, self.root_fd, self.affinity, self.prlimit, self.dev_null, self.tree
                )
            except _Failed as failed:
                self._failed(client, request, [failed.step, failed.errno])
                return
            report = request.pop("report", None)
            if report is None:
                self._started(client, pid, request)
                return
            # By gbroker-exec: started once the job's program runs, in its cgroups and ids.
            os.set_blocking(report, False)
            self.starting[pid] = (report, client, request, bytearray())
            self.selector.register(report, selectors.EVENT_READ, pid)
            return
        self._fork(client, request)

    def _restore(self, client: socket.socket, request: dict[str, Any]) -> None:
        """Restore a job from a CRIU image (:mod:`.criu`): its launch record first, as for a
        start, then its init spawned as pid 1 of a new PID namespace, in the job's cgroup; the
        init's report pipe (fd 3) says, once closed, whether CRIU restored it."""
        if not self._open_record(client, request):
            return
        criu = _sibling("criu")
        paths: list[str] = []
        if request.get("cgroup") is not None:
            try:
                request["group"] = self._make_group(request)
                paths = request["group"].joined()
            except Exception as exc:
                print(f"gbroker launcher: job {request['job_id']}: cgroup: {exc}", file=sys.stderr)
                self._failed(client, request, ["cgroup", getattr(exc, "errno", 0) or 0])
                return
        argv = [
            sys.executable,
            "-I",
            "-S",
            _sibling_path("criu"),
            "init",
            request["image"],
            request["criu"],
            str(request["ns_pid"]),
            str(request["uid"]),
            str(request["gid"]),
            *paths,
        ]
        report, told = os.pipe2(os.O_CLOEXEC)
        try:
            own = criu.unshare_pid_namespace()
            try:
                pid = os.posix_spawn(
                    sys.executable,
                    argv,
                    request["env"],
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, self.dev_null, 0),
                        (os.POSIX_SPAWN_DUP2, self.dev_null, 1),
                        (os.POSIX_SPAWN_DUP2, told, 3),
                    ],
                    setsid=True,
                    setsigdef=_DEFAULTED,
                )
            finally:
                criu.back_to_own_pid_namespace(own)
        except OSError as exc:
            os.close(report)
            self._failed(client, request, [f"restore: {exc}", 0])
            return
        finally:
            os.close(told)
        request["restored"] = True
        os.set_blocking(report, False)
        self.starting[pid] = (report, client, request, bytearray())
        self.selector.register(report, selectors.EVENT_READ, pid)

    def _release(self, pid: int) -> None:
        """A frozen job runs elsewhere now: kill it all, and record its end as ``migrated``."""
        job = self.jobs.get(pid)
        if job is None:
            return
        job["migrated"] = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        group = job.get("group")
        if group is not None:
            _signal_group(group, signal.SIGKILL)
            with contextlib.suppress(OSError):
                group.freeze(False)  # a frozen task dies once thawed

    def _make_group(self, request: dict[str, Any]) -> Any:
        """The job's cgroup, with its CPUs and limits: an empty one of an earlier job if there
        is one (prepared, so a start makes no directories), else a new one, named
        ``<launcher>-<n>`` (the site's tree is found at the first job)."""
        confine = request["cgroup"]
        cpus, memory, pids = request["cpus"], confine.get("memory"), confine.get("pids")
        quota = confine.get("cpu")  # the site's CPU share of the job's cores (cgroups.cpu_quota)
        if self.pool:
            group = self.pool.pop()
            try:
                group.configure(cpus, memory, pids, quota)
            except OSError:  # removed under us (a sweep): a new one instead
                group = None
            if group is not None:
                return group
        if self.tree is None:
            self.tree = _cgroups().detect(self.root)
            if quota is not None and not self.tree.cpu:
                print(
                    f"gbroker launcher: jobs run uncapped: no cpu controller "
                    f"({self.tree.cpu_unavailable})",
                    file=sys.stderr,
                )
        self.groups_made += 1
        name = f"{self.group_prefix}-{self.groups_made}"
        return self.tree.make(name, cpus, memory, pids, quota)

    def _open_record(self, client: socket.socket, request: dict[str, Any]) -> bool:
        """Create ``LAUNCHES/<token>`` exclusively. False (and the start refused) if it exists:
        a restarted broker voided the token, deciding that this launch never happened."""
        token = request.get("token")
        if token is None:
            return True
        if not (isinstance(token, str) and 0 < len(token) <= 64 and token.isalnum()):
            self._send(client, {"op": "failed", "id": request["id"], "error": ["token", 0]})
            return False
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            request["record"] = os.open(token, flags, 0o600, dir_fd=self.launches)
        except OSError as exc:
            self._send(
                client, {"op": "failed", "id": request["id"], "error": ["launch record", exc.errno]}
            )
            return False
        return True

    @staticmethod
    def _close_record(request: dict[str, Any], **facts: Any) -> None:
        """Fill the launch record in (the job's pid and start, or why it did not start)."""
        fd = request.pop("record", None)
        if fd is None:
            return
        try:
            os.write(fd, json.dumps({"job_id": request["job_id"], **facts}).encode() + b"\n")
        finally:
            os.close(fd)

    def _failed(self, client: socket.socket, request: dict[str, Any], error: list[Any]) -> None:
        self._close_record(request, pid=None, error=error)
        group = request.pop("group", None)
        if group is not None:  # made for a job that never ran: for the next one
            self.stale_groups.append(group)
        self._send(client, {"op": "failed", "id": request["id"], "error": error})

    def _started(self, client: socket.socket, pid: int, request: dict[str, Any]) -> None:
        started_at = time.time()
        group = request.get("group")
        cgroup = None if group is None else group.name
        self._close_record(request, pid=pid, started_at=started_at, cgroup=cgroup)
        self.jobs[pid] = request
        if client in self.clients:
            self.owners[pid] = client
        self._send(
            client,
            {"op": "started", "id": request["id"], "pid": pid, "at": started_at, "cgroup": cgroup},
        )

    def _fork(self, client: socket.socket, request: dict[str, Any]) -> None:
        """Fork the job; its child's report pipe tells, once it closes, whether it runs."""
        self.affinity.widen()  # a child that sets no CPUs of its own keeps every one
        report_read, report_write = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(report_read)
            os.close(report_write)
            self._failed(client, request, ["fork", exc.errno or 0])
            return
        if pid == 0:
            os.close(report_read)
            _child(request, report_write)
        os.close(report_write)
        # Not waited for here: the next job is forked while this one prepares on another core.
        os.set_blocking(report_read, False)
        self.starting[pid] = (report_read, client, request, bytearray())
        self.selector.register(report_read, selectors.EVENT_READ, pid)

    def _reported(self, pid: int, drain: bool = False) -> None:
        """Read a starting job's report pipe; once it is closed, say how the start went."""
        if pid not in self.starting:  # done already, by a drain in this same round
            return
        report, client, request, told = self.starting[pid]
        if drain:  # the child has ended: whatever it wrote is there, and then the end
            os.set_blocking(report, True)
        try:
            while chunk := os.read(report, 512):
                told += chunk
        except BlockingIOError:
            return  # more to come, or the end
        del self.starting[pid]
        self.selector.unregister(report)
        os.close(report)
        if told and request.get("restored"):  # CRIU's reason, said by the restore's init
            self._failed(client, request, [bytes(told).decode(errors="replace"), 0])
            return
        if told:  # it ends (status 127) without having run anything: nothing to record
            step, _, number = bytes(told).partition(b"\0")
            self._failed(client, request, [step.decode(errors="replace"), int(number or 0)])
            return
        self._started(client, pid, request)

    def _reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            if pid in self.starting:  # "started" (or "failed") must go before its "exit"
                self._reported(pid, drain=True)
            job = self.jobs.pop(pid, None)
            hit: dict[str, int] = {}
            if job is not None:
                # What is left of its group goes with the leader, whose id it still holds.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            if job is not None and job.get("group") is not None:
                hit = self._limits_hit(job, job["group"])
            said = None
            if job is not None and job.get("restored"):  # its init says how the job ended
                said = _sibling("criu").exit_of_init(pid)
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status) if said is None else said
            if job is None:
                continue
            process = job.get("process")
            if process is not None:  # reaped: nothing is left for its Popen to do
                process.returncode = code
            # The CPU time of the leader and what it reaped: whether RLIMIT_CPU ended it.
            used = round(usage.ru_utime + usage.ru_stime, 3)
            facts = {**_exit_facts(pid, code), "limits": hit, "cpu_time": used}
            if job.get("migrated"):  # released: it runs on elsewhere, this end is no failure
                facts["migrated"] = True
            try:
                ended_at = self._record_end(job, facts)
            except OSError as exc:
                ended_at = time.time()
                print(f"gbroker launcher: job {job['job_id']}: record: {exc}", file=sys.stderr)
            if job.get("group") is not None:
                # Recorded first (a broker that polls for the end reads it once the leader has
                # gone), then everything left in its cgroup, whatever its session, is killed
                # before the broker hears of the end: nothing of the job outlives its report.
                self._close_group(job, job["group"])
            self._send(self.owners.pop(pid, None), {"op": "exit", **facts, "ended_at": ended_at})
        self._remove_groups()

    def _close_group(self, job: dict[str, Any], group: Any) -> None:
        """Kill what is left of a job's cgroup; the group goes back to the pool once empty."""
        try:
            if group.kill() == 0 and group.empty():
                self.pool.append(group)
                return
            group.wait_dead()  # so that nothing of it still runs when the broker hears the end
        except OSError as exc:
            print(f"gbroker launcher: job {job['job_id']}: cgroup: {exc}", file=sys.stderr)
        self.stale_groups.append(group)

    def _limits_hit(self, job: dict[str, Any], group: Any) -> dict[str, int]:
        """Which of a job's cgroup limits the kernel enforced since it began."""
        try:
            hit: dict[str, int] = group.limits_hit()
        except OSError as exc:
            print(f"gbroker launcher: job {job['job_id']}: cgroup: {exc}", file=sys.stderr)
            return {}
        return hit

    def _remove_groups(self, all_of_them: bool = False) -> None:
        """Ended jobs' cgroups: back to the pool once empty (killed members leave once reaped),
        killed again meanwhile; with ``all_of_them`` (the launcher leaves), removed, the pool's
        too."""
        left = []
        for group in self.stale_groups:
            try:
                if group.empty():
                    self.pool.append(group)
                else:
                    group.kill()
                    left.append(group)
            except OSError as exc:
                print(f"gbroker launcher: cgroup {group.paths}: {exc}", file=sys.stderr)
        self.stale_groups = left
        if all_of_them:
            for group in self.pool:
                with contextlib.suppress(OSError):
                    group.remove()
            self.pool = []

    def _record_end(self, job: dict[str, Any], facts: dict[str, Any]) -> float:
        """Record how a job ended as a line appended to its launch record (in the root's
        records directory, the broker's alone: never a file a job can write); when it ended.
        A start without a token is told to its broker only."""
        ended_at = time.time()
        token = job.get("token")
        if token is not None:
            line = json.dumps({**facts, "ended_at": ended_at}).encode()
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(token, flags, dir_fd=self.launches)
            try:
                os.write(fd, line + b"\n")
            finally:
                os.close(fd)
        return ended_at

    def _retire(self) -> None:
        """Give up the root: no new connections, the lock released; jobs still supervised."""
        if self.listener is not None:
            self.selector.unregister(self.listener)
            try:  # ours only: a newer launcher may have bound the name already
                if os.stat(self.socket_name).st_ino == self.socket_inode:
                    os.unlink(self.socket_name)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


# Linux's generic ioctl numbers for a file's attribute flags (``lsattr``/``chattr``), and
# ext2/3/4's "top of directory hierarchies" (``chattr +T``).
_LONG = struct.calcsize("l")
_FS_IOC_GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
_FS_IOC_SETFLAGS = (1 << 30) | (_LONG << 16) | (ord("f") << 8) | 2
FS_TOPDIR_FL = 0x00020000


def spread_subdirectories(directory: str) -> bool:
    """Mark ``directory`` a top of directory hierarchies (``chattr +T``), as ``/home`` is; True
    if it is one now. False where the file system has no such flag (tmpfs, xfs, ...): harmless.

    Why the job root is one. ext4 puts a new directory in its parent's block group, and its
    files beside it; without a journal (this development host's file system) it will not reuse
    an inode freed in the last 5 to 305 seconds, so each creation steps over every such inode
    of the group, a buffer-cache lookup each. A root in a group where many files were deleted
    lately (other jobs' purges, another user's ``rm -r``, a test run) then costs milliseconds
    of kernel CPU per job directory and stream file: 2.4-2.9 ms of launcher CPU per job and
    284-332 starts/s in ``scripts/bench/bench_launch.py``, against 0.37-0.40 ms and 1,047-1,049
    starts/s with the root marked (one launcher, the two alternated, 2026-11-25). Marked,
    ext4's Orlov allocator spreads the root's subdirectories over groups with more free inodes
    than average, each job directory (and its files) in a mostly clean group. What that costs:
    Orlov's look over every group at each ``mkdir`` in the root, about a fifth of a launcher's
    CPU per job (perf, same day).
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = array.array("I", [0])  # the kernel reads and writes an int
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        if not flags[0] & FS_TOPDIR_FL:
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
    except OSError:  # ENOTTY, EOPNOTSUPP: no such flags here; EPERM: not the owner's
        return False
    finally:
        os.close(fd)
    return True


def _show_title(packages: str, title: str) -> None:
    """``ps`` shows ``gbroker launcher ROOT`` instead of the interpreter's command line, with
    ``setproctitle`` from ``packages`` (the broker's site-packages; no ``site`` here)."""
    sys.path.append(packages)
    try:
        import setproctitle  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    finally:
        sys.path.remove(packages)
    setproctitle.setproctitle(f"gbroker launcher {title}")


def _ignore(number: int, frame: Any) -> None:
    """The launcher's handler for the signals it passes on: nothing."""


def main(argv: list[str]) -> int:
    """``launcher.py <root> <ready fd> [<index> [<site-packages>]]``: take the root's launcher
    number ``index`` (default 0), say ``ok`` on the fd, serve (with a short title in ``ps``,
    from ``setproctitle`` found in site-packages)."""
    root, ready = argv[1], int(argv[2])
    index = int(argv[3]) if len(argv) > 3 else 0
    if len(argv) > 4:
        _show_title(argv[4], root if index == 0 else f"{root} #{index}")
    for number in _PASSED_ON:  # caught, not ignored: an exec sets a caught one back to default
        signal.signal(number, _ignore)
    if os.geteuid() == 0:
        os.setgroups([])  # none of root's groups: the launcher takes a job's ids as effective
    os.umask(0o077)
    os.chdir(root)  # names relative to it: a socket's path may not exceed 107 bytes
    spread_subdirectories(".")  # each job's directory in a block group of its own choosing
    lock = os.open(lock_name(index), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        os.write(ready, b"busy")  # another launcher holds the root: use that one
        return 0
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_name(index))  # a dead launcher's, since we hold the lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_name(index))
    listener.listen(64)
    listener.setblocking(False)
    launcher = Launcher(root, listener, lock, index)
    # A collection in a forked child would touch (and so copy) every object; the launcher makes
    # no cycles worth collecting.
    gc.disable()
    gc.freeze()
    os.write(ready, b"ok")
    os.close(ready)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    launcher.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
