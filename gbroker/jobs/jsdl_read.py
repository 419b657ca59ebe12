"""Reading JSDL 1.0 XML (with the POSIX, SPMD, HPC Profile and GBroker extensions) into a
:class:`~gbroker.jobs.description.JobDescription`: untrusted bytes through defusedxml after a
size check, every element matched by namespace and local name, every problem a
:class:`~gbroker.jobs.description.JsdlError` naming the element path (see
:mod:`gbroker.jobs.description` for the rules)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Any, NoReturn

from gbroker.core.apples import MODEL_KEYS, PerformanceModel, parse_model
from gbroker.core.malleable import Malleability
from gbroker.core.model import JobClass
from gbroker.errors import InvalidInput
from gbroker.jobs.description import (
    GBROKER_NS,
    HPCPA_NS,
    HPCPA_NS_OGF,
    JSDL_NS,
    MAX_DOCUMENT_BYTES,
    POSIX_NS,
    SPMD_NS,
    UNICORE_NS,
    XSI_NS,
    ApplicationKind,
    Component,
    CreationFlag,
    FileSystem,
    JobDescription,
    JsdlError,
    RangeKind,
    RangeValue,
    StagingEntry,
    did_you_mean,
)
from gbroker.jobs.jsdl_paths import APP, DESC, RES, ROOT, SCHED, XML_PATHS
from gbroker.jobs.malleability import MALLEABILITY_ATTRIBUTES, malleability_from
from gbroker.jobs.parsing import check_size, parse_xml, split_tag
from gbroker.jobs.values import ENV_NAME, format_number

# --------------------------------------------------------------------------------------------
# Reading XML

# xsd:double / xsd:decimal lexical forms, without INF and NaN.
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _clark(ns: str, local: str) -> str:
    return f"{{{ns}}}{local}" if ns else local


_APP_ELEMENTS = {
    "POSIXApplication": (ApplicationKind.POSIX, (POSIX_NS,)),
    "HPCProfileApplication": (ApplicationKind.HPCPA, (HPCPA_NS, HPCPA_NS_OGF)),
    "SPMDApplication": (ApplicationKind.SPMD, (SPMD_NS,)),
}
# What to write instead of an application kind GBroker does not run.
_APP_HINTS = {
    "MPIApplication": "; write an MPI job as an SPMDApplication of namespace "
    f"{SPMD_NS} with its NumberOfProcesses and SPMDVariation",
    "ParallelApplication": "; write a parallel job as an SPMDApplication",
}
_RANGE_KINDS = "Exact, LowerBoundedRange, UpperBoundedRange or Range"

# The namespaces of JSDL and the extensions GBroker reads: an element of one of them that the
# reader does not take at its place is an error (a typo there would drop what it asks for),
# while elements of any other namespace are the schemas' extension points (xsd:any ##other).
_FAMILY = {
    JSDL_NS: "JSDL",
    POSIX_NS: "JSDL POSIX",
    SPMD_NS: "JSDL SPMD",
    HPCPA_NS: "HPC Profile Application",
    HPCPA_NS_OGF: "HPC Profile Application",
}
_HPCPA = (HPCPA_NS, HPCPA_NS_OGF)
_POSIX_ELEMENTS = (
    "Executable", "Argument", "Input", "Output", "Error", "WorkingDirectory", "Environment",
    "WallTimeLimit", "FileSizeLimit", "CoreDumpLimit", "DataSegmentLimit", "LockedMemoryLimit",
    "MemoryLimit", "OpenDescriptorsLimit", "PipeSizeLimit", "StackSizeLimit", "CPUTimeLimit",
    "ProcessCountLimit", "VirtualMemoryLimit", "ThreadCountLimit", "UserName", "GroupName",
)  # fmt: skip
_SPMD_ELEMENTS = ("NumberOfProcesses", "ProcessesPerHost", "ThreadsPerProcess", "SPMDVariation")
_RESOURCES = (
    "CandidateHosts", "FileSystem", "ExclusiveExecution", "OperatingSystem", "CPUArchitecture",
    "IndividualCPUSpeed", "IndividualCPUTime", "IndividualCPUCount",
    "IndividualNetworkBandwidth", "IndividualPhysicalMemory", "IndividualVirtualMemory",
    "IndividualDiskSpace", "TotalCPUTime", "TotalCPUCount", "TotalPhysicalMemory",
    "TotalVirtualMemory", "TotalDiskSpace", "TotalResourceCount",
)  # fmt: skip


def _in(namespaces: tuple[str, ...], *names: str) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(names, namespaces)


# What each element of the schemas (jsdl.xsd, jsdl-posix.xsd, jsdl-spmd.xsd, GFD.111's
# HPCProfileApplication; FileSystem's MountSource from GFD.136) holds: child name -> the
# namespaces the reader takes it in. Some of it is refused where it is read (_NOT_HONOURED).
_CHILDREN: dict[str, dict[str, tuple[str, ...]]] = {
    "JobDefinition": _in((JSDL_NS,), "JobDescription"),
    "JobDescription": _in(
        (JSDL_NS,), "JobIdentification", "Application", "Resources", "DataStaging"
    ),
    "JobIdentification": _in((JSDL_NS,), "JobName", "Description", "JobAnnotation", "JobProject"),
    "Application": {
        **_in((JSDL_NS,), "ApplicationName", "ApplicationVersion", "Description"),
        "POSIXApplication": (POSIX_NS,),
        "HPCProfileApplication": _HPCPA,
        "SPMDApplication": (SPMD_NS,),
    },
    # Each kind takes the POSIX elements (the SPMD schema refers to them; an HPC Profile
    # Application's own ones are its namespace's, and POSIX limits are its extensions).
    "POSIXApplication": _in((POSIX_NS,), *_POSIX_ELEMENTS),
    "HPCProfileApplication": _in((*_HPCPA, POSIX_NS), *_POSIX_ELEMENTS),
    "SPMDApplication": {
        **_in((POSIX_NS, SPMD_NS), *_POSIX_ELEMENTS),
        **_in((SPMD_NS,), *_SPMD_ELEMENTS),
    },
    # GridWay writes CandidateHost for CandidateHosts.
    "Resources": _in((JSDL_NS,), *_RESOURCES, "CandidateHost"),
    "CandidateHosts": _in((JSDL_NS,), "HostName"),
    "FileSystem": _in(
        (JSDL_NS,), "FileSystemType", "Description", "MountPoint", "MountSource", "DiskSpace"
    ),
    "OperatingSystem": _in(
        (JSDL_NS,), "OperatingSystemType", "OperatingSystemVersion", "Description"
    ),
    "OperatingSystemType": _in((JSDL_NS,), "OperatingSystemName"),
    "CPUArchitecture": _in((JSDL_NS,), "CPUArchitectureName"),
    "Range": _in((JSDL_NS,), "LowerBound", "UpperBound"),
    "DataStaging": _in(
        (JSDL_NS,),
        *("FileName", "FilesystemName", "CreationFlag", "DeleteOnTermination", "Source"),
        "Target",
    ),
    "Source": _in((JSDL_NS, ""), "URI"),  # UNICORE leaves URI unqualified
    "Target": _in((JSDL_NS, ""), "URI"),
}
_CHILDREN["CandidateHost"] = _CHILDREN["CandidateHosts"]


def _homes() -> dict[str, str]:
    """Where each element belongs (the first parent that holds it), for one written in the
    wrong place."""
    homes: dict[str, str] = {}
    for parent, children in _CHILDREN.items():
        for name in children:
            if name != "Description":  # at home in several places
                homes.setdefault(name, parent)
    return homes


_HOME = _homes()
_UNHONOURED_LIMIT = (
    " (GBroker applies WallTimeLimit and CPUTimeLimit only; each site sets the other limits "
    "for all its jobs)"
)
# Elements the schemas define that GBroker does not carry out: refused, never read and dropped.
_NOT_HONOURED = {
    "MountSource": "no MountSource (a site mounts its own file systems: name one it declares, "
    "with its FileSystemType and MountPoint if they matter)",
    "UserName": "no UserName (a job runs as the local account its site maps the submitting "
    "user to)",
    "GroupName": "no GroupName (a job runs with the groups of the local account its site "
    "maps the submitting user to)",
    **{
        name: f"no {name}{_UNHONOURED_LIMIT}"
        for name in _POSIX_ELEMENTS
        if name.endswith("Limit") and name not in ("WallTimeLimit", "CPUTimeLimit")
    },
}

# Elements real writers put in JSDL's namespace that JSDL does not define.
_NOT_JSDL = {
    "StagingSchedule": " (StagingSchedule is not JSDL's, and GBroker has no such schedule: it "
    "stages a job's files in before it starts and out after it ends)",
}


def _parent(path: str) -> str:
    """The local name of the element at the end of ``path`` (``DataStaging[2]``: DataStaging)."""
    return path.rsplit("/", 1)[-1].split("[", 1)[0]


class JsdlReader:
    """Walks a parsed JSDL tree; every error names ``document`` and an element path."""

    def __init__(self, document: str) -> None:
        self.document = document
        # Where each field read from an element came from, for errors found after reading.
        self.paths: dict[str, str] = {}

    def fail(self, path: str, expected: str, found: object = None) -> NoReturn:
        raise JsdlError(self.document, path, expected, found)

    # -- values ---------------------------------------------------------------------------

    def text(self, el: ET.Element, path: str) -> str:
        if len(el):
            self.fail(f"{path}/{split_tag(el[0].tag)[1]}", "text only, no child elements")
        return el.text or ""

    def token(self, el: ET.Element, path: str) -> str | None:
        return self.text(el, path).strip() or None

    def boolean(self, text: str, path: str) -> bool:
        value = text.strip()
        if value in ("true", "1"):
            return True
        if value in ("false", "0"):
            return False
        self.fail(path, "true or false", text)

    def number(self, el: ET.Element, path: str) -> float:
        text = self.text(el, path).strip()
        if not text:
            self.fail(path, "a number", "nothing")
        if not _NUMBER.fullmatch(text):
            self.fail(path, "a number", text)
        return float(text)

    def integer(self, el: ET.Element, path: str, minimum: int) -> int:
        value = self.number(el, path)
        if not value.is_integer():
            self.fail(path, "a whole number", self.text(el, path).strip())
        if value < minimum:
            self.fail(path, f"an integer >= {minimum}", int(value))
        return int(value)

    def attribute(self, el: ET.Element, name: str) -> str | None:
        """An unqualified attribute, its name matched case-insensitively (UNICORE's
        ``actualTotalCPUCount`` is the schema's ``actualtotalcpucount``)."""
        for key, value in el.attrib.items():
            if key.lower() == name:
                return value
        return None

    def unexpected(self, child: ET.Element, path: str) -> NoReturn:
        """Refuse ``child`` of the element at ``path``: an element of JSDL or its extensions
        that the reader does not take there (unknown, misspelt, misplaced, of the wrong
        namespace, or defined but not honoured), naming the nearest known name."""
        ns, local = split_tag(child.tag)
        parent = _parent(path)
        here = f"{path}/{local}"
        known = _CHILDREN.get(parent, {})
        family = _FAMILY.get(ns, "JSDL")
        if local in known and ns in known[local]:
            reason = _NOT_HONOURED.get(local, f"no {local} here (GBroker does not honour it)")
            self.fail(here, reason, (child.text or "").strip()[:80] or local)
        if local in known:
            namespaces = " or ".join(n for n in known[local] if n)
            self.fail(here, f"{local} of namespace {namespaces}", _clark(ns, local))
        if local in _HOME and _HOME[local] != parent:
            where = f"{local} belongs in {_HOME[local]}"
            self.fail(here, f"an element of {parent} ({where})", local)
        hint = _NOT_JSDL.get(local) or did_you_mean(local, known, n=1)
        hint = hint or (f": {', '.join(known)}" if known else "")
        found = local if ns in _FAMILY else _clark(ns, local)
        self.fail(here, f"an element {family} defines in {parent}{hint}", found)

    def ours(self, ns: str) -> bool:
        """Whether an element of namespace ``ns`` is JSDL's or an extension's the reader knows
        (else it is another namespace's extension, which the schemas let through)."""
        return ns in _FAMILY

    def singleton(self, seen: set[str], local: str, path: str) -> None:
        if local in seen:
            self.fail(path, f"at most one {local}", "another one")
        seen.add(local)

    # -- structure ------------------------------------------------------------------------

    def job_definition(self, root: ET.Element) -> JobDescription:
        ns, local = split_tag(root.tag)
        if (ns, local) != (JSDL_NS, ROOT):
            hint = " (a JSDL fragment, not a job definition)" if ns == JSDL_NS else ""
            self.fail(
                local,
                f"the root element JobDefinition in namespace {JSDL_NS}{hint}",
                _clark(ns, local),
            )
        descriptions = []
        for child in root:
            ns, local = split_tag(child.tag)
            if (ns, local) == (JSDL_NS, "JobDescription"):
                descriptions.append(child)
            elif self.ours(ns):
                self.unexpected(child, ROOT)
        if not descriptions:
            self.fail(ROOT, "a JobDescription element")
        if len(descriptions) > 1:
            self.fail(ROOT, "exactly one JobDescription", len(descriptions))
        return self.job_description(descriptions[0])

    def job_description(self, el: ET.Element) -> JobDescription:
        fields_: dict[str, Any] = {}
        staging: list[StagingEntry] = []
        seen: set[str] = set()
        for child in el:
            ns, local = split_tag(child.tag)
            if ns == JSDL_NS:
                if local == "DataStaging":
                    staging.append(self.data_staging(child, f"{DESC}/DataStaging", len(staging)))
                    continue
                if local in ("JobIdentification", "Application", "Resources"):
                    self.singleton(seen, local, f"{DESC}/{local}")
                    getattr(self, local.lower())(child, fields_)
                    continue
            if self.ours(ns):
                self.unexpected(child, DESC)
            elif ns == GBROKER_NS:
                if local != "Scheduling":
                    self.fail(f"{DESC}/{local}", "a GBroker element Scheduling here", local)
                self.singleton(seen, local, SCHED)
                self.scheduling(child, fields_)
        fields_["staging"] = tuple(staging)
        program = fields_.get("executable") or fields_.get("application_name")
        # GFD.56 makes Application optional: a job of DataStaging only stages in, then out.
        if program is None and ("Application" in seen or not staging):
            if "Application" in seen:
                where, found = APP, "an Application with neither"
            else:
                where, found = DESC, "nothing to run" if len(el) else "an empty JobDescription"
            self.fail(
                where,
                "an Executable (in POSIXApplication, HPCProfileApplication or SPMDApplication) "
                "or an ApplicationName (or DataStaging alone, for a staging-only job)",
                found,
            )
        try:
            return JobDescription(**fields_)
        except JsdlError as exc:
            raise JsdlError(
                self.document,
                self.paths.get(exc.path) or XML_PATHS.get(exc.path, f"{DESC} ({exc.path})"),
                exc.expected,
                exc.found,
            ) from exc

    def jobidentification(self, el: ET.Element, out: dict[str, Any]) -> None:
        path = f"{DESC}/JobIdentification"
        annotations: list[str] = []
        projects: list[str] = []
        seen: set[str] = set()
        for child in el:
            ns, local = split_tag(child.tag)
            if not self.ours(ns):
                continue
            here = f"{path}/{local}"
            if ns != JSDL_NS:
                self.unexpected(child, path)
            elif local == "JobName":
                self.singleton(seen, local, here)
                out["name"] = self.token(child, here)
            elif local == "Description":
                self.singleton(seen, local, here)
                text = self.text(child, here)
                out["description"] = text if text.strip() else None
            elif local == "JobAnnotation":
                annotations.append(self.text(child, here))
            elif local == "JobProject":
                projects.append(self.text(child, here))
            else:
                self.unexpected(child, path)
        out["annotations"] = tuple(annotations)
        out["projects"] = tuple(projects)

    def application(self, el: ET.Element, out: dict[str, Any]) -> None:
        seen: set[str] = set()
        program: ET.Element | None = None
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{APP}/{local}"
            if ns == JSDL_NS and local in ("ApplicationName", "ApplicationVersion"):
                self.singleton(seen, local, here)
                key = "application_name" if local == "ApplicationName" else "application_version"
                out[key] = self.token(child, here)
            elif ns == JSDL_NS and local == "Description":
                continue  # what the application is, for people: it asks nothing
            elif local in _APP_ELEMENTS:
                kind, namespaces = _APP_ELEMENTS[local]
                if ns not in namespaces:
                    self.fail(here, f"{local} in namespace {namespaces[0]}", _clark(ns, local))
                if program is not None:
                    self.fail(
                        here,
                        "at most one of POSIXApplication, HPCProfileApplication or SPMDApplication",
                        f"{split_tag(program.tag)[1]} and {local}",
                    )
                program = child
                out["application"] = kind
                self.program(child, kind, ns, here, out)
            elif ns == GBROKER_NS:
                self.fail(here, "no GBroker element inside Application", local)
            elif self.ours(ns):
                self.unexpected(child, APP)
            elif local.endswith("Application"):
                # Another middleware's kind of application (GridSAM's MPIApplication, ...):
                # ignoring it, as xsd:any would, would run something else or nothing.
                hint = _APP_HINTS.get(local, "")
                self.fail(
                    here,
                    "a POSIXApplication, HPCProfileApplication or SPMDApplication (GBroker runs "
                    f"no other kind of application{hint})",
                    f"{local} of namespace {ns}" if ns else local,
                )

    def program(
        self, el: ET.Element, kind: ApplicationKind, own_ns: str, path: str, out: dict[str, Any]
    ) -> None:
        """POSIXApplication, HPCProfileApplication or SPMDApplication (POSIX elements inside)."""
        accepted = {*(_HPCPA if own_ns in _HPCPA else (own_ns,)), POSIX_NS}
        arguments: list[str] = []
        environment: dict[str, str] = {}
        # JSDL's filesystemName attribute: which file system a path is relative to.
        filesystems: dict[str, str] = {}
        seen: set[str] = set()

        def filesystem(child: ET.Element, key: str, here: str) -> None:
            name = child.get("filesystemName")
            if name is not None:
                filesystems[key] = name
                self.paths[f"filesystem_names.{key}"] = f"{here}/@filesystemName"

        keys = {
            "Executable": "executable",
            "Input": "input",
            "Output": "output",
            "Error": "error",
            "WorkingDirectory": "working_directory",
            "SPMDVariation": "spmd_variation",
        }
        for child in el:
            ns, local = split_tag(child.tag)
            if not self.ours(ns):
                continue
            here = f"{path}/{local}"
            if ns not in accepted:
                self.unexpected(child, path)
            elif local == "Argument":
                here = f"{path}/Argument[{len(arguments) + 1}]"
                filesystem(child, f"arguments[{len(arguments)}]", here)
                arguments.append(self.text(child, here))
            elif local == "Environment":
                here = f"{path}/Environment[{len(environment) + 1}]"
                name = (child.get("name") or "").strip()
                if not name:
                    self.fail(here, 'a name="..." attribute')
                if not ENV_NAME.fullmatch(name):
                    self.fail(here, "a variable name without '=' or spaces", name)
                if name in environment:
                    self.fail(here, "each variable once", name)
                filesystem(child, f"environment.{name}", here)
                environment[name] = self.text(child, here)
            elif local in keys and (local != "SPMDVariation" or kind is ApplicationKind.SPMD):
                self.singleton(seen, local, here)
                out[keys[local]] = self.token(child, here)
                self.paths[keys[local]] = here
                filesystem(child, keys[local], here)
            elif local in ("WallTimeLimit", "CPUTimeLimit"):
                self.singleton(seen, local, here)
                key = "wall_time_limit" if local == "WallTimeLimit" else "cpu_time_limit"
                out[key] = self.integer(child, here, 0)
            elif kind is ApplicationKind.SPMD and local == "NumberOfProcesses":
                self.singleton(seen, local, here)
                count, flag = self.spmd_count(child, here, "actualtotalcpucount")
                out["number_of_processes"], out["processes_from_allocation"] = count, flag
            elif kind is ApplicationKind.SPMD and local == "ThreadsPerProcess":
                self.singleton(seen, local, here)
                count, flag = self.spmd_count(child, here, "actualindividualcpucount")
                out["threads_per_process"], out["threads_from_allocation"] = count, flag
            elif kind is ApplicationKind.SPMD and local == "ProcessesPerHost":
                self.singleton(seen, local, here)
                out["processes_per_host"] = self.integer(child, here, 1)
            else:
                self.unexpected(child, path)
        out["arguments"] = tuple(arguments)
        out["environment"] = environment
        out["filesystem_names"] = filesystems

    def spmd_count(self, el: ET.Element, path: str, flag_name: str) -> tuple[int | None, bool]:
        """A count that may instead be "as many as CPUs allocated" (an attribute set true)."""
        flag_text = self.attribute(el, flag_name)
        flag = self.boolean(flag_text, f"{path}/@{flag_name}") if flag_text is not None else False
        nil_text = el.get(f"{{{XSI_NS}}}nil")
        nil = self.boolean(nil_text, f"{path}/@xsi:nil") if nil_text is not None else False
        if self.token(el, path) is None:
            if flag or nil:
                return None, flag
            self.fail(path, f'a positive integer (or {flag_name}="true")', "nothing")
        return self.integer(el, path, 1), flag

    def resources(self, el: ET.Element, out: dict[str, Any]) -> None:
        hosts: list[str] = []
        seen: set[str] = set()
        ranges = {
            "TotalCPUCount": ("total_cpu_count", True),
            "IndividualCPUCount": ("individual_cpu_count", True),
            "TotalCPUTime": ("total_cpu_time", False),
            "IndividualCPUTime": ("individual_cpu_time", False),
            "TotalResourceCount": ("total_resource_count", True),
            "IndividualCPUSpeed": ("individual_cpu_speed", False),
            "IndividualNetworkBandwidth": ("individual_network_bandwidth", False),
            "IndividualPhysicalMemory": ("individual_physical_memory", False),
            "TotalPhysicalMemory": ("total_physical_memory", False),
            "IndividualDiskSpace": ("individual_disk_space", False),
            "TotalDiskSpace": ("total_disk_space", False),
        }
        systems: list[FileSystem] = []
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{RES}/{local}"
            if ns == GBROKER_NS:
                self.fail(here, "no GBroker element inside Resources", local)
            if not self.ours(ns):
                continue
            if ns != JSDL_NS:
                self.unexpected(child, RES)
            if local in ("CandidateHosts", "CandidateHost"):  # GridWay writes CandidateHost
                for i, host in enumerate(child):
                    host_ns, host_local = split_tag(host.tag)
                    if (host_ns, host_local) == (JSDL_NS, "HostName"):
                        name = self.token(host, f"{here}/HostName[{i + 1}]")
                        if name is not None:
                            hosts.append(name)
                    elif self.ours(host_ns):
                        self.unexpected(host, here)
            elif local in ranges:
                self.singleton(seen, local, here)
                key, counts = ranges[local]
                out[key] = self.range_value(child, here, counts)
                self.paths[key] = here
            elif local == "FileSystem":
                systems.append(self.file_system(child, f"{here}[{len(systems) + 1}]"))
            elif local == "ExclusiveExecution":
                self.singleton(seen, local, here)
                out["exclusive_execution"] = self.boolean(self.text(child, here), here)
            elif local == "OperatingSystem":
                self.singleton(seen, local, here)
                self.operating_system(child, here, out)
            elif local == "CPUArchitecture":
                self.singleton(seen, local, here)
                name_el = self.only_child(child, here, "CPUArchitectureName")
                out["cpu_architecture"] = self.token(name_el, f"{here}/CPUArchitectureName")
                self.paths["cpu_architecture"] = f"{here}/CPUArchitectureName"
                if out["cpu_architecture"] is None:
                    self.fail(f"{here}/CPUArchitectureName", "an architecture such as x86_64")
            elif local in ("IndividualVirtualMemory", "TotalVirtualMemory"):
                self.fail(
                    here,
                    "no virtual memory requirement (GBroker's sites declare physical memory "
                    "only: ask for IndividualPhysicalMemory or TotalPhysicalMemory)",
                    local,
                )
            else:
                self.unexpected(child, RES)
        names = [fs.name for fs in systems]
        for i, name in enumerate(names):
            if name in names[:i]:
                self.fail(f"{RES}/FileSystem[{i + 1}]/@name", "each file system once", name)
        out["candidate_hosts"] = tuple(hosts)
        out["file_systems"] = tuple(systems)

    def only_child(self, el: ET.Element, path: str, local: str) -> ET.Element:
        """The one JSDL child ``local`` of ``el`` (others' extensions aside)."""
        found = []
        for child in el:
            ns, name = split_tag(child.tag)
            if (ns, name) == (JSDL_NS, local):
                found.append(child)
            elif self.ours(ns):
                self.unexpected(child, path)
        if len(found) != 1:
            self.fail(f"{path}/{local}", f"exactly one {local}", len(found))
        return found[0]

    def operating_system(self, el: ET.Element, path: str, out: dict[str, Any]) -> None:
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{path}/{local}"
            if not self.ours(ns):
                continue
            if ns != JSDL_NS:
                self.unexpected(child, path)
            if local == "OperatingSystemType":
                name_el = self.only_child(child, here, "OperatingSystemName")
                where = f"{here}/OperatingSystemName"
                out["operating_system"] = self.token(name_el, where)
                self.paths["operating_system"] = where
                if out["operating_system"] is None:
                    self.fail(where, "an operating system such as LINUX")
            elif local == "OperatingSystemVersion":
                out["operating_system_version"] = self.token(child, here)
            elif local != "Description":  # for people: it asks nothing
                self.unexpected(child, path)

    def file_system(self, el: ET.Element, path: str) -> FileSystem:
        values: dict[str, Any] = {"name": el.get("name")}
        if values["name"] is None:
            self.fail(f"{path}/@name", 'a name="..." attribute (HOME, SCRATCH, ...)')
        seen: set[str] = set()
        keys = {"FileSystemType": "type", "Description": "description", "MountPoint": "mount_point"}
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{path}/{local}"
            if not self.ours(ns):
                continue
            if ns != JSDL_NS:
                self.unexpected(child, path)
            if local in keys:
                self.singleton(seen, local, here)
                values[keys[local]] = self.token(child, here)
            elif local == "DiskSpace":
                self.singleton(seen, local, here)
                values["disk_space"] = self.range_value(child, here, False)
            else:
                self.unexpected(child, path)
        try:
            return FileSystem(**values)
        except JsdlError as exc:
            where = {
                "name": "@name",
                "type": "FileSystemType",
                "mount_point": "MountPoint",
                "disk_space": "DiskSpace",
            }.get(exc.path, exc.path)
            self.fail(f"{path}/{where}", exc.expected, exc.found)

    def range_value(self, el: ET.Element, path: str, counts: bool) -> RangeValue:
        """A RangeValue_Type element holding one range (GBroker takes no unions of ranges).

        For CPU counts the whole numbers inside the range are kept: bounds are rounded inwards
        and an exclusive bound moves by one.
        """
        parts = list(el)
        if not parts:
            self.fail(path, f"one of {_RANGE_KINDS}", "nothing")
        for part in parts:
            ns, local = split_tag(part.tag)
            if ns != JSDL_NS or local not in (
                "Exact",
                "LowerBoundedRange",
                "UpperBoundedRange",
                "Range",
            ):
                self.fail(f"{path}/{local}", f"a range kind: {_RANGE_KINDS}", _clark(ns, local))
        if len(parts) > 1:
            self.fail(
                path,
                "exactly one range (GBroker takes no unions of ranges)",
                ", ".join(split_tag(p.tag)[1] for p in parts),
            )
        part = parts[0]
        local = split_tag(part.tag)[1]
        here = f"{path}/{local}"
        if local == "Exact":
            if part.get("epsilon") is not None:
                self.fail(
                    f"{here}/@epsilon",
                    "an Exact value without epsilon (GBroker takes an exact value as exact: "
                    "write a Range for a value within bounds)",
                    part.get("epsilon"),
                )
            value = self.number(part, here)
            if counts:
                value = self.count(part, here, value, None)
            return self.make_range(here, RangeKind.EXACT, value, value)
        if local == "LowerBoundedRange":
            return self.make_range(
                here, RangeKind.LOWER_BOUNDED, self.bound(part, here, counts, "lower"), None
            )
        if local == "UpperBoundedRange":
            return self.make_range(
                here, RangeKind.UPPER_BOUNDED, None, self.bound(part, here, counts, "upper")
            )
        bounds: dict[str, ET.Element] = {}
        for child in part:
            ns, name = split_tag(child.tag)
            if ns == JSDL_NS and name in ("LowerBound", "UpperBound"):
                self.singleton(set(bounds), name, f"{here}/{name}")
                bounds[name] = child
            else:  # Range_Type has no extension point
                self.unexpected(child, here)
        for name in ("LowerBound", "UpperBound"):
            if name not in bounds:
                self.fail(f"{here}/{name}", f"its {name} element")
        lower = self.bound(bounds["LowerBound"], f"{here}/LowerBound", counts, "lower")
        upper = self.bound(bounds["UpperBound"], f"{here}/UpperBound", counts, "upper")
        if lower > upper:
            what = "whole numbers of CPUs" if counts else "values"
            self.fail(
                here, f"LowerBound <= UpperBound (a range holding {what})", f"{lower}..{upper}"
            )
        return self.make_range(here, RangeKind.RANGE, lower, upper)

    def bound(self, el: ET.Element, path: str, counts: bool, side: str) -> float:
        value = self.number(el, path)
        exclusive_text = el.get("exclusiveBound")
        exclusive = (
            self.boolean(exclusive_text, f"{path}/@exclusiveBound")
            if exclusive_text is not None
            else False
        )
        if not counts:
            if value < 0:
                self.fail(path, "a value >= 0", format_number(value))
            return value
        if side == "lower":
            whole = math.floor(value) + 1 if exclusive else math.ceil(value)
        else:
            whole = math.ceil(value) - 1 if exclusive else math.floor(value)
        return self.count(el, path, float(whole), value)

    def count(self, el: ET.Element, path: str, value: float, written: float | None) -> int:
        shown = format_number(written if written is not None else value)
        if not value.is_integer():
            self.fail(path, "a whole number of CPUs", self.text(el, path).strip())
        if value < 1:
            self.fail(path, "a CPU count >= 1", shown if written is not None else int(value))
        return int(value)

    def make_range(
        self, path: str, kind: RangeKind, lower: float | None, upper: float | None
    ) -> RangeValue:
        try:
            return RangeValue(kind, lower, upper)
        except JsdlError as exc:
            self.fail(path, exc.expected, exc.found)

    def data_staging(self, el: ET.Element, base: str, index: int) -> StagingEntry:
        path = f"{base}[{index + 1}]"
        values: dict[str, Any] = {}
        seen: set[str] = set()
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{path}/{local}"
            if ns == JSDL_NS:
                if local == "FileName":
                    self.singleton(seen, local, here)
                    values["file_name"] = self.token(child, here)
                elif local == "FilesystemName":
                    self.singleton(seen, local, here)
                    values["filesystem"] = self.token(child, here)
                elif local == "CreationFlag":
                    self.singleton(seen, local, here)
                    flag = self.token(child, here) or ""
                    try:
                        values["creation_flag"] = CreationFlag(flag)
                    except ValueError:
                        near = did_you_mean(flag, [str(f) for f in CreationFlag])
                        self.fail(here, f"overwrite, append or dontOverwrite{near}", flag)
                elif local == "DeleteOnTermination":
                    self.singleton(seen, local, here)
                    values["delete_on_termination"] = self.boolean(self.text(child, here), here)
                elif local in ("Source", "Target"):
                    self.singleton(seen, local, here)
                    values[local.lower()] = self.uri(child, here)
                else:
                    self.unexpected(child, path)
            elif local == "InlineData" and ns in (GBROKER_NS, UNICORE_NS):
                self.singleton(seen, local, here)
                values["inline_data"] = self.text(child, here)
            elif ns == GBROKER_NS:
                if local == "Site":
                    self.singleton(seen, local, here)
                    values["site"] = self.token(child, here)
                elif local == "Size":
                    self.singleton(seen, local, here)
                    values["size"] = self.integer(child, here, 0)
                else:
                    self.fail(here, "a GBroker element InlineData, Site or Size", local)
            elif self.ours(ns):
                self.unexpected(child, path)
        if values.get("file_name") is None:
            self.fail(f"{path}/FileName", "a FileName (the file's name in the job's directory)")
        if "source" in values and values["source"] is None and "inline_data" not in values:
            self.fail(f"{path}/Source/URI", "a URI to stage the file in from")
        if "target" in values and values["target"] is None:
            self.fail(f"{path}/Target/URI", "a URI to stage the file out to")
        try:
            return StagingEntry(**values)
        except JsdlError as exc:
            where = {
                "file_name": "FileName",
                "size": "gbroker:Size",
                "filesystem": "FilesystemName",
            }.get(exc.path, exc.path)
            self.fail(f"{path}/{where}", exc.expected, exc.found)

    def uri(self, el: ET.Element, path: str) -> str | None:
        uri: str | None = None
        for child in el:
            ns, local = split_tag(child.tag)
            if local == "URI" and ns in (JSDL_NS, ""):  # UNICORE tests leave URI unqualified
                if uri is not None:
                    self.fail(f"{path}/URI", "at most one URI", "another one")
                uri = self.token(child, f"{path}/URI") or ""
            elif self.ours(ns):
                self.unexpected(child, path)
        return uri or None

    def scheduling(self, el: ET.Element, out: dict[str, Any]) -> None:
        seen: set[str] = set()
        for child in el:
            ns, local = split_tag(child.tag)
            here = f"{SCHED}/{local}"
            if ns != GBROKER_NS or local not in _SCHEDULING:
                self.fail(here, f"a GBroker element {', '.join(_SCHEDULING)}", local)
            if local == "Component":  # one per component, in rank order
                out.setdefault("components", []).append(self.component(child, here))
                continue
            self.singleton(seen, local, here)
            if local == "Coallocation":
                out["coallocation"] = self.token(child, here)
            elif local == "Model":
                out["model"] = self.model(child, here)
            elif local == "Malleability":
                out["malleability"] = self.malleability(child, here)
            elif local == "JobClass":
                text = self.token(child, here) or ""
                try:
                    out["job_class"] = JobClass(text)
                except ValueError:
                    near = did_you_mean(text, [str(c) for c in JobClass])
                    self.fail(here, f"rigid, moldable or malleable{near}", text)
            else:
                key = "min_cores" if local == "MinCores" else "max_cores"
                out[key] = self.integer(child, here, 1)

    def component(self, el: ET.Element, path: str) -> Component:
        """``<gbroker:Component cores="4" site="A"/>`` (``site`` optional)."""
        if len(el) or (el.text or "").strip():
            self.fail(path, "attributes only (cores, site)")
        for key in el.attrib:
            if key not in ("cores", "site"):
                self.fail(f"{path}/@{key}", "an attribute cores or site", key)
        cores = el.attrib.get("cores")
        if cores is None or not cores.strip().isdigit() or int(cores) < 1:
            self.fail(f"{path}/@cores", "the component's cores, an integer >= 1", cores)
        site = el.attrib.get("site")
        return Component(int(cores), None if site is None else site.strip())

    def model(self, el: ET.Element, path: str) -> PerformanceModel:
        """``<gbroker:Model units="1000" compute="0.001" exchange="8000" iterations="100"/>``:
        an AppLeS performance model, its keys as attributes (docs/APPLES.md)."""
        if len(el) or (el.text or "").strip():
            self.fail(path, f"attributes only ({', '.join(MODEL_KEYS)})")
        data: dict[str, object] = {}
        for key, text in el.attrib.items():
            if key in ("units", "iterations", "cores") and text.strip().isdigit():
                data[key] = int(text)
            elif key == "topology" or not _NUMBER.fullmatch(text.strip()):
                data[key] = text.strip()
            else:
                data[key] = float(text)
        try:
            return parse_model(data)
        except InvalidInput as exc:
            where = exc.field.removeprefix("model").removeprefix(".")
            self.fail(f"{path}/@{where}" if where else path, exc.expected, exc.found)

    def malleability(self, el: ET.Element, path: str) -> Malleability:
        """``<gbroker:Malleability sizes="power2" obligation="mandatory" deadline="5"/>``."""
        if len(el) or (el.text or "").strip():
            self.fail(path, "attributes only (sizes, initiative, obligation, deadline, ...)")
        out: dict[str, Any] = {}
        for key, text in el.attrib.items():
            name = MALLEABILITY_ATTRIBUTES.get(key.lower())
            where = f"{path}/@{key}"
            if name is None:
                expected = ", ".join(MALLEABILITY_ATTRIBUTES.values())
                self.fail(where, f"an attribute of {expected}", key)
            if name in ("deadline", "reconfiguration_cost"):
                if not _NUMBER.fullmatch(text.strip()):
                    self.fail(where, "a number", text)
                out[name] = float(text)
            elif name == "evolving":
                out[name] = self.boolean(text, where)
            elif name == "initial":
                if not text.strip().isdigit() or int(text) < 1:
                    self.fail(where, "an integer >= 1", text)
                out[name] = int(text)
            else:
                out[name] = text.strip()
        return malleability_from(out, self.fail, path)


_SCHEDULING = (
    "JobClass",
    "MinCores",
    "MaxCores",
    "Malleability",
    "Component",
    "Coallocation",
    "Model",
)


def parse_jsdl(
    data: str | bytes, *, document: str = "<jsdl>", max_bytes: int = MAX_DOCUMENT_BYTES
) -> JobDescription:
    """Read a JSDL 1.0 document; :class:`JsdlError` says what is wrong and where."""
    raw = data.encode() if isinstance(data, str) else data
    check_size(raw, document, max_bytes)
    if not raw.strip():
        raise JsdlError(document, "document", "a JSDL document", "an empty file")
    # Text goes in as text: its characters are already decoded, whatever the XML declaration says.
    return JsdlReader(document).job_definition(parse_xml(data, document))
