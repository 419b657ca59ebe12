#!/usr/bin/env bash
# Mutation testing of the claim, lease, ranking and durability code (issue 10, item 7):
# mutmut mutates gbroker/core/{dispatch,site,ranking}.py and gbroker/daemon/journal.py
# ([tool.mutmut] in pyproject.toml) and runs, for each mutant, the fast tests that reach the
# mutated function (tests/core, tests/daemon/test_journal*.py). Prints the kill rate per module.
#   usage: scripts/mutation.sh            (about 10-20 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The protocol model check runs once per mutant that reaches it: fewer examples each time.
export GBROKER_MODEL_EXAMPLES=${GBROKER_MODEL_EXAMPLES:-40}
rm -rf mutants
nice -n 10 "$PY" -m mutmut run --max-children "$(nproc)" > mutants.log 2>&1 || true
"$PY" - <<'PY'
import json, pathlib
total_killed = total = 0
print(f"{'module':34} {'mutants':>8} {'killed':>7} {'survived':>9} {'kill rate':>10}")
for meta in sorted(pathlib.Path("mutants").rglob("*.py.meta")):
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    # pytest: 0 = every test passed (the mutant survived), 5 = no test reached it (survived);
    # anything else (failures, a crash, a timeout) killed it. None: not run.
    ran = {k: v for k, v in codes.items() if v is not None}
    survived = [k for k, v in ran.items() if v in (0, 5)]
    killed = len(ran) - len(survived)
    total += len(ran); total_killed += killed
    name = str(meta.relative_to("mutants"))[: -len(".meta")]
    print(f"{name:34} {len(ran):>8} {killed:>7} {len(survived):>9} {killed / max(1, len(ran)):>10.1%}")
print(f"{'all':34} {total:>8} {total_killed:>7} {total - total_killed:>9} {total_killed / max(1, total):>10.1%}")
print("survivors: .venv/bin/mutmut results; one mutant's diff: .venv/bin/mutmut show NAME")
PY
