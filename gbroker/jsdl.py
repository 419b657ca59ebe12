"""JSDL 1.0 job descriptions: read them, check them, turn them into jobs, write them back.

Theory of operation
-------------------
A user hands any broker a job as a JSDL 1.0 document (OGF GFD.56) with the POSIX (GFD.56), HPC
Profile Application (GFD.111) and SPMD (GFD.115) extensions, or as the equivalent JSON/YAML
mapping. Either becomes a :class:`JobDescription`: *what* to run (program, arguments,
environment, standard streams, staging) and *what it asks for* (CPU counts, processes, limits,
hosts). :meth:`JobDescription.to_job` derives from it the schedulers' :class:`Job`: rank r, max
rank, job class, requested time, and the input files l with sizes z_l and sites h_l.

Reading is liberal, reporting precise:

* Untrusted bytes are parsed by defusedxml only, after a size check (``MAX_DOCUMENT_BYTES``); a
  DTD, entity or external reference is refused (no billion laughs, no XXE).
* YAML is read without anchors and aliases (:mod:`gbroker.safeyaml`): a few hundred bytes of
  aliases expand to gigabytes (billion laughs in YAML).
* Every number is bounded: counts of cores, processes and threads by ``MAX_CORES``, wall time by
  ``MAX_SECONDS``, CPU time by ``MAX_CPU_SECONDS``, declared file sizes by ``MAX_FILE_BYTES``.
* The paths the job writes or reads (Input, Output, Error, WorkingDirectory, each staging
  FileName) are confined to the job directory when the description is built: relative, no
  ``..``, no NUL, at most ``MAX_PATH_BYTES``, normalised (``./a//b`` is ``a/b``). Input
  ``/dev/null`` (GridWay writes it) reads as no Input, which is what the executor does anyway.
* Elements are matched by namespace and local name, in any order. Known deviations of real
  writers are accepted: GridWay's ``<CandidateHost>`` beside the schema's ``<CandidateHosts>``;
  UNICORE's SPMD attributes ``actualTotalCPUCount`` (the schema: ``actualtotalcpucount``), its HPC
  Profile namespace under schemas.ogf.org (the GFD.111 one is under schemas.ggf.org), its
  ``InlineData``, an unqualified ``<URI>``, a ``DataStaging`` without ``CreationFlag`` (taken as
  ``overwrite``). JSDL's range values are doubles: a CPU count range keeps the whole numbers
  inside it (``Range 1.5..4`` is 2..4, an ``exclusiveBound`` moves the bound by one).
* Elements of other namespaces are ignored (JSDL's ``xsd:any``); unknown elements of GBroker's
  own namespace are errors (a typo there would silently change how a job is scheduled).
* Every problem is a :class:`JsdlError` (an ``InvalidInput``) that names the document, the
  element path (``JobDefinition/JobDescription/Resources/TotalCPUCount/Exact``, repeated
  elements numbered from 1: ``DataStaging[2]``) and what was expected. Never a traceback.

A job must name something to run: an ``Executable``, or an ``ApplicationName`` that the
executing site resolves (UNICORE's way). A description with neither (an empty or staging-only
``JobDescription``) is rejected.

The GBroker extension (namespace ``urn:gbroker:jsdl:1``) carries what JSDL cannot say::

    <gbroker:Scheduling>                       in JobDescription, after any DataStaging
      <gbroker:JobClass>malleable</gbroker:JobClass>      rigid | moldable | malleable
      <gbroker:MinCores>2</gbroker:MinCores>
      <gbroker:MaxCores>16</gbroker:MaxCores>
      <gbroker:Malleability sizes="power2" obligation="mandatory" deadline="10"/>
    </gbroker:Scheduling>

``Malleability``'s attributes (all optional): ``sizes`` (``any``, ``power2``, ``multiple:K`` or a
list ``2,4,8``), ``initiative`` (scheduler, application, both), ``obligation`` (voluntary,
mandatory), ``deadline`` and ``reconfigurationCost`` (seconds), ``evolving`` (true, false),
``initial`` (cores to start on); JSON/YAML has the same under ``malleability``, in snake case.
    <gbroker:InlineData>...</gbroker:InlineData>  in DataStaging: the file's content, inline
    <gbroker:Site>s3</gbroker:Site>               in DataStaging: the site holding it (h_l)
    <gbroker:Size>1048576</gbroker:Size>          in DataStaging: its size in bytes (z_l)

The job's cores (:meth:`JobDescription.core_request`): r = MinCores, else NumberOfProcesses,
else the lower bound of TotalCPUCount, else 1; max = MaxCores, else the upper bound of a
TotalCPUCount range (Range or UpperBoundedRange), else r; the class is JobClass, else moldable
when max > r, else rigid. The requested time is WallTimeLimit, else TotalCPUTime / r, else
IndividualCPUTime (upper bounds; linear speed-up, as :class:`Job` assumes).

:func:`to_jsdl` writes elements in schema order with fixed prefixes, extension elements only
where the XSDs allow ``xsd:any``, so ``parse_jsdl(to_jsdl(d)) == d`` and the output validates
against the official XSDs. :func:`to_mapping` and :func:`from_mapping` do the same for JSON/YAML.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from os import PathLike
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, NoReturn, cast
from xml.parsers import expat

import defusedxml
import defusedxml.ElementTree as SafeET

from gbroker.core.malleable import Malleability, SizeRule
from gbroker.core.model import InputFile, Job, JobClass
from gbroker.core.requirements import FileSystemNeed, Requirements
from gbroker.errors import InvalidInput, Shown

__all__ = [
    "GBROKER_NS",
    "HPCPA_NS",
    "HPCPA_NS_OGF",
    "JSDL_NS",
    "MAX_CORES",
    "MAX_CPU_SECONDS",
    "MAX_DOCUMENT_BYTES",
    "MAX_FILE_BYTES",
    "MAX_PATH_BYTES",
    "MAX_SECONDS",
    "POSIX_NS",
    "REQUIREMENT_FIELDS",
    "SPMD_NS",
    "ApplicationKind",
    "CreationFlag",
    "FileSystem",
    "JobDescription",
    "JsdlError",
    "RangeKind",
    "RangeValue",
    "StagingEntry",
    "document_format",
    "from_mapping",
    "load_job_description",
    "loads_job_description",
    "parse_jsdl",
    "requirement_field",
    "summary",
    "to_jsdl",
    "to_mapping",
]

JSDL_NS = "http://schemas.ggf.org/jsdl/2005/11/jsdl"
POSIX_NS = "http://schemas.ggf.org/jsdl/2005/11/jsdl-posix"
SPMD_NS = "http://schemas.ogf.org/jsdl/2007/02/jsdl-spmd"
HPCPA_NS = "http://schemas.ggf.org/jsdl/2006/07/jsdl-hpcpa"
#: The HPC Profile Application namespace as UNICORE also writes it.
HPCPA_NS_OGF = "http://schemas.ogf.org/jsdl/2006/07/jsdl-hpcpa"
GBROKER_NS = "urn:gbroker:jsdl:1"
UNICORE_NS = "http://www.unicore.eu/unicore/jsdl-extensions"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

#: Documents larger than this are refused before parsing (1 MiB).
MAX_DOCUMENT_BYTES = 1 << 20
#: The most cores, processes or threads a job may ask for (any count in a description).
MAX_CORES = 1 << 20
#: The longest wall time limit: ten years, in seconds.
MAX_SECONDS = 10 * 366 * 86_400
#: The longest CPU time (a limit or a TotalCPUTime/IndividualCPUTime bound): MAX_SECONDS on
#: each of MAX_CORES cores.
MAX_CPU_SECONDS = MAX_SECONDS * MAX_CORES
#: The largest staged file a description may declare (``size``), in bytes: 1 PiB.
MAX_FILE_BYTES = 1 << 50
#: The longest path inside the job directory (Input, Output, Error, WorkingDirectory, a
#: staging FileName), in UTF-8 bytes; each of its components is at most MAX_NAME_BYTES.
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
#: The largest memory or disk space a description may ask for, in bytes: 1 PiB.
MAX_AMOUNT_BYTES = 1 << 50
#: The fastest CPU (Hz) or network (bits/s) a description may ask for.
MAX_RATE = 1e15


class JsdlError(InvalidInput):
    """A job description that cannot be accepted: which document, where in it, what was expected.

    ``path`` is an element path for XML (``JobDefinition/JobDescription/Resources``), a
    line/column for text that does not parse, or a field path for mappings (``staging[0].size``).
    """

    def __init__(self, document: str, path: str, expected: str, found: object = None) -> None:
        self.document = document
        self.path = path
        super().__init__(f"{document}: {path}" if document else path, expected, found)


class ApplicationKind(StrEnum):
    """Which JSDL application extension describes the program."""

    POSIX = "posix"
    HPCPA = "hpcpa"
    SPMD = "spmd"


class CreationFlag(StrEnum):
    """JSDL's CreationFlag: what to do when a staged file already exists."""

    OVERWRITE = "overwrite"
    APPEND = "append"
    DONT_OVERWRITE = "dontOverwrite"


class RangeKind(StrEnum):
    """The four shapes of a JSDL RangeValue."""

    EXACT = "exact"
    LOWER_BOUNDED = "lower_bounded"
    UPPER_BOUNDED = "upper_bounded"
    RANGE = "range"


# Characters XML 1.0 can carry (everything else makes the document unreadable).
_NOT_XML_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# xsd:double / xsd:decimal lexical forms, without INF and NaN.
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_ENV_NAME = re.compile(r"[^=\s]+")
# A file system's name (JSDL: an NCName); it becomes a path component at the site.
_FS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_FS_EXPECTED = "a file system name: a letter or '_', then letters, digits, '_', '-' or '.'"
_PATH_FIELDS = ("input", "output", "error", "working_directory")
_PATH_EXPECTED = (
    "a relative path inside the job directory: no leading '/', no '..', at most "
    f"{MAX_PATH_BYTES} bytes ({MAX_NAME_BYTES} per component)"
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _given(value: object) -> bool:
    """Whether a field holds something (0 does; None, False and empty collections do not)."""
    if value is None or value is False:
        return False
    return not (isinstance(value, tuple | Mapping) and not value)


def _check_text(key: str, value: str) -> None:
    bad = _NOT_XML_CHAR.search(value)
    if bad:
        raise JsdlError("", key, "text without control characters", value)


def _job_path(key: str, value: str, *, directory: bool = False) -> str:
    """``value`` as a normalised path confined to the job directory (``a//b/./c`` is ``a/b/c``).

    Checked when a description is built, so that a path that could never be used (or that would
    write outside the job directory) is refused at submission, not at launch.
    """
    if "\0" in value:
        raise JsdlError("", key, "a path without NUL characters", value)
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise JsdlError("", key, _PATH_EXPECTED, value)
    if not path.parts and not directory:
        raise JsdlError("", key, "a file name inside the job directory, not the directory", value)
    if len(value.encode()) > MAX_PATH_BYTES or any(
        len(part.encode()) > MAX_NAME_BYTES for part in path.parts
    ):
        raise JsdlError("", key, _PATH_EXPECTED, value)
    return str(path)


def _bounded_int(key: str, value: object, low: int, high: int, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise JsdlError("", key, f"{what} from {low} to {high}", value)


def _fs_name(key: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FS_NAME.fullmatch(value.strip()):
        raise JsdlError("", key, _FS_EXPECTED, value)
    return value.strip()


def _token(key: str, value: object) -> str | None:
    """A name-like string, whitespace-stripped; empty becomes None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise JsdlError("", key, "a string", value)
    _check_text(key, value)
    return value.strip() or None


@dataclass(frozen=True, slots=True)
class RangeValue:
    """A JSDL RangeValue: an exact value, a one-sided bound or a closed range (inclusive).

    CPU counts hold whole numbers; times hold seconds.
    """

    kind: RangeKind
    lower: float | None = None
    upper: float | None = None

    def __post_init__(self) -> None:
        kind = RangeKind(self.kind)
        object.__setattr__(self, "kind", kind)
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not math.isfinite(value)):
                raise JsdlError("", name, "a finite number", value)
            if value is not None and value < 0:
                raise JsdlError("", name, "a number >= 0", value)
        has = (self.lower is not None, self.upper is not None)
        wanted = {
            RangeKind.EXACT: (True, True),
            RangeKind.LOWER_BOUNDED: (True, False),
            RangeKind.UPPER_BOUNDED: (False, True),
            RangeKind.RANGE: (True, True),
        }[kind]
        if has != wanted:
            raise JsdlError("", "kind", f"bounds that fit a {kind} range", (self.lower, self.upper))
        if kind is RangeKind.EXACT and self.lower != self.upper:
            raise JsdlError("", "upper", f"equal to lower ({self.lower}) for an exact value", self)
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise JsdlError("", "upper", f">= lower ({self.lower})", self.upper)

    @classmethod
    def exact(cls, value: float) -> RangeValue:
        return cls(RangeKind.EXACT, value, value)

    @classmethod
    def at_least(cls, value: float) -> RangeValue:
        return cls(RangeKind.LOWER_BOUNDED, value, None)

    @classmethod
    def at_most(cls, value: float) -> RangeValue:
        return cls(RangeKind.UPPER_BOUNDED, None, value)

    @classmethod
    def between(cls, lower: float, upper: float) -> RangeValue:
        return cls(RangeKind.RANGE, lower, upper)

    def __str__(self) -> str:
        lo, hi = _fmt_number(self.lower), _fmt_number(self.upper)
        return {
            RangeKind.EXACT: lo,
            RangeKind.LOWER_BOUNDED: f">= {lo}",
            RangeKind.UPPER_BOUNDED: f"<= {hi}",
            RangeKind.RANGE: f"{lo}..{hi}",
        }[self.kind]


def _fmt_number(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@dataclass(frozen=True, slots=True)
class StagingEntry:
    """One JSDL DataStaging: a file of the job's working directory staged in and/or out.

    Attributes:
        file_name: the name in the job's working directory.
        source: URI to fetch it from before the job starts (stage in).
        target: URI to send it to after the job ends (stage out).
        creation_flag: what to do if the file exists (JSDL requires it; absent reads as
            overwrite).
        delete_on_termination: delete it when the job ends; None when the document is silent.
        inline_data: the file's content carried in the description itself.
        site: the GBroker site holding the input (h_l); None: the submitting broker.
        size: its size in bytes (z_l); None when unknown.
        filesystem: the file system (JSDL FilesystemName) ``file_name`` is relative to; None:
            the job's directory.
    """

    file_name: str
    source: str | None = None
    target: str | None = None
    creation_flag: CreationFlag = CreationFlag.OVERWRITE
    delete_on_termination: bool | None = None
    inline_data: str | None = None
    site: str | None = None
    size: int | None = None
    filesystem: str | None = None

    def __post_init__(self) -> None:
        name = _token("file_name", self.file_name)
        if name is None:
            raise JsdlError("", "file_name", "a non-empty file name", self.file_name)
        object.__setattr__(self, "file_name", _job_path("file_name", name))
        for key in ("source", "target", "site"):
            object.__setattr__(self, key, _token(key, getattr(self, key)))
        try:
            object.__setattr__(self, "creation_flag", CreationFlag(self.creation_flag))
        except ValueError:
            raise JsdlError(
                "", "creation_flag", "overwrite, append or dontOverwrite", self.creation_flag
            ) from None
        if self.delete_on_termination is not None and not isinstance(
            self.delete_on_termination, bool
        ):
            raise JsdlError(
                "", "delete_on_termination", "true or false", self.delete_on_termination
            )
        if self.inline_data is not None:
            if not isinstance(self.inline_data, str):
                raise JsdlError("", "inline_data", "a string", self.inline_data)
            _check_text("inline_data", self.inline_data)
        _bounded_int("size", self.size, 0, MAX_FILE_BYTES, "a size in bytes")
        object.__setattr__(self, "filesystem", _fs_name("filesystem", self.filesystem))

    @property
    def stages_in(self) -> bool:
        """Whether the file is brought to the job before it starts."""
        return self.source is not None or self.inline_data is not None

    @property
    def stages_out(self) -> bool:
        """Whether the file is sent away after the job ends."""
        return self.target is not None


_FS_TYPES = ("normal", "spool", "temporary", "swap")


@dataclass(frozen=True, slots=True)
class FileSystem:
    """A JSDL FileSystem the job needs: its name, and if given its type (normal, spool,
    temporary, swap), description, mount point and disk space (bytes)."""

    name: str
    type: str | None = None
    description: str | None = None
    mount_point: str | None = None
    disk_space: RangeValue | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _fs_name("name", self.name))
        if self.name is None:
            raise JsdlError("", "name", _FS_EXPECTED, self.name)
        if self.type is not None and self.type not in _FS_TYPES:
            raise JsdlError("", "type", f"one of {', '.join(_FS_TYPES)}", self.type)
        for key in ("description", "mount_point"):
            object.__setattr__(self, key, _token(key, getattr(self, key)))
        if self.mount_point is not None and not self.mount_point.startswith("/"):
            raise JsdlError("", "mount_point", "an absolute path", self.mount_point)
        _check_amount("disk_space", self.disk_space, MAX_AMOUNT_BYTES, "bytes")


def _check_amount(key: str, value: object, high: float, unit: str) -> None:
    if value is None:
        return
    if not isinstance(value, RangeValue):
        raise JsdlError("", key, "a RangeValue", value)
    if any(b is not None and b > high for b in (value.lower, value.upper)):
        raise JsdlError("", key, f"{unit} from 0 to {_fmt_number(high)}", str(value))


_TOKEN_FIELDS = (
    "name",
    "application_name",
    "application_version",
    "executable",
    "input",
    "output",
    "error",
    "working_directory",
    "spmd_variation",
    "operating_system",
    "operating_system_version",
    "cpu_architecture",
)
_COUNT_FIELDS = (
    "number_of_processes",
    "processes_per_host",
    "threads_per_process",
    "min_cores",
    "max_cores",
)
_SPMD_FIELDS = (
    "number_of_processes",
    "processes_from_allocation",
    "processes_per_host",
    "threads_per_process",
    "threads_from_allocation",
    "spmd_variation",
)
# Resource amounts: their field, largest value, unit.
_AMOUNT_FIELDS = (
    ("individual_cpu_speed", MAX_RATE, "Hz"),
    ("individual_network_bandwidth", MAX_RATE, "bits/s"),
    ("individual_physical_memory", MAX_AMOUNT_BYTES, "bytes"),
    ("total_physical_memory", MAX_AMOUNT_BYTES, "bytes"),
    ("individual_disk_space", MAX_AMOUNT_BYTES, "bytes"),
    ("total_disk_space", MAX_AMOUNT_BYTES, "bytes"),
)
_APPLICATION_FIELDS = (
    "executable",
    "arguments",
    "environment",
    "input",
    "output",
    "error",
    "working_directory",
    "wall_time_limit",
    "cpu_time_limit",
    *_SPMD_FIELDS,
)


@dataclass(frozen=True, slots=True)
class JobDescription:
    """What a JSDL document (or its JSON/YAML equivalent) says about a job.

    Identification: ``name``, ``description``, ``annotations``, ``projects``.
    Application: ``application_name``/``application_version`` (resolved by the site when no
    ``executable`` is given), ``application`` (which extension: POSIX, HPC Profile or SPMD;
    inferred from the fields when None), ``executable``, ``arguments``, ``environment``,
    ``input``/``output``/``error`` (the standard streams), ``working_directory``,
    ``wall_time_limit`` and ``cpu_time_limit`` (POSIX limits, seconds).
    SPMD: ``number_of_processes`` (or ``processes_from_allocation``: as many as CPUs
    allocated), ``processes_per_host``, ``threads_per_process`` (or
    ``threads_from_allocation``), ``spmd_variation`` (the MPI flavour, a URI).
    Resources: ``candidate_hosts``, ``total_cpu_count``, ``individual_cpu_count`` (CPU count
    ranges), ``total_cpu_time``, ``individual_cpu_time`` (seconds); what the job needs of a site
    (:meth:`requirements`): ``exclusive_execution``, ``operating_system`` (and its version),
    ``cpu_architecture``, ``individual_cpu_speed`` (Hz), ``individual_network_bandwidth``
    (bits/s), ``individual_physical_memory``, ``total_physical_memory``,
    ``individual_disk_space``, ``total_disk_space`` (bytes), ``total_resource_count`` (nodes),
    ``file_systems`` (JSDL FileSystem elements).
    ``filesystem_names``: which paths are relative to a file system instead of the job
    directory (JSDL's ``filesystemName``), keyed by field: ``executable``, ``input``,
    ``output``, ``error``, ``working_directory``, ``arguments[i]`` (from 0) or
    ``environment.NAME``.
    ``staging``: the DataStaging entries. GBroker extension: ``job_class``, ``min_cores``,
    ``max_cores``, and a malleable job's ``malleability`` (the sizes it accepts, who starts a
    change, whether it must comply, its deadline, its reconfiguration cost, whether it asks for
    sizes itself, its initial size: :class:`~gbroker.core.malleable.Malleability`). A
    description with no program and only staging is a staging-only job.

    Every value validates itself on construction; an error names the field.
    """

    name: str | None = None
    description: str | None = None
    annotations: tuple[str, ...] = ()
    projects: tuple[str, ...] = ()
    application_name: str | None = None
    application_version: str | None = None
    application: ApplicationKind | None = None
    executable: str | None = None
    arguments: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict, hash=False)
    input: str | None = None
    output: str | None = None
    error: str | None = None
    working_directory: str | None = None
    filesystem_names: Mapping[str, str] = field(default_factory=dict, hash=False)
    wall_time_limit: int | None = None
    cpu_time_limit: int | None = None
    number_of_processes: int | None = None
    processes_from_allocation: bool = False
    processes_per_host: int | None = None
    threads_per_process: int | None = None
    threads_from_allocation: bool = False
    spmd_variation: str | None = None
    candidate_hosts: tuple[str, ...] = ()
    total_cpu_count: RangeValue | None = None
    individual_cpu_count: RangeValue | None = None
    total_cpu_time: RangeValue | None = None
    individual_cpu_time: RangeValue | None = None
    exclusive_execution: bool | None = None
    operating_system: str | None = None
    operating_system_version: str | None = None
    cpu_architecture: str | None = None
    individual_cpu_speed: RangeValue | None = None
    individual_network_bandwidth: RangeValue | None = None
    individual_physical_memory: RangeValue | None = None
    total_physical_memory: RangeValue | None = None
    individual_disk_space: RangeValue | None = None
    total_disk_space: RangeValue | None = None
    total_resource_count: RangeValue | None = None
    file_systems: tuple[FileSystem, ...] = ()
    staging: tuple[StagingEntry, ...] = ()
    job_class: JobClass | None = None
    min_cores: int | None = None
    max_cores: int | None = None
    malleability: Malleability | None = None

    def __post_init__(self) -> None:
        set_ = self._set
        for key in _TOKEN_FIELDS:
            set_(key, _token(key, getattr(self, key)))
        if self.description is not None:
            if not isinstance(self.description, str):
                raise JsdlError("", "description", "a string", self.description)
            _check_text("description", self.description)
            set_("description", self.description if self.description.strip() else None)
        for key in ("annotations", "projects", "candidate_hosts"):
            values = tuple(_token(f"{key}[{i}]", v) for i, v in enumerate(getattr(self, key)))
            set_(key, tuple(v for v in values if v is not None))
        arguments = tuple(self.arguments)
        for i, arg in enumerate(arguments):
            if not isinstance(arg, str):
                raise JsdlError("", f"arguments[{i}]", "a string", arg)
            _check_text(f"arguments[{i}]", arg)
        set_("arguments", arguments)
        environment = dict(self.environment)
        for key, value in environment.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise JsdlError("", "environment", "variable names without '=' or spaces", key)
            if not isinstance(value, str):
                raise JsdlError("", f"environment.{key}", "a string", value)
            _check_text(f"environment.{key}", value)
            _check_text("environment", key)
        set_("environment", MappingProxyType(environment))
        if self.input == "/dev/null":  # GridWay writes it; no Input means the same
            set_("input", None)
        for key in _PATH_FIELDS:
            value = getattr(self, key)
            if value is not None:
                set_(key, _job_path(key, value, directory=key == "working_directory"))
        for key in _COUNT_FIELDS:
            _bounded_int(key, getattr(self, key), 1, MAX_CORES, "an integer")
        _bounded_int("wall_time_limit", self.wall_time_limit, 0, MAX_SECONDS, "whole seconds")
        _bounded_int("cpu_time_limit", self.cpu_time_limit, 0, MAX_CPU_SECONDS, "whole seconds")
        for key in ("processes_from_allocation", "threads_from_allocation"):
            if not isinstance(getattr(self, key), bool):
                raise JsdlError("", key, "true or false", getattr(self, key))
        for key in ("total_cpu_count", "individual_cpu_count"):
            self._check_count_range(key)
        for key in ("total_cpu_time", "individual_cpu_time"):
            value = getattr(self, key)
            if value is None:
                continue
            if not isinstance(value, RangeValue):
                raise JsdlError("", key, "a RangeValue", value)
            if any(b is not None and b > MAX_CPU_SECONDS for b in (value.lower, value.upper)):
                raise JsdlError("", key, f"seconds from 0 to {MAX_CPU_SECONDS}", str(value))
        self._check_resources()
        staging = tuple(self.staging)
        for i, entry in enumerate(staging):
            if not isinstance(entry, StagingEntry):
                raise JsdlError("", f"staging[{i}]", "a StagingEntry", entry)
        set_("staging", staging)
        self._check_filesystem_names()
        if self.job_class is not None:
            try:
                set_("job_class", JobClass(self.job_class))
            except ValueError:
                raise JsdlError(
                    "", "job_class", "rigid, moldable or malleable", self.job_class
                ) from None
        self._settle_application()
        if self.staging_only and (
            self.application is not None or not self.staging or self.application_version
        ):
            raise JsdlError(
                "", "executable", "an executable or an application name (or only staging)"
            )
        _, _, job_class = self.core_request()  # the core bounds must agree with each other
        if self.malleability is not None:
            if not isinstance(self.malleability, Malleability):
                raise JsdlError("", "malleability", "a Malleability", self.malleability)
            if job_class is not JobClass.MALLEABLE:
                raise JsdlError(
                    "", "malleability", "a malleable job (job_class malleable) to declare it"
                )

    def _check_resources(self) -> None:
        if self.exclusive_execution is not None and not isinstance(self.exclusive_execution, bool):
            raise JsdlError("", "exclusive_execution", "true or false", self.exclusive_execution)
        for key, high, unit in _AMOUNT_FIELDS:
            _check_amount(key, getattr(self, key), high, unit)
        self._check_count_range("total_resource_count")
        systems = tuple(self.file_systems)
        names: set[str] = set()
        for i, fs in enumerate(systems):
            if not isinstance(fs, FileSystem):
                raise JsdlError("", f"file_systems[{i}]", "a FileSystem", fs)
            if fs.name in names:
                raise JsdlError("", f"file_systems[{i}].name", "each file system once", fs.name)
            names.add(fs.name)
        self._set("file_systems", systems)

    def _check_filesystem_names(self) -> None:
        """Each key names a path field the job has; the paths stay inside their file system."""
        refs = dict(self.filesystem_names)
        for key, name in refs.items():
            where = f"filesystem_names.{key}"
            refs[key] = cast(str, _fs_name(where, name))
            if key in ("executable", *_PATH_FIELDS):
                value = getattr(self, key)
            elif (m := re.fullmatch(r"arguments\[(\d{1,6})\]", str(key))) is not None:
                index = int(m[1])
                value = self.arguments[index] if index < len(self.arguments) else None
            elif isinstance(key, str) and key.startswith("environment."):
                value = self.environment.get(key.removeprefix("environment."))
            else:
                raise JsdlError(
                    "",
                    where,
                    "a path field: executable, input, output, error, working_directory, "
                    "arguments[i] or environment.NAME",
                    key,
                )
            if value is None:
                raise JsdlError("", where, f"a reference to a field the job has ({key})", None)
            _job_path(where, value, directory=key == "working_directory")
        self._set("filesystem_names", MappingProxyType(refs))

    @property
    def staging_only(self) -> bool:
        """Whether the job runs no program: it stages files in, then out."""
        return self.executable is None and self.application_name is None

    def requirements(self) -> Requirements | None:
        """What the job needs of a site beyond cores (lower bounds of its ranges); None when
        it needs nothing more. File systems named by ``filesystemName`` references or staging
        entries but not declared in ``file_systems`` are needed by name."""

        asked = (
            self.operating_system,
            self.operating_system_version,
            self.cpu_architecture,
            self.exclusive_execution,
            self.individual_cpu_count,
            self.total_resource_count,
            *(getattr(self, key) for key, _, _ in _AMOUNT_FIELDS),
        )
        elsewhere = self.file_systems or self.filesystem_names
        if not any(asked) and not elsewhere and not any(e.filesystem for e in self.staging):
            return None  # the usual job: cores only (no object built per submission)

        def low(value: RangeValue | None) -> int | None:
            return None if value is None or value.lower is None else int(value.lower)

        def rate(value: RangeValue | None) -> float | None:
            return None if value is None or value.lower is None else float(value.lower)

        needs = [
            FileSystemNeed(fs.name, fs.type, fs.mount_point, low(fs.disk_space))
            for fs in self.file_systems
        ]
        declared = {fs.name for fs in self.file_systems}
        referenced = [*self.filesystem_names.values(), *(e.filesystem for e in self.staging)]
        for name in referenced:
            if name is not None and name not in declared:
                declared.add(name)
                needs.append(FileSystemNeed(name))
        requirements = Requirements(
            operating_system=self.operating_system,
            operating_system_version=self.operating_system_version,
            cpu_architecture=self.cpu_architecture,
            exclusive_execution=bool(self.exclusive_execution),
            cpu_speed=rate(self.individual_cpu_speed),
            network_bandwidth=rate(self.individual_network_bandwidth),
            cores_per_node=low(self.individual_cpu_count),
            nodes=low(self.total_resource_count),
            individual_memory=low(self.individual_physical_memory),
            total_memory=low(self.total_physical_memory),
            individual_disk=low(self.individual_disk_space),
            total_disk=low(self.total_disk_space),
            file_systems=tuple(needs),
        )
        return None if requirements.empty else requirements

    def _set(self, key: str, value: object) -> None:
        object.__setattr__(self, key, value)

    def _check_count_range(self, key: str) -> None:
        value = getattr(self, key)
        if value is None:
            return
        if not isinstance(value, RangeValue):
            raise JsdlError("", key, "a RangeValue", value)
        for bound in (value.lower, value.upper):
            if bound is not None and (not float(bound).is_integer() or not 1 <= bound <= MAX_CORES):
                raise JsdlError(
                    "", key, f"CPU counts that are whole numbers from 1 to {MAX_CORES}", str(value)
                )

    def _settle_application(self) -> None:
        spmd = any(_given(getattr(self, key)) for key in _SPMD_FIELDS)
        used = spmd or any(_given(getattr(self, key)) for key in _APPLICATION_FIELDS)
        kind = self.application
        if kind is None:
            if used:
                self._set("application", ApplicationKind.SPMD if spmd else ApplicationKind.POSIX)
            return
        try:
            kind = ApplicationKind(kind)
        except ValueError:
            raise JsdlError("", "application", "posix, hpcpa or spmd", kind) from None
        self._set("application", kind)
        if spmd and kind is not ApplicationKind.SPMD:
            raise JsdlError(
                "", "application", "spmd for a job with SPMD fields (processes, variation)", kind
            )

    @property
    def environ(self) -> dict[str, str]:
        """The environment as a plain dict (a copy)."""
        return dict(self.environment)

    @property
    def stage_in(self) -> tuple[StagingEntry, ...]:
        """The entries staged to the job before it starts."""
        return tuple(e for e in self.staging if e.stages_in)

    @property
    def stage_out(self) -> tuple[StagingEntry, ...]:
        """The entries sent away after the job ends."""
        return tuple(e for e in self.staging if e.stages_out)

    def rank_field(self, xml: bool) -> str:
        """Where the job's r comes from, as an error names it: the element of a JSDL document
        or the field of a mapping (MinCores, NumberOfProcesses, else TotalCPUCount)."""
        key = "total_cpu_count"
        if self.min_cores is not None:
            key = "min_cores"
        elif self.number_of_processes is not None:
            key = "number_of_processes"
        return _XML_PATHS[key] if xml else key

    def core_request(self) -> tuple[int, int, JobClass]:
        """(r, max rank, class): the cores the job asks for (rules in the module docstring)."""
        total = self.total_cpu_count
        lower: tuple[int, str] | None = None
        for value, key in (
            (self.min_cores, "min_cores"),
            (self.number_of_processes, "number_of_processes"),
            (total.lower if total is not None else None, "total_cpu_count"),
        ):
            if value is not None:
                lower = (int(value), key)
                break
        rank, rank_key = lower if lower is not None else (1, "")
        upper: tuple[int, str] | None = None
        if self.max_cores is not None:
            upper = (self.max_cores, "max_cores")
        elif total is not None and total.kind in (RangeKind.RANGE, RangeKind.UPPER_BOUNDED):
            assert total.upper is not None
            upper = (int(total.upper), "total_cpu_count")
        max_rank, max_key = upper if upper is not None else (rank, "")
        if max_rank < rank:
            source = f" ({rank_key})" if rank_key else ""
            raise JsdlError("", max_key, f"at least {rank} cores{source}", max_rank)
        job_class = self.job_class
        if job_class is None:
            job_class = JobClass.MOLDABLE if max_rank > rank else JobClass.RIGID
        elif job_class is JobClass.RIGID and max_rank > rank:
            raise JsdlError(
                "",
                "job_class",
                f"moldable or malleable for a job of {rank}..{max_rank} cores",
                str(job_class),
            )
        return rank, max_rank, job_class

    def estimated_run_time(self, rank: int) -> float | None:
        """Seconds on ``rank`` cores: WallTimeLimit, else TotalCPUTime / r, else
        IndividualCPUTime (their upper bounds); None when the description gives no time."""
        if self.wall_time_limit is not None:
            return float(self.wall_time_limit)
        if self.total_cpu_time is not None and self.total_cpu_time.upper is not None:
            return self.total_cpu_time.upper / rank
        if self.individual_cpu_time is not None and self.individual_cpu_time.upper is not None:
            return float(self.individual_cpu_time.upper)
        return None

    def to_job(self, job_id: str, default_site: str) -> Job:
        """The job as the schedulers see it.

        Input files are the staged-in entries, each of its ``size`` (inline data: its length in
        UTF-8; unknown: 0) at its ``site`` (unknown: ``default_site``, the submitting broker).
        """
        rank, max_rank, job_class = self.core_request()
        files = []
        for entry in self.stage_in:
            size = entry.size
            if size is None:
                size = len(entry.inline_data.encode()) if entry.inline_data is not None else 0
            files.append(InputFile(entry.file_name, size, entry.site or default_site))
        return Job(
            id=job_id,
            rank=rank,
            requested_time=self.estimated_run_time(rank),
            job_class=job_class,
            max_rank=max_rank,
            input_files=tuple(files),
            malleability=self.malleability,
            requirements=self.requirements(),
        )


# --------------------------------------------------------------------------------------------
# Reading XML


def _split(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return "", tag


def _clark(ns: str, local: str) -> str:
    return f"{{{ns}}}{local}" if ns else local


_ROOT = "JobDefinition"
_DESC = "JobDefinition/JobDescription"
_APP = f"{_DESC}/Application"
_RES = f"{_DESC}/Resources"
_SCHED = f"{_DESC}/Scheduling"
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
# Where a field of JobDescription lives in a document, for errors found after reading.
_XML_PATHS = {
    "number_of_processes": f"{_APP}/SPMDApplication/NumberOfProcesses",
    "total_cpu_count": f"{_RES}/TotalCPUCount",
    "individual_cpu_count": f"{_RES}/IndividualCPUCount",
    "job_class": f"{_SCHED}/JobClass",
    "min_cores": f"{_SCHED}/MinCores",
    "max_cores": f"{_SCHED}/MaxCores",
    "executable": _APP,
    "total_resource_count": f"{_RES}/TotalResourceCount",
}


class _Reader:
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
            self.fail(f"{path}/{_split(el[0].tag)[1]}", "text only, no child elements")
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

    def singleton(self, seen: set[str], local: str, path: str) -> None:
        if local in seen:
            self.fail(path, f"at most one {local}", "another one")
        seen.add(local)

    # -- structure ------------------------------------------------------------------------

    def job_definition(self, root: ET.Element) -> JobDescription:
        ns, local = _split(root.tag)
        if (ns, local) != (JSDL_NS, _ROOT):
            hint = " (a JSDL fragment, not a job definition)" if ns == JSDL_NS else ""
            self.fail(
                local,
                f"the root element JobDefinition in namespace {JSDL_NS}{hint}",
                _clark(ns, local),
            )
        descriptions = [c for c in root if _split(c.tag) == (JSDL_NS, "JobDescription")]
        if not descriptions:
            self.fail(_ROOT, "a JobDescription element")
        if len(descriptions) > 1:
            self.fail(_ROOT, "exactly one JobDescription", len(descriptions))
        return self.job_description(descriptions[0])

    def job_description(self, el: ET.Element) -> JobDescription:
        fields_: dict[str, Any] = {}
        staging: list[StagingEntry] = []
        seen: set[str] = set()
        for child in el:
            ns, local = _split(child.tag)
            if ns == JSDL_NS:
                if local == "DataStaging":
                    staging.append(self.data_staging(child, f"{_DESC}/DataStaging", len(staging)))
                    continue
                if local in ("JobIdentification", "Application", "Resources"):
                    self.singleton(seen, local, f"{_DESC}/{local}")
                    getattr(self, local.lower())(child, fields_)
            elif ns == GBROKER_NS:
                if local != "Scheduling":
                    self.fail(f"{_DESC}/{local}", "a GBroker element Scheduling here", local)
                self.singleton(seen, local, _SCHED)
                self.scheduling(child, fields_)
        fields_["staging"] = tuple(staging)
        program = fields_.get("executable") or fields_.get("application_name")
        # GFD.56 makes Application optional: a job of DataStaging only stages in, then out.
        if program is None and ("Application" in seen or not staging):
            if "Application" in seen:
                where, found = _APP, "an Application with neither"
            else:
                where, found = _DESC, "nothing to run" if len(el) else "an empty JobDescription"
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
                self.paths.get(exc.path) or _XML_PATHS.get(exc.path, f"{_DESC} ({exc.path})"),
                exc.expected,
                exc.found,
            ) from exc

    def jobidentification(self, el: ET.Element, out: dict[str, Any]) -> None:
        path = f"{_DESC}/JobIdentification"
        annotations: list[str] = []
        projects: list[str] = []
        seen: set[str] = set()
        for child in el:
            ns, local = _split(child.tag)
            if ns != JSDL_NS:
                continue
            here = f"{path}/{local}"
            if local == "JobName":
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
        out["annotations"] = tuple(annotations)
        out["projects"] = tuple(projects)

    def application(self, el: ET.Element, out: dict[str, Any]) -> None:
        seen: set[str] = set()
        program: ET.Element | None = None
        for child in el:
            ns, local = _split(child.tag)
            here = f"{_APP}/{local}"
            if ns == JSDL_NS and local in ("ApplicationName", "ApplicationVersion"):
                self.singleton(seen, local, here)
                key = "application_name" if local == "ApplicationName" else "application_version"
                out[key] = self.token(child, here)
            elif local in _APP_ELEMENTS:
                kind, namespaces = _APP_ELEMENTS[local]
                if ns not in namespaces:
                    self.fail(here, f"{local} in namespace {namespaces[0]}", _clark(ns, local))
                if program is not None:
                    self.fail(
                        here,
                        "at most one of POSIXApplication, HPCProfileApplication or SPMDApplication",
                        f"{_split(program.tag)[1]} and {local}",
                    )
                program = child
                out["application"] = kind
                self.program(child, kind, ns, here, out)
            elif ns == GBROKER_NS:
                self.fail(here, "no GBroker element inside Application", local)
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
        accepted = {own_ns, POSIX_NS}
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
            ns, local = _split(child.tag)
            if ns not in accepted:
                continue
            here = f"{path}/{local}"
            if local == "Argument":
                here = f"{path}/Argument[{len(arguments) + 1}]"
                filesystem(child, f"arguments[{len(arguments)}]", here)
                arguments.append(self.text(child, here))
            elif local == "Environment":
                here = f"{path}/Environment[{len(environment) + 1}]"
                name = (child.get("name") or "").strip()
                if not name:
                    self.fail(here, 'a name="..." attribute')
                if not _ENV_NAME.fullmatch(name):
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
            ns, local = _split(child.tag)
            here = f"{_RES}/{local}"
            if ns == GBROKER_NS:
                self.fail(here, "no GBroker element inside Resources", local)
            if ns != JSDL_NS:
                continue
            if local in ("CandidateHosts", "CandidateHost"):  # GridWay writes CandidateHost
                for i, host in enumerate(child):
                    if _split(host.tag) == (JSDL_NS, "HostName"):
                        name = self.token(host, f"{here}/HostName[{i + 1}]")
                        if name is not None:
                            hosts.append(name)
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
                if out["cpu_architecture"] is None:
                    self.fail(f"{here}/CPUArchitectureName", "an architecture such as x86_64")
            elif local in ("IndividualVirtualMemory", "TotalVirtualMemory"):
                self.fail(
                    here,
                    "no virtual memory requirement (GBroker's sites declare physical memory "
                    "only: ask for IndividualPhysicalMemory or TotalPhysicalMemory)",
                    local,
                )
        names = [fs.name for fs in systems]
        for i, name in enumerate(names):
            if name in names[:i]:
                self.fail(f"{_RES}/FileSystem[{i + 1}]/@name", "each file system once", name)
        out["candidate_hosts"] = tuple(hosts)
        out["file_systems"] = tuple(systems)

    def only_child(self, el: ET.Element, path: str, local: str) -> ET.Element:
        """The one JSDL child ``local`` of ``el`` (others' extensions aside)."""
        found = [c for c in el if _split(c.tag) == (JSDL_NS, local)]
        if len(found) != 1:
            self.fail(f"{path}/{local}", f"exactly one {local}", len(found))
        return found[0]

    def operating_system(self, el: ET.Element, path: str, out: dict[str, Any]) -> None:
        for child in el:
            ns, local = _split(child.tag)
            here = f"{path}/{local}"
            if ns != JSDL_NS:
                continue
            if local == "OperatingSystemType":
                name_el = self.only_child(child, here, "OperatingSystemName")
                out["operating_system"] = self.token(name_el, f"{here}/OperatingSystemName")
                if out["operating_system"] is None:
                    self.fail(f"{here}/OperatingSystemName", "an operating system such as LINUX")
            elif local == "OperatingSystemVersion":
                out["operating_system_version"] = self.token(child, here)

    def file_system(self, el: ET.Element, path: str) -> FileSystem:
        values: dict[str, Any] = {"name": el.get("name")}
        if values["name"] is None:
            self.fail(f"{path}/@name", 'a name="..." attribute (HOME, SCRATCH, ...)')
        seen: set[str] = set()
        keys = {"FileSystemType": "type", "Description": "description", "MountPoint": "mount_point"}
        for child in el:
            ns, local = _split(child.tag)
            here = f"{path}/{local}"
            if ns != JSDL_NS:
                continue
            if local in keys:
                self.singleton(seen, local, here)
                values[keys[local]] = self.token(child, here)
            elif local == "DiskSpace":
                self.singleton(seen, local, here)
                values["disk_space"] = self.range_value(child, here, False)
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
            ns, local = _split(part.tag)
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
                ", ".join(_split(p.tag)[1] for p in parts),
            )
        part = parts[0]
        local = _split(part.tag)[1]
        here = f"{path}/{local}"
        if local == "Exact":
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
            ns, name = _split(child.tag)
            if ns == JSDL_NS and name in ("LowerBound", "UpperBound"):
                self.singleton(set(bounds), name, f"{here}/{name}")
                bounds[name] = child
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
                self.fail(path, "a value >= 0", _fmt_number(value))
            return value
        if side == "lower":
            whole = math.floor(value) + 1 if exclusive else math.ceil(value)
        else:
            whole = math.ceil(value) - 1 if exclusive else math.floor(value)
        return self.count(el, path, float(whole), value)

    def count(self, el: ET.Element, path: str, value: float, written: float | None) -> int:
        shown = _fmt_number(written if written is not None else value)
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
            ns, local = _split(child.tag)
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
                        self.fail(here, "overwrite, append or dontOverwrite", flag)
                elif local == "DeleteOnTermination":
                    self.singleton(seen, local, here)
                    values["delete_on_termination"] = self.boolean(self.text(child, here), here)
                elif local in ("Source", "Target"):
                    self.singleton(seen, local, here)
                    values[local.lower()] = self.uri(child, here)
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
            ns, local = _split(child.tag)
            if local == "URI" and ns in (JSDL_NS, ""):  # UNICORE tests leave URI unqualified
                if uri is not None:
                    self.fail(f"{path}/URI", "at most one URI", "another one")
                uri = self.token(child, f"{path}/URI") or ""
        return uri or None

    def scheduling(self, el: ET.Element, out: dict[str, Any]) -> None:
        seen: set[str] = set()
        for child in el:
            ns, local = _split(child.tag)
            here = f"{_SCHED}/{local}"
            if ns != GBROKER_NS or local not in (
                "JobClass",
                "MinCores",
                "MaxCores",
                "Malleability",
            ):
                self.fail(
                    here, "a GBroker element JobClass, MinCores, MaxCores or Malleability", local
                )
            self.singleton(seen, local, here)
            if local == "Malleability":
                out["malleability"] = self.malleability(child, here)
            elif local == "JobClass":
                text = self.token(child, here) or ""
                try:
                    out["job_class"] = JobClass(text)
                except ValueError:
                    self.fail(here, "rigid, moldable or malleable", text)
            else:
                key = "min_cores" if local == "MinCores" else "max_cores"
                out[key] = self.integer(child, here, 1)

    def malleability(self, el: ET.Element, path: str) -> Malleability:
        """``<gbroker:Malleability sizes="power2" obligation="mandatory" deadline="5"/>``."""
        if len(el) or (el.text or "").strip():
            self.fail(path, "attributes only (sizes, initiative, obligation, deadline, ...)")
        out: dict[str, Any] = {}
        for key, text in el.attrib.items():
            name = _MALLEABILITY_ATTRIBUTES.get(key.lower())
            where = f"{path}/@{key}"
            if name is None:
                expected = ", ".join(_MALLEABILITY_ATTRIBUTES.values())
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
        return _malleability(out, self.fail, path)


_MALLEABILITY_ATTRIBUTES = {
    "sizes": "sizes",
    "initiative": "initiative",
    "obligation": "obligation",
    "deadline": "deadline",
    "reconfigurationcost": "reconfiguration_cost",
    "evolving": "evolving",
    "initial": "initial",
}
"""``<gbroker:Malleability>``'s attributes (matched without case) and the fields they set."""


def _check_size(data: bytes, document: str, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise JsdlError(
            document,
            "document",
            f"at most {max_bytes} bytes (the job description size limit)",
            len(data),
        )


def _parse_xml(data: str | bytes, document: str) -> ET.Element:
    try:
        root = SafeET.fromstring(data, forbid_dtd=True)
    except ET.ParseError as exc:
        line, column = exc.position
        reason = expat.ErrorString(exc.code) if isinstance(exc.code, int) else str(exc)
        if reason == "unbound prefix":
            text = data if isinstance(data, str) else data.decode("utf-8", "replace")
            source = text.splitlines()
            if 0 < line <= len(source):
                m = re.match(r"</?([\w.-]+):", source[line - 1][column:])
                if m:
                    reason = f"unbound prefix {m.group(1)} (no xmlns:{m.group(1)} in scope)"
        raise JsdlError(
            document, f"line {line}, column {column + 1}", "well-formed XML", reason
        ) from None
    except defusedxml.DefusedXmlException as exc:
        raise JsdlError(
            document,
            "document",
            "XML without a DTD, entity declarations or external references",
            type(exc).__name__,
        ) from None
    return cast(ET.Element, root)


def parse_jsdl(
    data: str | bytes, *, document: str = "<jsdl>", max_bytes: int = MAX_DOCUMENT_BYTES
) -> JobDescription:
    """Read a JSDL 1.0 document; :class:`JsdlError` says what is wrong and where."""
    raw = data.encode() if isinstance(data, str) else data
    _check_size(raw, document, max_bytes)
    if not raw.strip():
        raise JsdlError(document, "document", "a JSDL document", "an empty file")
    # Text goes in as text: its characters are already decoded, whatever the XML declaration says.
    return _Reader(document).job_definition(_parse_xml(data, document))


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
    lo, hi = _fmt_number(value.lower), _fmt_number(value.upper)
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
            names = {field_: key for key, field_ in _MALLEABILITY_ATTRIBUTES.items()}
            for name, value in _malleability_to_mapping(desc.malleability).items():
                attribute = "reconfigurationCost" if name == "reconfiguration_cost" else names[name]
                text = str(value).lower() if isinstance(value, bool) else str(value)
                declared.set(attribute, text)
    ET.indent(root, space="  ")
    body = ET.tostring(root, encoding="unicode")
    # ElementTree escapes CR in attributes but not in text, where a parser would turn it into LF.
    body = body.replace("\r", "&#13;")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


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
    *(key for key, _, _ in _AMOUNT_FIELDS),
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
            out[f.name] = _malleability_to_mapping(value)
        elif f.name == "file_systems":
            out[f.name] = [_file_system_to_mapping(fs) for fs in value]
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        elif isinstance(value, StrEnum):
            out[f.name] = str(value)
        else:
            out[f.name] = value
    return out


_MALLEABILITY_FIELDS = (
    "sizes",
    "initiative",
    "obligation",
    "deadline",
    "reconfiguration_cost",
    "evolving",
    "initial",
)
"""The keys of a malleability declaration, in JSON/YAML (XML: attributes, in camel case)."""
_DEFAULT_MALLEABILITY = Malleability()


def _malleability(
    values: dict[str, Any], fail: Callable[[str, str, object], NoReturn], path: str
) -> Malleability:
    """A :class:`Malleability` from checked values; its own errors name ``path.field``."""
    try:
        if "sizes" in values:
            values["sizes"] = SizeRule.parse(values["sizes"])
        return Malleability(**values)
    except InvalidInput as exc:
        field_ = exc.field.removeprefix("malleability.")
        fail(f"{path}.{field_}", exc.expected, exc.found)


def _malleability_to_mapping(declared: Malleability) -> dict[str, Any]:
    """The declaration's values that differ from the defaults, as JSON/YAML data."""
    out: dict[str, Any] = {}
    for name in _MALLEABILITY_FIELDS:
        value = getattr(declared, name)
        if value == getattr(_DEFAULT_MALLEABILITY, name):
            continue
        out[name] = str(value) if isinstance(value, StrEnum | SizeRule) else value
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
                self.fail(where, f"a known field ({', '.join(allowed)})", key)
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
        if not _is_int(value):
            self.fail(path, "an integer", value)
        assert isinstance(value, int)
        if value < minimum:
            self.fail(path, f"an integer >= {minimum}", value)
        return value

    def number(self, value: object, path: str) -> float:
        if not _is_number(value) or not math.isfinite(cast(float, value)):
            self.fail(path, "a number", value)
        return cast(float, value)

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def range_value(self, value: object, path: str, counts: bool) -> RangeValue:
        def bound(x: object, where: str) -> float:
            return self.integer(x, where, 1) if counts else self.number(x, where)

        if _is_number(value):
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
        data = self.mapping(value, path, _MALLEABILITY_FIELDS)
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
        return _malleability(out, self.fail, path)

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
            elif key in _COUNT_FIELDS:
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


def _parse_json(text: str, document: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsdlError(
            document, f"line {exc.lineno}, column {exc.colno}", "well-formed JSON", exc.msg
        ) from None
    except RecursionError:
        raise JsdlError(document, "document", "JSON nested less deeply", "too deep") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise JsdlError(document, "document", "numbers of at most 4300 digits", str(exc)) from None


def _parse_yaml(text: str, document: str) -> object:
    import yaml

    from gbroker import safeyaml

    try:
        return safeyaml.load(text)
    except safeyaml.AliasRefused as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        raise JsdlError(
            document, where, "YAML without anchors or aliases", Shown(exc.problem or "")
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        raise JsdlError(document, where, "well-formed YAML", exc.problem or str(exc)) from None
    except yaml.YAMLError as exc:
        raise JsdlError(document, "document", "well-formed YAML", str(exc)) from None
    except RecursionError:
        raise JsdlError(document, "document", "YAML nested less deeply", "too deep") from None


#: The JSDL element (under JobDefinition/JobDescription/) and the JSON/YAML field that express
#: each requirement (:class:`gbroker.core.requirements.Need`), for errors that name them.
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
}


def requirement_field(need: str, xml: bool) -> str:
    """How an error names the requirement ``need``: its element path for a JSDL document, its
    field for JSON/YAML."""
    element, key = REQUIREMENT_FIELDS[need]
    return f"{_DESC}/{element}" if xml else key


def document_format(data: bytes) -> str:
    """Which form a submission is written in: "jsdl", "json" or "yaml" (from its content)."""
    return _sniff(data)


def _sniff(raw: bytes) -> str:
    head = raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
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
    _check_size(raw, document, max_bytes)
    fmt = fmt or _sniff(raw)
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
    parsed = _parse_json(text, document) if fmt == "json" else _parse_yaml(text, document)
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
        lines.append(f"time limit  {_fmt_number(run_time)} s (estimated from CPU time)")
    else:
        lines.append("time limit  none")
    if desc.candidate_hosts:
        lines.append(f"hosts       {', '.join(desc.candidate_hosts)}")
    lines.extend(f"needs       {need}" for need in _needs(desc))
    for key, fs_name in desc.filesystem_names.items():
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
        out.append(f"CPU speed >= {_fmt_number(desc.individual_cpu_speed.lower)} Hz")
    bandwidth = desc.individual_network_bandwidth
    if bandwidth is not None and bandwidth.lower is not None:
        out.append(f"network bandwidth >= {_fmt_number(bandwidth.lower)} bit/s")
    if desc.individual_cpu_count is not None and desc.individual_cpu_count.lower is not None:
        out.append(f"cores per node >= {_fmt_number(desc.individual_cpu_count.lower)}")
    if desc.total_resource_count is not None and desc.total_resource_count.lower is not None:
        out.append(f"nodes >= {_fmt_number(desc.total_resource_count.lower)}")
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
