"""The code's prose stays prose: a module docstring is a theory of operation, not a manual,
and the code carries no issue numbers (they are the git log's history).

A module's usage, options, measured figures and long examples belong in its docs/ page, which
the docstring points to.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

MAX_DOCSTRING_LINES = 40


ISSUE = re.compile(r"\bissues? #?[0-9]+|\(#[0-9]+\)", re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted((ROOT / "gbroker").rglob("*.py"))


def _docstring_lines(path: Path) -> int:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return len(docstring.splitlines()) if docstring else 0


def test_module_docstrings_are_theories_of_operation() -> None:
    too_long = {
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in _modules()
        if (lines := _docstring_lines(path)) > MAX_DOCSTRING_LINES
    }
    assert not too_long, (
        f"module docstrings over {MAX_DOCSTRING_LINES} lines (keep the theory of operation, "
        f"move usage, options, figures and examples to docs/): {sorted(too_long)}"
    )


def test_no_issue_numbers_in_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, f"issue numbers belong in the git log, not the code: {found}"
