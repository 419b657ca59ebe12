"""The tree keeps the map of docs/DESIGN.md: each package imports only what the "May import:" line
of its ``__init__`` docstring names (the one source of the rules), and no modules import each
other around a circle (lazy imports inside functions count too). The core is sans-I/O: it imports
no module that does I/O, reads a clock or draws global randomness; gbroker.app imports the
standard library only."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import networkx as nx  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
OURS = ("gbroker", "netmon", "dcsmon")
# Everyone's: the exceptions, and the root package, which imports nothing (checked below).
BASICS = {"gbroker.errors", "gbroker"}
# What the sans-I/O core may not import: I/O, clocks, processes, global randomness.
NOT_IN_THE_CORE = {
    "asyncio",
    "socket",
    "time",
    "random",
    "datetime",
    "subprocess",
    "sqlite3",
}


@dataclass(frozen=True)
class Rule:
    """A package's "May import:" line: ``anything`` (the command line), or the packages of ours it
    names (with ``and below``, what those may import too) and whether it keeps to the standard
    library."""

    anything: bool
    packages: frozenset[str]
    below: bool
    stdlib_only: bool


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "gbroker" or len(parts) == 1:
        return parts[0]
    return f"gbroker.{parts[1]}"


def _modules() -> dict[str, Path]:
    found = {}
    for top in OURS:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _packages() -> dict[str, Path]:
    """Each package on the map and its ``__init__``: the top-level packages of gbroker, netmon
    and dcsmon."""
    found = {top: ROOT / top / "__init__.py" for top in ("netmon", "dcsmon")}
    for init in sorted((ROOT / "gbroker").glob("*/__init__.py")):
        found[f"gbroker.{init.parent.name}"] = init
    return found


def _rule(init: Path) -> Rule:
    """The rule its ``__init__`` docstring states, from "May import" to the end of its sentence
    or clause (``;``): ``:mod:`` references name the packages of ours."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    found = re.search(r"May import(.*?)(?:;|\.(?:\s|$))", doc, re.DOTALL)
    assert found, f"{init.relative_to(ROOT)}: its docstring has no 'May import:' line"
    line = " ".join(found.group(1).split())
    names = {_package(name) for name in re.findall(r":mod:`([\w.]+)`", line)}
    return Rule(
        anything="anything" in line,
        packages=frozenset(names),
        below="and below" in line,
        stdlib_only="standard library only" in line,
    )


def _rules() -> dict[str, Rule]:
    return {package: _rule(init) for package, init in _packages().items()}


def _allowed(rules: dict[str, Rule]) -> dict[str, set[str]]:
    """What each package may import of ours; ``and below`` adds, transitively, what the named
    packages may import."""
    allowed: dict[str, set[str]] = {}
    for package, rule in rules.items():
        reach = set(rule.packages)
        todo = list(reach) if rule.below else []
        while todo:
            below = rules.get(todo.pop())
            for other in (below.packages if below else set()) - reach:
                reach.add(other)
                todo.append(other)
        allowed[package] = reach
    return allowed


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``path`` imports, anywhere in it (a name imported from a
    package that is itself a module counts as that module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in OURS)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
    return out


def _outside_imports(path: Path) -> set[str]:
    """The top-level names of the modules not of ours that ``path`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out - set(OURS) - {"__future__"}


def test_every_package_imports_only_what_its_init_allows() -> None:
    modules = _modules()
    rules = _rules()
    allowed = _allowed(rules)
    wrong = defaultdict(set)
    for name, path in modules.items():
        source = _package(name)
        if source not in rules or rules[source].anything:
            continue
        for target in _imports(path, modules):
            other = _package(target)
            if other in (source, *BASICS) or other in allowed[source]:
                continue
            wrong[name].add(target)
    assert not wrong, f"imports their package's 'May import:' line does not allow: {dict(wrong)}"


def test_every_package_is_on_the_map() -> None:
    packages = {_package(name) for name in _modules()}
    assert packages - _packages().keys() == {*BASICS, "gbroker.__main__"}


def test_every_rule_names_packages_on_the_map() -> None:
    rules = _rules()
    named = {name for rule in rules.values() for name in rule.packages}
    assert named - rules.keys() <= BASICS


def test_the_command_line_alone_may_import_anything() -> None:
    assert [package for package, rule in _rules().items() if rule.anything] == ["gbroker.cli"]


def test_packages_of_the_standard_library_only_import_nothing_else() -> None:
    modules = _modules()
    rules = _rules()
    strict = {package for package, rule in rules.items() if rule.stdlib_only}
    assert {"gbroker.core", "gbroker.app"} <= strict
    wrong = {
        name: sorted(outside)
        for name, path in modules.items()
        if _package(name) in strict
        and (outside := _outside_imports(path) - sys.stdlib_module_names)
    }
    assert not wrong, f"imports beyond the standard library: {wrong}"


def test_the_core_reads_no_clock_does_no_io_and_draws_no_global_randomness() -> None:
    modules = _modules()
    wrong = {
        name: sorted(found)
        for name, path in modules.items()
        if _package(name) == "gbroker.core" and (found := _outside_imports(path) & NOT_IN_THE_CORE)
    }
    assert not wrong, f"the sans-I/O core imports {wrong}"


def test_no_modules_import_each_other_around_a_circle() -> None:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path, modules):
            if target != name and not name.startswith(target + ".") and target in modules:
                graph.add_edge(name, target)
    circles = [c for c in nx.simple_cycles(graph) if len(c) > 1]
    assert not circles, f"modules that import each other: {circles[:5]}"


def test_no_loose_modules_beside_the_packages() -> None:
    loose = sorted(p.name for p in (ROOT / "gbroker").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py"]


def test_the_root_package_imports_nothing_of_ours() -> None:
    modules = _modules()
    assert _imports(ROOT / "gbroker" / "__init__.py", modules) == set()
