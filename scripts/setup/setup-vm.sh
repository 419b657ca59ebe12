#!/usr/bin/env bash
# The parts of the cgroup v2 test VM (scripts/quality/cgroup2_vm.py): QEMU, a static busybox for the
# guest's init, and a Debian kernel with the few modules the guest loads (virtio, 9p, overlay).
# The kernel is unpacked from Debian's linux-image package into a cache, not installed: this host
# boots a kernel of its own and needs neither its /boot nor an initramfs of the package's.
# Idempotent, and quick when everything is there (no apt at all then).
# Usage: bash scripts/setup/setup-vm.sh   (as root, or with sudo available)
#   GBROKER_VM_CACHE: where the kernel goes (default .venv/.cache/cgroup2-vm in the checkout)
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${GBROKER_VM_CACHE:-$PWD/.venv/.cache/cgroup2-vm}"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
missing=()
installed qemu-system-x86 || missing+=(qemu-system-x86)
installed busybox-static || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
    bash scripts/setup/apt_install.sh "${missing[@]}"
fi

# A kernel unpacked before (its directory is renamed into place only once complete) will do.
if compgen -G "$cache/kernel-*/boot/vmlinuz-*" >/dev/null; then
    exit 0
fi
# The package that linux-image-amd64 stands for now, e.g. linux-image-6.1.0-56-amd64.
kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }'
}
package="$(kernel_package)"
if [ -z "$package" ]; then
    # No package lists yet (a fresh machine): apt_install.sh updates them, waiting for apt's
    # locks, and then installs nothing.
    bash scripts/setup/apt_install.sh
    package="$(kernel_package)"
fi
if [ -z "$package" ]; then
    echo "setup-vm.sh: apt knows no linux-image-amd64 to take the guest's kernel from" >&2
    exit 1
fi
mkdir -p "$cache"
work="$(mktemp -d "$cache/.unpack.XXXXXX")"
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"  # apt's download sandbox user must be able to write there
(cd "$work" && apt-get download -qq "$package" 2>/dev/null) || {
    # The lists name a version the archive no longer has: refresh them once.
    bash scripts/setup/apt_install.sh
    (cd "$work" && apt-get download -qq "$package")
}
mkdir "$work/root"
dpkg-deb --fsys-tarfile "$work"/*.deb | tar -x -C "$work/root" --wildcards \
    './boot/vmlinuz-*' \
    './lib/modules/*/modules.builtin' \
    './lib/modules/*/kernel/drivers/virtio' \
    './lib/modules/*/kernel/net/9p' \
    './lib/modules/*/kernel/fs'
version="$(basename "$work"/root/boot/vmlinuz-*)"
version="${version#vmlinuz-}"
# Into place in one rename; another setup that got there first (two test workers) is as good.
mv -T "$work/root" "$cache/kernel-$version" 2>/dev/null || [ -d "$cache/kernel-$version/boot" ]
echo "setup-vm.sh: the guest's kernel is $package ($version), in $cache/kernel-$version"
