#!/usr/bin/env bash
# Make sure a single-node Slurm can be started by scripts/bench_daemon.py: Debian's slurm-wlm
# (slurmctld, slurmd and the client commands, 22.05 on Debian 12) and munge (its authentication).
# Idempotent: does nothing when slurmctld, slurmd, sbatch, scontrol and munged are all present.
# Installs the Debian packages but never starts or enables their services (the benchmark starts
# its own slurmctld, slurmd and, when none is running, munged, and stops what it started).
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"
have_all() {
    for tool in slurmctld slurmd sbatch scontrol squeue munged; do
        command -v "$tool" >/dev/null 2>&1 || return 1
    done
}
if have_all; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
# policy-rc.d exit 101 keeps the packages' post-install from starting the services.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    created_policy=1
fi
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        $sudo rm -f "$policy"
    fi
}
trap cleanup EXIT
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge
if ! have_all; then
    echo "ensure_slurm.sh: slurmctld, slurmd, sbatch, scontrol, squeue or munged is still" \
        "missing after apt-get install" >&2
    exit 1
fi
