"""What a fleet writes for its brokers: its topology, with what the host offers filled in."""

from __future__ import annotations

import platform
from pathlib import Path

from gbroker.fleet.files import _host_platform, write_fleet_files
from gbroker.topology import SiteSpec, Topology, load_topology


def test_a_fleet_s_sites_offer_this_hosts_system_unless_the_topology_says_otherwise(
    tmp_path: Path,
) -> None:
    """Local, namespace and container fleets run their jobs on this host: a site that declares
    no operating system or architecture offers this host's, so JSDL asking for them runs."""
    source = Topology(
        [
            SiteSpec("plain", 4),
            SiteSpec("declared", 4, operating_system="AIX", cpu_architecture="powerpc"),
        ],
        "full",
        name="two",
    )
    files = write_fleet_files(source, tmp_path, lambda site: f"http://{site}:1")
    written, path = files.topology, files.topology_file
    again = load_topology(path)
    assert again.sites == written.sites
    system, machine = _host_platform()
    assert (system, machine) == ("LINUX", "x86_64") or platform.machine() != "x86_64"
    plain, declared = again.sites["plain"], again.sites["declared"]
    assert (plain.operating_system, plain.cpu_architecture) == (system, machine)
    assert (declared.operating_system, declared.cpu_architecture) == ("AIX", "powerpc")
    assert plain.http == "http://plain:1"
