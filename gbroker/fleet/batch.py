"""The batch systems a local fleet runs for its sites: a Slurm cluster of its own for each
``manager: slurm`` site (:mod:`gbroker.fleet.slurm`), a Grid Engine cell of its own for each
``manager: gridengine`` site (:mod:`gbroker.fleet.gridengine`).

Theory of operation. Both live the same life in a fleet, which this module is: ``fleet up``
starts each site's system before its broker (:func:`start`) and tells the broker where it is,
in ``serve``'s arguments (``--manager``, ``--jobs-dir``, a Slurm cluster's ``--slurm-conf``)
and in its environment (a Grid Engine cell's ``SGE_ROOT``, ``SGE_CELL`` and ports, as its
users' ``settings.sh`` sets them: fleet.json records it with the member, so that ``fleet
restart`` and the chaos tool start the broker again just so); ``fleet.json`` keeps each system
under its manager's name (``slurm``, ``gridengine``: :func:`systems` reads them back); ``fleet
status`` shows whether its daemons run; ``fleet down``, or an ``up`` that failed, stops it
after the brokers, the jobs still in it cancelled. A system is started on this host, so only a
local fleet has such sites (:func:`check`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from gbroker.errors import InvalidInput
from gbroker.fleet.gridengine import SiteCell
from gbroker.fleet.members import FleetError
from gbroker.fleet.slurm import PROMPT, ClusterSpec, SlurmCluster, cluster_name
from gbroker.topology import SiteSpec, Topology

__all__ = [
    "KINDS",
    "MAX_SLURM_NODES",
    "BatchSystem",
    "check",
    "records",
    "start",
    "status",
    "systems",
]

KINDS: Mapping[str, tuple[str, str]] = {
    "slurm": ("Slurm cluster", "Slurm clusters"),
    "gridengine": ("Grid Engine cell", "Grid Engine cells"),
}
"""Each batch manager a fleet runs, and what one of its systems is called (and several)."""

MAX_SLURM_NODES = 16
"""The most slurmds a local fleet starts for one Slurm site (each a process of this host)."""


class BatchSystem(Protocol):
    """A site's running batch system, as a fleet handles it."""

    def record(self) -> dict[str, Any]:
        """What ``fleet.json`` keeps of it (enough to stop it from another process)."""
        ...

    def serve_args(self) -> tuple[str, ...]:
        """The site's broker's ``gbroker serve`` arguments that point it there."""
        ...

    def environment(self) -> dict[str, str]:
        """What the site's broker needs in its environment to reach it."""
        ...

    def setting(self) -> str:
        """Where it is, as its users would set it (``SLURM_CONF=...``, ``SGE_ROOT=...``)."""
        ...

    def wait_idle(self, deadline: float) -> None:
        """Wait (until ``deadline``, a ``time.monotonic()`` value) until it takes jobs."""
        ...

    def alive(self) -> dict[str, bool]:
        """Each of its daemons: whether it runs."""
        ...

    def stop(self, grace: float = 10.0, cancel: bool = False) -> int:
        """Stop it; how many jobs it still had (cancelled with ``cancel``)."""
        ...


def check(source: Topology, runtime: str) -> None:
    """A site with a batch manager needs a local fleet, which starts its system on this host:
    a Slurm cluster of at most :data:`MAX_SLURM_NODES` nodes, a Grid Engine cell of one host."""
    for site in source.sites.values():
        if site.manager not in KINDS:
            continue
        kind = KINDS[site.manager][0]
        if runtime != "local":
            raise FleetError(
                f"site {site.name} has manager: {site.manager}, and a {runtime} fleet cannot "
                f"start its {kind}: only a local fleet (--runtime local) does"
            )
        nodes = site.properties().node_count
        if site.manager == "slurm" and nodes > MAX_SLURM_NODES:
            raise InvalidInput(
                f"site[{site.name}].nodes",
                f"at most {MAX_SLURM_NODES} for a Slurm site of a local fleet (a slurmd each)",
                nodes,
            )
        if site.manager == "gridengine" and nodes > 1:
            raise InvalidInput(
                f"site[{site.name}].nodes",
                "1 for a Grid Engine site of a local fleet (its cell is one host: this one)",
                nodes,
            )


def _cluster_spec(site: SiteSpec) -> ClusterSpec:
    """The Slurm cluster of a ``manager: slurm`` site: its nodes share its cores."""
    properties = site.properties()
    # Its nodes are the site's hosts where it names them (jobs' candidate hosts match them).
    nodes = properties.hosts or tuple(f"node{i}" for i in range(1, properties.node_count + 1))
    assert site.slurm is not None  # a slurm site has its settings (SiteSpec)
    return ClusterSpec(
        cluster_name(site.name),
        properties.node_cores,
        nodes,
        site.slurm.partition,
        scheduler_parameters=PROMPT,
    )


def start(
    source: Topology, directory: Path, deadline: float, started: dict[str, BatchSystem]
) -> None:
    """Start each batch site's system (a Slurm cluster's files in ``<directory>/slurm/<site>``;
    a Grid Engine cell, slots as many as the site's cores) and wait until each takes jobs, by
    ``deadline`` (a ``time.monotonic()`` value). Each goes into ``started`` (by site) as soon
    as it runs, so that the caller can stop them all if one fails."""
    for spec in source.sites.values():
        if spec.manager == "slurm":
            cluster_directory = directory / "slurm" / spec.name
            cluster_directory.mkdir(parents=True, exist_ok=True)
            cluster = started[spec.name] = SlurmCluster(cluster_directory, _cluster_spec(spec))
            cluster.launch()  # the slurmds come up while the next system starts
        elif spec.manager == "gridengine":
            started[spec.name] = SiteCell.start(spec.cores, deadline)
    for system in started.values():
        system.wait_idle(deadline)


def records(source: Topology, started: Mapping[str, BatchSystem]) -> dict[str, dict[str, Any]]:
    """What ``fleet.json`` keeps of ``started``: by manager, then site."""
    kept: dict[str, dict[str, Any]] = {}
    for site, system in started.items():
        kept.setdefault(source.sites[site].manager, {})[site] = system.record()
    return kept


def _from_record(manager: str, record: dict[str, Any]) -> BatchSystem:
    if manager == "slurm":
        return SlurmCluster.from_record(record)
    return SiteCell.from_record(record)


def systems(record: Mapping[str, Any]) -> Iterator[tuple[str, str, BatchSystem]]:
    """Each batch system a fleet's record names: (manager, site, system)."""
    for manager in KINDS:
        for site, kept in record.get(manager, {}).items():
            yield manager, site, _from_record(manager, kept)


def status(system: BatchSystem) -> dict[str, Any]:
    """A system in ``fleet status``: where it is, whether each daemon runs, and whether all do."""
    daemons = system.alive()
    return {"setting": system.setting(), "daemons": daemons, "up": all(daemons.values())}
