#!/usr/bin/env bash
# Set up .venv (if needed, with the peer simulator AccaSim for validation) and run every quality
# gate: ruff lint, ruff format check, mypy, pytest. Installs mosquitto, Open MPI and MPICH, Slurm
# (with munge), Chromium, Docker (with mmdebstrap) and QEMU (with a kernel for the cgroup v2 VM) from Debian's
# packages when missing, and starts dockerd when none runs; the tests start their own daemons,
# fleets, images and VMs.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k ranking
#
# pytest runs twice: first every test not marked `serial`, on several workers (pytest-xdist, a
# test file per worker, GBROKER_TEST_WORKERS of them, default 4: most tests wait on processes
# and sockets, not on the 2 CPUs), then the `serial` ones alone, one after another: they time
# things (throughput, shaped links) or hold what the host has once (namespaces, containers,
# Slurm). A run that selects no test in one of the two is fine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup/setup.sh dev,peer
bash scripts/setup/ensure_mosquitto.sh
bash scripts/setup/ensure_criu.sh >/dev/null  # CRIU 4.2 (built from vendor/, cached): checkpoints of running jobs
bash scripts/setup/ensure_job_numpy.sh  # examples/jacobi2d.py: numpy for the python3 jobs run
bash scripts/setup/ensure_mpi.sh  # SPMD jobs: Open MPI and MPICH, launchers and compilers
bash scripts/setup/ensure_slurm.sh  # Slurm clusters: the benchmark's smoke tests, Slurm sites of fleets
bash scripts/setup/ensure_gridengine.sh  # Grid Engine sites: a private cell per site (gbroker.fleet.gridengine)
bash scripts/setup/ensure_docker.sh  # container fleets: docker.io, mmdebstrap, a running dockerd
bash scripts/setup/ensure_chromium.sh  # the fleet dashboard's test drives Debian's Chromium headless
bash scripts/setup/setup-vm.sh  # QEMU and a kernel: the cgroup v2 VM of tests/site/test_cgroup2_vm.py
# Meanwhile, in the background: the container image that the serial tests' container fleets run
# (a minute of building, overlapped with the checks and the parallel tests; those tests then
# find it up to date, and build it themselves if this failed).
image_log=$(mktemp -t gbroker-image-build.XXXXXX)
.venv/bin/gbroker image build >"$image_log" 2>&1 &
image_build=$!
trap 'kill "$image_build" 2>/dev/null || true' EXIT  # a failed check need not wait for it
echo "== ruff check";         .venv/bin/ruff check .
echo "== ruff format --check"; .venv/bin/ruff format --check .
echo "== mypy";               .venv/bin/mypy
echo "== pytest (in parallel)"
parallel=0
.venv/bin/pytest -n "${GBROKER_TEST_WORKERS:-4}" --dist loadfile -m "not serial" --durations=0 --durations-min=5 "$@" || parallel=$?
if ! wait "$image_build"; then
    echo "== gbroker image build failed in the background (the container tests say why):"
    cat "$image_log"
fi
rm -f "$image_log"
echo "== pytest (serial)"
serial=0
# A failed serial test runs once more (listed as rerun in the summary): test_bounded_work's
# explain (readers not ready in 60 s) and jacobi_real (a plan with no rows) each failed once in
# four runs of one tree, causes not yet found.
.venv/bin/pytest -p no:xdist -m serial --reruns 1 --reruns-delay 2 --durations=0 --durations-min=5 "$@" || serial=$?
# 5 is pytest's "no test selected": fine for one of the two (arguments that pick a few tests).
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
[ "$parallel" -eq 5 ] && parallel=0
[ "$serial" -eq 5 ] && serial=0
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
