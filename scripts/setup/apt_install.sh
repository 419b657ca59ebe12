#!/usr/bin/env bash
# Install Debian packages without starting their services: the project's scripts start their own
# processes (mosquitto, munged, slurmctld, slurmd) and never want the system's.
# Another apt or dpkg at work (unattended-upgrades, another setup script) holds apt's locks: this
# waits for them, saying once who holds which, up to $GBROKER_APT_LOCK_TIMEOUT seconds in all
# (default 600), instead of failing at once.
# Usage: bash scripts/setup/apt_install.sh PACKAGE...   (as root, or with sudo available)
set -euo pipefail
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
timeout="${GBROKER_APT_LOCK_TIMEOUT:-600}"
deadline=$((SECONDS + timeout))

# "process PID, COMMAND" holding a lock on the file $1, else nothing. apt and dpkg lock
# their files with fcntl (flock(1) cannot see those locks); F_GETLK names the holder.
held_by() {
    $sudo python3 - "$1" <<'PY'
import fcntl, os, struct, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError:  # no such lock file: nobody holds it
    sys.exit(0)
asked = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
kind, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, asked))
if kind != fcntl.F_UNLCK:
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        name = "?"
    print(f"process {pid}, {name}")
PY
}

# Wait until no other process holds any of the lock files given, saying so once each.
wait_for_locks() {
    local lock holder said=""
    for lock in "$@"; do
        while holder="$(held_by "$lock")" && [ -n "$holder" ]; do
            if [ "$said" != "$lock" ]; then
                echo "apt_install.sh: another apt or dpkg holds $lock ($holder);" \
                    "waiting for it, at most ${timeout} s in all" >&2
                said="$lock"
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "apt_install.sh: $lock is still held ($holder) after ${timeout} s" >&2
                return 1
            fi
            sleep 1
        done
    done
}

# apt-get update takes the package lists' lock and does not wait for it (DPkg::Lock::Timeout is
# for dpkg's locks only): wait here, and again if another apt took it in between.
update() {
    local out
    while true; do
        wait_for_locks /var/lib/apt/lists/lock
        if out="$($sudo apt-get update -qq 2>&1)"; then
            [ -z "$out" ] || printf '%s\n' "$out" >&2
            return 0
        fi
        if ! grep -q "Could not get lock" <<<"$out" || [ "$SECONDS" -ge "$deadline" ]; then
            printf '%s\n' "$out" >&2
            return 1
        fi
    done
}

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
update
# The message first; apt-get itself then waits for dpkg's locks should another apt take them
# meanwhile (the archives' lock it would not wait for: another apt holds dpkg's with it).
wait_for_locks /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/cache/apt/archives/lock
left=$((deadline - SECONDS))
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout="$((left > 1 ? left : 1))" "$@"
