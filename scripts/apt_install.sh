#!/usr/bin/env bash
# Install Debian packages without starting their services: the project's scripts start their own
# processes (mosquitto, munged, slurmctld, slurmd) and never want the system's.
# Usage: bash scripts/apt_install.sh PACKAGE...   (as root, or with sudo available)
set -euo pipefail
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
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
