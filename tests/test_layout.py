"""The tree keeps the map of docs/DESIGN.md: each package imports only the packages below it, and
no modules import each other around a circle (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
OURS = ("gbroker", "netmon", "dcsmon")

# docs/DESIGN.md, "What may import what". errors is everyone's; cli may import anything.
ALLOWED: dict[str, set[str]] = {
    "gbroker.core": set(),
    "gbroker.app": set(),
    "gbroker.untrusted": set(),
    "gbroker.jobs": {"gbroker.core", "gbroker.untrusted"},
    "gbroker.topology": {"gbroker.core", "gbroker.untrusted"},
    "gbroker.security": set(),
    "gbroker.protocol": {"gbroker.core", "gbroker.jobs", "netmon"},
    "gbroker.mqtt": {"gbroker.core", "gbroker.protocol", "gbroker.security", "netmon", "dcsmon"},
    "gbroker.site": {"gbroker.app", "gbroker.core"},
    "gbroker.workloads": {"gbroker.core", "gbroker.jobs"},
    "gbroker.sim": {"gbroker.core", "gbroker.workloads", "gbroker.topology", "netmon"},
    "gbroker.daemon": {
        "gbroker.core",
        "gbroker.app",
        "gbroker.jobs",
        "gbroker.topology",
        "gbroker.security",
        "gbroker.protocol",
        "gbroker.mqtt",
        "gbroker.site",
        "netmon",
        "dcsmon",
    },
    "gbroker.client": {"gbroker.jobs", "gbroker.protocol", "gbroker.security"},
    "gbroker.fleet": {"gbroker.topology", "gbroker.mqtt", "gbroker.security", "gbroker.client"},
    "gbroker.tools": {
        "gbroker.fleet",
        "gbroker.client",
        "gbroker.topology",
        "gbroker.core",
    },
    "netmon": set(),
    "dcsmon": {"gbroker.core", "netmon"},  # its CPU sensor forecasts with netmon's ensemble
}
# Everyone's: the exceptions, and the root package, which imports nothing (checked below).
BASICS = {"gbroker.errors", "gbroker"}


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


def test_every_package_imports_only_what_the_map_allows() -> None:
    modules = _modules()
    wrong = defaultdict(set)
    for name, path in modules.items():
        source = _package(name)
        if source not in ALLOWED:
            continue
        for target in _imports(path, modules):
            other = _package(target)
            if other in (source, *BASICS) or other in ALLOWED[source]:
                continue
            wrong[name].add(target)
    assert not wrong, f"imports the map (docs/DESIGN.md) does not allow: {dict(wrong)}"


def test_every_package_is_on_the_map() -> None:
    packages = {_package(name) for name in _modules()}
    assert packages - ALLOWED.keys() == {"gbroker", "gbroker.cli", *BASICS, "gbroker.__main__"}


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
