"""JSON and YAML job descriptions: the same fields as JSDL in snake case (:func:`from_mapping`,
:func:`to_mapping`); YAML is read without anchors and aliases
(:mod:`gbroker.untrusted.safeyaml`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from enum import StrEnum
from typing import Any, NoReturn, cast

from gbroker.core.apples import MODEL_KEYS, parse_model
from gbroker.core.malleable import Malleability
from gbroker.errors import InvalidInput
from gbroker.jobs.description import (
    AMOUNT_FIELDS,
    COUNT_FIELDS,
    Component,
    ComponentOf,
    FileSystem,
    JobDescription,
    JsdlError,
    RangeKind,
    RangeValue,
    StagingEntry,
    did_you_mean,
)
from gbroker.jobs.malleability import (
    MALLEABILITY_FIELDS,
    malleability_from,
    malleability_to_mapping,
)
from gbroker.jobs.values import is_int, is_number

#: The fields of a JSON/YAML job, each with the JSDL element it stands for and what it says
#: (``gbroker jsdl fields`` prints them).
FIELDS: dict[str, tuple[str, str]] = {
    "name": ("JobIdentification/JobName", "the job's name"),
    "description": ("JobIdentification/Description", "what the job is, for people"),
    "annotations": ("JobIdentification/JobAnnotation", "notes, a list of strings"),
    "projects": ("JobIdentification/JobProject", "projects, a list of strings"),
    "application_name": ("Application/ApplicationName", "an application the site resolves"),
    "application_version": ("Application/ApplicationVersion", "its version"),
    "application": ("Application/*Application", "posix, hpcpa or spmd (else inferred)"),
    "executable": ("POSIXApplication/Executable", "the program to run"),
    "arguments": ("POSIXApplication/Argument", "its arguments, a list of strings"),
    "environment": ("POSIXApplication/Environment", "variables, a mapping of names to values"),
    "input": ("POSIXApplication/Input", "standard input, a file of the job's directory"),
    "output": ("POSIXApplication/Output", "standard output's file (default stdout)"),
    "error": ("POSIXApplication/Error", "standard error's file (default stderr)"),
    "working_directory": ("POSIXApplication/WorkingDirectory", "where the job starts"),
    "filesystem_names": (
        "@filesystemName",
        "path fields relative to a site's file system: {working_directory: SCRATCH, ...}",
    ),
    "wall_time_limit": ("POSIXApplication/WallTimeLimit", "seconds of wall time"),
    "cpu_time_limit": ("POSIXApplication/CPUTimeLimit", "seconds of CPU time (RLIMIT_CPU)"),
    "number_of_processes": ("SPMDApplication/NumberOfProcesses", "the SPMD job's processes"),
    "processes_from_allocation": (
        "NumberOfProcesses/@actualtotalcpucount",
        "true: one process per allocated CPU",
    ),
    "processes_per_host": ("SPMDApplication/ProcessesPerHost", "processes on each host"),
    "threads_per_process": ("SPMDApplication/ThreadsPerProcess", "threads of each process"),
    "threads_from_allocation": (
        "ThreadsPerProcess/@actualindividualcpucount",
        "true: one thread per CPU of a host",
    ),
    "spmd_variation": ("SPMDApplication/SPMDVariation", "the MPI flavour, a URI"),
    "candidate_hosts": ("Resources/CandidateHosts", "the sites it may run at (name patterns)"),
    "total_cpu_count": ("Resources/TotalCPUCount", "cores: 4, or {lower: 2, upper: 8}"),
    "individual_cpu_count": ("Resources/IndividualCPUCount", "cores per node (a range)"),
    "total_cpu_time": ("Resources/TotalCPUTime", "CPU seconds in all (a range)"),
    "individual_cpu_time": ("Resources/IndividualCPUTime", "CPU seconds per node (a range)"),
    "exclusive_execution": ("Resources/ExclusiveExecution", "true: a site that allows it"),
    "operating_system": ("OperatingSystemType/OperatingSystemName", "LINUX, FreeBSD, ..."),
    "operating_system_version": ("OperatingSystem/OperatingSystemVersion", "its version"),
    "cpu_architecture": ("CPUArchitecture/CPUArchitectureName", "x86_64, arm, ..."),
    "individual_cpu_speed": ("Resources/IndividualCPUSpeed", "Hz (a range)"),
    "individual_network_bandwidth": ("Resources/IndividualNetworkBandwidth", "bit/s (a range)"),
    "individual_physical_memory": ("Resources/IndividualPhysicalMemory", "bytes per node"),
    "total_physical_memory": ("Resources/TotalPhysicalMemory", "bytes in all (a range)"),
    "individual_disk_space": ("Resources/IndividualDiskSpace", "bytes per node (a range)"),
    "total_disk_space": ("Resources/TotalDiskSpace", "bytes in all (a range)"),
    "total_resource_count": ("Resources/TotalResourceCount", "nodes (a range)"),
    "file_systems": ("Resources/FileSystem", "file systems the job needs, a list"),
    "staging": ("DataStaging", "files staged in and out, a list"),
    "job_class": ("gbroker:JobClass", "rigid, moldable or malleable"),
    "min_cores": ("gbroker:MinCores", "the fewest cores it runs on"),
    "max_cores": ("gbroker:MaxCores", "the most cores it can use"),
    "malleability": ("gbroker:Malleability", "how a malleable job resizes"),
    "components": (
        "gbroker:Component",
        "a co-allocated job's parts, started together: [{cores: 4, site: A}, {cores: 2}]",
    ),
    "coallocation": ("gbroker:Coallocation", "how components are placed: worst-fit, cm, fcm, ..."),
    "model": (
        "gbroker:Model",
        "an AppLeS performance model: the planner chooses the sites and partition (docs/APPLES.md)",
    ),
    "component_of": ("-", "set by the owner broker on each component; refused in a submission"),
    "sweep": ("sweep:Sweep", "a parameter sweep: the job becomes an array"),
}
#: The keys of the mappings inside a job (a staging entry, a file system, ...).
NESTED_FIELDS: dict[str, tuple[str, ...]] = {
    "staging[i]": tuple(f.name for f in fields(StagingEntry)),
    "file_systems[i]": ("name", "type", "description", "mount_point", "disk_space"),
    "malleability": MALLEABILITY_FIELDS,
    "components[i]": ("cores", "site"),
    "model": MODEL_KEYS,
    "a range": ("exact", "lower", "upper"),
    "sweep": ("assignments", "sweeps"),
    "sweep...assignments[i]": ("parameters", "values", "loop_integer", "loop_double"),
}


def unknown_field(key: object, allowed: Iterable[str]) -> str:
    """What an error says was expected instead of the unknown key ``key``: the nearest known
    key(s) first, then the known ones (a long list: where to find it)."""
    allowed = tuple(allowed)
    near = did_you_mean(str(key), allowed, quote=True).strip()
    near = f": {near[1:-1]}" if near else ""
    if len(allowed) > 12:
        known = "known fields: gbroker jsdl fields, or docs/JSDL.md"
    else:
        known = f"known: {', '.join(allowed)}"
    return f"a known field{near} ({known})"


# --------------------------------------------------------------------------------------------
# JSON / YAML


def _range_to_mapping(value: RangeValue) -> dict[str, float]:
    def num(x: float | None) -> float:
        assert x is not None
        return int(x) if float(x).is_integer() else x

    if value.kind is RangeKind.EXACT:
        return {"exact": num(value.lower)}
    if value.kind is RangeKind.LOWER_BOUNDED:
        return {"lower": num(value.lower)}
    if value.kind is RangeKind.UPPER_BOUNDED:
        return {"upper": num(value.upper)}
    return {"lower": num(value.lower), "upper": num(value.upper)}


_RANGE_FIELDS = (
    "total_cpu_count",
    "individual_cpu_count",
    "total_cpu_time",
    "individual_cpu_time",
    "total_resource_count",
    *(key for key, _, _ in AMOUNT_FIELDS),
)


def to_mapping(desc: JobDescription) -> dict[str, Any]:
    """The description as plain JSON/YAML data; fields that are unset are left out."""
    out: dict[str, Any] = {}
    for f in fields(desc):
        value = getattr(desc, f.name)
        if (
            value is None
            or (value is False and f.name != "exclusive_execution")
            or value == ()
            or (f.name in ("environment", "filesystem_names") and not value)
        ):
            continue
        if f.name in ("environment", "filesystem_names"):
            out[f.name] = dict(value)
        elif f.name in _RANGE_FIELDS:
            out[f.name] = _range_to_mapping(value)
        elif f.name == "staging":
            out[f.name] = [_staging_to_mapping(entry) for entry in value]
        elif f.name == "malleability":
            out[f.name] = malleability_to_mapping(value)
        elif f.name == "components":
            out[f.name] = [
                {"cores": c.cores} | ({} if c.site is None else {"site": c.site}) for c in value
            ]
        elif f.name == "model":
            out[f.name] = value.as_dict()
        elif f.name == "component_of":
            part = {"gang": value.gang, "size": value.size, "index": value.index}
            part["site"] = value.site
            if value.units is not None:
                part["units"] = value.units
            out[f.name] = part
        elif f.name == "file_systems":
            out[f.name] = [_file_system_to_mapping(fs) for fs in value]
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        elif isinstance(value, StrEnum):
            out[f.name] = str(value)
        else:
            out[f.name] = value
    return out


def _file_system_to_mapping(fs: FileSystem) -> dict[str, Any]:
    out: dict[str, Any] = {"name": fs.name}
    for key in ("type", "description", "mount_point"):
        if getattr(fs, key) is not None:
            out[key] = getattr(fs, key)
    if fs.disk_space is not None:
        out["disk_space"] = _range_to_mapping(fs.disk_space)
    return out


def _staging_to_mapping(entry: StagingEntry) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(entry):
        value = getattr(entry, f.name)
        if value is None:
            continue
        out[f.name] = str(value) if isinstance(value, StrEnum) else value
    return out


class _MappingReader:
    """Checks plain data field by field; errors name the field path (``staging[1].size``)."""

    def __init__(self, document: str) -> None:
        self.document = document

    def fail(self, path: str, expected: str, found: object = None) -> NoReturn:
        raise JsdlError(self.document, path, expected, found)

    def mapping(self, value: object, path: str, allowed: Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path or "document", "a mapping (a JSON object or YAML mapping)", value)
        allowed = tuple(allowed)
        for key in value:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                suggested = (*allowed, "sweep") if not path else allowed
                self.fail(where, unknown_field(key, suggested), key)
        return dict(value)

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, "a string", value)
        return value

    def strings(self, value: object, path: str) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Sequence):
            self.fail(path, "a list of strings", value)
        return tuple(self.string(v, f"{path}[{i}]") for i, v in enumerate(value))

    def integer(self, value: object, path: str, minimum: int) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not is_int(value):
            self.fail(path, "an integer", value)
        assert isinstance(value, int)
        if value < minimum:
            self.fail(path, f"an integer >= {minimum}", value)
        return value

    def number(self, value: object, path: str) -> float:
        if not is_number(value) or not math.isfinite(cast(float, value)):
            self.fail(path, "a number", value)
        return cast(float, value)

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def range_value(self, value: object, path: str, counts: bool) -> RangeValue:
        def bound(x: object, where: str) -> float:
            return self.integer(x, where, 1) if counts else self.number(x, where)

        if is_number(value):
            v = bound(value, path)
            return self.make(path, RangeKind.EXACT, v, v)
        if counts and not isinstance(value, Mapping):  # e.g. `four`: say what a count may be
            expected = "an integer >= 1, or a mapping with exact, or lower and/or upper"
            self.fail(path, expected, value)
        data = self.mapping(value, path, ("exact", "lower", "upper"))
        if "exact" in data:
            if len(data) > 1:
                self.fail(path, "exact alone, or lower and/or upper", sorted(data))
            v = bound(data["exact"], f"{path}.exact")
            return self.make(path, RangeKind.EXACT, v, v)
        lower = bound(data["lower"], f"{path}.lower") if "lower" in data else None
        upper = bound(data["upper"], f"{path}.upper") if "upper" in data else None
        if lower is None and upper is None:
            self.fail(path, "exact, lower or upper", "an empty mapping")
        if lower is not None and upper is not None:
            return self.make(path, RangeKind.RANGE, lower, upper)
        if lower is not None:
            return self.make(path, RangeKind.LOWER_BOUNDED, lower, None)
        return self.make(path, RangeKind.UPPER_BOUNDED, None, upper)

    def make(
        self, path: str, kind: RangeKind, lower: float | None, upper: float | None
    ) -> RangeValue:
        try:
            return RangeValue(kind, lower, upper)
        except JsdlError as exc:
            self.fail(f"{path}.{exc.path}", exc.expected, exc.found)

    def staging(self, value: object, path: str) -> StagingEntry:
        names = [f.name for f in fields(StagingEntry)]
        data = self.mapping(value, path, names)
        if "file_name" not in data:
            self.fail(f"{path}.file_name", "a file name")
        out: dict[str, Any] = {}
        for key, item in data.items():
            where = f"{path}.{key}"
            if item is None:
                continue
            if key == "size":
                out[key] = self.integer(item, where, 0)
            elif key == "delete_on_termination":
                out[key] = self.boolean(item, where)
            else:
                out[key] = self.string(item, where)
        try:
            return StagingEntry(**out)
        except JsdlError as exc:
            self.fail(f"{path}.{exc.path}", exc.expected, exc.found)

    def malleability(self, value: object, path: str) -> Malleability:
        data = self.mapping(value, path, MALLEABILITY_FIELDS)
        out: dict[str, Any] = {}
        for key, item in data.items():
            where = f"{path}.{key}"
            if item is None:
                continue
            if key in ("sizes", "initiative", "obligation"):
                out[key] = self.string(item, where)
            elif key in ("deadline", "reconfiguration_cost"):
                out[key] = self.number(item, where)
            elif key == "evolving":
                out[key] = self.boolean(item, where)
            else:  # initial
                out[key] = self.integer(item, where, 1)
        return malleability_from(out, self.fail, path)

    def component(self, value: object, path: str) -> Component:
        data = self.mapping(value, path, ("cores", "site"))
        if "cores" not in data:
            self.fail(f"{path}.cores", "the component's cores, an integer >= 1")
        site = data.get("site")
        return Component(
            self.integer(data["cores"], f"{path}.cores", 1),
            None if site is None else self.string(site, f"{path}.site"),
        )

    def component_of(self, value: object, path: str) -> ComponentOf:
        keys = ("gang", "size", "index", "site", "units")
        data = self.mapping(value, path, keys)
        for key in keys[:4]:
            if key not in data:
                self.fail(f"{path}.{key}", "a value (set by the owner broker)")
        units = data.get("units")
        return ComponentOf(
            self.string(data["gang"], f"{path}.gang"),
            self.integer(data["size"], f"{path}.size", 1),
            self.integer(data["index"], f"{path}.index", 0),
            self.string(data["site"], f"{path}.site"),
            None if units is None else self.integer(units, f"{path}.units", 1),
        )

    def file_system(self, value: object, path: str) -> FileSystem:
        data = self.mapping(
            value, path, ("name", "type", "description", "mount_point", "disk_space")
        )
        out: dict[str, Any] = {}
        for key, item in data.items():
            if item is None:
                continue
            if key == "disk_space":
                out[key] = self.range_value(item, f"{path}.{key}", False)
            else:
                out[key] = self.string(item, f"{path}.{key}")
        if "name" not in out:
            self.fail(f"{path}.name", "a file system name")
        try:
            return FileSystem(**out)
        except JsdlError as exc:
            self.fail(f"{path}.{exc.path}", exc.expected, exc.found)

    def description(self, value: object) -> JobDescription:
        names = [f.name for f in fields(JobDescription)]
        data = self.mapping(value, "", names)
        out: dict[str, Any] = {}
        for key, item in data.items():
            if item is None:
                continue
            if key in ("annotations", "projects", "arguments", "candidate_hosts"):
                out[key] = self.strings(item, key)
            elif key == "environment":
                if not isinstance(item, Mapping):
                    self.fail(key, "a mapping of variable names to values", item)
                out[key] = {
                    self.string(k, key): self.string(v, f"{key}.{k}") for k, v in item.items()
                }
            elif key in COUNT_FIELDS:
                out[key] = self.integer(item, key, 1)
            elif key in ("wall_time_limit", "cpu_time_limit"):
                out[key] = self.integer(item, key, 0)
            elif key in ("processes_from_allocation", "threads_from_allocation"):
                out[key] = self.boolean(item, key)
            elif key in _RANGE_FIELDS:
                out[key] = self.range_value(item, key, key.endswith("count"))
            elif key == "staging":
                if isinstance(item, str) or not isinstance(item, Sequence):
                    self.fail(key, "a list of staging entries", item)
                out[key] = tuple(self.staging(e, f"staging[{i}]") for i, e in enumerate(item))
            elif key == "malleability":
                out[key] = self.malleability(item, key)
            elif key == "components":
                if isinstance(item, str) or not isinstance(item, Sequence):
                    self.fail(key, "a list of components {cores, site}", item)
                out[key] = tuple(self.component(e, f"components[{i}]") for i, e in enumerate(item))
            elif key == "component_of":
                out[key] = self.component_of(item, key)
            elif key == "model":
                if not isinstance(item, Mapping):
                    self.fail(key, "a mapping: " + ", ".join(MODEL_KEYS), item)
                try:
                    out[key] = parse_model(item)
                except InvalidInput as exc:
                    self.fail(exc.field.removeprefix(": "), exc.expected, exc.found)
            elif key == "file_systems":
                if isinstance(item, str) or not isinstance(item, Sequence):
                    self.fail(key, "a list of file systems {name, type, mount_point, ...}", item)
                out[key] = tuple(
                    self.file_system(e, f"file_systems[{i}]") for i, e in enumerate(item)
                )
            elif key == "filesystem_names":
                if not isinstance(item, Mapping):
                    self.fail(key, "a mapping of path fields to file system names", item)
                out[key] = {
                    self.string(k, key): self.string(v, f"{key}.{k}") for k, v in item.items()
                }
            elif key == "exclusive_execution":
                out[key] = self.boolean(item, key)
            else:
                out[key] = self.string(item, key)
        try:
            return JobDescription(**out)
        except JsdlError as exc:
            self.fail(exc.path, exc.expected, exc.found)


def from_mapping(data: object, *, document: str = "<mapping>") -> JobDescription:
    """Read the JSON/YAML form (the keys of :func:`to_mapping`); unknown keys are errors.

    Ranges are written ``4``, ``{exact: 4}``, ``{lower: 2}``, ``{upper: 8}`` or
    ``{lower: 2, upper: 8}``.
    """
    return _MappingReader(document).description(data)


#: The JSDL element (under JobDefinition/JobDescription/) and the JSON/YAML field that express
#: each requirement (:class:`gbroker.core.requirements.Need`), for errors that name them.
