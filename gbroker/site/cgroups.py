"""A cgroup per job: its cores (cpuset), memory, processes (pids), freezer and CPU share (cpu)
(ARCHITECTURE §11).

Theory of operation. Slurm's ``task/cgroup`` and ``proctrack/cgroup`` confine each job so: the
kernel, not the job, holds its cores, memory and process count, and every process the job forks
stays in its group whatever its session or environment, so the site can freeze, count and kill
all of it. Here each executor root (one site's launchers) has a *site group*, and each job a
group below it named by its job id::

    <hierarchy>/gbroker/<site key>/<job id>

cgroup v2 (one hierarchy; ``cpuset``, ``memory`` and ``pids`` enabled down to the site group)
is used where the host offers it; else the v1 controllers, each its own hierarchy
(``/sys/fs/cgroup/{cpuset,memory,pids,freezer}``), as on hybrid hosts. :func:`detect` says
which, or why neither (then jobs run with rlimits and CPU affinity only, and the executor says
so in one log line).

The ``cpu`` controller is optional: where the host offers it, a site whose topology gives it a
``cpu_share`` S < 1 caps every job's CPU time at S x its cores (:func:`cpu_quota`: cgroup v2's
``cpu.max``, v1's ``cpu.cfs_quota_us`` per ``cpu.cfs_period_us``), which is how the sites of one
test machine differ in CPU. Where it cannot be used, :attr:`Tree.cpu_unavailable` says why and
jobs run uncapped (the executor says so in one log line).

Who does what. The **launcher** (which runs as root, forks every job, and imports nothing but
the standard library: this module is loaded by its path) makes the job's group as it starts
the job (:meth:`Tree.make`), *enters it itself* for the moment of the fork, so that the job's
first process is born inside it (a process moved after its fork could have forked already),
and leaves it (:meth:`Tree.enter`, :meth:`Tree.leave`); moving a process costs microseconds
(about 9 us a round trip per v1 hierarchy, measured here). When the job's leader ends, the
launcher kills whatever is left in the group (:meth:`Group.kill`: ``cgroup.kill`` on v2, else
freeze, SIGKILL every member, thaw), reads which limits the kernel enforced
(:meth:`Group.limits_hit`: OOM kills, refused forks) into the job's end record, and keeps the
group, once empty, for its next job (a pool per launcher: a start makes no directory). The
**executor** changes a running job's cpuset on a resize (:meth:`Group.set_cpus`) and kills a
job's group itself when its launcher is gone.

Nothing here blocks: every operation is a few small reads and writes of cgroupfs files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable, Iterator

V1_CONTROLLERS = ("cpuset", "memory", "pids", "freezer")
"""The v1 hierarchies a job's group spans (each mounted at ``/sys/fs/cgroup/<name>``)."""
V2_CONTROLLERS = ("cpuset", "memory", "pids")
"""The v2 controllers a site group enables for its jobs (the freezer is built into v2)."""
CPU = "cpu"
"""The optional controller of a site's CPU share (v1: its own hierarchy, often ``cpu,cpuacct``)."""
CPU_PERIOD = 100_000
"""The period, in microseconds, a job's CPU quota is given per (the kernel's default)."""
MIN_CPU_QUOTA = 1_000
"""The least quota the kernel accepts, in microseconds per period."""

MOUNTS = "/proc/self/mounts"
CGROUP_ROOT = "/sys/fs/cgroup"


def site_key(root: str) -> str:
    """The site group's name for an executor root: stable, short, and a legal file name."""
    return "site-" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]


def cpu_quota(share: float, cores: int, period: int = CPU_PERIOD) -> int | None:
    """A job's CPU time per ``period`` (microseconds) at a site whose jobs get ``share`` of each
    of their ``cores``: ``share x cores x period``, at least the kernel's least quota. None for a
    share of 1 or more: the job's cpuset holds it to its cores already."""
    if not share > 0:
        raise ValueError(f"cpu_share: expected a share > 0, got {share!r}")
    if share >= 1 or cores < 1:
        return None
    return max(MIN_CPU_QUOTA, round(share * cores * period))


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _make_searchable(directory: str) -> None:
    """Make the cgroup ``directory`` (if it is not there) and leave it 0755 whatever the umask
    it was made under: a job's account must reach its own group's files through it (CRIU,
    dumping as the job, checks its freezer's ``freezer.state``), and the launcher runs under
    umask 077 (a release before this one left its groups 0700)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory)
    os.chmod(directory, 0o755)


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as file:
        return file.read()


def _mounts(mounts: str = MOUNTS) -> Iterator[tuple[str, str, set[str]]]:
    """(mount point, file system type, options) of every cgroup mount."""
    with open(mounts, encoding="utf-8", errors="replace") as file:
        for line in file:
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                point = fields[1].replace("\\040", " ")
                yield point, fields[2], set(fields[3].split(","))


def _counts(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``key value`` lines) as numbers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


class Unavailable(Exception):
    """Per-job cgroups cannot be used here; the message says why (for the site's log)."""


class Tree:
    """Where a site's job groups live, and how to make, enter and leave them.

    ``version`` is 1 or 2; ``site`` maps each controller's hierarchy (v1; the one hierarchy on
    v2, under the key ``""``) to the site group's directory. ``cpu_unavailable`` is None where
    the ``cpu`` controller caps job groups (v1: ``site`` has a ``cpu`` hierarchy), else why not.
    """

    def __init__(
        self, version: int, site: dict[str, str], cpu_unavailable: str | None = "not looked for"
    ) -> None:
        self.version = version
        self.site = site
        self.cpu_unavailable = cpu_unavailable
        self._home: dict[str, str] = {}  # where the caller was, to go back to (enter/leave)

    @property
    def cpu(self) -> bool:
        """Whether job groups here can have a CPU quota (:func:`cpu_quota`)."""
        return self.cpu_unavailable is None

    def describe(self) -> str:
        """A short line for the logs and ``fleet status``."""
        if self.version == 2:
            names = (*V2_CONTROLLERS, *((CPU,) if self.cpu else ()))
            return f"cgroup v2 ({', '.join(names)}) at {self.site['']}"
        return f"cgroup v1 ({', '.join(self.site)}) under {CGROUP_ROOT}/*/" + os.path.relpath(
            self.site["cpuset"], os.path.join(CGROUP_ROOT, "cpuset")
        )

    def group(self, name: str) -> Group:
        """The group called ``name`` (made or not)."""
        paths = {key: os.path.join(path, name) for key, path in self.site.items()}
        return Group(self.version, paths, cpu=self.cpu)

    def make(
        self,
        name: str,
        cpus: Iterable[int],
        memory: int | None,
        pids: int | None,
        quota: int | None = None,
    ) -> Group:
        """Make (or reuse) the group called ``name``, with these CPUs and limits (``quota``:
        CPU microseconds per :data:`CPU_PERIOD`, :func:`cpu_quota`)."""
        group = self.group(name)
        for path in group.paths.values():
            _make_searchable(path)
        if self.version == 1:  # a v1 cpuset needs its memory nodes before any task
            mems = _read(os.path.join(self.site["cpuset"], "cpuset.mems")).strip()
            _write(os.path.join(group.paths["cpuset"], "cpuset.mems"), mems)
            # The root cpuset balances the load over every CPU already; a child that balances
            # too makes the kernel rebuild its scheduling domains at each change of its CPUs.
            _write(os.path.join(group.paths["cpuset"], "cpuset.sched_load_balance"), "0")
        group.configure(cpus, memory, pids, quota)
        return group

    def enter(self, group: Group) -> None:
        """Move the calling process into ``group`` (its children are born there)."""
        me = str(os.getpid())
        joined = group.joined()
        for key, path in group.paths.items():
            if path not in joined:
                continue
            if key not in self._home:
                self._home[key] = self._current(key)
            _write(os.path.join(path, "cgroup.procs"), me)

    def leave(self) -> None:
        """Move the calling process back to where it was before :meth:`enter`."""
        me = str(os.getpid())
        for home in self._home.values():
            with contextlib.suppress(OSError):
                _write(os.path.join(home, "cgroup.procs"), me)

    def _current(self, key: str) -> str:
        """The directory of the calling process's cgroup in hierarchy ``key``."""
        mount = os.path.dirname(os.path.dirname(self.site[key]))  # <mount>/gbroker/<site key>
        wanted = "0" if self.version == 2 else key
        for line in _read("/proc/self/cgroup").splitlines():
            number, controllers, path = line.split(":", 2)
            if (self.version == 2 and number == wanted) or wanted in controllers.split(","):
                relative = path.lstrip("/")
                # In a cgroup namespace our own group may show as "/": the mount's root is ours.
                return os.path.join(mount, relative) if relative else mount
        return mount

    def remove(self) -> bool:
        """Remove the site group with the job groups in it that are empty; whether it is
        gone (a job still running keeps it)."""
        for job_id in self.jobs():
            with contextlib.suppress(OSError):
                self.group(job_id).remove()
        return _remove_all(self.site.values())

    def sweep(self) -> int:
        """Remove the empty job groups a crash left behind (a job still running keeps its
        own); how many went."""
        gone = 0
        for job_id in self.jobs():
            group = self.group(job_id)
            with contextlib.suppress(OSError):
                if not group.members() and group.remove():
                    gone += 1
        return gone

    def jobs(self) -> list[str]:
        """The job ids that have a group here now, in any hierarchy (a launcher removing one
        takes them one hierarchy after the other)."""
        names: set[str] = set()
        for path in self.site.values():
            with contextlib.suppress(OSError):
                names.update(e.name for e in os.scandir(path) if e.is_dir())
        return sorted(names)


class Group:
    """One job's cgroup: a directory per hierarchy (``paths``, keyed as :attr:`Tree.site`)."""

    def __init__(self, version: int, paths: dict[str, str], cpu: bool = False) -> None:
        self.version = version
        self.paths = paths
        self.cpu = cpu  # whether it can have a CPU quota (Tree.cpu)
        self.name = os.path.basename(next(iter(paths.values())))
        # What it was last given (configure skips writing what is set already, as a group is
        # reused job after job), and its kernel counters when its present job began.
        self._set: tuple[tuple[int, ...], int | None, int | None] | None = None
        self._quota: int | None = None
        self.baseline: dict[str, int] = {}

    def configure(
        self, cpus: Iterable[int], memory: int | None, pids: int | None, quota: int | None = None
    ) -> None:
        """Give the group these CPUs, memory limit (bytes), process limit and CPU quota
        (microseconds per :data:`CPU_PERIOD`; None: none; ignored where :attr:`cpu` is
        false: the executor has said that jobs run uncapped there)."""
        if self._set is None or self._quota != quota:
            self.set_cpu_quota(quota)
        cpu_set = tuple(sorted(set(cpus)))
        was = self._set
        if was is None or was[0] != cpu_set:
            self.set_cpus(cpu_set)
        if was is None or was[1] != memory:
            if self.version == 1:
                _write(self._file("memory", "memory.limit_in_bytes"), str(memory or -1))
            else:
                _write(self._file("", "memory.max"), str(memory) if memory else "max")
        if was is None or was[2] != pids:
            _write(self._file("pids", "pids.max"), str(pids) if pids else "max")
        self._set = (cpu_set, memory, pids)

    def set_cpu_quota(self, quota: int | None) -> None:
        """Cap the group's CPU time at ``quota`` microseconds per :data:`CPU_PERIOD` (None:
        uncapped); nothing where the cpu controller is not here."""
        if not self.cpu:
            return
        if self.version == 2:
            limit = "max" if quota is None else str(quota)
            _write(self._file(CPU, "cpu.max"), f"{limit} {CPU_PERIOD}")
        else:
            _write(self._file(CPU, "cpu.cfs_period_us"), str(CPU_PERIOD))
            _write(self._file(CPU, "cpu.cfs_quota_us"), str(-1 if quota is None else quota))
        self._quota = quota

    def _file(self, controller: str, name: str) -> str:
        return os.path.join(self.paths[controller if self.version == 1 else ""], name)

    def exists(self) -> bool:
        return all(os.path.isdir(path) for path in self.paths.values())

    def set_cpus(self, cpus: Iterable[int]) -> None:
        """Confine the group to ``cpus`` (a malleable job's resize moves it)."""
        _write(self._file("cpuset", "cpuset.cpus"), ",".join(map(str, sorted(set(cpus)))))
        if self._set is not None:
            self._set = (tuple(sorted(set(cpus))), *self._set[1:])

    def members(self) -> list[int]:
        """The pids in the group (every hierarchy agrees; the freezer's on v1)."""
        try:
            text = _read(self._file("freezer", "cgroup.procs"))
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) every process of the group at once, forks in flight included."""
        if self.version == 2:
            _write(self._file("", "cgroup.freeze"), "1" if frozen else "0")
            return
        _write(self._file("freezer", "freezer.state"), "FROZEN" if frozen else "THAWED")
        if frozen:  # FREEZING until every task has stopped
            for _ in range(1000):
                if _read(self._file("freezer", "freezer.state")).strip() == "FROZEN":
                    return
                time.sleep(0.001)

    def kill(self) -> int:
        """SIGKILL every process of the group, however it was forked (one round: on v1, a
        frozen group, so that nothing forks meanwhile); how many there were. What is left after
        (a process forked by one that was dying) is the next round's: see :meth:`empty`."""
        members = self.members()
        if not members:
            return 0
        if self.version == 2 and os.path.exists(self._file("", "cgroup.kill")):
            _write(self._file("", "cgroup.kill"), "1")
            return len(members)
        with contextlib.suppress(OSError):
            self.freeze()
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.freeze(False)  # a frozen task dies only once thawed
        return len(members)

    def empty(self) -> bool:
        """Whether no process is left in the group, and none charged to its process limit: a
        killed process leaves ``cgroup.procs`` when it dies, but stays charged (``pids.current``)
        until its parent reaps it. A group reused before that would refuse its next job's forks."""
        if self.members():
            return False
        try:
            return int(_read(self._file("pids", "pids.current"))) == 0
        except (OSError, ValueError):  # no pids controller here
            return True

    def wait_dead(self, timeout: float = 0.2) -> bool:
        """Wait, ``timeout`` seconds at most, until no process of the group still runs: a
        SIGKILLed process dies when next scheduled, not at once (a zombie, dead and waiting to
        be reaped, counts as dead). Whether none runs."""
        deadline = time.monotonic() + timeout
        while True:
            running = [pid for pid in self.members() if _running(pid)]
            if not running:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def limits_hit(self) -> dict[str, int]:
        """What the kernel refused or killed for the group's limits since its present job
        began (:attr:`baseline`): ``oom_kill`` (processes the OOM killer ended at the memory
        limit), ``pids_max`` (forks refused at the process limit). Zero counts are left out.
        The counts now become the baseline of the group's next job (it is reused)."""
        counts = self.counters()
        hit = {
            key: counts[key] - self.baseline.get(key, 0)
            for key in counts
            if counts[key] > self.baseline.get(key, 0)
        }
        self.baseline = counts
        return hit

    def joined(self) -> list[str]:
        """The directories a job joins (writing itself into each ``cgroup.procs``). On v1,
        the cpuset and the freezer always (its cores; killing all it forked), the memory and
        pids hierarchies (and the cpu one) only while the group has a limit there: joining a v1
        hierarchy is a migration of its own (tens of microseconds each, per start), and one
        without a limit holds nothing."""
        if self.version == 2:
            return [self.paths[""]]
        limits = self._set or ((), None, None)
        wanted = ["cpuset", "freezer", *(("memory",) if limits[1] else ())]
        wanted += ["pids"] if limits[2] else []
        wanted += [CPU] if self.cpu and self._quota is not None else []
        return [self.paths[key] for key in wanted]

    def counters(self) -> dict[str, int]:
        """The kernel's counts of the group's limits enforced, since the group was made (on v1,
        of the hierarchies its job joined: :meth:`joined`)."""
        out: dict[str, int] = {}
        limits = self._set or ((), None, None)
        if self.version == 1 and not limits[1] and not limits[2]:
            return out
        with contextlib.suppress(OSError):
            if self.version == 2:
                events = _counts(_read(self._file("", "memory.events")))
            else:
                events = _counts(_read(self._file("memory", "memory.oom_control")))
            if events.get("oom_kill"):
                out["oom_kill"] = events["oom_kill"]
        with contextlib.suppress(OSError):
            refused = _counts(_read(self._file("pids", "pids.events"))).get("max", 0)
            if refused:
                out["pids_max"] = refused
        return out

    def remove(self) -> bool:
        """Remove the (empty) group; False if something is still in it."""
        return _remove_all(self.paths.values())


def _remove_all(directories: Iterable[str]) -> bool:
    """Remove each cgroup directory; whether all are gone (one still in use stays)."""
    gone = True
    for path in directories:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                raise
            gone = False
    return gone


def _v2_mount(mounts: str) -> str | None:
    for point, kind, _ in _mounts(mounts):
        if kind == "cgroup2":
            controllers = set(_read(os.path.join(point, "cgroup.controllers")).split())
            if set(V2_CONTROLLERS) <= controllers:
                return point
    return None


def _v1_mounts(mounts: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for point, kind, options in _mounts(mounts):
        if kind == "cgroup":
            for controller in (*V1_CONTROLLERS, CPU):
                if controller in options:
                    found[controller] = point
    return found


def _enable(directory: str, controllers: Iterable[str]) -> None:
    """Enable ``controllers`` for the children of ``directory`` (v2's subtree_control)."""
    wanted = " ".join(f"+{name}" for name in controllers)
    try:
        _write(os.path.join(directory, "cgroup.subtree_control"), wanted)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise Unavailable(
                f"cgroup v2: cannot enable {wanted} below {directory}: it holds processes "
                "(cgroup v2 lets only groups without processes share controllers)"
            ) from exc
        raise


def _v2_cpu(mount: str, directories: Iterable[str], make: bool) -> str | None:
    """None if job groups below ``directories`` (the gbroker and site groups) can have the cpu
    controller (``make``: enabled for them now), else why not."""
    if CPU not in _read(os.path.join(mount, "cgroup.controllers")).split():
        return f"the cgroup v2 mount {mount} offers no cpu controller"
    if not make:
        return None
    try:
        for directory in (mount, *directories):
            _enable(directory, [CPU])
    except (OSError, Unavailable) as exc:  # e.g. a real-time process outside the root group
        return f"cgroup v2: cannot enable +cpu: {exc}"
    return None


def _v1_cpu(mount: str | None, site: str, make: bool) -> str | None:
    """None if the v1 cpu hierarchy at ``mount`` has (``make``: now) the site group ``site``,
    else why not."""
    if mount is None:
        return "no cgroup v1 hierarchy for cpu"
    if not make:
        return None if os.access(mount, os.W_OK) else f"{mount} is read-only here"
    try:
        for directory in (os.path.dirname(site), site):
            _make_searchable(directory)
    except OSError as exc:
        return f"cannot make {site}: {exc}"
    return None


def _checked(tree: Tree, hierarchies: list[str]) -> Tree:
    """``tree``, if each hierarchy's root is one we may make groups in."""
    for hierarchy in hierarchies:
        if not os.access(hierarchy, os.W_OK):
            raise Unavailable(f"{hierarchy} is read-only here")
    return tree


def detect(root: str, mounts: str = MOUNTS, make: bool = True) -> Tree:
    """The site group of executor root ``root``, made if needed (``make``; else only found,
    and checked writable): on cgroup v2 where its mount offers cpuset, memory and pids, else
    on the v1 hierarchies; with the cpu controller where it can be had (else the tree's
    ``cpu_unavailable`` says why). Raises :class:`Unavailable` saying why neither can be used
    (not root, no such mounts, a read-only cgroupfs)."""
    if os.geteuid() != 0:
        raise Unavailable("the broker is not root: it cannot make cgroups")
    key = site_key(root)
    try:
        v2 = _v2_mount(mounts)
        if v2 is not None:
            parent = os.path.join(v2, "gbroker")
            site = os.path.join(parent, key)
            if not make:
                return _checked(Tree(2, {"": site}, _v2_cpu(v2, (parent,), False)), [v2])
            for directory in (parent, site):
                _make_searchable(directory)
            _enable(v2, V2_CONTROLLERS)
            _enable(parent, V2_CONTROLLERS)
            _enable(site, V2_CONTROLLERS)
            return Tree(2, {"": site}, _v2_cpu(v2, (parent, site), True))
        v1 = _v1_mounts(mounts)
        missing = [name for name in V1_CONTROLLERS if name not in v1]
        if missing:
            raise Unavailable(
                "no cgroup v2 mount with cpuset, memory and pids, and no cgroup v1 "
                f"hierarchy for {', '.join(missing)}"
            )
        sites: dict[str, str] = {}
        for controller in V1_CONTROLLERS:
            parent = os.path.join(v1[controller], "gbroker")
            site = os.path.join(parent, key)
            sites[controller] = site
            if not make:
                continue
            for directory in (parent, site):
                _make_searchable(directory)
                if controller == "cpuset":  # a v1 cpuset is empty until given cpus and mems
                    above = os.path.dirname(directory)
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        if not _read(os.path.join(directory, name)).strip():
                            _write(
                                os.path.join(directory, name),
                                _read(os.path.join(above, name)).strip(),
                            )
        cpu_site = os.path.join(v1.get(CPU, ""), "gbroker", key)
        cpu_unavailable = _v1_cpu(v1.get(CPU), cpu_site, make)
        if cpu_unavailable is None:
            sites[CPU] = cpu_site
        tree = Tree(1, sites, cpu_unavailable)
        return _checked(tree, [v1[name] for name in V1_CONTROLLERS]) if not make else tree
    except OSError as exc:
        raise Unavailable(f"cannot make the site's cgroup: {exc}") from exc
