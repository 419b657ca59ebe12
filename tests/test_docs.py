"""What the documentation names exists: README.md, docs/*.md and topologies/README.md against
the code.

- every option of a ``gbroker ...`` command line (in a code block or a `code span`) is an option
  of that very command (its ``--help``);
- every option of a ``python -m scripts.group.X ...`` (or ``python scripts/group/X.py``) or
  ``bash scripts/group/X.sh ...`` line is one that script defines, itself or through the functions
  of the modules of scripts/ it calls (``options.add_seeds(parser, ...)``);
- an option named alone (a span that starts with ``--``) is an option of some ``gbroker``
  command or of some script;
- every path of the repository a span names (``gbroker/...``, ``scripts/...``, ``docs/...``,
  ...), and every such path ending in a file extension anywhere in the text, exists;
- every module a span names (``gbroker.x.y``, ``netmon.x``), or the attribute it names in one,
  exists.

Commands of other tools (``sbatch --wrap``, ``mmdebstrap --variant``) and placeholders (``FILE``,
``<site>``, ``gbXXXX``) are not checked.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gbroker.cli import build_parser
from tests.conftest import ROOT

DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "topologies" / "README.md",
]
TOP = ("gbroker", "scripts", "tests", "docs", "topologies", "examples", "netmon", "dcsmon", ".ci")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(map(re.escape, TOP)) + r")/[\w./*<-]*")
TOPIC = "gbroker/v1/"  # MQTT topics (gbroker/v1/site/<site>/state) are no paths
FILE_EXTENSIONS = (".py", ".sh", ".md", ".c", ".yaml", ".json", ".jsdl", ".js", ".html", ".toml")
MODULE = re.compile(r"(?<![\w./-])(?:gbroker|netmon|dcsmon)(?:\.[A-Za-z_]\w*)+")


def _spans(text: str) -> Iterator[str]:
    """The text's code: each line of a fenced block (continuations joined), each `span`."""
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        yield from block.group(1).replace("\\\n", " ").splitlines()
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    yield from re.findall(r"`([^`\n]+)`", outside)


def _commands(span: str) -> Iterator[list[str]]:
    """The commands of a line of code, each as its words, without a prompt, a comment or
    leading variable assignments."""
    for part in re.split(r"&&|\|\||[;|]", span.split(" # ", 1)[0]):
        words = part.split()
        if words and words[0] == "$":
            words = words[1:]
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if words:
            yield words


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _every_option(parser: argparse.ArgumentParser) -> set[str]:
    found = _options(parser)
    for sub in _subparsers(parser).values():
        found |= _every_option(sub)
    return found


ARGUMENT = re.compile(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"")


def _module_file(dotted: str) -> Path | None:
    """The file of a module of scripts/ (``scripts.bench.bench_slurm``), if there is one."""
    path = ROOT.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(text: str) -> set[Path]:
    """The modules of scripts/ a script imports (``from scripts import options``,
    ``from scripts.experiments.figures import ...``, ``import scripts.orderly``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    found = (_module_file(name) for name in names if name.split(".")[0] == "scripts")
    return {path for path in found if path is not None}


def _called(name: str, text: str) -> bool:
    return name != "main" and re.search(rf"\b{re.escape(name)}\(", text) is not None


@functools.cache
def _functions(module: Path) -> dict[str, frozenset[str]]:
    """The options each function of a module of scripts/ adds to a parser: its own
    ``add_argument("--x"`` and those of the imported functions it calls."""
    text = module.read_text()
    imported: dict[str, frozenset[str]] = {}
    for other in _imported(text) - {module}:
        imported |= _functions(other)
    out: dict[str, frozenset[str]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            body = ast.get_source_segment(text, node) or ""
            found = set(ARGUMENT.findall(body))
            for name, options in imported.items():
                if _called(name, body):
                    found |= options
            out[node.name] = frozenset(found)
    return out


def _script_options(script: Path) -> set[str]:
    """Options a script defines: its ``add_argument("--x"`` and those the functions it calls
    of the modules of scripts/ it imports add; a shell script's every ``--x``."""
    text = script.read_text()
    if script.suffix == ".sh":
        return set(OPTION.findall(text))
    found = set(ARGUMENT.findall(text))
    for module in _imported(text) - {script}:
        for name, options in _functions(module).items():
            if _called(name, text):
                found |= options
    return found


PARSER = build_parser()
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.sh"))
KNOWN_OPTIONS = _every_option(PARSER).union(*(_script_options(s) for s in SCRIPTS))


def _missing(path: str) -> bool:
    """A path of the repository (a glob: none matches) that does not exist; placeholders
    (``<site>``) and MQTT topics are no paths."""
    path = path.rstrip(".")
    if "<" in path or path.startswith(TOPIC):
        return False
    if "*" in path:
        return not any(ROOT.glob(path))
    return not (ROOT / path).exists()


def _problems(doc: Path) -> Iterator[str]:
    text = doc.read_text()
    for span in _spans(text):
        if span.startswith("--"):
            for option in OPTION.findall(span.split()[0]):
                if option not in KNOWN_OPTIONS:
                    yield f"{option}: no gbroker command or script has it"
        for words in _commands(span):
            yield from _command_problems(words)
        for path in PATH.findall(span):
            if _missing(path):
                yield f"{path.rstrip('.')}: no such path"
        for module in MODULE.findall(span):
            if not _importable(module):
                yield f"{module}: no such module or attribute"
    for path in PATH.findall(text):  # in prose too: a path ending in a file's extension
        if path.rstrip(".").endswith(FILE_EXTENSIONS) and _missing(path):
            yield f"{path.rstrip('.')}: no such path"


def _command_problems(words: list[str]) -> Iterator[str]:
    name = words[0].rsplit("/", 1)[-1]
    if name == "gbroker":
        parser, path = PARSER, ["gbroker"]
        for word in words[1:]:
            sub = _subparsers(parser).get(word)
            if sub is None:
                break
            parser, path = sub, [*path, word]
        allowed = _options(parser)
        for option in OPTION.findall(" ".join(words[len(path) :])):
            if option not in allowed:
                yield f"{' '.join(path)} {option}: not an option of `{' '.join(path)}`"
    elif name in ("python", "python3", "bash") and len(words) > 1:
        if words[1:2] == ["-m"] and len(words) > 2 and words[2].startswith("scripts."):
            script, rest = words[2], words[3:]  # python -m scripts.bench.bench_daemon
            file = _module_file(script)
        elif words[1].startswith("scripts/"):
            script, rest = words[1], words[2:]
            file = ROOT / script if (ROOT / script).is_file() else None
        else:
            return
        if file is None:
            yield f"{script}: no such script"
            return
        allowed = _script_options(file)
        for option in OPTION.findall(" ".join(rest)):
            if option not in allowed:
                yield f"{script} {option}: not an option of {script}"


def _importable(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=[str(doc.relative_to(ROOT)) for doc in DOCS])
def test_what_the_documentation_names_exists(doc: Path) -> None:
    assert sorted(set(_problems(doc))) == []


def test_the_check_finds_what_is_missing(tmp_path: Path) -> None:
    """The check is no check that cannot fail: each kind of mistake is caught."""
    doc = tmp_path / "WRONG.md"
    doc.write_text(
        "Run `gbroker serve --site a --max-uploads 8GiB` or\n\n"
        "```sh\n$ GBROKER_FLEET=x gbroker fleet up --topology t.yaml \\\n    --no-such-flag\n"
        "python -m scripts.bench.bench_daemon --quick --slow\n"
        "python -m scripts.experiments.exp_koala --seeds 10 --plot k.png\n"
        "python -m scripts.experiments.gone --seeds 2\n"
        "bash scripts/setup/ensure_criu.sh --nothing\n```\n\n"
        "Alone: `--never-defined`. See `gbroker/topology.py`, scripts/gone.py, "
        "`tests/daemon/test_nothing*.py` and `gbroker.client.quick.NoSuchThing`; not "
        "`gbroker/v1/site/<site>/state`, `gbroker/fleet/` or `tests/daemon/test_journal*.py`.\n"
    )
    assert sorted(set(_problems(doc))) == sorted(
        [
            "--never-defined: no gbroker command or script has it",
            "gbroker fleet up --no-such-flag: not an option of `gbroker fleet up`",
            "gbroker serve --max-uploads: not an option of `gbroker serve`",
            "gbroker.client.quick.NoSuchThing: no such module or attribute",
            "gbroker/topology.py: no such path",
            "tests/daemon/test_nothing*.py: no such path",
            "scripts.bench.bench_daemon --slow: not an option of scripts.bench.bench_daemon",
            "scripts.experiments.exp_koala --plot: not an option of scripts.experiments.exp_koala",
            "scripts.experiments.gone: no such script",
            "scripts/setup/ensure_criu.sh --nothing: not an option of scripts/setup/ensure_criu.sh",
            "scripts/gone.py: no such path",
        ]
    )


def test_the_readme_lists_every_page_of_docs() -> None:
    """README.md's "Where to read on" is the index of docs/."""
    index = (ROOT / "README.md").read_text().split("## Where to read on", 1)[1]
    listed = set(re.findall(r"docs/[\w-]+\.md", index))
    assert listed == {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
