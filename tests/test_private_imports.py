"""No module of gbroker takes another module's private names (issue 36): what two modules share is
public, in a module named for what it is. A private name starts with one underscore (dunders such
as ``__version__`` are public); taking one is importing it (``from gbroker.jobs.x import _y``) or
reaching it through an imported module or name (``safeyaml._y``, ``SlurmBackend._y``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("gbroker", "netmon", "dcsmon")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module ``node`` imports from, its relative form resolved against ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def private_uses(path: Path, root: Path) -> list[str]:
    """Where ``path`` takes a private name of another module of ours: ``file:line: what``."""
    module = _module_of(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    found: list[tuple[int, str]] = []
    imported: set[str] = set()  # local names bound to a module or name of ours
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, package)
            if source.split(".")[0] not in OURS or source == module:
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"from {source} import {alias.name}"))
                else:
                    imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        base: ast.expr = node.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and base.id in imported:
            found.append((node.lineno, ast.unparse(node)))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_takes_another_modules_private_names() -> None:
    found = [
        use for path in sorted((ROOT / "gbroker").rglob("*.py")) for use in private_uses(path, ROOT)
    ]
    assert not found, "private names taken across modules (make them public):\n" + "\n".join(found)


def test_the_check_finds_each_way_of_taking_one(tmp_path: Path) -> None:
    package = tmp_path / "gbroker" / "jobs"
    package.mkdir(parents=True)
    (package / "reader.py").write_text(
        "from gbroker.jobs.description import JsdlError, _DESC\n"
        "from . import _helpers\n"
        "from gbroker import __version__\n"
        "import gbroker.jobs.safeyaml as safeyaml\n"
        "from gbroker.jobs import mapping\n"
        "\n"
        "def _mine() -> None:\n"
        "    safeyaml._load()\n"
        "    mapping.inner._parse()\n"
        "    JsdlError._field\n"
        "    unrelated._fine\n"
    )
    assert private_uses(package / "reader.py", tmp_path) == [
        "gbroker/jobs/reader.py:1: from gbroker.jobs.description import _DESC",
        "gbroker/jobs/reader.py:2: from gbroker.jobs import _helpers",
        "gbroker/jobs/reader.py:8: safeyaml._load",
        "gbroker/jobs/reader.py:9: mapping.inner._parse",
        "gbroker/jobs/reader.py:10: JsdlError._field",
    ]
