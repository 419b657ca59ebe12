#!/usr/bin/env bash
# Set up .venv (if needed, with the peer simulator AccaSim for validation) and run every quality
# gate: ruff lint, ruff format check, mypy, pytest. Installs mosquitto, Slurm (with munge),
# Chromium and Docker (with mmdebstrap) from Debian's packages when missing, and starts dockerd when none
# runs; the tests start their own daemons, fleets and images.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k ranking
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
echo "== pytest";             .venv/bin/pytest "$@"
