"""A job description: what to run and what it asks for, checked, and the core's Job it makes.

Reading JSDL is :mod:`.jsdl_read`, writing it :mod:`.jsdl_write`, JSON/YAML :mod:`.mapping`, any
document by its format :mod:`.documents`; what they share is :mod:`.parsing` (untrusted text into
a tree), :mod:`.jsdl_paths`, :mod:`.malleability` and :mod:`.values`.

Theory of operation
-------------------
A user hands any broker a job as a JSDL 1.0 document (OGF GFD.56) with the POSIX (GFD.56), HPC
Profile Application (GFD.111) and SPMD (GFD.115) extensions, or as the equivalent JSON/YAML
mapping. Either becomes a :class:`JobDescription`: *what* to run (program, arguments,
environment, standard streams, staging) and *what it asks for* (CPU counts, processes, limits,
hosts). :meth:`JobDescription.to_job` derives from it the schedulers' :class:`Job`: rank r, max
rank, job class, requested time, and the input files l with sizes z_l and sites h_l.

Reading is liberal, reporting precise. The bytes are untrusted: parsed without DTDs or entities
(defusedxml) or YAML aliases, every number bounded (the ``MAX_*`` constants) and every path the
job reads or writes confined to its job directory when the description is built, so nothing
downstream checks them again. Elements are matched by namespace and local name in any order;
known deviations of real writers are taken; an element is honoured or refused, never read and
dropped. Every problem is a :class:`JsdlError` naming the document, the element path and what
was expected. What JSDL cannot say (job class, core bounds, malleability, a staged file's site
and size) is GBroker's extension, namespace ``urn:gbroker:jsdl:1``. :func:`to_jsdl` writes in
schema order, so ``parse_jsdl(to_jsdl(d)) == d`` and the output validates against the official
XSDs; :func:`to_mapping` and :func:`from_mapping` do the same for JSON/YAML.

What is taken, tolerated and refused, the extension's elements and how r, max and the requested
time are derived: docs/JSDL.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import cast

from gbroker.core.apples import PerformanceModel
from gbroker.core.malleable import Malleability
from gbroker.core.model import Gang, InputFile, Job, JobClass
from gbroker.core.requirements import FileSystemNeed, Requirements
from gbroker.errors import InvalidInput
from gbroker.jobs.jsdl_paths import XML_PATHS
from gbroker.jobs.values import ENV_NAME, format_number, is_number

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


class SpmdLauncher(StrEnum):
    """How a site starts an SPMD job's processes (:data:`SPMD_VARIATIONS`)."""

    MPI = "mpi"  # the site's default MPI (gbroker.site.spmd: Open MPI, else MPICH)
    OPEN_MPI = "openmpi"  # Open MPI's mpiexec
    MPICH = "mpich"  # MPICH's hydra mpiexec
    THREADS = "threads"  # one process of OMP_NUM_THREADS threads: the program's own business


#: GFD.115's SPMDVariation URIs: this prefix, then the flavour's name.
SPMD_VARIATION_PREFIX = "http://www.ogf.org/jsdl/2007/02/jsdl-spmd/"
#: The SPMDVariation names a site runs, and how. GFD.115 names MPI, GridMPI, IntelMPI, LAM-MPI,
#: MPICH1, MPICH2, MPICH-GM, MPICH-MX, MVAPICH, MVAPICH2, OpenMP, POE, PVM and None; UNICORE
#: writes OpenMPI. The ones left out need a launcher GBroker's sites do not have (LAM, GM, MX,
#: POE, PVM, an MPICH1 ch_p4) and are refused at submission, never run once in silence.
SPMD_VARIATIONS: Mapping[str, SpmdLauncher] = MappingProxyType(
    {
        "MPI": SpmdLauncher.MPI,
        "OpenMPI": SpmdLauncher.OPEN_MPI,
        "MPICH2": SpmdLauncher.MPICH,
        "MPICH": SpmdLauncher.MPICH,
        "OpenMP": SpmdLauncher.THREADS,
        "None": SpmdLauncher.THREADS,
    }
)
# The namespace's spelling of the prefix, which writers use too.
_SPMD_VARIATION_PREFIXES = (SPMD_VARIATION_PREFIX, f"{SPMD_NS}/")
_SPMD_VARIATION_EXPECTED = (
    f"an SPMD variation this broker runs: {SPMD_VARIATION_PREFIX} (or nothing) followed by "
    + ", ".join(SPMD_VARIATIONS)
)


def _spmd_variation(value: str | None) -> str | None:
    """The variation as its canonical URI (a bare name, or the namespace's prefix, will do);
    a JsdlError naming ``spmd_variation`` for one no site runs."""
    if value is None:
        return None
    name = value
    for prefix in _SPMD_VARIATION_PREFIXES:
        if value.startswith(prefix):
            name = value.removeprefix(prefix)
            break
    name = name.rstrip("/")
    for known in SPMD_VARIATIONS:
        if name.lower() == known.lower():
            return SPMD_VARIATION_PREFIX + known
    raise JsdlError(
        "",
        "spmd_variation",
        _SPMD_VARIATION_EXPECTED + did_you_mean(name, list(SPMD_VARIATIONS)),
        value,
    )


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
# A file system's name (JSDL: an NCName); it becomes a path component at the site.
_FS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_FS_EXPECTED = "a file system name: a letter or '_', then letters, digits, '_', '-' or '.'"
_PATH_FIELDS = ("input", "output", "error", "working_directory")
_PATH_EXPECTED = (
    "a relative path inside the job directory: no leading '/', no '..', at most "
    f"{MAX_PATH_BYTES} bytes ({MAX_NAME_BYTES} per component)"
)


#: JSDL's OperatingSystemTypeEnumeration (GFD.56 §6.2.4.1.1, from CIM): the names an
#: OperatingSystemName may hold, spelt exactly so.
OPERATING_SYSTEMS = (
    "Unknown", "MACOS", "ATTUNIX", "DGUX", "DECNT", "Tru64_UNIX", "OpenVMS", "HPUX", "AIX",
    "MVS", "OS400", "OS_2", "JavaVM", "MSDOS", "WIN3x", "WIN95", "WIN98", "WINNT", "WINCE",
    "NCR3000", "NetWare", "OSF", "DC_OS", "Reliant_UNIX", "SCO_UnixWare", "SCO_OpenServer",
    "Sequent", "IRIX", "Solaris", "SunOS", "U6000", "ASERIES", "TandemNSK", "TandemNT",
    "BS2000", "LINUX", "Lynx", "XENIX", "VM", "Interactive_UNIX", "BSDUNIX", "FreeBSD",
    "NetBSD", "GNU_Hurd", "OS9", "MACH_Kernel", "Inferno", "QNX", "EPOC", "IxWorks",
    "VxWorks", "MiNT", "BeOS", "HP_MPE", "NextStep", "PalmPilot", "Rhapsody", "Windows_2000",
    "Dedicated", "OS_390", "VSE", "TPF", "Windows_R_Me", "Caldera_Open_UNIX", "OpenBSD",
    "Not_Applicable", "Windows_XP", "z_OS", "other",
)  # fmt: skip
#: JSDL's ProcessorArchitectureEnumeration (GFD.56 §6.2.5.1): a CPUArchitectureName.
CPU_ARCHITECTURES = (
    "sparc", "powerpc", "x86", "x86_32", "x86_64", "parisc", "mips", "ia64", "arm", "other",
)  # fmt: skip
# Names real machines give that JSDL spells otherwise (``uname -m`` on Linux).
_ARCHITECTURE_HINTS = {"amd64": "x86_64", "aarch64": "arm", "arm64": "arm", "i386": "x86"}


def nearest(word: str, known: Iterable[str], n: int = 1) -> list[str]:
    """The names of ``known`` closest to ``word`` (a misspelling of one of them), best first,
    compared without case (difflib's ratio, at least 0.6); an exact match but for case first."""
    by_lower: dict[str, str] = {}
    for name in known:
        by_lower.setdefault(name.lower(), name)
    lower = word.lower()
    if lower in by_lower:
        return [by_lower[lower]]
    return [by_lower[m] for m in difflib.get_close_matches(lower, list(by_lower), n=n)]


def did_you_mean(word: str, known: Iterable[str], *, n: int = 2, quote: bool = False) -> str:
    """`` (did you mean X?)`` for the names of ``known`` nearest ``word`` (at most ``n``);
    empty if none is near."""
    found = nearest(word, known, n=n)
    if not found:
        return ""
    names = [f"'{name}'" if quote else name for name in found]
    return f" (did you mean {' or '.join(names)}?)"


def _enumerated(key: str, value: str | None, allowed: tuple[str, ...], enumeration: str) -> None:
    """Refuse a value outside a JSDL enumeration, naming the nearest value it allows."""
    if value is None or value in allowed:
        return
    hint = _ARCHITECTURE_HINTS.get(value.lower()) if allowed is CPU_ARCHITECTURES else None
    near = f" (did you mean {hint}?)" if hint else did_you_mean(value, allowed)
    if not near:
        near = f": {', '.join(allowed)}" if len(allowed) <= 12 else " (GFD.56 lists them)"
    raise JsdlError("", key, f"a value of JSDL's {enumeration}{near}", value)


def _given(value: object) -> bool:
    """Whether a field holds something (0 does; None, False and empty collections do not)."""
    if value is None or value is False:
        return False
    return not (isinstance(value, tuple | Mapping) and not value)


def _check_text(key: str, value: str) -> None:
    bad = _NOT_XML_CHAR.search(value)
    if bad:
        raise JsdlError("", key, "text without control characters", value)


def _job_path(key: str, value: str, *, directory: bool = False, absolute: bool = False) -> str:
    """``value`` as a normalised path confined to the job directory (``a//b/./c`` is ``a/b/c``).

    Checked when a description is built, so that a path that could never be used (or that would
    write outside the job directory) is refused at submission, not at launch. With
    ``absolute``, an absolute path is kept as written (normalised): the site takes it inside
    the job directory (:attr:`JobDescription.run_directory`).
    """
    if "\0" in value:
        raise JsdlError("", key, "a path without NUL characters", value)
    path = PurePosixPath(value)
    if (path.is_absolute() and not absolute) or ".." in path.parts:
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
            if value is not None and (not is_number(value) or not math.isfinite(value)):
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
        lo, hi = format_number(self.lower), format_number(self.upper)
        return {
            RangeKind.EXACT: lo,
            RangeKind.LOWER_BOUNDED: f">= {lo}",
            RangeKind.UPPER_BOUNDED: f"<= {hi}",
            RangeKind.RANGE: f"{lo}..{hi}",
        }[self.kind]


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
                "",
                "creation_flag",
                "overwrite, append or dontOverwrite"
                + did_you_mean(str(self.creation_flag), [str(f) for f in CreationFlag]),
                self.creation_flag,
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
            near = did_you_mean(str(self.type), _FS_TYPES)
            raise JsdlError("", "type", f"one of {', '.join(_FS_TYPES)}{near}", self.type)
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
        raise JsdlError("", key, f"{unit} from 0 to {format_number(high)}", str(value))


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
COUNT_FIELDS = (
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
AMOUNT_FIELDS = (
    ("individual_cpu_speed", MAX_RATE, "Hz"),
    ("individual_network_bandwidth", MAX_RATE, "bits/s"),
    ("individual_physical_memory", MAX_AMOUNT_BYTES, "bytes"),
    ("total_physical_memory", MAX_AMOUNT_BYTES, "bytes"),
    ("individual_disk_space", MAX_AMOUNT_BYTES, "bytes"),
    ("total_disk_space", MAX_AMOUNT_BYTES, "bytes"),
)
#: The most components a co-allocated job may have.
MAX_COMPONENTS = 256
#: How a co-allocated job's components are placed (KOALA's policies, :mod:`gbroker.core.coalloc`).
COALLOCATION_POLICIES = ("worst-fit", "close-to-files", "cm", "fcm")


@dataclass(frozen=True, slots=True)
class Component:
    """One component of a co-allocated job: its ``cores``, and the ``site`` it must run at
    (None: the placement policy chooses)."""

    cores: int
    site: str | None = None

    def check(self, where: str) -> None:
        _bounded_int(f"{where}.cores", self.cores, 1, MAX_CORES, "an integer")
        if self.cores is None:
            raise JsdlError("", f"{where}.cores", "an integer from 1", None)
        if self.site is not None and _token(f"{where}.site", self.site) is None:
            raise JsdlError("", f"{where}.site", "a site name", self.site)


@dataclass(frozen=True, slots=True)
class ComponentOf:
    """What makes a description one component of co-allocated job ``gang``: set by the owner
    broker when it places the job, never by a submission. ``units``: the work units the AppLeS
    planner gave this component (None: not planned)."""

    gang: str
    size: int
    index: int
    site: str
    units: int | None = None

    def check(self) -> None:
        if not isinstance(self.gang, str) or not self.gang:
            raise JsdlError("", "component_of.gang", "a job id", self.gang)
        _bounded_int("component_of.size", self.size, 1, MAX_COMPONENTS, "an integer")
        _bounded_int("component_of.index", self.index, 0, self.size - 1, "an integer")
        if _token("component_of.site", self.site) is None:
            raise JsdlError("", "component_of.site", "a site name", self.site)
        _bounded_int("component_of.units", self.units, 1, 1 << 40, "an integer")


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
    ``threads_from_allocation``), ``spmd_variation`` (the MPI flavour, a URI); the program gets
    them in its environment (:meth:`spmd_environment`).
    Resources: ``total_cpu_count``, ``individual_cpu_count`` (CPU count ranges),
    ``total_cpu_time``, ``individual_cpu_time`` (seconds); what the job needs of a site
    (:meth:`requirements`): ``candidate_hosts`` (the sites it may run at: name patterns),
    ``exclusive_execution``, ``operating_system`` (and its version),
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
    components: tuple[Component, ...] = ()
    coallocation: str | None = None
    component_of: ComponentOf | None = None
    model: PerformanceModel | None = None

    def __post_init__(self) -> None:
        set_ = self._set
        for key in _TOKEN_FIELDS:
            set_(key, _token(key, getattr(self, key)))
        set_("spmd_variation", _spmd_variation(self.spmd_variation))
        _enumerated(
            "operating_system", self.operating_system, OPERATING_SYSTEMS, "OperatingSystemName"
        )
        _enumerated(
            "cpu_architecture", self.cpu_architecture, CPU_ARCHITECTURES, "CPUArchitectureName"
        )
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
            if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
                raise JsdlError("", "environment", "variable names without '=' or spaces", key)
            if not isinstance(value, str):
                raise JsdlError("", f"environment.{key}", "a string", value)
            _check_text(f"environment.{key}", value)
            _check_text("environment", key)
        set_("environment", MappingProxyType(environment))
        if self.input == "/dev/null":  # GridWay writes it; no Input means the same
            set_("input", None)
        if self.working_directory is None and "working_directory" in self.filesystem_names:
            # <WorkingDirectory filesystemName="SPOOL"/>: the file system's mount point itself.
            set_("working_directory", ".")
        for key in _PATH_FIELDS:
            value = getattr(self, key)
            if value is not None:
                wd = key == "working_directory"
                set_(key, _job_path(key, value, directory=wd, absolute=wd))
        for key in COUNT_FIELDS:
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
                    "",
                    "job_class",
                    "rigid, moldable or malleable"
                    + did_you_mean(str(self.job_class), [str(c) for c in JobClass]),
                    self.job_class,
                ) from None
        self._settle_application()
        if self.staging_only and (
            self.application is not None or not self.staging or self.application_version
        ):
            raise JsdlError(
                "", "executable", "an executable or an application name (or only staging)"
            )
        self._check_components()
        _, _, job_class = self.core_request()  # the core bounds must agree with each other
        if self.malleability is not None:
            if not isinstance(self.malleability, Malleability):
                raise JsdlError("", "malleability", "a Malleability", self.malleability)
            if job_class is not JobClass.MALLEABLE:
                raise JsdlError(
                    "", "malleability", "a malleable job (job_class malleable) to declare it"
                )

    def _check_components(self) -> None:
        """A co-allocated job: its components, how they are placed; what it cannot say too."""
        components = tuple(self.components)
        self._set("components", components)
        if len(components) > MAX_COMPONENTS:
            raise JsdlError(
                "", "components", f"at most {MAX_COMPONENTS} components", len(components)
            )
        for i, component in enumerate(components):
            if not isinstance(component, Component):
                raise JsdlError("", f"components[{i}]", "a component {cores, site}", component)
            component.check(f"components[{i}]")
        if self.coallocation is not None:
            if self.coallocation not in COALLOCATION_POLICIES:
                raise JsdlError(
                    "",
                    "coallocation",
                    " or ".join(COALLOCATION_POLICIES)
                    + did_you_mean(str(self.coallocation), COALLOCATION_POLICIES),
                    self.coallocation,
                )
            if not components:
                raise JsdlError("", "coallocation", "components to place (none are given)")
        if self.model is not None:
            if not isinstance(self.model, PerformanceModel):
                raise JsdlError("", "model", "a performance model", self.model)
            if components:
                raise JsdlError(
                    "", "components", "nothing for a job with a model (its planner makes them)"
                )
            if self.coallocation is not None:
                raise JsdlError("", "coallocation", "nothing for a job with a model")
        if self.component_of is not None:
            if not isinstance(self.component_of, ComponentOf):
                raise JsdlError("", "component_of", "a ComponentOf", self.component_of)
            self.component_of.check()
            if components or self.model is not None:
                raise JsdlError("", "component_of", "no components or model of its own")
        if not components and self.model is None:
            return
        # Each component says its own cores and site: the job-wide forms would be ignored.
        for key in ("total_cpu_count", "min_cores", "max_cores", "malleability"):
            if getattr(self, key) is not None:
                raise JsdlError(
                    "", key, "nothing for a job with components (give each component's cores)"
                )
        if self.job_class not in (None, JobClass.RIGID):
            raise JsdlError("", "job_class", "rigid (or none) for a job with components")
        if self.candidate_hosts:
            raise JsdlError(
                "", "candidate_hosts", "nothing for a job with components (give each its site)"
            )

    def _check_resources(self) -> None:
        if self.exclusive_execution is not None and not isinstance(self.exclusive_execution, bool):
            raise JsdlError("", "exclusive_execution", "true or false", self.exclusive_execution)
        for key, high, unit in AMOUNT_FIELDS:
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

    @property
    def spmd_launcher(self) -> SpmdLauncher | None:
        """How a site starts this job's processes: an MPI launcher's ranks, or one process
        (:attr:`SpmdLauncher.THREADS`); None for a job that is not SPMD or names no variation
        (its program then starts its processes itself, from :meth:`spmd_environment`)."""
        if self.application is not ApplicationKind.SPMD or self.spmd_variation is None:
            return None
        return SPMD_VARIATIONS[self.spmd_variation.removeprefix(SPMD_VARIATION_PREFIX)]

    def spmd_processes(self, cores: int) -> int:
        """N, the processes of an SPMD job on ``cores`` allocated cores: NumberOfProcesses,
        else (``actualtotalcpucount``, or none given) one per allocated core."""
        return self.number_of_processes or cores

    def spmd_threads(self, cores: int) -> int | None:
        """t, the threads (and cores) of each process: ThreadsPerProcess, else with
        ``actualindividualcpucount`` one host's share of the ``cores`` (``cores`` / h, h the
        hosts its ProcessesPerHost p spreads its N processes over) divided among that host's
        processes, else None (not said). 8 cores, 8 processes, 4 a host: 2 hosts of 4 cores,
        1 each (not 8 // 4: that would ask each host for 8)."""
        threads = self.threads_per_process
        if threads is None and self.threads_from_allocation:
            processes = self.spmd_processes(cores)
            on_host = min(processes, self.processes_per_host or processes)
            hosts = -(-processes // on_host)
            threads = max(1, cores // hosts // on_host)
        return threads

    def spmd_nodes(self) -> int | None:
        """The hosts an SPMD job's ProcessesPerHost asks for, ceil(N / ProcessesPerHost), N
        being its processes on its r cores; None when it gives no ProcessesPerHost."""
        if self.processes_per_host is None or self.application is not ApplicationKind.SPMD:
            return None
        processes = self.spmd_processes(self.core_request()[0])
        return -(-processes // self.processes_per_host)

    def spmd_environment(self, cores: int) -> dict[str, str]:
        """What an SPMD job is told of its processes at the site that runs it on ``cores``
        cores (empty for any other job): ``GBROKER_SPMD_PROCESSES`` (N:
        :meth:`spmd_processes`), ``GBROKER_SPMD_PROCESSES_PER_HOST``,
        ``GBROKER_SPMD_THREADS_PER_PROCESS`` and ``OMP_NUM_THREADS`` (t:
        :meth:`spmd_threads`) and ``GBROKER_SPMD_VARIATION`` (the MPI flavour's URI). A job
        with an MPI variation is started as N ranks by the site (:attr:`spmd_launcher`); one
        without a variation is started once, and its program starts the processes from
        these."""
        if self.application is not ApplicationKind.SPMD:
            return {}
        env = {"GBROKER_SPMD_PROCESSES": str(self.spmd_processes(cores))}
        if self.processes_per_host is not None:
            env["GBROKER_SPMD_PROCESSES_PER_HOST"] = str(self.processes_per_host)
        threads = self.spmd_threads(cores)
        if threads is not None:
            env["GBROKER_SPMD_THREADS_PER_PROCESS"] = str(threads)
            env["OMP_NUM_THREADS"] = str(threads)
        if self.spmd_variation is not None:
            env["GBROKER_SPMD_VARIATION"] = self.spmd_variation
        return env

    @property
    def run_directory(self) -> str | None:
        """Where the job starts, relative to its job directory (None: the job directory).

        A site keeps every path of a job inside the job's directory, an absolute
        ``working_directory`` included: ``/scratch/run`` is ``scratch/run`` there (created if
        needed), ``/`` the job directory itself. A file system's (``filesystem_names``) is
        made concrete by the executing site first (the stager: its link in the directory)."""
        if self.working_directory is None:
            return None
        path = PurePosixPath(self.working_directory.lstrip("/"))
        return str(path) if path.parts else None

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
            self.candidate_hosts,
            self.processes_per_host,
            *(getattr(self, key) for key, _, _ in AMOUNT_FIELDS),
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
            nodes=_most(low(self.total_resource_count), self.spmd_nodes()),
            individual_memory=low(self.individual_physical_memory),
            total_memory=low(self.total_physical_memory),
            individual_disk=low(self.individual_disk_space),
            total_disk=low(self.total_disk_space),
            file_systems=tuple(needs),
            candidate_hosts=self.candidate_hosts,
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
        return XML_PATHS[key] if xml else key

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

    def component(
        self, gang: str, index: int, size: int, site: str, cores: int, units: int | None = None
    ) -> JobDescription:
        """Component ``index`` of this co-allocated job, placed at ``site`` on ``cores``: the
        same program, pinned there as a rigid job of its own (its owner's placement)."""
        return dataclasses.replace(
            self,
            components=(),
            coallocation=None,
            model=None,
            total_cpu_count=RangeValue.exact(cores),
            component_of=ComponentOf(gang, size, index, site, units),
        )

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
        if self.components:  # the whole job, as its largest component sees a site
            rank = max_rank = max(c.cores for c in self.components)
        elif self.model is not None:  # as one of the components its planner makes sees one
            rank = max_rank = self.model.cores
        part = self.component_of
        return Job(
            id=job_id,
            rank=rank,
            requested_time=self.estimated_run_time(rank),
            job_class=job_class,
            max_rank=max_rank,
            input_files=tuple(files),
            malleability=self.malleability,
            requirements=self.requirements(),
            gang=None if part is None else Gang(part.gang, part.size, part.index, part.site),
        )


def _most(*values: int | None) -> int | None:
    """The largest of the values given (None: none given)."""
    given = [v for v in values if v is not None]
    return max(given) if given else None
