#!/usr/bin/env bash
# Mutation testing of the claim, lease, ranking and durability code (issue 10, item 7):
# mutmut mutates gbroker/core/{dispatch,site,ranking}.py and gbroker/daemon/journal.py
# ([tool.mutmut] in pyproject.toml) and runs, for each mutant, the fast tests that reach the
# mutated function (tests/core, tests/daemon/test_journal*.py). Prints the kill rate per module
# and every survivor that is not explained as equivalent (scripts/quality/mutation_report.py; the
# explained ones: scripts/quality/mutation-equivalent.tsv and docs/RESILIENCE.md).
#   usage: scripts/quality/mutation.sh            (about 15-25 minutes on 2 cores)
#          scripts/quality/mutation.sh --report   (the table again, from the last run's mutants/)
# Exit status 1 if a survivor is not explained.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
# The protocol model check runs once per mutant that reaches it: fewer examples each time.
export GBROKER_MODEL_EXAMPLES=${GBROKER_MODEL_EXAMPLES:-40}
if [ "${1:-}" != "--report" ]; then
    rm -rf mutants
    nice -n 10 "$PY" -m mutmut run --max-children "$(nproc)" > mutants.log 2>&1 || true
    # A mutant explained as equivalent that was killed anyway: a test that failed for another
    # reason, or a wrong explanation. It gets one more run; the report lists it either way.
    doubtful=$("$PY" scripts/quality/mutation_report.py --doubtful)
    if [ -n "$doubtful" ]; then
        echo "$doubtful" > mutants/doubtful.txt
        # shellcheck disable=SC2086  # one mutant name per word
        nice -n 10 "$PY" -m mutmut run --max-children "$(nproc)" $doubtful >> mutants.log 2>&1 || true
    fi
fi
exec "$PY" scripts/quality/mutation_report.py
