#!/usr/bin/env bash
# Set up .venv (if needed, with the peer simulator AccaSim for validation) and run every quality
# gate: ruff lint, ruff format check, mypy, pytest. Installs mosquitto, Slurm (with munge),
# Chromium and Docker (with mmdebstrap) from Debian's packages when missing, and starts dockerd when none
# runs; the tests start their own daemons, fleets and images.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k ranking
#
# pytest runs twice: first every test not marked `serial`, on several workers (pytest-xdist, a
# test file per worker, GBROKER_TEST_WORKERS of them, default 4: most tests wait on processes
# and sockets, not on the 2 CPUs), then the `serial` ones alone, one after another: they time
# things (throughput, shaped links) or hold what the host has once (namespaces, containers,
# Slurm). A run that selects no test in one of the two is fine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,peer
bash scripts/ensure_mosquitto.sh
bash scripts/ensure_slurm.sh  # the benchmark's Slurm smoke tests start a single-node Slurm
bash scripts/ensure_docker.sh  # container fleets: docker.io, mmdebstrap, a running dockerd
bash scripts/ensure_chromium.sh  # the fleet dashboard's test drives Debian's Chromium headless
echo "== ruff check";         .venv/bin/ruff check .
echo "== ruff format --check"; .venv/bin/ruff format --check .
echo "== mypy";               .venv/bin/mypy
echo "== pytest (in parallel)"
parallel=0
.venv/bin/pytest -n "${GBROKER_TEST_WORKERS:-4}" --dist loadfile -m "not serial" "$@" || parallel=$?
echo "== pytest (serial)"
serial=0
.venv/bin/pytest -p no:xdist -m serial "$@" || serial=$?
# 5 is pytest's "no test selected": fine for one of the two (arguments that pick a few tests).
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
[ "$parallel" -eq 5 ] && parallel=0
[ "$serial" -eq 5 ] && serial=0
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
