"""The daemon never asks which back-end it has (issue 36; STYLE 17, 18): outside ``gbroker/site``
no module tests an object against a back-end class (``isinstance``, ``issubclass``). What differs
between back-ends (can it resize, what its health report adds, who its jobs run as) is on the
seam, :class:`gbroker.site.backend.Backend`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "gbroker" / "site"


def back_end_classes(site: Path = SITE) -> set[str]:
    """The seam, every class in ``site`` that says whether it resizes (a back-end), and their
    subclasses."""
    classes = [
        node
        for path in site.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
    ]
    names = {"Backend"} | {
        node.name
        for node in classes
        for item in node.body
        for target in (
            item.targets
            if isinstance(item, ast.Assign)
            else [item.target]
            if isinstance(item, ast.AnnAssign)
            else []
        )
        if isinstance(target, ast.Name) and target.id == "resizes"
    }
    while more := {
        node.name
        for node in classes
        if node.name not in names
        and any(isinstance(base, ast.Name) and base.id in names for base in node.bases)
    }:
        names |= more
    return names


def type_tests(source: str, classes: set[str], where: str = "<source>") -> list[str]:
    """Where ``source`` calls ``isinstance`` or ``issubclass`` with one of ``classes``."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            continue
        for part in ast.walk(node.args[1]):
            name = part.id if isinstance(part, ast.Name) else getattr(part, "attr", None)
            if name in classes:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_back_ends_are_found() -> None:
    assert {"Backend", "Executor", "SlurmBackend", "GridEngineBackend"} <= back_end_classes()


def test_no_module_outside_the_site_asks_which_back_end_it_has() -> None:
    classes = back_end_classes()
    found = [
        use
        for package in ("gbroker", "netmon", "dcsmon")
        for path in sorted((ROOT / package).rglob("*.py"))
        if SITE not in path.parents
        for use in type_tests(path.read_text(), classes, str(path.relative_to(ROOT)))
    ]
    assert not found, "put what differs on the Backend seam instead:\n" + "\n".join(found)


def test_the_check_finds_each_way_of_asking() -> None:
    source = (
        "if isinstance(backend, Executor): pass\n"
        "if isinstance(b, (slurm.SlurmBackend, int)): pass\n"
        "if issubclass(kind, GridEngineBackend | None): pass\n"
        "if isinstance(b, Path): pass\n"
    )
    found = type_tests(source, {"Executor", "SlurmBackend", "GridEngineBackend"})
    assert [use.split(":")[1] for use in found] == ["1", "2", "3"]
