#!/usr/bin/env bash
# Make sure both MPI flavours an SPMD job may name are installed, with their compilers: Open MPI
# (openmpi-bin, libopenmpi-dev: mpiexec.openmpi, mpicc.openmpi; 4.1 on Debian 12) and MPICH
# (mpich, libmpich-dev: mpiexec.mpich, mpicc.mpich; 4.0 on Debian 12). The `local` back-end
# launches an SPMD job's ranks with them (gbroker/site/spmd.py) and the tests compile
# examples/mpi_ranks.c with each. Idempotent: does nothing when all four tools are present.
set -euo pipefail
have_all() {
    for tool in mpiexec.openmpi mpicc.openmpi mpiexec.mpich mpicc.mpich; do
        command -v "$tool" >/dev/null 2>&1 || return 1
    done
}
if have_all; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" openmpi-bin libopenmpi-dev mpich libmpich-dev
if ! have_all; then
    echo "ensure_mpi.sh: mpiexec.openmpi, mpicc.openmpi, mpiexec.mpich or mpicc.mpich is" \
        "still missing after apt-get install" >&2
    exit 1
fi
