#!/usr/bin/env bash
# Build the sample MPI program examples/mpi_ranks.c for both MPI flavours a site runs:
# DIR/mpi_ranks.openmpi (mpicc.openmpi) and DIR/mpi_ranks.mpich (mpicc.mpich), mode 0755, where
# the jobs' users can run them (examples/mpi-ranks.yaml names them there).
# Usage: bash examples/build_mpi_ranks.sh [DIR]   (default /usr/local/libexec/gbroker-examples;
# scripts/setup/ensure_mpi.sh installs the compilers)
set -euo pipefail
dir="${1:-/usr/local/libexec/gbroker-examples}"
source="$(dirname "$0")/mpi_ranks.c"
mkdir -p "$dir"
chmod 0755 "$dir"
for flavour in openmpi mpich; do
    "mpicc.$flavour" -O2 -o "$dir/mpi_ranks.$flavour" "$source"
    chmod 0755 "$dir/mpi_ranks.$flavour"
done
echo "built $dir/mpi_ranks.openmpi and $dir/mpi_ranks.mpich"
