"""Topology files: the YAML format read and written (:func:`load_topology`, :func:`loads`,
:func:`save_topology`, :func:`dumps`); the format is described in :mod:`gbroker.topology`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import networkx as nx  # type: ignore[import-untyped]
import yaml

from gbroker.core.names import check_site_name, count
from gbroker.core.requirements import FileSystemSpec
from gbroker.errors import InvalidInput, Shown
from gbroker.topology.checks import (
    cores_of,
    endpoint,
    is_int,
    name_of,
    non_negative,
    optional_bandwidth,
    positive,
    share_of,
)
from gbroker.topology.graphs import FORMS, directed, named_graph
from gbroker.topology.model import (
    DEFAULT_LINK,
    MANAGERS,
    LinkSpec,
    SiteSpec,
    SlurmSpec,
    Topology,
    neighbourhood_form,
)
from gbroker.untrusted import safeyaml
from gbroker.untrusted.safeyaml import AliasRefused, NoAliasLoader

# --- YAML ---------------------------------------------------------------------------------------


class _Loader(NoAliasLoader):
    """PyYAML's safe loader without anchors and aliases (:mod:`gbroker.untrusted.safeyaml`), also
    reading YAML 1.2 floats such as ``12.5e6`` and ``1e-3``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_TOP_KEYS = ("name", "description", "defaults", "sites", "neighbourhood", "links", "data")
_SITE_KEYS = (
    "name",
    "cores",
    "speed",
    "uplink",
    "downlink",
    "http",
    "mqtt",
    "os",
    "os_version",
    "arch",
    "nodes",
    "cores_per_node",
    "memory_per_core",
    "memory_per_node",
    "disk",
    "cpu_speed",
    "exclusive",
    "file_systems",
    "manager",
    "slurm",
    "hosts",
    "cpu_share",
)
# YAML key -> SiteSpec attribute, where they differ.
_SITE_ATTRS = {
    "os": "operating_system",
    "os_version": "operating_system_version",
    "arch": "cpu_architecture",
}
_SIZE_KEYS = ("memory_per_core", "memory_per_node", "disk")
_FS_KEYS = ("name", "mount", "type", "free")
_SLURM_KEYS = ("partition",)
_LINK_KEYS = ("bandwidth", "latency")
_PAIR_KEYS = ("from", "to", "bandwidth", "latency", "symmetric")


def _mapping(field: str, value: object, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(field, f"a mapping with keys {', '.join(keys)}", value)
    for key in value:
        if key not in keys:
            raise InvalidInput(f"{field}.{key}", f"one of the keys {', '.join(keys)}", key)
    return value


def _required(field: str, mapping: Mapping[str, Any], key: str, expected: str) -> object:
    if key not in mapping:
        raise InvalidInput(f"{field}.{key}" if field else key, f"{expected}, but it is missing")
    return mapping[key]


def _link_from(field: str, raw: Mapping[str, Any], default: LinkSpec) -> LinkSpec:
    bandwidth = positive(
        f"{field}.bandwidth", raw.get("bandwidth", default.bandwidth), "a bandwidth in bytes/s"
    )
    latency = non_negative(
        f"{field}.latency", raw.get("latency", default.latency), "a latency in seconds"
    )
    return LinkSpec(bandwidth, latency)


_SIZE_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGTP]i?B|B)?\s*")
_SIZE_UNITS = {"B": 1, **{f"{p}B": 1000 ** (k + 1) for k, p in enumerate("kMGTP")}}
_SIZE_UNITS |= {f"{p}iB": 1024 ** (k + 1) for k, p in enumerate("KMGTP")}
_SIZE_UNITS["KB"] = 1000


def _bytes(field: str, value: object) -> int:
    """A size: whole bytes, or text with a unit (``2GiB``, ``100GB``, ``512 MiB``)."""
    expected = "a size: bytes, or text such as 2GiB, 512MiB or 100GB"
    if is_int(value) and value >= 0:
        return value
    match = _SIZE_TEXT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidInput(field, expected, value)
    size = float(match[1]) * _SIZE_UNITS[match[2] or "B"]
    if not size < 2**63 or size != int(size):
        raise InvalidInput(field, "a whole number of bytes", value)
    return int(size)


def _file_systems_from(field: str, raw: object) -> tuple[FileSystemSpec, ...]:
    if not isinstance(raw, list):
        raise InvalidInput(field, "a list of {name, mount, type, free}", raw)
    out = []
    for i, entry in enumerate(raw):
        here = f"{field}[{i}]"
        fs = _mapping(here, entry, _FS_KEYS)
        free = fs.get("free")
        try:
            out.append(
                FileSystemSpec(
                    name=name_of(f"{here}.name", _required(here, fs, "name", "a file system name")),
                    mount=name_of(
                        f"{here}.mount", _required(here, fs, "mount", "an absolute path")
                    ),
                    type=fs.get("type", "normal"),
                    free=None if free is None else _bytes(f"{here}.free", free),
                )
            )
        except InvalidInput as exc:
            if exc.field.startswith(here):
                raise
            raise InvalidInput(
                f"{here}.{exc.field.rsplit('.', 1)[-1]}", exc.expected, exc.found
            ) from exc
    return tuple(out)


def _slurm_from(field: str, raw: object) -> SlurmSpec:
    settings = _mapping(field, raw, _SLURM_KEYS)
    try:
        return SlurmSpec(**settings)
    except InvalidInput as exc:
        key = exc.field.removeprefix("slurm.")
        raise InvalidInput(f"{field}.{key}", exc.expected, exc.found) from exc


def _site_from(field: str, raw: object) -> SiteSpec:
    site = _mapping(field, raw, _SITE_KEYS)
    extra: dict[str, Any] = {}
    for key in ("os", "os_version", "arch"):
        if site.get(key) is not None:
            extra[_SITE_ATTRS[key]] = name_of(f"{field}.{key}", str(site[key]))
    for key in ("nodes", "cores_per_node"):
        if site.get(key) is not None:
            extra[key] = cores_of(f"{field}.{key}", site[key])
    for key in _SIZE_KEYS:
        if site.get(key) is not None:
            extra[key] = _bytes(f"{field}.{key}", site[key])
    if site.get("cpu_speed") is not None:
        extra["cpu_speed"] = positive(f"{field}.cpu_speed", site["cpu_speed"], "a speed in Hz")
    if "exclusive" in site:
        if not isinstance(site["exclusive"], bool):
            raise InvalidInput(f"{field}.exclusive", "true or false", site["exclusive"])
        extra["exclusive"] = site["exclusive"]
    if site.get("file_systems") is not None:
        extra["file_systems"] = _file_systems_from(f"{field}.file_systems", site["file_systems"])
    if "manager" in site:
        if site["manager"] not in MANAGERS:
            raise InvalidInput(f"{field}.manager", f"one of {', '.join(MANAGERS)}", site["manager"])
        extra["manager"] = site["manager"]
    if "slurm" in site:
        extra["slurm"] = _slurm_from(f"{field}.slurm", site["slurm"])
    if "cpu_share" in site:
        extra["cpu_share"] = share_of(f"{field}.cpu_share", site["cpu_share"])
    if site.get("hosts") is not None:
        hosts = site["hosts"]
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise InvalidInput(f"{field}.hosts", "a list of host names, one per node", hosts)
        extra["hosts"] = tuple(hosts)
    name = check_site_name(_required(field, site, "name", "a site name"), field=f"{field}.name")
    try:
        return SiteSpec(
            name=name,
            cores=cores_of(f"{field}.cores", _required(field, site, "cores", "an integer >= 1")),
            speed=positive(f"{field}.speed", site.get("speed", 1.0), "a speed"),
            uplink=optional_bandwidth(f"{field}.uplink", site.get("uplink")),
            downlink=optional_bandwidth(f"{field}.downlink", site.get("downlink")),
            http=endpoint(f"{field}.http", site.get("http")),
            mqtt=endpoint(f"{field}.mqtt", site.get("mqtt")),
            **extra,
        )
    except InvalidInput as exc:
        prefix = f"site[{name}]."
        if not exc.field.startswith(prefix):
            raise
        key = exc.field[len(prefix) :]
        key = {v: k for k, v in _SITE_ATTRS.items()}.get(key, key)
        raise InvalidInput(f"{field}.{key}", exc.expected, exc.found) from exc


def _neighbourhood_from(raw: object, names: Sequence[str]) -> nx.DiGraph:
    if isinstance(raw, str):
        return directed(named_graph("neighbourhood", raw, len(names)), names)
    if not isinstance(raw, dict):
        raise InvalidInput("neighbourhood", FORMS, raw)
    known = set(names)
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    for site, targets in raw.items():
        if site not in known:
            raise InvalidInput(f"neighbourhood.{site}", "a site of the topology", site)
        if targets is None:
            continue
        if not isinstance(targets, list):
            raise InvalidInput(f"neighbourhood.{site}", "a list of site names", targets)
        for k, target in enumerate(targets):
            field = f"neighbourhood.{site}[{k}]"
            if not isinstance(target, str) or target not in known:
                raise InvalidInput(field, "a site of the topology", target)
            if target == site:
                raise InvalidInput(field, f"a site other than {site} itself", target)
            graph.add_edge(site, target)
    return graph


def _links_from(
    raw: object, names: Sequence[str], default: LinkSpec
) -> dict[tuple[str, str], LinkSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InvalidInput("links", "a list of {from, to, bandwidth, latency, symmetric}", raw)
    known = set(names)
    links: dict[tuple[str, str], LinkSpec] = {}
    origin: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(raw):
        field = f"links[{i}]"
        pair = _mapping(field, entry, _PAIR_KEYS)
        ends = []
        for side in ("from", "to"):
            end = _required(field, pair, side, "a site name")
            if not isinstance(end, str) or end not in known:
                raise InvalidInput(f"{field}.{side}", "a site of the topology", end)
            ends.append(end)
        a, b = ends
        if a == b:
            raise InvalidInput(f"{field}.to", "a site other than 'from'", b)
        symmetric = pair.get("symmetric", False)
        if not isinstance(symmetric, bool):
            raise InvalidInput(f"{field}.symmetric", "true or false", symmetric)
        link = _link_from(field, pair, default)
        for key in [(a, b), (b, a)] if symmetric else [(a, b)]:
            if key in links:
                raise InvalidInput(
                    field,
                    f"one entry per directed pair, but {key[0]} -> {key[1]} is also in "
                    f"links[{origin[key]}]",
                )
            links[key], origin[key] = link, i
    return links


def _data_from(raw: object, names: set[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput("data", "a mapping data set name -> site", raw)
    data: dict[str, str] = {}
    for data_set, site in raw.items():
        name_of("data", data_set)
        if not isinstance(site, str) or site not in names:
            raise InvalidInput(f"data.{data_set}", "a site of the topology", site)
        data[data_set] = site
    return data


def _from_document(document: object, default_name: str) -> Topology:
    doc = _mapping("document", document, _TOP_KEYS)
    name = name_of("name", doc.get("name", default_name))
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput("description", "a string", description)
    default = _link_from(
        "defaults", _mapping("defaults", doc.get("defaults", {}), _LINK_KEYS), DEFAULT_LINK
    )
    raw_sites = _required("", doc, "sites", "a list of sites")
    if not isinstance(raw_sites, list) or not raw_sites:
        raise InvalidInput("sites", "a non-empty list of sites", raw_sites)
    sites = [_site_from(f"sites[{i}]", raw) for i, raw in enumerate(raw_sites)]
    names = [site.name for site in sites]
    seen: set[str] = set()
    for i, site_name in enumerate(names):
        if site_name in seen:
            raise InvalidInput(f"sites[{i}].name", "a name no earlier site has", site_name)
        seen.add(site_name)
    neighbourhood = _neighbourhood_from(_required("", doc, "neighbourhood", FORMS), names)
    return Topology(
        sites,
        neighbourhood,
        name=name,
        description=description,
        links=_links_from(doc.get("links"), names, default),
        default_link=default,
        data=_data_from(doc.get("data"), seen),
    )


def loads(text: str, *, source: str | None = None, default_name: str = "topology") -> Topology:
    """Parse a topology from YAML ``text``; errors name ``source`` (if given) and the field."""
    prefix = f"{source}: " if source else ""
    try:
        document = safeyaml.load(text, _Loader)  # builds only plain data, refuses aliases
    except AliasRefused as exc:
        mark = exc.problem_mark
        where = f"{source or '<string>'}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise InvalidInput(
            where or "<string>", "YAML without anchors or aliases", Shown(exc.problem or "")
        ) from exc
    except RecursionError as exc:
        raise InvalidInput(source or "<string>", "YAML nested less deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source or '<string>'}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidInput(where or "<string>", f"valid YAML ({problem})") from exc
    try:
        return _from_document(document, default_name)
    except InvalidInput as exc:
        if not prefix:
            raise
        raise InvalidInput(prefix + exc.field, exc.expected, exc.found) from exc


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read and validate a topology file; errors name the file and the field.

    Raises:
        OSError: the file cannot be read.
        InvalidInput: it is not UTF-8 YAML describing a valid topology.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(str(path), f"UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return loads(text, source=str(path), default_name=path.stem)


def _document(topology: Topology) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": topology.name}
    if topology.description:
        doc["description"] = topology.description
    doc["defaults"] = {
        "bandwidth": topology.default_link.bandwidth,
        "latency": topology.default_link.latency,
    }
    sites = []
    for site in topology.sites.values():
        entry: dict[str, Any] = {"name": site.name, "cores": site.cores}
        if site.speed != 1.0:
            entry["speed"] = site.speed
        for key in ("uplink", "downlink", "http", "mqtt"):
            if (value := getattr(site, key)) is not None:
                entry[key] = value
        for key in _SITE_KEYS[7:]:
            value = getattr(site, _SITE_ATTRS.get(key, key))
            if key == "manager":
                if value != "local":
                    entry[key] = value
            elif key == "slurm":
                if value is not None and value != SlurmSpec():
                    entry[key] = {"partition": value.partition}
            elif key == "file_systems":
                if value:
                    entry[key] = [
                        {"name": fs.name, "mount": fs.mount, "type": fs.type}
                        | ({} if fs.free is None else {"free": fs.free})
                        for fs in value
                    ]
            elif key == "exclusive":
                if value:
                    entry[key] = True
            elif key == "hosts":
                if value:
                    entry[key] = list(value)
            elif key == "cpu_share":
                if value != 1.0:
                    entry[key] = value
            elif value is not None:
                entry[key] = value
        sites.append(entry)
    doc["sites"] = sites
    form = neighbourhood_form(topology)
    doc["neighbourhood"] = form or {
        site: list(topology.neighbourhood.successors(site)) for site in topology.sites
    }
    links = []
    written: set[tuple[str, str]] = set()
    for (a, b), link in topology.links.items():
        if (a, b) in written:
            continue
        entry = {"from": a, "to": b, "bandwidth": link.bandwidth, "latency": link.latency}
        if topology.links.get((b, a)) == link:
            entry["symmetric"] = True
            written.add((b, a))
        written.add((a, b))
        links.append(entry)
    if links:
        doc["links"] = links
    if topology.data:
        doc["data"] = dict(topology.data)
    return doc


def dumps(topology: Topology) -> str:
    """The topology as YAML that :func:`loads` reads back to an equal topology."""
    header = (
        f"# GBroker topology: {count(len(topology.sites), 'site')}, "
        f"{count(topology.total_cores, 'core')}. Format: topologies/README.md\n"
    )
    body = yaml.safe_dump(
        _document(topology),
        sort_keys=False,
        default_flow_style=None,
        allow_unicode=True,
        width=100,
    )
    return header + body


def save_topology(topology: Topology, target: str | os.PathLike[str] | TextIO) -> None:
    """Write the topology as YAML to a path or an open text stream."""
    text = dumps(topology)
    if isinstance(target, str | os.PathLike):
        Path(target).write_text(text, encoding="utf-8")
    else:
        target.write(text)
