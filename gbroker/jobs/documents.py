"""A job description document of any format: its format sniffed or named by its suffix, loaded
(:func:`load_job_description`), and summarized for people (:func:`summary`)."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from gbroker.jobs.description import (
    MAX_DOCUMENT_BYTES,
    ApplicationKind,
    CreationFlag,
    JobDescription,
    JsdlError,
    RangeValue,
    StagingEntry,
)
from gbroker.jobs.jsdl_paths import DESC
from gbroker.jobs.jsdl_read import parse_jsdl
from gbroker.jobs.mapping import from_mapping
from gbroker.jobs.parsing import check_size, parse_json, parse_yaml
from gbroker.jobs.values import format_number

REQUIREMENT_FIELDS = {
    "cores": ("Resources/TotalCPUCount", "total_cpu_count"),
    "operating_system": (
        "Resources/OperatingSystem/OperatingSystemType/OperatingSystemName",
        "operating_system",
    ),
    "operating_system_version": (
        "Resources/OperatingSystem/OperatingSystemVersion",
        "operating_system_version",
    ),
    "cpu_architecture": ("Resources/CPUArchitecture/CPUArchitectureName", "cpu_architecture"),
    "exclusive_execution": ("Resources/ExclusiveExecution", "exclusive_execution"),
    "individual_cpu_speed": ("Resources/IndividualCPUSpeed", "individual_cpu_speed"),
    "individual_network_bandwidth": (
        "Resources/IndividualNetworkBandwidth",
        "individual_network_bandwidth",
    ),
    "individual_cpu_count": ("Resources/IndividualCPUCount", "individual_cpu_count"),
    "total_resource_count": ("Resources/TotalResourceCount", "total_resource_count"),
    "individual_physical_memory": (
        "Resources/IndividualPhysicalMemory",
        "individual_physical_memory",
    ),
    "total_physical_memory": ("Resources/TotalPhysicalMemory", "total_physical_memory"),
    "individual_disk_space": ("Resources/IndividualDiskSpace", "individual_disk_space"),
    "total_disk_space": ("Resources/TotalDiskSpace", "total_disk_space"),
    "file_system": ("Resources/FileSystem", "file_systems"),
    "candidate_hosts": ("Resources/CandidateHosts", "candidate_hosts"),
}


def requirement_field(need: str, xml: bool) -> str:
    """How an error names the requirement ``need``: its element path for a JSDL document, its
    field for JSON/YAML."""
    element, key = REQUIREMENT_FIELDS[need]
    return f"{DESC}/{element}" if xml else key


def document_format(data: bytes) -> str:
    """Which form a submission is written in: "jsdl", "json" or "yaml" (from its content)."""
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if head == b"<":
        return "jsdl"
    if head in (b"{", b"["):
        return "json"
    return "yaml"


_FORMATS = {".jsdl": "jsdl", ".xml": "jsdl", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def loads_job_description(
    data: str | bytes,
    *,
    document: str = "<job>",
    fmt: str | None = None,
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> JobDescription:
    """Read a job in any of the forms: ``fmt`` is "jsdl", "json" or "yaml", or None to sniff
    (``<`` starts JSDL, ``{`` JSON, anything else YAML)."""
    raw = data.encode() if isinstance(data, str) else data
    check_size(raw, document, max_bytes)
    fmt = fmt or document_format(raw)
    if fmt == "jsdl":
        return parse_jsdl(data, document=document, max_bytes=max_bytes)
    if fmt not in ("json", "yaml"):
        raise ValueError(f"unknown job description format {fmt!r}")
    if not raw.strip():
        raise JsdlError(document, "document", "a job description", "an empty file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JsdlError(document, f"byte {exc.start}", "UTF-8 text", exc.reason) from None
    parsed = parse_json(text, document) if fmt == "json" else parse_yaml(text, document)
    return from_mapping(parsed, document=document)


def load_job_description(
    path: str | PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES
) -> JobDescription:
    """Read a job file: JSDL (``.jsdl``, ``.xml``), JSON (``.json``) or YAML (``.yaml``,
    ``.yml``); other names are sniffed from the content. Raises OSError when unreadable."""
    file = Path(path)
    document = str(path)
    with file.open("rb") as handle:
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        size = file.stat().st_size
        raise JsdlError(
            document,
            "document",
            f"at most {max_bytes} bytes (the job description size limit)",
            size,
        )
    return loads_job_description(
        raw, document=document, fmt=_FORMATS.get(file.suffix.lower()), max_bytes=max_bytes
    )


def summary(desc: JobDescription) -> list[str]:
    """A short human summary, one ``label  value`` line each (``gbroker jsdl check`` prints it)."""
    import shlex

    rank, max_rank, job_class = desc.core_request()
    lines: list[str] = []
    if desc.name:
        lines.append(f"name        {desc.name}")
    if desc.staging_only:
        lines.append("program     none: a staging-only job (stage in, then stage out)")
    elif desc.executable is not None:
        lines.append(f"executable  {shlex.join([desc.executable, *desc.arguments])}")
    else:
        version = f" {desc.application_version}" if desc.application_version else ""
        args = f" {shlex.join(desc.arguments)}" if desc.arguments else ""
        lines.append(
            f"application {desc.application_name}{version}{args} (the site resolves the name)"
        )
    cores = f"{rank}" if max_rank == rank else f"{rank}..{max_rank}"
    details = [str(job_class)]
    if desc.application is ApplicationKind.SPMD:
        spmd = "SPMD"
        if desc.spmd_variation:
            spmd += f" {desc.spmd_variation.rstrip('/').rsplit('/', 1)[-1]}"
        if desc.number_of_processes is not None:
            spmd += f", {desc.number_of_processes} processes"
        elif desc.processes_from_allocation:
            spmd += ", one process per allocated CPU"
        if desc.processes_per_host is not None:
            spmd += f", {desc.processes_per_host} per host"
        details.append(spmd)
    if desc.total_cpu_count is not None:
        details.append(f"TotalCPUCount {desc.total_cpu_count}")
    lines.append(f"cores       {cores} ({'; '.join(details)})")
    run_time = desc.estimated_run_time(rank)
    if desc.wall_time_limit is not None:
        lines.append(f"time limit  {desc.wall_time_limit} s")
    elif run_time is not None:
        lines.append(f"time limit  {format_number(run_time)} s (estimated from CPU time)")
    else:
        lines.append("time limit  none")
    if desc.candidate_hosts:
        hosts = ", ".join(desc.candidate_hosts)
        lines.append(f"hosts       {hosts} (it runs only at a site, or a host of one, so named)")
    lines.extend(f"needs       {need}" for need in _needs(desc))
    lines.extend(_working_directory(desc))
    for key, fs_name in desc.filesystem_names.items():
        if key != "working_directory":
            lines.append(f"path        {key} is relative to file system {fs_name}")

    def at(entry: StagingEntry) -> str:
        return f" (in file system {entry.filesystem})" if entry.filesystem else ""

    for entry in desc.stage_in:
        origin = entry.source if entry.source is not None else "inline data"
        if entry.inline_data is not None and entry.source is not None:
            origin += " (inline data)"
        where = f" at {entry.site}" if entry.site else ""
        size = f", {entry.size} bytes" if entry.size is not None else ""
        flag = (
            f", {entry.creation_flag}" if entry.creation_flag is not CreationFlag.OVERWRITE else ""
        )
        lines.append(f"stage in    {entry.file_name}{at(entry)} <- {origin}{where}{size}{flag}")
    lines.extend(f"stage out   {e.file_name}{at(e)} -> {e.target}" for e in desc.stage_out)
    deleted = [e.file_name for e in desc.staging if e.delete_on_termination]
    if deleted:
        lines.append(f"deleted     at the end: {', '.join(deleted)}")
    return lines


def _working_directory(desc: JobDescription) -> list[str]:
    """Where the job starts, as the executing site will have it."""
    wd = desc.working_directory
    if wd is None:
        return []
    fs_name = desc.filesystem_names.get("working_directory")
    if fs_name is not None:
        where = "" if wd == "." else f"{wd} in "
        return [f"working dir {where}file system {fs_name} (its mount point at the site)"]
    if wd.startswith("/"):
        inside = desc.run_directory
        there = f"{inside} in the job's directory" if inside else "the job's directory"
        return [
            f"working dir {wd}: the site starts the job in {there} (it keeps a job's paths "
            "inside its directory; filesystemName names a site's file system)"
        ]
    return [f"working dir {wd} in the job's directory"]


def _needs(desc: JobDescription) -> list[str]:
    """The job's requirements of a site, for people."""
    from gbroker.core.requirements import format_bytes

    out: list[str] = []
    if desc.operating_system or desc.operating_system_version:
        version = f" {desc.operating_system_version}" if desc.operating_system_version else ""
        out.append(f"operating system {desc.operating_system or 'any'}{version}")
    if desc.cpu_architecture:
        out.append(f"CPU architecture {desc.cpu_architecture}")
    if desc.exclusive_execution:
        out.append("exclusive execution")
    amounts = (
        ("individual_physical_memory", "memory per node"),
        ("total_physical_memory", "memory in all"),
        ("individual_disk_space", "disk per node"),
        ("total_disk_space", "disk in all"),
    )
    for key, what in amounts:
        value: RangeValue | None = getattr(desc, key)
        if value is not None and value.lower is not None:
            out.append(f"{what} >= {format_bytes(value.lower)}")
    if desc.individual_cpu_speed is not None and desc.individual_cpu_speed.lower is not None:
        out.append(f"CPU speed >= {format_number(desc.individual_cpu_speed.lower)} Hz")
    bandwidth = desc.individual_network_bandwidth
    if bandwidth is not None and bandwidth.lower is not None:
        out.append(f"network bandwidth >= {format_number(bandwidth.lower)} bit/s")
    if desc.individual_cpu_count is not None and desc.individual_cpu_count.lower is not None:
        out.append(f"cores per node >= {format_number(desc.individual_cpu_count.lower)}")
    if desc.total_resource_count is not None and desc.total_resource_count.lower is not None:
        out.append(f"nodes >= {format_number(desc.total_resource_count.lower)}")
    for fs in desc.file_systems:
        parts = [f"file system {fs.name}"]
        if fs.type:
            parts.append(f"type {fs.type}")
        if fs.mount_point:
            parts.append(f"mounted at {fs.mount_point}")
        if fs.disk_space is not None and fs.disk_space.lower is not None:
            parts.append(f">= {format_bytes(fs.disk_space.lower)} free")
        out.append(", ".join(parts))
    return out
