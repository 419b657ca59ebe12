#!/usr/bin/env bash
# Make sure Debian's Chromium is installed: the fleet dashboard's test drives it headless with
# Playwright (the Python package, pointed at /usr/bin/chromium: it downloads no browser of its
# own). Idempotent: does nothing when /usr/bin/chromium is there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" chromium
if [ ! -x /usr/bin/chromium ]; then
    echo "ensure_chromium.sh: /usr/bin/chromium is still missing after apt-get install" >&2
    exit 1
fi
