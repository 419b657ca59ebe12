"""topologies/README.md's table says what each shipped file holds: checked against the files."""

from __future__ import annotations

from pathlib import Path

from gbroker.topology import load_topology, neighbourhood_form

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def table() -> dict[str, list[str]]:
    rows = {}
    for line in (TOPOLOGIES / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and cells[0].endswith(".yaml`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_table_lists_every_file_with_its_sites_cores_graph_and_default_link() -> None:
    rows = table()
    assert set(rows) == {p.name for p in TOPOLOGIES.glob("*.yaml")}
    for name, (sites, cores, form, link, _) in rows.items():
        topology = load_topology(TOPOLOGIES / name)
        assert int(sites) == len(topology.sites), name
        assert int(cores) == topology.total_cores, name
        assert form == (neighbourhood_form(topology) or "explicit"), name
        bandwidth, latency = link.split(", ")
        assert float(bandwidth.removesuffix(" B/s")) == topology.default_link.bandwidth, name
        assert float(latency.removesuffix(" ms")) / 1e3 == topology.default_link.latency, name
