#!/usr/bin/env bash
# Make sure a private Grid Engine cell can be started by gbroker.fleet.gridengine (a fleet's
# `manager: gridengine` sites, tests/site/test_gridengine.py): Debian's Grid Engine 8.1.9
# (gridengine-master: sge_qmaster; gridengine-exec: sge_execd and sge_shepherd; gridengine-client:
# qsub, qstat, qdel, qrls, qhost, qconf, qacct). Idempotent: does nothing when every tool is there.
# Installs the packages without letting them configure a cluster of their own (the debconf
# question shared/gridengineconfig answered false: no /var/lib/gridengine/default cell is made)
# and never starts their services (scripts/setup/apt_install.sh); a cell is each fleet's own, under its
# directory, with its own ports.
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"
tools="sge_qmaster sge_execd qsub qstat qdel qrls qhost qconf qacct"
have_all() {
    local tool
    for tool in $tools; do
        command -v "$tool" >/dev/null 2>&1 || return 1
    done
    [ -x /usr/lib/gridengine/spoolinit ] && [ -x /usr/lib/gridengine/spooldefaults ]
}
if have_all; then
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# Without this answer the packages' post-install makes and starts the system's own cell.
printf '%s\n' \
    "gridengine-common shared/gridengineconfig boolean false" \
    "gridengine-master shared/gridengineconfig boolean false" \
    "gridengine-client shared/gridengineconfig boolean false" \
    "gridengine-exec shared/gridengineconfig boolean false" | $sudo debconf-set-selections
bash "$(dirname "$0")/apt_install.sh" gridengine-common gridengine-master gridengine-exec \
    gridengine-client
# Best effort: without systemd (a container) there is nothing to disable.
if command -v systemctl >/dev/null 2>&1; then
    $sudo systemctl disable --quiet gridengine-master gridengine-exec 2>/dev/null ||
        echo "ensure_gridengine.sh: could not disable the gridengine-master and" \
            "gridengine-exec units" >&2
fi
if ! have_all; then
    echo "ensure_gridengine.sh: one of $tools (or spoolinit, spooldefaults) is still missing" \
        "after apt-get install" >&2
    exit 1
fi
