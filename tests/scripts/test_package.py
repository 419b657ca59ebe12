"""scripts/ is a package: each Python script is a module of it (``python -m scripts.bench.X``)
and imports the others as modules, never through ``sys.path``."""

from __future__ import annotations

import ast
from typing import TypeGuard

from tests.conftest import ROOT

SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))


def test_every_folder_of_python_scripts_is_a_package() -> None:
    folders = {path.parent for path in SCRIPTS}
    assert (
        sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []
    )


def _uses_sys_path(node: ast.AST) -> TypeGuard[ast.Attribute]:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def test_no_script_changes_sys_path() -> None:
    changing = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in SCRIPTS
        for node in ast.walk(ast.parse(path.read_text()))
        if _uses_sys_path(node)
    ]
    assert changing == []


def test_scripts_import_each_other_as_modules_of_the_package() -> None:
    """A bare ``import orderly`` worked only with the script's folder on ``sys.path``."""
    ours = {path.stem for path in SCRIPTS}
    bare = []
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module.split(".")[0]]
            bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n in ours - {"scripts"}]
    assert bare == []
