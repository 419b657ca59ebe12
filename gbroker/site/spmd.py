"""SPMD jobs as ranks: the command that starts an MPI job's N processes with a site's launcher.

Theory of operation
-------------------
An SPMD job (JSDL SPMD, GFD.115; ``processes``/``spmd_variation`` in JSON/YAML) whose variation
names an MPI is not run once: its site starts N ranks of its program through the launcher of
that MPI. The description decides *what* (``gbroker.jobs.description``: N, ProcessesPerHost p,
ThreadsPerProcess t and the variation's :class:`MpiFlavour`, refusing at submission any variation
no site runs); this module decides *how*, as pure functions of :class:`Ranks`, the job's cores
and the launchers installed, so a back-end only runs the argv it is given:

* :func:`local_argv`, for the ``local`` back-end: one ``mpiexec`` on the broker's host, the
  ranks bound to the job's own CPUs (its cgroup's cpuset).
* :func:`batch_argv` and :func:`sbatch_options`, for a batch system's back-end (Slurm): the line
  of the batch script that starts the ranks inside the allocation, and the allocation to ask
  for.

Flavours (:data:`LAUNCHERS`): ``openmpi``, ``mpich``, and ``mpi`` (the site's default: Open MPI
where installed, else MPICH). A flavour whose launcher the site lacks fails the job at the site
(:class:`LauncherMissing`), never runs it once. Placement (:func:`rank_cpus`): h = ceil(N / p)
"hosts" emulated as h consecutive groups of the job's CPUs, p ranks each in rank order, each
rank bound to t CPUs of its group. Each launcher runs without ssh, as a uid with no passwd entry,
in a cgroup; MPICH's working directory is ``/proc/self/cwd``, since the job's uid may not reach
its job directory's absolute path. docs/SITES.md ("MPI jobs: SPMD as ranks") has the launchers'
names, the placement rule in full and each launcher's options, with why.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gbroker.errors import InvalidInput

__all__ = [
    "LAUNCHERS",
    "LauncherMissing",
    "MpiFlavour",
    "Ranks",
    "batch_argv",
    "installed_launchers",
    "local_argv",
    "rank_cpus",
    "sbatch_options",
]


class MpiFlavour(StrEnum):
    """Which MPI starts the ranks (the values of ``gbroker.jobs.description.SpmdLauncher``)."""

    DEFAULT = "mpi"  # the site's default: Open MPI, else MPICH
    OPEN_MPI = "openmpi"
    MPICH = "mpich"


#: Each flavour's launcher, as Debian's openmpi-bin and mpich install them.
LAUNCHERS: Mapping[MpiFlavour, str] = {
    MpiFlavour.OPEN_MPI: "mpiexec.openmpi",
    MpiFlavour.MPICH: "mpiexec.mpich",
}
# What the site's default MPI is, in order of preference.
_DEFAULT_ORDER = (MpiFlavour.OPEN_MPI, MpiFlavour.MPICH)


class LauncherMissing(InvalidInput):
    """The site has no launcher for the job's MPI flavour: the job fails here, saying so."""

    def __init__(self, flavour: MpiFlavour) -> None:
        if flavour is MpiFlavour.DEFAULT:
            wanted = " or ".join(LAUNCHERS[f] for f in _DEFAULT_ORDER)
        else:
            wanted = LAUNCHERS[flavour]
        super().__init__("spmd_variation", f"a site with {wanted} on its PATH", str(flavour))
        self.flavour = flavour


@dataclass(frozen=True, slots=True)
class Ranks:
    """How to start an SPMD job's ranks: N ``processes`` of ``threads`` cores each (t), at most
    ``per_host`` of them on one host (p; None: no limit), with the MPI of ``flavour``."""

    flavour: MpiFlavour
    processes: int
    per_host: int | None = None
    threads: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "flavour", MpiFlavour(self.flavour))
        for key in ("processes", "per_host", "threads"):
            value = getattr(self, key)
            if value is None and key == "per_host":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"ranks.{key}", "an integer >= 1", value)

    @property
    def hosts(self) -> int:
        """h, the hosts the ranks span: ceil(N / p), else 1."""
        if self.per_host is None:
            return 1
        return -(-self.processes // self.per_host)


def installed_launchers(which: Callable[[str], str | None] = shutil.which) -> dict[MpiFlavour, str]:
    """The launchers this host has (on the caller's PATH), by flavour, as absolute paths."""
    found = {flavour: which(name) for flavour, name in LAUNCHERS.items()}
    return {flavour: path for flavour, path in found.items() if path}


def _launcher(flavour: MpiFlavour, launchers: Mapping[MpiFlavour, str]) -> tuple[MpiFlavour, str]:
    """The flavour that runs ``flavour`` here (the default resolved) and its launcher's path."""
    candidates = _DEFAULT_ORDER if flavour is MpiFlavour.DEFAULT else (flavour,)
    for candidate in candidates:
        if candidate in launchers:
            return candidate, launchers[candidate]
    raise LauncherMissing(flavour)


def rank_cpus(ranks: Ranks, cpus: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The host CPUs each rank is bound to, rank by rank (see the module's docstring).

    ``cpus`` are the job's CPUs in slot order, one per allocated core (a CPU may repeat)."""
    if not cpus:
        raise InvalidInput("cpus", "the job's CPUs, at least one", list(cpus))
    hosts = ranks.hosts
    count = len(cpus)
    groups: list[tuple[int, ...]]
    if count < hosts:  # fewer cores than hosts: a core each, round the cores
        groups = [(cpus[k % count],) for k in range(hosts)]
    else:
        groups = [tuple(cpus[k * count // hosts : (k + 1) * count // hosts]) for k in range(hosts)]
    per_host = ranks.per_host or ranks.processes
    out = []
    for rank in range(ranks.processes):
        group = groups[rank // per_host]
        first = (rank % per_host) * ranks.threads
        out.append(tuple(sorted({group[(first + x) % len(group)] for x in range(ranks.threads)})))
    return tuple(out)


def local_argv(
    ranks: Ranks,
    command: Sequence[str],
    cpus: Sequence[int],
    launchers: Mapping[MpiFlavour, str],
    taskset: str = "taskset",
) -> list[str]:
    """The argv that starts ``command`` (the program and its arguments) as the job's ranks on
    this host, bound to ``cpus`` (:func:`rank_cpus`), with the launcher of ``ranks.flavour``
    among ``launchers`` (:func:`installed_launchers`). Raises :class:`LauncherMissing`."""
    flavour, launcher = _launcher(ranks.flavour, launchers)
    bound = rank_cpus(ranks, cpus)
    n = str(ranks.processes)
    if flavour is MpiFlavour.MPICH:
        binding = ",".join("+".join(map(str, each)) for each in bound)
        return [
            launcher, "-launcher", "fork", "-wdir", "/proc/self/cwd",
            "-n", n, "-bind-to", f"user:{binding}", *command,
        ]  # fmt: skip
    argv = [launcher, "--mca", "plm", "isolated", "--allow-run-as-root"]
    argv += ["--host", f"localhost:{n}", "--bind-to", "none"]
    for rank, each in enumerate(bound):
        if rank:
            argv.append(":")
        argv += ["-n", "1", taskset, "-c", ",".join(map(str, each)), *command]
    return argv


def batch_argv(
    ranks: Ranks, command: Sequence[str], launchers: Mapping[MpiFlavour, str] | None = None
) -> list[str]:
    """The line of a batch script that starts ``command`` as the job's ranks inside its
    allocation (Slurm's ``sbatch`` with :func:`sbatch_options`): the flavour's ``mpiexec``,
    which finds the allocation itself (Open MPI's and MPICH's both read ``SLURM_*`` and start
    their daemons with ``srun``) and places N ranks on it; binding is the batch system's (its
    cgroup per job and task). ``launchers``: the compute nodes' launchers, where they differ
    from the names of :data:`LAUNCHERS`; the default flavour is Open MPI's unless only MPICH's
    is given. Raises :class:`LauncherMissing` for a flavour ``launchers`` lacks."""
    known = dict(LAUNCHERS) if launchers is None else dict(launchers)
    _, launcher = _launcher(ranks.flavour, known)
    return [launcher, "-n", str(ranks.processes), *command]


def sbatch_options(ranks: Ranks) -> list[str]:
    """The ``sbatch`` options of the allocation the ranks need: N tasks of t CPUs each, at most
    p to a node."""
    options = [f"--ntasks={ranks.processes}", f"--cpus-per-task={ranks.threads}"]
    if ranks.per_host is not None:  # never more a node than there are: Slurm would ask a node
        # for p x t CPUs (BadConstraints on a node with fewer), for 1 process of p = 4
        options.append(f"--ntasks-per-node={min(ranks.per_host, ranks.processes)}")
    return options
