#!/usr/bin/env bash
# Build gbroker-exec (below), and the native front of the `gbroker` command (gbroker/cli/native/gbroker.c) and install it as
# .venv/bin/gbroker, with pip's Python script beside it as .venv/bin/gbroker-py, which it runs for
# every command but a plain `gbroker submit FILE...` (gbroker/cli/native/gbroker.c says why). Idempotent.
# Needs a C compiler and Debian's libcjson-dev (installed here when missing and we may).
# Without them GBroker works the same, with the Python `gbroker` only: slower to start.
# Usage: bash scripts/setup/build_native.sh [--check]   (--check: fail instead of falling back)
set -euo pipefail
cd "$(dirname "$0")/../.."
check="${1:-}"
bin=.venv/bin
fail() {
    echo "build_native: $*; the gbroker command stays Python only (slower to start)" >&2
    if [ "$check" = "--check" ]; then exit 1; fi
    exit 0
}
[ -x "$bin/python" ] || fail "no .venv (run scripts/setup/setup.sh)"
# gbroker-exec (gbroker/site/native/gbroker-exec.c): what a root site's launcher spawns to start a
# job in its cgroups, under its rlimits and ids. Static: one exec of a small program. Without it,
# the launcher forks each job (about 0.45 ms more of its CPU per start).
cc="${CC:-cc}"
exec_src=gbroker/site/native/gbroker-exec.c
if command -v "$cc" >/dev/null && ! { [ -x "$bin/gbroker-exec" ] && [ "$bin/gbroker-exec" -nt "$exec_src" ]; }; then
    tmp="$(mktemp "$bin/.gbroker-exec.XXXXXX")"
    if "$cc" -O2 -Wall -Wextra -Werror -std=gnu11 -static -o "$tmp" "$exec_src" 2>/dev/null \
        || "$cc" -O2 -Wall -Wextra -Werror -std=gnu11 -o "$tmp" "$exec_src"; then
        chmod 755 "$tmp"
        mv -f "$tmp" "$bin/gbroker-exec"
    else
        rm -f "$tmp"
        echo "build_native: gbroker-exec did not build: a root site's launcher forks its jobs" >&2
    fi
fi
if [ ! -f /usr/include/cjson/cJSON.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        # It waits for another apt or dpkg that holds apt's locks, saying so.
        bash scripts/setup/apt_install.sh libcjson-dev || fail "cannot install libcjson-dev"
    else
        fail "no cJSON headers (apt-get install libcjson-dev)"
    fi
fi
command -v "$cc" >/dev/null || fail "no C compiler ($cc)"
# pip writes its script as bin/gbroker on every install: that one is the Python CLI.
if [ -f "$bin/gbroker" ] && [ "$(head -c 2 "$bin/gbroker")" = "#!" ]; then
    mv -f "$bin/gbroker" "$bin/gbroker-py"
fi
[ -x "$bin/gbroker-py" ] || fail "no Python gbroker script to run (reinstall with scripts/setup/setup.sh)"
if [ -x "$bin/gbroker" ] && [ "$bin/gbroker" -nt gbroker/cli/native/gbroker.c ]; then
    exit 0  # built from this source already
fi
tmp="$(mktemp "$bin/.gbroker.XXXXXX")"
if ! "$cc" -O2 -Wall -Wextra -Werror -std=gnu11 -o "$tmp" gbroker/cli/native/gbroker.c -lcjson; then
    rm -f "$tmp"
    mv -f "$bin/gbroker-py" "$bin/gbroker"  # the Python CLI, as pip left it
    fail "the C build failed"
fi
chmod 755 "$tmp"
mv -f "$tmp" "$bin/gbroker"
