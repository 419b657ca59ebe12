"""Every script the repository names exists: a path (``scripts/setup/ensure_criu.sh``), a module
(``python -m scripts.experiments.exp_koala``) or a join (``ROOT / "scripts" / "setup" / ...``),
in the code, its error messages and docstrings, the tests, the documentation and the CI.

tests/test_docs.py checks the documentation's commands and their options; this checks the
names everywhere else too, so that moving a script cannot leave a message that sends a user to a
file that is gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

WHERE = ["README.md", "pyproject.toml", ".ci", "docs", "gbroker", "netmon", "dcsmon", "scripts",
         "tests", "topologies", "examples", "vendor/README.md"]  # fmt: skip
SUFFIXES = {".py", ".sh", ".md", ".toml", ".yaml", ".c", ".h", ".tsv", ""}
# tests/test_docs.py names missing scripts on purpose (its check of the check).
NOT = {ROOT / "tests" / "test_docs.py"}
PATH = re.compile(r"(?<![\w./-])scripts/(?:[\w/*-]|\\?\.)*[\w*]")  # a regex's \. too
MODULE = re.compile(r"(?<![\w./-])scripts(?:\.[a-z_]\w*)+")
JOIN = re.compile(r"\"scripts\"((?:\s*/\s*\"[\w.-]+\")+)")


def _files() -> Iterator[Path]:
    for name in WHERE:
        top = ROOT / name
        found = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in found:
            skipped = "__pycache__" in path.parts or "static" in path.parts or path in NOT
            if path.is_file() and path.suffix in SUFFIXES and not skipped:
                yield path


def _names(text: str) -> Iterator[str]:
    for path in PATH.findall(text):
        yield path.replace("\\", "")
    for module in MODULE.findall(text):
        if module.count(".") >= 2 or module.removeprefix("scripts.") in ("options", "orderly"):
            yield module
    for parts in JOIN.findall(text):
        yield "scripts/" + "/".join(re.findall(r"\"([\w.-]+)\"", parts))


def _exists(name: str) -> bool:
    if "/" not in name:  # a module
        path = ROOT.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    if "*" in name:
        return any(ROOT.glob(name))
    return (ROOT / name.rstrip(".")).exists()


def _missing() -> Iterator[str]:
    for path in _files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in _names(text):
            if not _exists(name):
                yield f"{path.relative_to(ROOT)}: {name}"


def test_every_script_the_repository_names_exists() -> None:
    assert sorted(set(_missing())) == []


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("run scripts/setup/ensure_criu.sh first", "scripts/setup/ensure_criu.sh"),
        ("`python -m scripts.experiments.exp_koala --seeds 10`", "scripts.experiments.exp_koala"),
        ('ROOT / "scripts" / "setup" / "ensure_slurm.sh"', "scripts/setup/ensure_slurm.sh"),
        (r'match=r"scripts/setup/ensure_mosquitto\.sh"', "scripts/setup/ensure_mosquitto.sh"),
        ("from scripts import orderly", None),  # imports are the interpreter's to check
    ],
)
def test_the_names_it_finds(text: str, name: str | None) -> None:
    assert list(_names(text)) == ([] if name is None else [name])
