#!/usr/bin/env bash
# Make sure the mosquitto MQTT broker binary is installed (the MQTT tests start it on loopback).
# Idempotent: does nothing when mosquitto is already installed. Installs the Debian package but
# never starts or enables the system service; the tests run their own mosquitto processes.
set -euo pipefail
# Debian installs it in /usr/sbin, which may be missing from PATH for non-root users.
if command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
# policy-rc.d exit 101 keeps the package's post-install from starting the service.
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
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mosquitto
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    echo "ensure_mosquitto.sh: mosquitto is still missing after apt-get install" >&2
    exit 1
fi
