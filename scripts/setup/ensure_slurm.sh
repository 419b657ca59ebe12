#!/usr/bin/env bash
# Make sure Slurm clusters can be started (gbroker/fleet/slurm.py: a fleet's Slurm sites, the
# benchmarks): Debian's slurm-wlm (slurmctld, slurmd and the client commands, 22.05 on Debian 12)
# and munge (its authentication).
# Idempotent: does nothing when every tool a cluster uses is present (gbroker/fleet/slurm.py's
# TOOLS: munged, mungekey, slurmctld, slurmd, sbatch, squeue, sinfo, scancel).
# Installs the Debian packages but never starts their services, and disables the systemd units the
# packages enable (the benchmark starts its own munged, slurmctld and slurmd and stops them).
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"
have_all() {
    for tool in munged mungekey slurmctld slurmd sbatch squeue sinfo scancel; do
        command -v "$tool" >/dev/null 2>&1 || return 1
    done
}
if have_all; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" slurmctld slurmd slurm-client munge
# Best effort: without systemd (a container) there is nothing to disable.
if command -v systemctl >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo systemctl disable --quiet slurmctld slurmd munge 2>/dev/null ||
        echo "ensure_slurm.sh: could not disable the slurmctld, slurmd and munge units" >&2
fi
if ! have_all; then
    echo "ensure_slurm.sh: munged, mungekey, slurmctld, slurmd, sbatch, squeue or sinfo is" \
        "still missing after apt-get install" >&2
    exit 1
fi
