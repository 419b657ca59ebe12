"""Parameter sweeps (OGF GFD.149, the JSDL Parameter Sweep Job Extension): one document, N jobs.

Theory of operation
-------------------
A sweep document is a JSDL job (the *template*) plus a ``sweep:Sweep`` element beside its
``JobDescription``. A Sweep holds one or more ``Assignment`` elements and, optionally, nested
Sweeps. An Assignment binds one *function* (a list of values: ``Values``, ``LoopInteger``,
``LoopDouble``) to one or more *parameters* (places in the template: an XPath ``Match``, or a
``substring`` of a node's text). Matches are evaluated once, on the template, so a value never
changes what a Match selects, and substitutions in one node do not shift each other.

All Assignments of one Sweep advance together; a nested Sweep runs in full for each of its
parent's values (a cross product); sibling Sweeps run one after the other. Each combination is
one *element* of the job array, a complete :class:`~gbroker.jobs.description.JobDescription`
read by the same reader as any document, so every check applies to every element; an error
names the element (``[sweep element 37]``). The JSON/YAML form is a ``sweep`` key beside the
job's fields, its parameters field paths of the job's mapping.

An array's size is counted before any element is made (at most
:data:`~gbroker.core.arrays.MAX_ARRAY_SIZE`), sweeps nest at most :data:`MAX_SWEEP_DEPTH` deep
and an XPath is at most :data:`MAX_MATCH_CHARS` long. The functions, parameters and the JSON/YAML
form with examples: docs/JSDL.md, "Parameter sweeps: job arrays".
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from os import PathLike
from pathlib import Path
from typing import Any, NoReturn, cast

import elementpath
from elementpath.xpath_nodes import AttributeNode, EtreeElementNode, TextNode

from gbroker.core.arrays import MAX_ARRAY_SIZE
from gbroker.jobs.description import JSDL_NS, MAX_DOCUMENT_BYTES, JobDescription, JsdlError
from gbroker.jobs.documents import document_format
from gbroker.jobs.jsdl_paths import ROOT
from gbroker.jobs.jsdl_read import JsdlReader
from gbroker.jobs.mapping import from_mapping, to_mapping, unknown_field
from gbroker.jobs.parsing import check_size, parse_json, parse_xml, parse_yaml, split_tag

__all__ = [
    "MAX_MATCH_CHARS",
    "MAX_SWEEP_DEPTH",
    "SWEEP_FUNCTIONS_NS",
    "SWEEP_NS",
    "JobArray",
    "load_submission",
    "loads_job",
    "loads_submission",
]

SWEEP_NS = "http://schemas.ogf.org/jsdl/2009/03/sweep"
SWEEP_FUNCTIONS_NS = "http://schemas.ogf.org/jsdl/2009/03/sweep/functions"
MAX_SWEEP_DEPTH = 8
MAX_MATCH_CHARS = 1024
_FORMATS = {".jsdl": "jsdl", ".xml": "jsdl", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}
_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[^.\[\]]+|\[\d{1,6}\])*")
_FIELD_PART = re.compile(r"\.([^.\[\]]+)|\[(\d{1,6})\]")


@dataclass(frozen=True, slots=True)
class JobArray:
    """One submission that is many jobs: the elements, in sweep order (element i is
    ``elements[i - 1]``), and where they came from.

    ``mapping`` is the JSON/YAML form (template and ``sweep``) when the sweep was written so.
    """

    elements: tuple[JobDescription, ...]
    document: str = "<job>"
    mapping: Mapping[str, Any] | None = None

    @property
    def size(self) -> int:
        return len(self.elements)

    def varying(self, limit: int = 4) -> dict[str, list[Any]]:
        """The fields whose values differ between elements, each with its first ``limit``
        values (what ``gbroker jsdl check`` shows of an array)."""
        forms = [to_mapping(e) for e in self.elements]
        keys = sorted({k for f in forms for k in f})
        out: dict[str, list[Any]] = {}
        for key in keys:
            values = [f.get(key) for f in forms]
            if any(v != values[0] for v in values):
                out[key] = values[:limit]
        return out


# -- functions -------------------------------------------------------------------------------


def _plain_decimal(value: Decimal) -> str:
    """A LoopDouble value as text: ``0.5``, ``1.0``, ``-2.25`` (no exponent, no trailing 0s)."""
    text = format(value.normalize(), "f")
    return text if "." in text else f"{text}.0"


@dataclass(frozen=True, slots=True)
class _Function:
    """A sweep function's values, as text (XML) and as typed values (JSON/YAML)."""

    texts: tuple[str, ...]
    typed: tuple[Any, ...]


def _loop_count(start: Decimal, end: Decimal, step: Decimal) -> int:
    if (end - start) * step < 0:
        return 0
    return int((end - start) / step) + 1


def _loop(
    fail: Any, where: str, start: Decimal, end: Decimal, step: Decimal, exceptions: set[Decimal]
) -> tuple[Decimal, ...]:
    """start, start + step, ... up to end (down to it for a negative step), minus exceptions."""
    if step == 0:
        fail(where, "a step other than 0", "0")
    count = _loop_count(start, end, step)
    skipped = sum(
        1
        for x in exceptions
        if (x - start) * step >= 0 and (x - start) % step == 0 and (end - x) * step >= 0
    )
    if count - skipped > MAX_ARRAY_SIZE:
        fail(where, f"a loop of at most {MAX_ARRAY_SIZE} values", f"{count - skipped} values")
    values = (start + k * step for k in range(count))
    return tuple(v for v in values if v not in exceptions)


def _loop_function(values: tuple[Decimal, ...], integer: bool) -> _Function:
    """A loop's values as text (``7``; ``0.5``) and typed (int; float)."""
    if integer:
        return _Function(tuple(str(int(v)) for v in values), tuple(int(v) for v in values))
    return _Function(tuple(_plain_decimal(v) for v in values), tuple(float(v) for v in values))


# -- targets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    """A place in the template that takes values: an element's text or an attribute."""

    element: ET.Element
    attribute: str | None

    def get(self) -> str:
        if self.attribute is None:
            return self.element.text or ""
        return self.element.get(self.attribute, "")

    def set(self, value: str) -> None:
        if self.attribute is None:
            self.element.text = value
        else:
            self.element.set(self.attribute, value)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where an assignment puts its value: nodes (XML) or a field path (mapping), whole or the
    characters ``start`` (from 0) on, ``length`` of them (None: to the end)."""

    where: str  # where it is written (an element path or a field path), for errors
    nodes: tuple[_Node, ...] = ()
    field: tuple[str | int, ...] = ()
    start: int | None = None
    length: int | None = None


@dataclass(frozen=True, slots=True)
class _Assignment:
    targets: tuple[_Target, ...]
    function: _Function
    where: str


@dataclass(frozen=True, slots=True)
class _Sweep:
    assignments: tuple[_Assignment, ...]
    children: tuple[_Sweep, ...]
    where: str

    def count(self) -> int:
        values = len(self.assignments[0].function.texts)
        if not self.children:
            return values
        return values * sum(child.count() for child in self.children)

    def bindings(self) -> Iterator[list[tuple[_Target, int, _Function]]]:
        """Each combination: (target, value index, function) for every assignment."""
        for k in range(len(self.assignments[0].function.texts)):
            mine = [(t, k, a.function) for a in self.assignments for t in a.targets]
            if not self.children:
                yield mine
                continue
            for child in self.children:
                for theirs in child.bindings():
                    yield mine + theirs


def _total(sweeps: Sequence[_Sweep], fail: Any, where: str) -> int:
    total = sum(s.count() for s in sweeps)
    if total > MAX_ARRAY_SIZE:
        fail(where, f"a sweep of at most {MAX_ARRAY_SIZE} jobs", f"{total} jobs")
    if total == 0:
        fail(where, "a sweep of at least one job", "0 jobs (every value is an Exception)")
    return total


def _spliced(original: str, parts: list[tuple[_Target, str]], fail: Any) -> str:
    """``original`` with each part's characters replaced (positions in ``original``)."""
    ranges = []
    for target, value in parts:
        start = target.start or 0
        end = len(original) if target.length is None else start + target.length
        if target.start is None:
            end = len(original)
        if start > len(original):
            fail(
                target.where,
                f"a substring inside the text {original[:60]!r} ({len(original)} characters)",
                f"start {start + 1}",
            )
        ranges.append((start, min(end, len(original)), value, target))
    ranges.sort(key=lambda r: r[0])
    for (_, end_a, _, a), (start_b, _, _, b) in itertools.pairwise(ranges):
        if start_b < end_a:
            fail(
                b.where,
                f"a substitution that does not overlap the one of {a.where}",
                f"both replace character {start_b + 1} of {original[:60]!r}",
            )
    out, at = [], 0
    for start, end, value, _ in ranges:
        out.append(original[at:start])
        out.append(value)
        at = end
    out.append(original[at:])
    return "".join(out)


# -- XML -------------------------------------------------------------------------------------


class _SweepReader:
    """Reads the Sweep elements of a parsed document; errors name the document and element."""

    def __init__(self, document: str, root: ET.Element, description: ET.Element) -> None:
        self.document = document
        self.root = root
        self.description = description
        # Which nodes lie in the JobDescription (only those may take values).
        self.inside = {id(el) for el in description.iter()}

    def fail(self, path: str, expected: str, found: object = None) -> NoReturn:
        raise JsdlError(self.document, path, expected, found)

    def sweep(self, el: ET.Element, where: str, depth: int) -> _Sweep:
        if depth > MAX_SWEEP_DEPTH:
            self.fail(where, f"sweeps nested at most {MAX_SWEEP_DEPTH} deep", depth)
        assignments: list[_Assignment] = []
        children: list[_Sweep] = []
        for child in el:
            ns, local = split_tag(child.tag)
            if ns != SWEEP_NS:
                continue
            if local == "Assignment":
                here = f"{where}/Assignment[{len(assignments) + 1}]"
                assignments.append(self.assignment(child, here))
            elif local == "Sweep":
                here = f"{where}/Sweep[{len(children) + 1}]"
                children.append(self.sweep(child, here, depth + 1))
            else:
                self.fail(f"{where}/{local}", "an Assignment or a nested Sweep", local)
        if not assignments:
            self.fail(f"{where}/Assignment", "at least one Assignment in each Sweep")
        counts = {len(a.function.texts) for a in assignments}
        if len(counts) > 1:
            self.fail(
                where,
                "Assignments that yield as many values each (they advance together)",
                ", ".join(str(len(a.function.texts)) for a in assignments),
            )
        return _Sweep(tuple(assignments), tuple(children), where)

    def assignment(self, el: ET.Element, where: str) -> _Assignment:
        targets: list[_Target] = []
        function: _Function | None = None
        for child in el:
            ns, local = split_tag(child.tag)
            if ns == SWEEP_NS and local == "DocumentNode":
                targets.append(
                    self.document_node(child, f"{where}/DocumentNode[{len(targets) + 1}]")
                )
            elif ns == SWEEP_FUNCTIONS_NS:
                if function is not None:
                    self.fail(f"{where}/{local}", "exactly one function per Assignment", local)
                function = self.function(child, f"{where}/{local}", local)
            elif ns == SWEEP_NS:
                self.fail(
                    f"{where}/{local}",
                    "DocumentNode parameters (GBroker sweeps no other kind of parameter)",
                    local,
                )
        if not targets:
            self.fail(f"{where}/DocumentNode", "at least one DocumentNode in each Assignment")
        if function is None:
            self.fail(where, "a function: Values, LoopInteger or LoopDouble", "none")
        return _Assignment(tuple(targets), function, where)

    def document_node(self, el: ET.Element, where: str) -> _Target:
        namespaces: dict[str, str] = {}
        match: str | None = None
        for child in el:
            ns, local = split_tag(child.tag)
            if ns != SWEEP_NS:
                continue
            if local == "NamespaceBinding":
                prefix, uri = child.get("prefix"), child.get("ns")
                if not prefix or not uri:
                    self.fail(f"{where}/NamespaceBinding", 'prefix="..." and ns="..." attributes')
                namespaces[prefix] = uri
            elif local == "Match":
                if match is not None:
                    self.fail(f"{where}/Match", "exactly one Match", "another one")
                match = (child.text or "").strip()
        here = f"{where}/Match"
        if not match:
            self.fail(here, "an XPath expression selecting a node of the JobDescription")
        if len(match) > MAX_MATCH_CHARS:
            self.fail(here, f"an XPath of at most {MAX_MATCH_CHARS} characters", len(match))
        return self.select(match, namespaces, here)

    def select(self, match: str, namespaces: dict[str, str], where: str) -> _Target:
        parser = elementpath.XPath1Parser(namespaces=namespaces)
        try:
            token = parser.parse(match)
        except elementpath.ElementPathError as exc:
            self.fail(where, "an XPath 1.0 expression (prefixes bound by NamespaceBinding)", exc)
        start: int | None = None
        length: int | None = None
        context = elementpath.XPathContext(self.root)
        if token.symbol == "substring":  # Genesis II's form: part of a node's text
            if len(token) not in (2, 3):
                self.fail(where, "substring(PATH, start) or substring(PATH, start, length)", match)
            start = self.whole(token[1].evaluate(context), where, "start", 1) - 1
            if len(token) == 3:
                length = self.whole(token[2].evaluate(context), where, "length", 0)
            token = token[0]
        try:
            selected = list(token.select(context))
        except (elementpath.ElementPathError, TypeError) as exc:
            self.fail(where, "an XPath that selects elements or attributes", exc)
        nodes: list[_Node] = []
        for item in selected:
            owner = item.parent if isinstance(item, AttributeNode | TextNode) else item
            if not isinstance(owner, EtreeElementNode):
                self.fail(where, "an XPath that selects elements or attributes", repr(item)[:80])
            element = cast(ET.Element, owner.elem)
            name = item.name if isinstance(item, AttributeNode) else None
            node = _Node(element, name)
            if id(node.element) not in self.inside:
                self.fail(where, "nodes inside the JobDescription", match)
            if node.attribute is None and len(node.element):
                self.fail(where, "elements of text only (no child elements)", match)
            nodes.append(node)
        if not nodes:
            self.fail(where, "an XPath that selects a node of the JobDescription", "nothing")
        return _Target(where, tuple(nodes), start=start, length=length)

    def whole(self, value: object, where: str, what: str, minimum: int) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float | Decimal)
            or not float(value).is_integer()
            or value < minimum
        ):
            self.fail(where, f"a whole-number substring {what} >= {minimum}", value)
        return int(value)

    def function(self, el: ET.Element, where: str, local: str) -> _Function:
        if local == "Values":
            texts: list[str] = []
            for child in el:
                ns, name = split_tag(child.tag)
                if (ns, name) != (SWEEP_FUNCTIONS_NS, "Value"):
                    continue
                if len(child):
                    self.fail(f"{where}/Value[{len(texts) + 1}]", "a value of text only")
                texts.append(child.text or "")
            if not texts:
                self.fail(f"{where}/Value", "at least one Value")
            if len(texts) > MAX_ARRAY_SIZE:
                self.fail(where, f"at most {MAX_ARRAY_SIZE} values", len(texts))
            return _Function(tuple(texts), tuple(texts))
        if local not in ("LoopInteger", "LoopDouble"):
            self.fail(where, "a function: Values, LoopInteger or LoopDouble", local)
        integer = local == "LoopInteger"
        bounds = {}
        for attr in ("start", "end", "step"):
            text = el.get(attr)
            if text is None:
                if attr == "step" and integer:
                    bounds[attr] = Decimal(1)
                    continue
                self.fail(f"{where}/@{attr}", f'a {attr}="..." attribute')
            bounds[attr] = self.number(text, f"{where}/@{attr}", integer)
        exceptions = set()
        for child in el:
            if split_tag(child.tag) == (SWEEP_FUNCTIONS_NS, "Exception"):
                exceptions.add(self.number(child.text or "", f"{where}/Exception", integer))
        values = _loop(self.fail, where, bounds["start"], bounds["end"], bounds["step"], exceptions)
        return _loop_function(values, integer)

    def number(self, text: str, where: str, integer: bool) -> Decimal:
        try:
            value = Decimal(text.strip())
        except InvalidOperation:
            value = Decimal("NaN")
        if not value.is_finite() or (integer and value != value.to_integral_value()):
            self.fail(where, "an integer" if integer else "a decimal number", text.strip())
        if abs(value) > Decimal(10) ** 15:
            self.fail(where, "a number of at most 15 digits", text.strip())
        return value


def _xml_array(
    data: str | bytes, document: str, expand: bool = True
) -> JobDescription | JobArray | None:
    root = parse_xml(data, document)
    reader = JsdlReader(document)
    sweeps_el = [c for c in root if split_tag(c.tag) == (SWEEP_NS, "Sweep")]
    if not sweeps_el or split_tag(root.tag) != (JSDL_NS, ROOT):
        return reader.job_definition(root)
    descriptions = [c for c in root if split_tag(c.tag) == (JSDL_NS, "JobDescription")]
    if len(descriptions) != 1:
        return reader.job_definition(root)  # says what is wrong with the definition
    if not expand:
        return None
    sweeper = _SweepReader(document, root, descriptions[0])
    sweeps = [
        sweeper.sweep(el, f"{ROOT}/Sweep[{k + 1}]" if len(sweeps_el) > 1 else f"{ROOT}/Sweep", 1)
        for k, el in enumerate(sweeps_el)
    ]
    total = _total(sweeps, sweeper.fail, f"{ROOT}/Sweep")
    elements: list[JobDescription] = []
    for bindings in (b for s in sweeps for b in s.bindings()):
        by_node: dict[_Node, list[tuple[_Target, str]]] = {}
        for target, k, function in bindings:
            for node in target.nodes:
                by_node.setdefault(node, []).append((target, function.texts[k]))
        saved = {node: node.get() for node in by_node}
        try:
            for node, parts in by_node.items():
                node.set(_spliced(saved[node], parts, sweeper.fail))
            try:
                elements.append(reader.job_definition(root))
            except JsdlError as exc:
                raise JsdlError(
                    document,
                    f"{exc.path} [sweep element {len(elements) + 1} of {total}]",
                    exc.expected,
                    exc.found,
                ) from exc
        finally:
            for node, text in saved.items():
                node.set(text)
    return JobArray(tuple(elements), document)


# -- JSON / YAML -----------------------------------------------------------------------------


class _MappingSweepReader:
    """The ``sweep`` key of a job mapping (the module docstring has its form)."""

    def __init__(self, document: str, template: Mapping[str, Any]) -> None:
        self.document = document
        self.template = template

    def fail(self, path: str, expected: str, found: object = None) -> NoReturn:
        raise JsdlError(self.document, path, expected, found)

    def keys(self, value: object, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(where, f"a mapping with keys {', '.join(allowed)}", value)
        for key in value:
            if key not in allowed:
                self.fail(f"{where}.{key}", unknown_field(key, allowed), key)
        return dict(value)

    def sweeps(self, value: object, where: str, depth: int) -> list[_Sweep]:
        if isinstance(value, Mapping):
            return [self.sweep(value, where, depth)]
        if isinstance(value, str) or not isinstance(value, Sequence) or not value:
            self.fail(where, "a sweep {assignments, sweeps} or a list of them", value)
        return [self.sweep(v, f"{where}[{k}]", depth) for k, v in enumerate(value)]

    def sweep(self, value: object, where: str, depth: int) -> _Sweep:
        if depth > MAX_SWEEP_DEPTH:
            self.fail(where, f"sweeps nested at most {MAX_SWEEP_DEPTH} deep", depth)
        data = self.keys(value, where, ("assignments", "sweeps"))
        raw = data.get("assignments")
        if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
            self.fail(f"{where}.assignments", "a list of at least one assignment", raw)
        assignments = [self.assignment(a, f"{where}.assignments[{k}]") for k, a in enumerate(raw)]
        children: list[_Sweep] = []
        if data.get("sweeps"):
            children = self.sweeps(data["sweeps"], f"{where}.sweeps", depth + 1)
        counts = {len(a.function.texts) for a in assignments}
        if len(counts) > 1:
            self.fail(
                f"{where}.assignments",
                "assignments that yield as many values each (they advance together)",
                ", ".join(str(len(a.function.texts)) for a in assignments),
            )
        return _Sweep(tuple(assignments), tuple(children), where)

    def assignment(self, value: object, where: str) -> _Assignment:
        functions = ("values", "loop_integer", "loop_double")
        data = self.keys(value, where, ("parameters", *functions))
        raw = data.get("parameters")
        if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
            self.fail(f"{where}.parameters", "a list of at least one field path", raw)
        targets = tuple(self.target(p, f"{where}.parameters[{k}]") for k, p in enumerate(raw))
        given = [f for f in functions if f in data]
        if len(given) != 1:
            self.fail(where, "exactly one of values, loop_integer or loop_double", given or None)
        return _Assignment(targets, self.function(given[0], data[given[0]], where), where)

    def target(self, value: object, where: str) -> _Target:
        start = length = None
        if isinstance(value, Mapping):
            data = self.keys(value, where, ("field", "start", "length"))
            path = data.get("field")
            if "start" in data:
                start = self.whole(data["start"], f"{where}.start", 1) - 1
            if "length" in data:
                if start is None:
                    self.fail(f"{where}.start", "a start (from 1) with a length")
                length = self.whole(data["length"], f"{where}.length", 0)
        else:
            path = value
        if not isinstance(path, str) or not _FIELD_PATH.fullmatch(path):
            self.fail(where, "a field path such as arguments[1] or staging[0].target", path)
        field: list[str | int] = [path.split(".", 1)[0].split("[", 1)[0]]
        for name, index in _FIELD_PART.findall(path[len(str(field[0])) :]):
            field.append(int(index) if index else name)
        current: Any = self.template
        for part in field:
            ok = (isinstance(part, int) and isinstance(current, list) and part < len(current)) or (
                isinstance(part, str) and isinstance(current, Mapping) and part in current
            )
            if not ok:
                self.fail(where, "a field the job has (its value is replaced)", path)
            current = current[part]
        if isinstance(current, Mapping | list):
            self.fail(where, "a field holding a value, not a mapping or list", path)
        if start is not None and not isinstance(current, str):
            self.fail(where, "a text field for a substring (start, length)", path)
        return _Target(path, field=tuple(field), start=start, length=length)

    def whole(self, value: object, where: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(where, f"an integer >= {minimum}", value)
        return value

    def function(self, kind: str, value: object, where: str) -> _Function:
        here = f"{where}.{kind}"
        if kind == "values":
            if isinstance(value, str) or not isinstance(value, Sequence) or not value:
                self.fail(here, "a list of at least one value", value)
            if len(value) > MAX_ARRAY_SIZE:
                self.fail(here, f"at most {MAX_ARRAY_SIZE} values", len(value))
            for k, item in enumerate(value):
                if isinstance(item, Mapping | list) or item is None:
                    self.fail(f"{here}[{k}]", "a string or a number", item)
                if isinstance(item, float) and not math.isfinite(item):
                    self.fail(f"{here}[{k}]", "a finite number", item)
            return _Function(tuple(_text(v) for v in value), tuple(value))
        integer = kind == "loop_integer"
        data = self.keys(value, here, ("start", "end", "step", "exceptions"))
        bounds = {}
        for key in ("start", "end", "step"):
            if key not in data:
                if key == "step" and integer:
                    bounds[key] = Decimal(1)
                    continue
                self.fail(f"{here}.{key}", f"a {key}")
            bounds[key] = self.number(data[key], f"{here}.{key}", integer)
        raw = data.get("exceptions", [])
        if isinstance(raw, str) or not isinstance(raw, Sequence):
            self.fail(f"{here}.exceptions", "a list of numbers", raw)
        exceptions = {self.number(x, f"{here}.exceptions[{k}]", integer) for k, x in enumerate(raw)}
        values = _loop(self.fail, here, bounds["start"], bounds["end"], bounds["step"], exceptions)
        return _loop_function(values, integer)

    def number(self, value: object, where: str, integer: bool) -> Decimal:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(where, "an integer" if integer else "a number", value)
        if (integer and not isinstance(value, int)) or not math.isfinite(value):
            self.fail(where, "an integer" if integer else "a finite number", value)
        if abs(value) > 10**15:
            self.fail(where, "a number of at most 15 digits", value)
        return Decimal(str(value))


def _text(value: object) -> str:
    if isinstance(value, float):
        return _plain_decimal(Decimal(repr(value)))
    return str(value)


def _put(mapping: Any, field: tuple[str | int, ...], value: Any) -> None:
    for part in field[:-1]:
        mapping = mapping[part]
    mapping[field[-1]] = value


def _get(mapping: Any, field: tuple[str | int, ...]) -> Any:
    for part in field:
        mapping = mapping[part]
    return mapping


def _mapping_array(
    data: object, document: str, expand: bool = True
) -> JobDescription | JobArray | None:
    if not isinstance(data, Mapping) or "sweep" not in data:
        return from_mapping(data, document=document)
    if not expand:
        return None
    template = {k: v for k, v in data.items() if k != "sweep"}
    reader = _MappingSweepReader(document, template)
    sweeps = reader.sweeps(data["sweep"], "sweep", 1)
    total = _total(sweeps, reader.fail, "sweep")
    elements: list[JobDescription] = []
    for bindings in (b for s in sweeps for b in s.bindings()):
        element = copy.deepcopy(template)
        by_field: dict[tuple[str | int, ...], list[tuple[_Target, int, _Function]]] = {}
        for target, k, function in bindings:
            by_field.setdefault(target.field, []).append((target, k, function))
        for field, parts in by_field.items():
            original = _get(template, field)
            whole = [p for p in parts if p[0].start is None]
            if len(parts) == 1 and whole and not isinstance(original, str):
                target, k, function = whole[0]
                _put(element, field, function.typed[k])  # a number stays a number
                continue
            texts = [(t, f.texts[k]) for t, k, f in parts]
            _put(element, field, _spliced(str(original), texts, reader.fail))
        try:
            elements.append(
                from_mapping(element, document=f"{document} [sweep element {len(elements) + 1}]")
            )
        except JsdlError as exc:
            raise JsdlError(
                document,
                f"{exc.path} [sweep element {len(elements) + 1} of {total}]",
                exc.expected,
                exc.found,
            ) from exc
    return JobArray(tuple(elements), document, dict(data))


# -- entry points ----------------------------------------------------------------------------


def loads_submission(
    data: str | bytes,
    *,
    document: str = "<job>",
    fmt: str | None = None,
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> JobDescription | JobArray:
    """Read a submission in any form: a job, or (with a sweep) a job array. ``fmt`` is "jsdl",
    "json" or "yaml", or None to sniff (as :func:`gbroker.jobs.documents.loads_job_description`).

    A sweep's work grows with more than its size (its XPaths are evaluated over the template,
    and it may make :data:`~gbroker.core.arrays.MAX_ARRAY_SIZE` jobs): a broker reads one in a
    worker process under a time budget (:mod:`gbroker.daemon.bounded`), never on its loop."""
    loaded = _loads(data, document, fmt, max_bytes, expand=True)
    assert loaded is not None
    return loaded


def loads_job(
    data: str | bytes,
    *,
    document: str = "<job>",
    fmt: str | None = None,
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> JobDescription | None:
    """The job of a document without a sweep, as :func:`loads_submission` reads it; None for a
    document with a sweep, which is left unexpanded (no XPath evaluated, no job made)."""
    loaded = _loads(data, document, fmt, max_bytes, expand=False)
    assert not isinstance(loaded, JobArray)
    return loaded


def _loads(
    data: str | bytes, document: str, fmt: str | None, max_bytes: int, expand: bool
) -> JobDescription | JobArray | None:
    raw = data.encode() if isinstance(data, str) else data
    check_size(raw, document, max_bytes)
    fmt = fmt or document_format(raw)
    if not raw.strip():
        raise JsdlError(document, "document", "a job description", "an empty file")
    if fmt == "jsdl":
        return _xml_array(data, document, expand)
    if fmt not in ("json", "yaml"):
        raise ValueError(f"unknown job description format {fmt!r}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JsdlError(document, f"byte {exc.start}", "UTF-8 text", exc.reason) from None
    parsed = parse_json(text, document) if fmt == "json" else parse_yaml(text, document)
    return _mapping_array(parsed, document, expand)


def load_submission(
    path: str | PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES
) -> JobDescription | JobArray:
    """Read a job file (as :func:`gbroker.jobs.documents.load_job_description`), sweeps included."""
    file = Path(path)
    with file.open("rb") as handle:
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise JsdlError(
            str(path),
            "document",
            f"at most {max_bytes} bytes (the job description size limit)",
            file.stat().st_size,
        )
    return loads_submission(
        raw, document=str(path), fmt=_FORMATS.get(file.suffix.lower()), max_bytes=max_bytes
    )
