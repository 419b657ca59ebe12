#!/usr/bin/env bash
# Make sure the mosquitto MQTT broker binary is installed (the MQTT tests start it on loopback).
# Idempotent: does nothing when mosquitto is already installed. Installs the Debian package but
# never starts or enables the system service; the tests run their own mosquitto processes.
set -euo pipefail
# Debian installs it in /usr/sbin, which may be missing from PATH for non-root users.
if command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" mosquitto
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    echo "ensure_mosquitto.sh: mosquitto is still missing after apt-get install" >&2
    exit 1
fi
