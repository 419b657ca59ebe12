#!/usr/bin/env bash
# Mutation testing of the claim, lease, ranking and durability code (issue 10, item 7):
# mutmut mutates gbroker/core/{dispatch,site,ranking}.py and gbroker/daemon/journal.py
# ([tool.mutmut] in pyproject.toml) and runs, for each mutant, the fast tests that reach the
# mutated function (tests/core, tests/daemon/test_journal*.py). Prints the kill rate per module.
#   usage: scripts/mutation.sh            (about 40-60 minutes on 2 cores)
#          scripts/mutation.sh --report   (the table again, from the last run's mutants/)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The protocol model check runs once per mutant that reaches it: fewer examples each time.
export GBROKER_MODEL_EXAMPLES=${GBROKER_MODEL_EXAMPLES:-40}
if [ "${1:-}" != "--report" ]; then
    rm -rf mutants
    nice -n 10 "$PY" -m mutmut run --max-children "$(nproc)" > mutants.log 2>&1 || true
fi
"$PY" - <<'PY'
import json, pathlib, subprocess

def case_only(name: str) -> bool:
    """A journal mutant that only changes the letter case of a string: an SQL statement (SQLite's
    keywords, table and column names are case-insensitive) or a codec name ("UTF-8"). Equivalent:
    no test can kill it."""
    diff = subprocess.run([".venv/bin/mutmut", "show", name], capture_output=True, text=True).stdout
    old = [l[1:] for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    new = [l[1:] for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    return len(old) == len(new) == 1 and old != new and old[0].lower() == new[0].lower()

total_killed = total = total_equivalent = 0
print(f"{'module':34} {'mutants':>8} {'killed':>7} {'survived':>9} {'kill rate':>10}"
      f" {'equivalent':>11} {'rate w/o them':>14}")
for meta in sorted(pathlib.Path("mutants").rglob("*.py.meta")):
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    # pytest: 0 = every test passed (the mutant survived), 5 = no test reached it (survived);
    # anything else (failures, a crash, a timeout) killed it. None: not run.
    ran = {k: v for k, v in codes.items() if v is not None}
    survived = [k for k, v in ran.items() if v in (0, 5)]
    killed = len(ran) - len(survived)
    name = str(meta.relative_to("mutants"))[: -len(".meta")]
    equivalent = sum(case_only(k) for k in survived) if name.endswith("journal.py") else 0
    total += len(ran); total_killed += killed; total_equivalent += equivalent
    rate = killed / max(1, len(ran))
    adjusted = killed / max(1, len(ran) - equivalent)
    print(f"{name:34} {len(ran):>8} {killed:>7} {len(survived):>9} {rate:>10.1%}"
          f" {equivalent:>11} {adjusted:>14.1%}")
print(f"{'all':34} {total:>8} {total_killed:>7} {total - total_killed:>9}"
      f" {total_killed / max(1, total):>10.1%} {total_equivalent:>11}"
      f" {total_killed / max(1, total - total_equivalent):>14.1%}")
print("equivalent: journal mutants that only change the letter case of an SQL statement or a")
print("codec name (SQLite and Python's codecs ignore case); every other survivor counts.")
print("survivors: .venv/bin/mutmut results; one mutant's diff: .venv/bin/mutmut show NAME")
PY
