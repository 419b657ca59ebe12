"""CRIU checkpoints of a running job at a ``local`` site (the seam is :mod:`.backend`'s).

Standard library only: the launcher runs this file by its path (``python -I -S criu.py init
...``), as it loads :mod:`.cgroups`.

Theory of operation. A job's process tree is dumped by CRIU (``criu dump --freeze-cgroup``: the
job's cgroup frozen, every process seized and written, the tree left stopped and frozen, still
holding its cores) into an image directory, with a manifest (:data:`MANIFEST`: the job's id,
directory, pid, uid, gid and argv) so that the image says by itself what it needs. The caller
copies the job's directory to the target site, where :meth:`Executor.restore
<gbroker.site.executor.Executor.restore>`:

- rewrites the image for its new place (:func:`prepare_restore`, through CRIU's ``crit``): paths
  under the source's job directory become the target's, credentials the job's account there;
  the originals are kept (``*.orig``) and every rewrite starts from them, so a failed restore
  may be tried again elsewhere;
- has a launcher restore it: launch record first (exactly once, as a start), then **an init**
  (:func:`init_main`) as pid 1 of a new PID namespace joins the job's cgroup, runs ``criu
  restore --restore-detached``, reports on a pipe, reaps, and ends with the job's status.

Why a PID namespace at every restore: CRIU gives each process its dumped pid, which on one host
the source's frozen tree may still hold; in an empty namespace every pid is free. The init is
that namespace's pid 1 (CRIU leaves after a detached restore); the job is never an init, so it
keeps plain signal semantics (a SIGTERM ends it). A restored job is dumped again from inside its
namespaces, so every move is the same move. Jobs do not start in a namespace of their own: that
would put an init in every start (the launcher's fast path) for the few that move.

docs/MIGRATION.md ("Checkpoint and restore at a site") has the details: the restore's steps, the
paths a restored job still sees, and where :func:`find_criu` looks for CRIU.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from typing import Any

__all__ = [
    "MANIFEST",
    "CriuFailed",
    "crit_command",
    "criu_works",
    "dump_argv",
    "find_criu",
    "image_size",
    "init_main",
    "log_tail",
    "prepare_restore",
    "read_manifest",
    "write_manifest",
]

MANIFEST = "gbroker-checkpoint.json"
"""The image directory's description of itself (:func:`write_manifest`)."""
DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"
EXIT_COMM = "gbx:"
"""How a restore's init names itself as it ends: ``gbx:e<code>`` or ``gbx:s<signal>``."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_REC, _MS_SLAVE = 0x4000, 0x80000
_PR_SET_NAME = 15
_FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class CriuFailed(Exception):
    """CRIU (or what prepares its work) failed; the message says why, for people."""


def find_criu() -> str | None:
    """The ``criu`` to use: ``$GBROKER_CRIU``, else ``scripts/setup/ensure_criu.sh``'s cached build,
    else ``criu`` on ``PATH``; None if there is none."""
    named = os.environ.get("GBROKER_CRIU")
    if named:
        return named if os.access(named, os.X_OK) else None
    caches = [os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache")]
    if os.environ.get("XDG_CACHE_HOME"):  # first: where the script was told to build
        caches.insert(0, os.environ["XDG_CACHE_HOME"])
    for cache in caches:
        built = os.path.join(cache, "gbroker", "criu", "bin", "criu")
        if os.access(built, os.X_OK):
            return os.path.realpath(built)
    return shutil.which("criu", path=os.environ.get("PATH", os.defpath) + ":/usr/sbin:/sbin")


_WORKS: dict[str, bool] = {}


def criu_works(criu: str | None) -> bool:
    """Whether ``criu check`` passes here (as root; asked once per path)."""
    if criu is None or os.geteuid() != 0:
        return False
    if criu not in _WORKS:
        try:
            done = subprocess.run(
                [criu, "check"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL
            )
            _WORKS[criu] = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _WORKS[criu] = False
    return _WORKS[criu]


def crit_command(criu: str) -> tuple[list[str], dict[str, str]]:
    """How to run CRIU's ``crit`` beside ``criu``: the cached build's (its ``python/`` beside
    ``bin/``, run by the system's Python, which has ``python3-protobuf``), else ``crit`` on
    ``PATH``. Raises :class:`CriuFailed` if there is none."""
    env = dict(os.environ)
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(criu))), "python")
    if os.path.isfile(os.path.join(beside, "crit", "__main__.py")):
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"
        env["PYTHONPATH"] = beside
        return [python, "-m", "crit"], env
    crit = shutil.which("crit")
    if crit is None:
        raise CriuFailed("crit (CRIU's image tool) is missing: run scripts/setup/ensure_criu.sh")
    return [crit], env


def _as_the_job(uid: int, gid: int) -> list[str]:
    """``setpriv`` to run CRIU with the job's uid and gid and every capability we have.

    Why: reading another process's rlimits (``prlimit``, which ``criu dump`` does for every
    task) needs CAP_SYS_RESOURCE, or the same real, effective and saved ids as the target's;
    a root without CAP_SYS_RESOURCE (as on these VMs) can dump only its own ids' processes.
    With the job's ids and our capabilities kept as ambient ones, CRIU can do both."""
    setpriv = shutil.which("setpriv", path=os.defpath + ":/usr/bin:/bin") or "setpriv"
    try:
        names = subprocess.run(
            [setpriv, "--list-caps"], capture_output=True, text=True, check=True
        ).stdout.split()
        with open("/proc/self/status") as status:
            line = next(x for x in status if x.startswith("CapEff:"))
        held = int(line.split()[1], 16)
    except (OSError, subprocess.CalledProcessError, StopIteration, ValueError):
        return []
    return _setpriv(uid, gid, [name for bit, name in enumerate(names) if held >> bit & 1])


def _setpriv(uid: int, gid: int, caps: list[str]) -> list[str]:
    """``setpriv`` to run a command as ``uid``/``gid``, no supplementary group, with ``caps``
    (capability names) as ambient capabilities, and no other."""
    setpriv = shutil.which("setpriv", path=os.defpath + ":/usr/bin:/bin") or "setpriv"
    kept = ",".join(f"+{name}" for name in caps)
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        f"--inh-caps=-all,{kept}",
        f"--ambient-caps=-all,{kept}",
        "--",
    ]


def dump_argv(
    criu: str, pid: int, into: str, freezer: str, inside_of: int | None, ids: tuple[int, int]
) -> list[str]:
    """The command that dumps the tree of ``pid`` into ``into``, freezing the cgroup directory
    ``freezer`` and leaving the tree stopped, as the job's ``ids`` (uid, gid) with our
    capabilities (:func:`_as_the_job`). ``inside_of``: the host pid of a restored job's init,
    whose PID and mount namespaces the dump runs in (``pid`` is then the job's pid there)."""
    argv = [
        *(_as_the_job(*ids) if ids[0] > 0 else []),
        criu,
        "dump",
        "--tree",
        str(pid),
        "--images-dir",
        into,
        "--log-file",
        DUMP_LOG,
        "--freeze-cgroup",
        freezer,
        "--leave-stopped",
        "--manage-cgroups=ignore",
    ]
    if ids[0] > 0:  # not root: CRIU wants to be told, and then relies on our capabilities
        argv.append("--unprivileged")
    if inside_of is None:
        return argv
    nsenter = shutil.which("nsenter") or "nsenter"
    return [nsenter, "--target", str(inside_of), "--pid", "--mount", "--", *argv]


def log_tail(path: str, lines: int = 4) -> str:
    """The last lines of a CRIU log (its errors), joined for one message; a regular file only,
    never through a link (a restore's log is written as the job's account), its last 64 KiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return "(no log: not a regular file)"
            file.seek(max(0, info.st_size - (64 << 10)))
            text = file.read(64 << 10).decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in kept if "Error" in line or "error" in line]
    return " | ".join((errors or kept)[-lines:]) or "(an empty log)"


def write_manifest(into: str, facts: dict[str, Any]) -> None:
    """Write the image's manifest (``kind`` ``criu`` and ``facts``)."""
    with open(os.path.join(into, MANIFEST), "w") as file:
        json.dump({"kind": "criu", **facts}, file)


def read_manifest(image: str) -> dict[str, Any]:
    """An image's manifest; :class:`CriuFailed` if it has none or it is not one of ours."""
    try:
        with open(os.path.join(image, MANIFEST)) as file:
            manifest = json.load(file)
    except (OSError, ValueError) as exc:
        raise CriuFailed(f"{image} holds no readable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "criu":
        raise CriuFailed(f"{image}/{MANIFEST}: kind: expected 'criu'")
    for key, kind in (("job_dir", str), ("pid", int)):
        if not isinstance(manifest.get(key), kind):
            raise CriuFailed(f"{image}/{MANIFEST}: {key}: expected a {kind.__name__}")
    return manifest


def image_size(image: str) -> int:
    """Bytes of the files in ``image``."""
    total = 0
    for entry in os.scandir(image):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def _moved(path: str, old: str, new: str) -> str:
    if path == old:
        return new
    if path.startswith(old + "/"):
        return new + path[len(old) :]
    return path


def _rewrite(image: str, name: str, crit: tuple[list[str], dict[str, str]], edit: Any) -> None:
    """Decode ``image/name`` (from its ``.orig``, kept the first time), ``edit`` its JSON,
    encode it back."""
    path = os.path.join(image, name)
    original = path + ".orig"
    if not os.path.exists(original):
        shutil.copy2(path, original)
    command, env = crit
    decoded = subprocess.run(
        [*command, "decode", "-i", original], capture_output=True, env=env, check=False
    )
    if decoded.returncode != 0:
        raise CriuFailed(f"crit decode {name}: {decoded.stderr.decode(errors='replace')[-300:]}")
    document = json.loads(decoded.stdout)
    edit(document)
    encoded = subprocess.run(
        [*command, "encode", "-o", path],
        input=json.dumps(document).encode(),
        capture_output=True,
        env=env,
        check=False,
    )
    if encoded.returncode != 0:
        raise CriuFailed(f"crit encode {name}: {encoded.stderr.decode(errors='replace')[-300:]}")


WORK = "work"
"""Beside a restore's image: the directory CRIU, as the job's account, writes its logs into."""
RESTORE_CAPS = ("checkpoint_restore", "setpcap")
"""All CRIU keeps of root's capabilities at a restore, run as the job's account: the pids of
the dump (``clone3`` with ``set_tid``) and dropping what the image's bounding set lacks. Never
DAC_OVERRIDE or the like: every file the job had open, mapped or stood in is opened again with
its account's rights, so a path swapped for a link to a file of root's is refused."""


def prepare_restore(image: str, job_dir: str, uid: int, gid: int, criu: str) -> dict[str, Any]:
    """Make ``image`` restorable with the job's directory at ``job_dir`` and its processes as
    ``uid``/``gid``, with no capability and no supplementary group, whatever the image said;
    readable by that account (only through a descriptor: its directory's parents are root's),
    with a :data:`WORK` directory of the account's beside it. The manifest. Raises
    :class:`CriuFailed`."""
    manifest = read_manifest(image)
    old = manifest["job_dir"].rstrip("/")
    new = job_dir.rstrip("/")
    crit = crit_command(criu)

    def move_files(document: dict[str, Any]) -> None:
        for entry in document.get("entries", ()):
            reg = entry.get("reg")
            if isinstance(reg, dict) and isinstance(reg.get("name"), str):
                reg["name"] = _moved(reg["name"], old, new)

    def change_owner(document: dict[str, Any]) -> None:
        for entry in document.get("entries", ()):
            creds = entry.get("thread_core", {}).get("creds")
            if not isinstance(creds, dict):
                raise CriuFailed("a core image with no credentials")
            for key in ("uid", "euid", "suid", "fsuid"):
                creds[key] = uid
            for key in ("gid", "egid", "sgid", "fsgid"):
                creds[key] = gid
            for key in ("cap_inh", "cap_prm", "cap_eff", "cap_amb"):
                creds[key] = [0, 0]
            creds.pop("groups", None)  # none (an empty list does not encode)
            creds["secbits"] = 0

    try:
        if old != new:
            _rewrite(image, "files.img", crit, move_files)
        for name in sorted(os.listdir(image)):
            if name.startswith("core-") and name.endswith(".img"):
                _rewrite(image, name, crit, change_owner)
        # The image is root's (its directory unreached by any job): the account reads it.
        for entry in os.scandir(image):
            os.lchown(entry.path, 0, 0)
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, 0o644)
        os.chmod(image, 0o755)
        work = os.path.join(os.path.dirname(image), WORK)
        shutil.rmtree(work, ignore_errors=True)
        os.mkdir(work, 0o700)
        os.lchown(work, uid, gid)
    except OSError as exc:
        raise CriuFailed(f"preparing the image {image}: {exc}") from None
    return manifest


def restore_argv(criu: str, uid: int, gid: int, image_fd: int, work_fd: int) -> list[str]:
    """The command that restores the image open as ``image_fd``, as ``uid``/``gid`` with only
    :data:`RESTORE_CAPS` (CRIU's unprivileged mode), its log in the directory ``work_fd``."""
    as_account = _setpriv(uid, gid, list(RESTORE_CAPS)) if uid != 0 else []
    return [
        *as_account,
        criu,
        "restore",
        "--images-dir",
        f"/proc/self/fd/{image_fd}",
        "--work-dir",
        f"/proc/self/fd/{work_fd}",
        "--log-file",
        RESTORE_LOG,
        "--restore-detached",
        "--manage-cgroups=ignore",
        *(["--unprivileged"] if uid != 0 else []),
    ]


# -- the init of a restore (run by the launcher as a script) ---------------------------------


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def unshare_pid_namespace() -> int:
    """Put this process's next children in a new PID namespace; a descriptor of its own
    namespace, for :func:`back_to_own_pid_namespace`."""
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc().unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    except BaseException:
        os.close(own)
        raise
    return own


def back_to_own_pid_namespace(own: int) -> None:
    """Children in this process's own PID namespace again."""
    try:
        _check(_libc().setns(own, _CLONE_NEWPID), "setns(pid)")
    finally:
        os.close(own)


def init_main(argv: list[str]) -> int:
    """``criu.py init IMAGE CRIU JOB_PID UID GID [CGROUP_DIR...]``, as pid 1 of a new PID
    namespace with its report pipe as fd 3: see the module's docstring."""
    image, criu, job_pid, uid, gid = argv[2], argv[3], int(argv[4]), int(argv[5]), int(argv[6])
    report = 3
    work = os.path.join(os.path.dirname(image), WORK)
    try:
        for directory in argv[7:]:
            with open(os.path.join(directory, "cgroup.procs"), "w") as procs:
                procs.write("0")
        libc = _libc()
        _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _check(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")

        def forward(number: int, frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job_pid, number)

        for number in _FORWARDED:
            signal.signal(number, forward)
        image_fd = os.open(image, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        done = subprocess.run(
            restore_argv(criu, uid, gid, image_fd, work_fd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(image_fd, work_fd),
            cwd="/",
            check=False,
        )
        os.close(image_fd)
        os.close(work_fd)
        if done.returncode != 0:
            tail = log_tail(os.path.join(work, RESTORE_LOG))
            raise CriuFailed(f"criu restore exited {done.returncode}: {tail}")
    except Exception as exc:
        os.write(report, str(exc).encode(errors="replace")[:4000] or b"failed")
        return 127
    os.close(report)  # restored: the launcher says "started"
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot be: the job is ours until it ends
            return 127
        if pid == job_pid:
            break
    code = os.waitstatus_to_exitcode(status)
    said = f"{EXIT_COMM}e{code}" if code >= 0 else f"{EXIT_COMM}s{-code}"
    _libc().prctl(_PR_SET_NAME, said.encode(), 0, 0, 0)
    return code if code >= 0 else 128 - code


def exit_of_init(pid: int) -> int | None:
    """How a restored job ended, as its (unreaped) init said in its ``comm``: an exit code
    (>= 0) or minus a signal; None if it did not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    if not comm.startswith(EXIT_COMM) or len(comm) < len(EXIT_COMM) + 2:
        return None
    kind, number = comm[len(EXIT_COMM)], comm[len(EXIT_COMM) + 1 :]
    if not number.isdigit():
        return None
    return int(number) if kind == "e" else -int(number)


if __name__ == "__main__":
    if len(sys.argv) > 6 and sys.argv[1] == "init":
        sys.exit(init_main(sys.argv))
    sys.exit("usage: criu.py init IMAGE CRIU JOB_PID UID GID [CGROUP_DIR...]")
