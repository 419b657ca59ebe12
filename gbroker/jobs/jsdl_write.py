"""Writing a :class:`~gbroker.jobs.description.JobDescription` back as JSDL 1.0: elements in
schema order with fixed prefixes, extension elements only where the XSDs allow ``xsd:any``, so
that ``parse_jsdl(to_jsdl(d)) == d`` and the output validates against the OGF schemas."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from gbroker.jobs.description import (
    GBROKER_NS,
    HPCPA_NS,
    JSDL_NS,
    POSIX_NS,
    SPMD_NS,
    XSI_NS,
    ApplicationKind,
    JobDescription,
    RangeKind,
    RangeValue,
)
from gbroker.jobs.malleability import MALLEABILITY_ATTRIBUTES, malleability_to_mapping
from gbroker.jobs.values import format_number

# --------------------------------------------------------------------------------------------
# Writing XML

_PREFIXES = {
    "jsdl": JSDL_NS,
    "jsdl-posix": POSIX_NS,
    "jsdl-spmd": SPMD_NS,
    "jsdl-hpcpa": HPCPA_NS,
    "gbroker": GBROKER_NS,
    "xsi": XSI_NS,
}


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    child = ET.SubElement(parent, tag, attrib)
    child.text = text
    return child


def _write_range(parent: ET.Element, tag: str, value: RangeValue | None) -> None:
    if value is None:
        return
    el = _el(parent, tag)
    lo, hi = format_number(value.lower), format_number(value.upper)
    if value.kind is RangeKind.EXACT:
        _el(el, "jsdl:Exact", lo)
    elif value.kind is RangeKind.LOWER_BOUNDED:
        _el(el, "jsdl:LowerBoundedRange", lo)
    elif value.kind is RangeKind.UPPER_BOUNDED:
        _el(el, "jsdl:UpperBoundedRange", hi)
    else:
        rng = _el(el, "jsdl:Range")
        _el(rng, "jsdl:LowerBound", lo)
        _el(rng, "jsdl:UpperBound", hi)


def _write_program(app: ET.Element, d: JobDescription) -> None:
    kind = d.application
    if kind is None:
        return
    tag = {
        ApplicationKind.POSIX: "jsdl-posix:POSIXApplication",
        ApplicationKind.HPCPA: "jsdl-hpcpa:HPCProfileApplication",
        ApplicationKind.SPMD: "jsdl-spmd:SPMDApplication",
    }[kind]
    # POSIX elements serve SPMD too; the HPC Profile has its own namespace.
    p = "jsdl-hpcpa" if kind is ApplicationKind.HPCPA else "jsdl-posix"
    el = _el(app, tag)
    refs = d.filesystem_names

    def fs(key: str) -> dict[str, str]:
        return {"filesystemName": refs[key]} if key in refs else {}

    if d.executable is not None:
        _el(el, f"{p}:Executable", d.executable, **fs("executable"))
    for i, arg in enumerate(d.arguments):
        _el(el, f"{p}:Argument", arg, **fs(f"arguments[{i}]"))
    for key, local in (
        ("input", "Input"),
        ("output", "Output"),
        ("error", "Error"),
        ("working_directory", "WorkingDirectory"),
    ):
        value = getattr(d, key)
        if value is not None:
            _el(el, f"{p}:{local}", value, **fs(key))
    for name, value in d.environment.items():
        _el(el, f"{p}:Environment", value, name=name, **fs(f"environment.{name}"))
    limits = (("wall_time_limit", "WallTimeLimit"), ("cpu_time_limit", "CPUTimeLimit"))
    if kind is ApplicationKind.POSIX:
        for key, local in limits:
            if getattr(d, key) is not None:
                _el(el, f"jsdl-posix:{local}", str(getattr(d, key)))
        return
    if kind is ApplicationKind.SPMD:
        _write_spmd_count(
            el,
            "NumberOfProcesses",
            d.number_of_processes,
            d.processes_from_allocation,
            "actualtotalcpucount",
        )
        if d.processes_per_host is not None:
            _el(el, "jsdl-spmd:ProcessesPerHost", str(d.processes_per_host))
        _write_spmd_count(
            el,
            "ThreadsPerProcess",
            d.threads_per_process,
            d.threads_from_allocation,
            "actualindividualcpucount",
        )
        if d.spmd_variation is not None:
            _el(el, "jsdl-spmd:SPMDVariation", d.spmd_variation)
    # SPMD and HPC Profile applications take other namespaces' elements last (xsd:any).
    for key, local in limits:
        if getattr(d, key) is not None:
            _el(el, f"jsdl-posix:{local}", str(getattr(d, key)))


def _write_spmd_count(
    el: ET.Element, local: str, count: int | None, from_allocation: bool, flag: str
) -> None:
    if count is None and not from_allocation:
        return
    attrib = {flag: "true"} if from_allocation else {}
    if count is None:
        attrib["xsi:nil"] = "true"
    _el(el, f"jsdl-spmd:{local}", None if count is None else str(count), **attrib)


_RESOURCE_RANGES = (
    # Schema order, after CandidateHosts, FileSystem, ExclusiveExecution, OperatingSystem and
    # CPUArchitecture.
    ("IndividualCPUSpeed", "individual_cpu_speed"),
    ("IndividualCPUTime", "individual_cpu_time"),
    ("IndividualCPUCount", "individual_cpu_count"),
    ("IndividualNetworkBandwidth", "individual_network_bandwidth"),
    ("IndividualPhysicalMemory", "individual_physical_memory"),
    ("IndividualDiskSpace", "individual_disk_space"),
    ("TotalCPUTime", "total_cpu_time"),
    ("TotalCPUCount", "total_cpu_count"),
    ("TotalPhysicalMemory", "total_physical_memory"),
    ("TotalDiskSpace", "total_disk_space"),
    ("TotalResourceCount", "total_resource_count"),
)


def _write_resources(job: ET.Element, desc: JobDescription) -> None:
    given = [
        desc.candidate_hosts,
        desc.file_systems,
        desc.exclusive_execution is not None,
        desc.operating_system or desc.operating_system_version,
        desc.cpu_architecture,
        *(getattr(desc, key) is not None for _, key in _RESOURCE_RANGES),
    ]
    if not any(given):
        return
    res = _el(job, "jsdl:Resources")
    if desc.candidate_hosts:
        hosts = _el(res, "jsdl:CandidateHosts")
        for host in desc.candidate_hosts:
            _el(hosts, "jsdl:HostName", host)
    for fs in desc.file_systems:
        el = _el(res, "jsdl:FileSystem", name=fs.name)
        if fs.type is not None:
            _el(el, "jsdl:FileSystemType", fs.type)
        if fs.description is not None:
            _el(el, "jsdl:Description", fs.description)
        if fs.mount_point is not None:
            _el(el, "jsdl:MountPoint", fs.mount_point)
        _write_range(el, "jsdl:DiskSpace", fs.disk_space)
    if desc.exclusive_execution is not None:
        _el(res, "jsdl:ExclusiveExecution", "true" if desc.exclusive_execution else "false")
    if desc.operating_system or desc.operating_system_version:
        os_el = _el(res, "jsdl:OperatingSystem")
        if desc.operating_system is not None:
            _el(
                _el(os_el, "jsdl:OperatingSystemType"),
                "jsdl:OperatingSystemName",
                desc.operating_system,
            )
        if desc.operating_system_version is not None:
            _el(os_el, "jsdl:OperatingSystemVersion", desc.operating_system_version)
    if desc.cpu_architecture is not None:
        _el(_el(res, "jsdl:CPUArchitecture"), "jsdl:CPUArchitectureName", desc.cpu_architecture)
    for local, key in _RESOURCE_RANGES:
        _write_range(res, f"jsdl:{local}", getattr(desc, key))


def to_jsdl(desc: JobDescription) -> str:
    """The description as a JSDL 1.0 document (UTF-8 text with an XML declaration)."""
    root = ET.Element("jsdl:JobDefinition", {f"xmlns:{p}": ns for p, ns in _PREFIXES.items()})
    job = _el(root, "jsdl:JobDescription")
    if desc.name or desc.description or desc.annotations or desc.projects:
        ident = _el(job, "jsdl:JobIdentification")
        if desc.name is not None:
            _el(ident, "jsdl:JobName", desc.name)
        if desc.description is not None:
            _el(ident, "jsdl:Description", desc.description)
        for annotation in desc.annotations:
            _el(ident, "jsdl:JobAnnotation", annotation)
        for project in desc.projects:
            _el(ident, "jsdl:JobProject", project)
    if not desc.staging_only:
        app = _el(job, "jsdl:Application")
        if desc.application_name is not None:
            _el(app, "jsdl:ApplicationName", desc.application_name)
        if desc.application_version is not None:
            _el(app, "jsdl:ApplicationVersion", desc.application_version)
        _write_program(app, desc)
    _write_resources(job, desc)
    for entry in desc.staging:
        st = _el(job, "jsdl:DataStaging")
        _el(st, "jsdl:FileName", entry.file_name)
        if entry.filesystem is not None:
            _el(st, "jsdl:FilesystemName", entry.filesystem)
        _el(st, "jsdl:CreationFlag", str(entry.creation_flag))
        if entry.delete_on_termination is not None:
            _el(st, "jsdl:DeleteOnTermination", "true" if entry.delete_on_termination else "false")
        if entry.source is not None or entry.inline_data is not None:
            source = _el(st, "jsdl:Source")
            if entry.source is not None:
                _el(source, "jsdl:URI", entry.source)
        if entry.target is not None:
            _el(_el(st, "jsdl:Target"), "jsdl:URI", entry.target)
        if entry.inline_data is not None:
            _el(st, "gbroker:InlineData", entry.inline_data)
        if entry.site is not None:
            _el(st, "gbroker:Site", entry.site)
        if entry.size is not None:
            _el(st, "gbroker:Size", str(entry.size))
    if (
        desc.job_class is not None
        or desc.min_cores is not None
        or desc.max_cores is not None
        or desc.malleability is not None
        or desc.components
        or desc.model is not None
    ):
        sched = _el(job, "gbroker:Scheduling")
        if desc.job_class is not None:
            _el(sched, "gbroker:JobClass", str(desc.job_class))
        if desc.min_cores is not None:
            _el(sched, "gbroker:MinCores", str(desc.min_cores))
        if desc.max_cores is not None:
            _el(sched, "gbroker:MaxCores", str(desc.max_cores))
        if desc.malleability is not None:
            declared = _el(sched, "gbroker:Malleability")
            names = {field_: key for key, field_ in MALLEABILITY_ATTRIBUTES.items()}
            for name, value in malleability_to_mapping(desc.malleability).items():
                attribute = "reconfigurationCost" if name == "reconfiguration_cost" else names[name]
                text = str(value).lower() if isinstance(value, bool) else str(value)
                declared.set(attribute, text)
        for component in desc.components:
            part = _el(sched, "gbroker:Component")
            part.set("cores", str(component.cores))
            if component.site is not None:
                part.set("site", component.site)
        if desc.coallocation is not None:
            _el(sched, "gbroker:Coallocation", desc.coallocation)
        if desc.model is not None:
            model = _el(sched, "gbroker:Model")
            for key, value in desc.model.as_dict().items():
                model.set(key, str(value))
    ET.indent(root, space="  ")
    body = ET.tostring(root, encoding="unicode")
    # ElementTree escapes CR in attributes but not in text, where a parser would turn it into LF.
    body = body.replace("\r", "&#13;")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'
