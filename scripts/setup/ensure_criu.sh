#!/usr/bin/env bash
# Make sure a working CRIU (checkpoint/restore of running processes) is at hand for the `local`
# back-end's checkpoints (gbroker/site/criu.py) and its tests.
# - If `criu` on PATH passes `criu check`, nothing more is done.
# - Else CRIU 4.2 is built from vendor/criu-4.2.tar.xz (Debian 12's criu 3.17 fails on kernels
#   >= 6.13; vendor/README.md) into a cache outside the checkout,
#   ${XDG_CACHE_HOME:-$HOME/.cache}/gbroker/criu-4.2-SHA (SHA: the tarball's sha256, first 16
#   digits), with the build dependencies from Debian (scripts/setup/apt_install.sh). A cached build is
#   reused. The cache holds bin/criu and python/ (crit and pycriu, for the image rewriting at a
#   restore); the link ${XDG_CACHE_HOME:-$HOME/.cache}/gbroker/criu points at the current one,
#   which is where gbroker looks (gbroker.site.criu.find_criu: $GBROKER_CRIU, then that link,
#   then PATH).
# Prints the path of the criu it found or built. A build takes a few minutes on 2 cores.
# Exit 1 with one line on stderr when no working criu can be had.
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"
here="$(cd "$(dirname "$0")/../.." && pwd)"
tarball="$here/vendor/criu-4.2.tar.xz"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/gbroker"
fail() { echo "ensure_criu.sh: $*" >&2; exit 1; }
works() { "$1" check >/dev/null 2>&1; }

[ -f "$tarball" ] || fail "$tarball is missing (the CRIU source this script builds)"
sha="$(sha256sum "$tarball" | cut -c1-16)"
cache="$cache_root/criu-4.2-$sha"
link="$cache_root/criu"
if [ -x "$cache/bin/criu" ] && [ -f "$cache/python/crit/__main__.py" ] && works "$cache/bin/criu"; then
    ln -sfn "$cache" "$link"
    echo "$cache/bin/criu"
    exit 0
fi
if command -v criu >/dev/null 2>&1 && works "$(command -v criu)" && command -v crit >/dev/null 2>&1; then
    command -v criu
    exit 0
fi
[ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1 ||
    fail "building CRIU needs its build dependencies installed: run as root or with sudo"
echo "ensure_criu.sh: building CRIU 4.2 from vendor/ into $cache (a few minutes)" >&2
bash "$here/scripts/setup/apt_install.sh" build-essential pkg-config python3 python3-protobuf \
    libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libnl-3-dev \
    libnet1-dev libcap-dev libbsd-dev libaio-dev libgnutls28-dev uuid-dev libnftables-dev \
    >&2 || fail "apt-get install of CRIU's build dependencies failed"
mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/.criu-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
tar -xJf "$tarball" -C "$work"
src="$work/criu-4.2"
log="$work/build.log"
# criu itself; lib (pycriu, with the images' Python modules from protoc); crit (its version.py)
if ! { make -C "$src" -j"$(nproc)" criu lib && make -C "$src" crit; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "make of CRIU 4.2 failed (the lines above are the end of its log)"
fi
stage="$work/stage"
mkdir -p "$stage/bin" "$stage/python"
cp "$src/criu/criu" "$stage/bin/criu"
cp -r "$src/lib/pycriu" "$stage/python/pycriu"
cp -r "$src/crit/crit" "$stage/python/crit"
works "$stage/bin/criu" || fail "the CRIU built from vendor/ does not pass \`criu check\`:" \
    "$("$stage/bin/criu" check 2>&1 | tail -n 1)"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
if ! why="$(cd / && PYTHONPATH="$stage/python" "$python" -c 'import crit.__main__, pycriu.images' 2>&1)"; then
    fail "crit or pycriu of the CRIU build does not import: $(tail -n 1 <<<"$why")"
fi
rm -rf "$cache"
mv "$stage" "$cache"
ln -sfn "$cache" "$link"
echo "$cache/bin/criu"
