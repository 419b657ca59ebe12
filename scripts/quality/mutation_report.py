"""The kill rate per module of the last mutation run (mutants/), and every survivor not explained.

Called by ``scripts/quality/mutation.sh``. A surviving mutant counts as *equivalent* (no test can
tell it from the code) only if it is explained, in one of two ways:

- it only changes the letter case of SQL text (a string literal with an SQL keyword in capitals,
  or a parenthesised column list, with no quote inside and no CREATE, whose names SQLite stores
  as written: SQLite reads keywords, table and column names, savepoint names and pragma values
  regardless of case) or of the codec name ``utf-8``;
- or its module, function and diff (the line before the change, the lines it removes and adds)
  are listed, with the reason, in ``scripts/quality/mutation-equivalent.tsv``. Each reason is
  explained in docs/RESILIENCE.md.

A listed mutant whose code changes no longer matches its entry, so it shows up as unexplained
until someone reads it again. Exit status 1 if a survivor is unexplained.

A mutant that was killed although it matches one of these is reported too: either a test failed
for another reason (a flaky test: sibling workers once named the same port, see
gbroker/fleet/ports.py), or the explanation is wrong. ``--doubtful`` prints just their names:
``scripts/quality/mutation.sh`` runs them once more before its report, which lists them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

MUTMUT = ".venv/bin/mutmut"
EXPLAINED = Path(__file__).with_name("mutation-equivalent.tsv")

_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
_SQL_WORD = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|FROM|WHERE|SET|VALUES|ORDER BY|LIMIT|COALESCE|"
    r"PRAGMA|BEGIN|COMMIT|SAVEPOINT|RELEASE|ROLLBACK|INTO|NULL)\b"
)
_COLUMNS = re.compile(r"\s*\(\w+(, \w+)*\)\s*")


def _sql_text(text: str) -> bool:
    if "'" in text or "CREATE" in text:  # a string literal, or names stored as written
        return False
    return _SQL_WORD.search(text) is not None or _COLUMNS.fullmatch(text) is not None


def case_only(removed: list[str], added: list[str]) -> bool:
    """Whether the mutant only changes the case of SQL text or of the codec name utf-8."""
    if len(removed) != 1 or len(added) != 1:
        return False
    old, new = removed[0], added[0]
    if old == new or old.lower() != new.lower():
        return False
    if _LITERAL.sub('""', old) != _LITERAL.sub('""', new):
        return False  # code outside the string literals changed
    pairs = zip(_LITERAL.findall(old), _LITERAL.findall(new), strict=True)
    return all(a == b or a.lower() == '"utf-8"' or _sql_text(a[1:-1]) for a, b in pairs)


def function_of(mutant: str) -> str:
    """``gbroker.core.dispatch.xǁBrokerǁ_finished__mutmut_13`` -> ``Broker._finished``."""
    name = mutant.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[1]
    return name[2:].replace("ǁ", ".") if name.startswith("xǁ") else name[2:]


def _shown(mutant: str, module: str) -> str:
    """The mutant's unified diff: through mutmut's own function when this mutmut has it (fast
    enough for every mutant), else through ``mutmut show``."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
    except ImportError:
        shown = subprocess.run([MUTMUT, "show", mutant], capture_output=True, text=True)
        return shown.stdout
    return str(get_diff_for_mutant(mutant, path=module))


def diff(mutant: str, module: str) -> tuple[str, list[str], list[str]]:
    """The line before the change, and the lines the mutant removes and adds, stripped."""
    lines = [line for line in _shown(mutant, module).splitlines() if not line.startswith("@@")]
    lines = [line for line in lines if not line.startswith(("---", "+++"))]
    changed = next((n for n, line in enumerate(lines) if line[:1] in "-+"), len(lines))
    before = next((line[1:].strip() for line in reversed(lines[:changed]) if line.strip()), "")
    removed = [line[1:].strip() for line in lines if line.startswith("-")]
    added = [line[1:].strip() for line in lines if line.startswith("+")]
    return before, removed, added


def key_of(mutant: str, module: str) -> tuple[tuple[str, ...], list[str], list[str]]:
    before, removed, added = diff(mutant, module)
    changes = (*(f"-{r}" for r in removed), *(f"+{a}" for a in added))
    return (module, function_of(mutant), f"~{before}", *changes), removed, added


def explained() -> dict[tuple[str, ...], str]:
    """(module, function, '~line before', '-removed'..., '+added'...) -> reason."""
    out = {}
    for line in EXPLAINED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            module, function, reason, *changes = line.split("\t")
            out[(module, function, *changes)] = reason
    return out


_SURVIVED = (0, 5, 33)


def main(argv: list[str]) -> int:
    listed = explained()
    rows = []
    unexplained: list[tuple[str, list[str], list[str]]] = []
    doubtful: list[str] = []  # killed, yet explained as equivalent
    totals = [0, 0, 0]  # mutants, killed, equivalent
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        # pytest: 0 = every test passed (the mutant survived), 5 = no test reached it
        # (survived); mutmut's 33 = no test selected calls the function (survived: it was
        # counted killed until 2026-11-25); anything else (failures, a crash, a timeout)
        # killed it. None: not run.
        ran = {k: v for k, v in codes.items() if v is not None}
        survivors = sorted(k for k, v in ran.items() if v in _SURVIVED)
        module = str(meta.relative_to("mutants"))[: -len(".meta")]
        case, reasoned = 0, 0
        for mutant, code in sorted(ran.items()):
            key, removed, added = key_of(mutant, module)
            if code not in _SURVIVED:
                if case_only(removed, added) or key in listed:
                    doubtful.append(mutant)
            elif case_only(removed, added):
                case += 1
            elif key in listed:
                reasoned += 1
            else:
                unexplained.append((mutant, removed, added))
        killed = len(ran) - len(survivors)
        equivalent = case + reasoned
        rows.append((module, len(ran), killed, len(survivors), case, reasoned, equivalent))
        totals[0] += len(ran)
        totals[1] += killed
        totals[2] += equivalent
    if "--doubtful" in argv:
        print("\n".join(doubtful))
        return 0
    if totals[0] == 0:
        # mutmut stopped before any mutant ran (its test run failed: see mutants.log)
        print("no mutant ran: mutmut failed before testing (see mutants.log)", file=sys.stderr)
        return 2
    print(
        f"{'module':27} {'mutants':>7} {'killed':>6} {'survived':>8} {'kill rate':>9}"
        f" {'equivalent (SQL case + listed)':>30} {'unexplained':>11} {'of the rest':>11}"
    )
    for module, n, killed, survived, case, reasoned, equivalent in rows:
        print(
            f"{module:27} {n:>7} {killed:>6} {survived:>8} {killed / max(1, n):>9.1%}"
            f" {f'{equivalent} ({case} + {reasoned})':>30} {survived - equivalent:>11}"
            f" {killed / max(1, n - equivalent):>11.1%}"
        )
    n, killed, equivalent = totals
    print(
        f"{'all':27} {n:>7} {killed:>6} {n - killed:>8} {killed / max(1, n):>9.1%}"
        f" {equivalent:>30} {n - killed - equivalent:>11} {killed / max(1, n - equivalent):>11.1%}"
    )
    print(
        "kill rate: killed / mutants. of the rest: killed / (mutants - equivalent).\n"
        "equivalent: survivors that only change the case of SQL text or the codec name utf-8,\n"
        f"and those listed with their reason in {EXPLAINED} (docs/RESILIENCE.md).\n"
        f"one mutant's diff: {MUTMUT} show NAME"
    )
    rerun = Path("mutants/doubtful.txt")
    if rerun.exists():
        names = rerun.read_text().split()
        print(f"\nrun twice, being killed at first though explained as equivalent: {len(names)}")
        for mutant in names:
            print(f"  {mutant}")
    if doubtful:
        print(f"\n{len(doubtful)} killed although explained as equivalent (run each alone again):")
        for mutant in doubtful:
            print(f"  {mutant}")
    if unexplained:
        print(f"\n{len(unexplained)} survivors not explained:")
        for mutant, removed, added in unexplained:
            print(f"  {mutant}")
            for line in removed:
                print(f"    - {line}")
            for line in added:
                print(f"    + {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
