"""A JSDL document against the OGF schemas (jsdl.xsd, jsdl-posix.xsd, jsdl-spmd.xsd), shipped in
``gbroker/jobs/schema/`` (their notice: its README), by xmlschema.

GBroker's reader (:mod:`.jsdl_read`) is liberal: it takes what real writers produce where the
schemas disagree (GridWay's ``CandidateHost``, UNICORE's camel-case SPMD attributes, elements out
of the schemas' order, a DataStaging without CreationFlag). :func:`schema_violations` says where
a document departs from the schemas, so that ``gbroker jsdl check`` can warn about it (and fail
on it with ``--schema``). The schemas are loaded on first use and kept for the process (and, built,
in the user's cache directory for the next one): only a command that validates pays for them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from gbroker.jobs.description import HPCPA_NS, JSDL_NS, POSIX_NS, SPMD_NS

if TYPE_CHECKING:
    import xmlschema

__all__ = ["SCHEMA_DIR", "SchemaViolation", "schema_violations"]

SCHEMA_DIR = Path(__file__).with_name("schema")
"""Where the shipped schemas are."""
_FILES = ("jsdl.xsd", "jsdl-posix.xsd", "jsdl-spmd.xsd")
# How the reasons name elements (the prefixes GFD.56 and its extensions use).
_PREFIXES = {
    "jsdl": JSDL_NS,
    "jsdl-posix": POSIX_NS,
    "jsdl-spmd": SPMD_NS,
    "jsdl-hpcpa": HPCPA_NS,
}


@dataclass(frozen=True, slots=True)
class SchemaViolation:
    """Where a document departs from the schemas (an element path as the reader's errors write
    it) and why, in xmlschema's words."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@cache
def _schema() -> xmlschema.XMLSchema10:
    """The schemas, built once per process; across processes, from the user's cache when a
    build of these very files by this very xmlschema is there (building costs a few tenths of
    a second, reading the cache a few hundredths)."""
    import xmlschema

    cached = _cache_file(xmlschema.__version__)
    schema = _read_cache(cached) if cached is not None else None
    if isinstance(schema, xmlschema.XMLSchema10):
        return schema
    # Loaded together: jsdl-spmd.xsd imports ./jsdl-posix.xsd, and lax xsd:any content then
    # validates against the extension schemas too. Local files only, nothing fetched.
    schema = xmlschema.XMLSchema10([str(SCHEMA_DIR / name) for name in _FILES], allow="local")
    if cached is not None:
        _write_cache(cached, schema)
    return schema


def _cache_file(version: str) -> Path | None:
    """Where the built schemas are cached: ``$XDG_CACHE_HOME/gbroker`` (else
    ``~/.cache/gbroker``), named by what they were built from; None without a home."""
    import hashlib
    import os
    import sys

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(root):
        return None
    digest = hashlib.sha256(f"{version} {sys.version}".encode())
    for name in _FILES:
        digest.update((SCHEMA_DIR / name).read_bytes())
    return Path(root) / "gbroker" / f"jsdl-schema-{digest.hexdigest()[:24]}.pickle"


def _read_cache(path: Path) -> object:
    """The cached build, if the file is the user's own and no one else may write it (a pickle
    runs code as it loads: only ours is read); None otherwise, or if it cannot be read."""
    import os
    import pickle

    try:
        with path.open("rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.getuid() or info.st_mode & 0o022:
                return None
            return pickle.load(handle)
    except Exception:  # missing, truncated, of another version: build afresh
        return None


def _write_cache(path: Path, schema: object) -> None:
    """Keep the build for the next process (atomically: a reader never sees half a file); a
    cache that cannot be written is no cache."""
    import os
    import pickle
    import tempfile

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".jsdl-schema-")
        try:
            with os.fdopen(fd, "wb") as handle:
                pickle.dump(schema, handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except Exception:  # read-only home, full disk, an unpicklable build: nothing kept
        return


def _paths(root: ET.Element) -> dict[ET.Element, str]:
    """Each element's path as the reader's errors write it: local names, a repeated element
    numbered from 1 among its like siblings (``DataStaging[2]``; the kinds that may repeat
    always, as the reader does: ``DataStaging[1]``)."""
    paths = {root: _local(root.tag)}
    stack = [root]
    while stack:
        parent = stack.pop()
        counts: dict[str, int] = {}
        for child in parent:
            counts[child.tag] = counts.get(child.tag, 0) + 1
        seen: dict[str, int] = {}
        for child in parent:
            if not isinstance(child.tag, str):
                continue
            seen[child.tag] = seen.get(child.tag, 0) + 1
            numbered = counts[child.tag] > 1 or _local(child.tag) in _NUMBERED
            index = f"[{seen[child.tag]}]" if numbered else ""
            paths[child] = f"{paths[parent]}/{_local(child.tag)}{index}"
            stack.append(child)
    return paths


# Elements the reader's paths always number.
_NUMBERED = frozenset({"DataStaging", "Argument", "Environment", "FileSystem", "HostName"})
# The namespaces the shipped schemas define (others' content is not judged here: their schemas
# are not shipped, so a failure there says nothing about JSDL).
_JUDGED = frozenset({JSDL_NS, POSIX_NS, SPMD_NS, ""})


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _namespace(tag: str) -> str:
    return tag[1:].partition("}")[0] if tag.startswith("{") else ""


def schema_violations(root: ET.Element) -> list[SchemaViolation]:
    """Every place ``root`` (a parsed JSDL document: parse it safely first) departs from the
    schemas, in document order; empty when it is valid. Elements of other namespaces than
    JSDL's, POSIX's and SPMD's are not judged, and schemas named in the document
    (``xsi:schemaLocation``) are not fetched."""
    paths: dict[ET.Element, str] | None = None
    violations = []
    for error in _schema().iter_errors(root, namespaces=_PREFIXES, use_location_hints=False):
        if error.elem is not None and _namespace(error.elem.tag) not in _JUDGED:
            continue
        if paths is None:
            paths = _paths(root)
        where = paths.get(error.elem, "document") if error.elem is not None else "document"
        reason = " ".join(str(error.reason or error.message).split())
        violations.append(SchemaViolation(where, reason))
    return violations
