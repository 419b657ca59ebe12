#!/usr/bin/env bash
# Make sure Docker can run containers here: docker.io (dockerd, and iptables with it),
# mmdebstrap (the base image is built from Debian packages: no registry is needed) and
# docker-compose. apt cannot start services on these machines, so when no dockerd answers this
# starts one in the background (its log: /var/log/gbroker-dockerd.log) and waits for it.
# Idempotent. Usage: bash scripts/setup/ensure_docker.sh   (as root)
set -euo pipefail
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ]; then
    bash "$(dirname "$0")/apt_install.sh" "${missing[@]}"
fi
if docker info >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_docker.sh: no dockerd answers, and only root can start one" >&2
    exit 1
fi
# Not the caller's terminal size: dockerd runs ps for `docker top`, which would cut lines to it.
nohup env -u COLUMNS -u LINES dockerd >/var/log/gbroker-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    sleep 0.5
done
echo "ensure_docker.sh: dockerd did not answer within 30 s; see /var/log/gbroker-dockerd.log" >&2
exit 1
